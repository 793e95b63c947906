"""Schedules in the run layer: firing them (and starting the supervisors of the command jobs
they make), and the Python API (``outlast.schedule``; ``@outlast.job(cron=…)``).

The store fires each fire time at most once (see :mod:`outlast.cron`); this layer starts what
the store cannot: a fired command job's supervisor, in the folder and with the environment its
schedule saved when it was added (on a PostgreSQL store whose maintainer runs on another host:
the saved folder if it exists there, and that host's environment).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from outlast import cron
from outlast.errors import InvalidInput
from outlast.model import Call, JobState, Kind, Schedule
from outlast.run import registry, spawn, timer
from outlast.run.registry import JobSpec
from outlast.store import Store

log = logging.getLogger("outlast.schedules")


def _context_path(store: Store, name: str) -> str:
    """Where a command schedule's environment is kept (0600, beside the jobs' logs)."""
    return str(store.log_path("schedule").with_name(f"@schedule-{name}.ctx"))


def save_context(store: Store, name: str, cwd: str, env: Mapping[str, str]) -> None:
    """Keep the folder and environment a command schedule's jobs run with (0600: an
    environment can hold secrets, so it stays out of the schedule's document)."""
    os.replace(spawn.write_context(store, cwd, dict(env)), _context_path(store, name))


def forget_context(store: Store, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(_context_path(store, name))


def start_workers(store: Store, jobs: Sequence[JobState]) -> None:
    """Start the supervisor of each fired command job (the pools claim the others)."""
    for job in jobs:
        if job.kind != Kind.COMMAND:
            continue
        try:
            saved = _context_path(store, job.fired.schedule if job.fired else "")
            cwd, env = job_context(saved)
            written = spawn.write_context(store, cwd or "/", env or dict(os.environ))
            spawn.adopt_context(store, written, job.id)
            if not timer.parked_at_start(store, job):
                spawn.spawn_supervisor(store, job.id)
        except OSError as exc:  # whoever reconciles it tries again (a stray, see reap)
            log.warning("cannot start the supervisor of scheduled job %s: %s", job.id, exc)


def job_context(path: str) -> tuple[str | None, dict[str, str] | None]:
    """A schedule's saved ``(cwd, env)``; a folder that is not there (another host) is
    None: the job runs where its supervisor is started."""
    cwd, env = spawn.read_context(path)
    return (cwd if cwd is not None and os.path.isdir(cwd) else None), env


def fire_due(store: Store) -> list[JobState]:
    """Fire the store's due schedules and start the supervisors of their command jobs."""
    made = store.fire_schedules()
    start_workers(store, made)
    return made


def run_now(store: Store, name: str) -> JobState:
    """One job of the schedule now (``outlast schedule run-now``)."""
    job = store.run_schedule_now(name)
    start_workers(store, [job])
    return job


def remove(store: Store, name: str) -> None:
    store.remove_schedule(name)
    forget_context(store, name)


def add_command(
    store: Store,
    name: str,
    argv: Sequence[str],
    *,
    cron_expr: str | None = None,
    every: object = None,
    tz: str | None = None,
    misfire: str = "once",
    overlap: bool = True,
    labels: Mapping[str, str] | None = None,
    attempts: int = 1,
    timeout: object = None,
    grace: float | None = None,
    keep: object = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    replace: bool = False,
    priority: int = 0,
) -> Schedule:
    """A schedule that runs ``argv`` as a command job at each fire time, in ``cwd`` (default:
    here) with ``env`` (default: this process's environment)."""
    if isinstance(argv, str) or not argv:
        raise InvalidInput("a command schedule needs the command: a list of strings")
    folder = os.path.abspath(cwd or os.getcwd())
    template = cron.template(
        Kind.COMMAND,
        name,
        command=list(argv),
        labels=labels,
        max_attempts=attempts,
        timeout=_seconds(timeout, "timeout"),
        grace=grace,
        keep=_seconds(keep, "keep"),
        cwd=folder,
        priority=priority,
    )
    schedule = _new(name, template, cron_expr, every, tz, misfire, overlap)
    saved = store.add_schedule(schedule, replace=replace)
    save_context(store, name, folder, dict(os.environ if env is None else env))
    return saved


def _seconds(value: object, what: str) -> float | None:
    from outlast.when import parse_duration

    return None if value is None else parse_duration(value, what)


def _new(
    name: str,
    template: Any,
    cron_expr: str | None,
    every: object,
    tz: str | None,
    misfire: str,
    overlap: bool,
) -> Schedule:
    interval = None if every is None else _seconds(every, "every")
    return cron.new_schedule(
        name, template, cron=cron_expr, every=interval, tz=tz, misfire=misfire, overlap=overlap
    )


def add_job(
    store: Store,
    job: JobSpec,
    *,
    name: str | None = None,
    cron_expr: str | None = None,
    every: object = None,
    tz: str | None = None,
    misfire: str = "once",
    overlap: bool = True,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    queue: str | None = None,
    attempts: int | None = None,
    timeout: object = None,
    keep: object = None,
    replace: bool = False,
    priority: int | None = None,
) -> Schedule:
    """A schedule that queues the registered ``job`` at each fire time (for the pools)."""
    from outlast import config

    if job.kind == Kind.PIPELINE and (args or kwargs):
        raise InvalidInput(f"pipeline {job.name!r} takes a payload object, not arguments")
    template = cron.template(
        job.kind,
        job.name,
        call=Call(job.module, list(args), dict(kwargs or {}), registry.module_root(job.module)),
        payload=payload,
        labels=labels,
        queue=job.queue if queue is None else queue,
        max_attempts=attempts or job.attempts or config.max_retries(),
        timeout=_seconds(timeout, "timeout") if timeout is not None else job.timeout,
        keep=_seconds(keep, "keep"),
        cleanup=job.cleanup,
        priority=job.priority if priority is None else priority,
    )
    schedule = _new(name or job.name, template, cron_expr, every, tz, misfire, overlap)
    return store.add_schedule(schedule, replace=replace)


def sync_declared(store: Store) -> list[Schedule]:
    """Store the schedules declared with ``@outlast.job(cron=…)`` / ``every=`` by the
    modules this process imported: a new one is added, a changed one takes its new
    definition (keeping its history, whether it is paused and, if its timing is the same,
    its next fire time). A pool, ``outlast serve`` and ``outlast scheduler`` do this at start."""
    out = []
    for spec in registry.declared_schedules():
        options = dict(spec.schedule or {})
        out.append(add_job(store, spec, replace=True, **options))
    return out


def describe(store: Store, schedule: Schedule) -> dict[str, Any]:
    """A schedule's document for people and programs (CLI ``--json``, HTTP): its stored
    fields plus ``last_status``, the status of the last job it made (null when none, or
    deleted since)."""
    doc = schedule.to_dict()
    status = None
    if schedule.last_job is not None:
        with contextlib.suppress(Exception):
            status = str(store.get(schedule.last_job).status)
    doc["last_status"] = status
    return doc
