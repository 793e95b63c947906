"""The store port: DESIGN.md's contract, implemented once over a small adapter interface.

A user (and the run layer) calls the public verbs here. An adapter (sqlite, files,
postgresql) implements the underscored methods: insert a state, read one, *apply* transitions
atomically (read, apply a pure transition from :mod:`outlast.machine`, write the state and its
events in one lock or transaction, wake waiters), select, remove, claim, read events, take and
probe worker locks. :class:`~outlast.store.sql.SqlStore` implements most of them once for both
SQL engines.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from outlast import config, cron, machine
from outlast.errors import (
    DuplicateJob,
    InvalidInput,
    JobActive,
    JobNotFound,
    OutlastError,
    ScheduleExists,
    ScheduleNotFound,
)
from outlast.ids import DEDICATED, check_id
from outlast.machine import Change
from outlast.model import (
    TERMINAL,
    Call,
    JobState,
    Kind,
    PipelineState,
    ProgressEvent,
    Schedule,
    Status,
    utcnow,
)
from outlast.store.common import log, worker_name
from outlast.store.follower import follow, settled, wait_released
from outlast.store.joblog import (
    FileCursor,
    LogCursor,
    LogSink,
    LogWriter,
    check_range,
    read_range,
    tail_file,
)
from outlast.store.journal import NOT_STARTED, Fate, Journal
from outlast.store.query import Filter, make_filter
from outlast.store.stats import Stats
from outlast.store.stats import from_states as stats_from_states
from outlast.store.task import Task
from outlast.store.timeline import Kept, Timeline
from outlast.store.timeline import check as check_timeline

#: A pure transition: the current state in, the change to write (or None: nothing) out.
Transition = Callable[[JobState], Change | None]
#: Reconciles a job whose worker may be gone; returns its true state.
Reconciler = Callable[[JobState], JobState]
#: A read-modify-write of one schedule: the schedule (None: there is none) in; the schedule to
#: write, or None to write nothing, or :data:`REMOVE` out.
ScheduleChange = Callable[[Schedule | None], object]
#: What a :data:`ScheduleChange` returns to remove the schedule.
REMOVE = object()
#: Jobs :meth:`Store.parked` reads beyond a key's free slots, for those a worker holds (one
#: just started, one waiting out its retry's backoff) that it skips.
PARKED_SLACK = 8
_LIVE_LOCK = threading.RLock()
_reconcilers: list[Callable[[Store], Reconciler]] = []


def use_reconciler(factory: Callable[[Store], Reconciler]) -> None:
    """Have :meth:`Store.wait` and :meth:`Store.watch` reconcile through ``factory(store)``
    by default. The run layer registers its own when it is loaded (it also kills what a dead
    command left running and restarts the worker of a retry); the store alone can only
    finish the jobs that pools run."""
    _reconcilers[:] = [factory]


@dataclass(frozen=True)
class Capabilities:
    """What an adapter can do; workers and watchers read these instead of checking types."""

    #: Writers wake waiters (``listen``) within milliseconds, so nobody needs to poll.
    pushes_notifications: bool
    #: Workers on several machines may share the store.
    spans_hosts: bool
    #: Logs live as files on this machine (``log_path``).
    local_logs: bool = True


class Listener(Protocol):
    """Wakes a waiter when the store changes. Arm it, check your condition, then ``wait``."""

    #: After ``drain``: True when what it consumed included an interrupt (a running job was
    #: canceled or deleted: ``listen(…, interrupts=True)``), or when it cannot tell (it
    #: polls, or reconnected); a pool then looks at the jobs it runs.
    interrupted: bool

    def wait(self, timeout: float | None) -> bool: ...
    def fileno(self) -> int | None: ...
    def drain(self) -> bool:
        """Consume what arrived without blocking; True when it said a job became claimable
        (or the listener cannot tell)."""
        ...

    def close(self) -> None: ...
    def __enter__(self) -> Listener: ...
    def __exit__(self, *exc: object) -> None: ...


class MaintenanceLock(Protocol):
    """The store's maintenance lock: at most one live process of a store holds it, and the
    kernel (or the database server) frees it when that process dies. Whoever holds it does
    the store's maintenance: reconciling jobs of dead workers (later: schedules, retention)."""

    def try_acquire(self) -> bool:
        """Take the lock if it is free; True when held."""
        ...

    def acquire(self) -> bool:
        """Block until the lock is held (True) or :meth:`interrupt` was called (False)."""
        ...

    def held(self) -> bool:
        """Whether it is still held (a database connection can be lost)."""
        ...

    def interrupt(self) -> None:
        """Make a blocked (or the next) :meth:`acquire` return False; thread-safe."""
        ...

    def release(self) -> None: ...


class ChangeWatch:
    """Tells, cheaply, whether the store may have changed since the last look: how the
    store's maintainer knows, without a query while nothing happens, that it must look at the
    schedules and at jobs nobody took again. True at the first look; this default is always
    True (the adapters do better)."""

    def changed(self) -> bool:
        return True

    def close(self) -> None:
        pass


class Applied(NamedTuple):
    """What a transition came to: the job's state now, and the events it appended."""

    state: JobState
    events: builtins.list[ProgressEvent]


class Store(abc.ABC):
    """Where jobs and their events live. Thread-safe; open one per process (not across fork)."""

    capabilities: Capabilities
    url: str

    # ----------------------------------------------------------------- the public contract
    def create(
        self,
        *,
        kind: Kind | str = Kind.COMMAND,
        name: str | None = None,
        command: builtins.list[str] | None = None,
        labels: Mapping[str, str] | None = None,
        queue: str = "default",
        payload: Mapping[str, Any] | None = None,
        max_attempts: int = 1,
        run_after: datetime | None = None,
        call: Call | None = None,
        timeout: float | None = None,
        grace: float | None = None,
        pipeline: PipelineState | None = None,
        keep: float | None = None,
        priority: int = 0,
        unique_key: str | None = None,
        on_conflict: str = "return",
        connection: Any = None,
        limit_key: str | None = None,
        limit: int | None = None,
        trace: str | None = None,
    ) -> Task:
        """Record a new pending job and return its handle; waiters on its queue are woken.
        ``run_after``: not to be claimed before then (a delay); ``keep``: seconds the job is
        kept once finished (None: ``$OUTLAST_KEEP``); ``priority``: higher is claimed first.

        ``unique_key``: while a live (pending, running or paused) job holds the key, nothing
        is created: the handle of that job is returned (``on_conflict="return"``) or
        :class:`DuplicateJob` raised (``"raise"``). Checked by the store atomically (a
        unique index among live jobs; on the files store, under the key's lock)."""
        if on_conflict not in ("return", "raise"):
            raise InvalidInput(f"on_conflict is 'return' or 'raise', not {on_conflict!r}")
        state = machine.new_job(
            kind=kind,
            name=name,
            command=command,
            labels=labels,
            queue=queue,
            payload=payload,
            max_attempts=max_attempts,
            run_after=run_after,
            call=call,
            timeout=timeout,
            grace=grace,
            pipeline=pipeline,
            keep=keep,
            priority=priority,
            unique_key=unique_key,
            limit_key=limit_key,
            limit=limit,
            trace=trace,
            now=utcnow(),
        )
        if connection is not None:
            holder = self._insert_on(connection, state)
        else:
            holder = self._insert(state)
        if holder is None:
            return Task(self, state.id)
        if on_conflict == "raise":
            raise DuplicateJob(
                f"job {holder.id} ({holder.status}) holds the unique key {unique_key!r}",
                existing=holder.id,
            )
        task = Task(self, holder.id)
        task.existing = True
        return task

    #: Jobs :meth:`create_many` inserts per transaction.
    CREATE_BATCH = 1000

    def create_many(
        self, jobs: Sequence[Mapping[str, Any]], common: Mapping[str, Any] | None = None
    ) -> builtins.list[Task]:
        """Record many pending jobs, each given as :meth:`create`'s keyword arguments (no
        ``connection``; ``on_conflict`` is ``"return"``: a job whose unique key a live job
        holds gets that job's handle, ``existing`` set; two jobs of one call may not hold
        the same key). ``common``: keyword arguments of every job, under each job's own
        (checked once for a job that gives only its call, payload and limit key: the fast
        path of a big batch). Every job is checked before anything is written; then they
        are inserted in order, :attr:`CREATE_BATCH` per transaction on the SQL stores, and
        the waiters of their queues are woken. Returns their handles, in order."""
        shared = dict(common or {})
        for fields in (shared, *jobs):
            if "connection" in fields or fields.get("on_conflict", "return") != "return":
                raise InvalidInput("create_many takes neither connection nor on_conflict")
        shared.pop("on_conflict", None)
        each = [
            {k: v for k, v in fields.items() if k != "on_conflict"}
            if "on_conflict" in fields
            else fields
            for fields in jobs
        ]
        states = machine.new_jobs(shared, each, utcnow())
        keys = [s.unique_key for s in states if s.unique_key is not None]
        if len(keys) != len(set(keys)):
            raise InvalidInput("two jobs of one create_many call hold the same unique key")
        tasks: builtins.list[Task] = []
        for start in range(0, len(states), self.CREATE_BATCH):
            batch = states[start : start + self.CREATE_BATCH]
            for state, holder in zip(batch, self._insert_many(batch), strict=True):
                task = Task(self, state.id if holder is None else holder.id)
                task.existing = holder is not None
                tasks.append(task)
        return tasks

    def retry(self, job_ids: builtins.list[str]) -> builtins.list[JobState]:
        """A new pending job for each finished job of ``job_ids``, with its definition (what
        to run, labels, queue, options), linked by ``retry_of``; the finished jobs stay as
        they were. Inserted together (one transaction per 500 on SQL stores). Raises
        :class:`InvalidTransition` naming the first job that is not finished, before
        anything is written. (A job whose unique key a live job holds gets that job
        instead.) Returns the new jobs' states, in order. The run layer's
        ``outlast.run.api.retry`` also starts the workers of commands and spawned jobs."""
        now = utcnow()
        copies = [machine.retry_copy(self.get(job_id), now) for job_id in job_ids]
        out: builtins.list[JobState] = []
        for start in range(0, len(copies), 500):
            batch = copies[start : start + 500]
            holders = self._insert_many(batch)
            out += [h or c for c, h in zip(batch, holders, strict=True)]
        return out

    def set_slots(self, key: str, slots: int | None) -> None:
        """Set how many jobs of the concurrency ``key`` may run at once (None: unset, each
        job's own ``limit`` applies again, else 1). Takes effect at the next claim."""
        machine.check_limit(key, None)
        if slots is not None:
            machine.check_slots(slots, "slots")
        self._set_slots(key, slots)

    def slots(self) -> dict[str, tuple[int | None, int]]:
        """``key -> (slots set, or None; jobs running now)`` for every key with slots set or
        a running job."""
        return self._slot_usage()

    def waiting_by_key(self) -> dict[str, int]:
        """``key -> how many of its command and spawned jobs wait to start`` (parked for a
        slot, or delayed) for every key that has one; a key's function jobs wait in their
        queues (:meth:`stats`). Read from the parked jobs' index on the SQL stores."""
        return dict(sorted(self._waiting_by_key().items()))

    def groups(self) -> builtins.list[dict[str, Any]]:
        """Every concurrency key with slots set, a running job or a waiting one, as
        ``{"name", "slots", "running", "waiting"}`` (``outlast group ls``, ``GET /groups``)."""
        usage, waiting = self._slot_usage(), self._waiting_by_key()
        return [
            {
                "name": key,
                "slots": usage.get(key, (None, 0))[0],
                "running": usage.get(key, (None, 0))[1],
                "waiting": waiting.get(key, 0),
            }
            for key in sorted({*usage, *waiting})
        ]

    def retries_of(self, job_id: str) -> builtins.list[str]:
        """The ids of the jobs that retry ``job_id``, oldest first."""
        return self._retries_of(check_id(job_id))

    def open(self, job_id: str) -> Task:
        """A handle to an existing job (the id is checked now, existence on first use)."""
        return Task(self, check_id(job_id))

    def get(self, job_id: str) -> JobState:
        """The job's state; :class:`JobNotFound` or :class:`CorruptJob` naming the job."""
        return self._read(check_id(job_id))

    # ----------------------------------------------------------------------- workers
    def register_worker(
        self,
        kind: str,
        *,
        queues: Sequence[str] = (),
        concurrency: int | None = None,
        job_id: str | None = None,
    ) -> dict[str, Any]:
        """Put this process in the store's registry of workers (``outlast workers``):
        ``kind`` (``pool``, ``async-pool``, ``server``, ``scheduler``, ``timer``, ``supervisor``,
        ``dedicated``), its queues and concurrency, or the one job it runs. Its liveness is a
        lock the kernel (or PostgreSQL) frees when it dies — the job's worker lock for a
        supervisor or dedicated worker, else the process's own — so a dead worker is never
        listed. Returns the record."""
        from outlast import __version__

        name = worker_name()
        host, _, pid = name.rpartition(":")
        doc: dict[str, Any] = {
            "name": name,
            "host": host,
            "pid": int(pid) if pid.isdigit() else None,
            "kind": kind,
            "queues": list(queues),
            "concurrency": concurrency,
            "job": job_id,
            "version": __version__,
            "since": utcnow().isoformat(),
        }
        if job_id is None:
            self._hold_registry(name)
        self._put_worker(name, json.dumps(doc, separators=(",", ":")).encode())
        return doc

    def unregister_worker(self) -> None:
        """Take this process out of the registry (it also goes when it dies)."""
        self._drop_worker(worker_name())

    def workers(self) -> builtins.list[dict[str, Any]]:
        """The live workers of the registry, with ``jobs``: how many running jobs each
        holds. Records of dead workers are removed as they are found."""
        return self._live_workers(self._running_by_worker())

    def _live_workers(self, running: dict[str, int]) -> builtins.list[dict[str, Any]]:
        docs: dict[str, dict[str, Any] | None] = {}
        for name, raw in self._worker_docs():
            try:
                doc = json.loads(raw)
                docs[name] = doc if isinstance(doc, dict) else None
            except ValueError:
                docs[name] = None
        own = [n for n, doc in docs.items() if doc is not None and not doc.get("job")]
        alive = self._registry_alive_many(own)
        found = []
        for name, doc in docs.items():
            try:
                job = doc.get("job") if doc is not None else None
                live = doc is not None and (self.worker_holds(job) if job else alive[name])
            except (TypeError, AttributeError, InvalidInput):
                live = False
            if not live or doc is None:
                with contextlib.suppress(OutlastError):
                    self._drop_worker(name)
                continue
            doc["jobs"] = running.get(name, 0)
            found.append(doc)
        return sorted(found, key=lambda d: (d.get("kind", ""), d.get("name", "")))

    def _running_by_worker(self) -> dict[str, int]:
        """How many running jobs each worker holds (one grouped read on the SQL stores)."""
        running: dict[str, int] = {}
        for state in self.list(status=Status.RUNNING, limit=None):
            if state.worker:
                running[state.worker] = running.get(state.worker, 0) + 1
        return running

    def _registry_alive_many(self, names: builtins.list[str]) -> dict[str, bool]:
        """:meth:`_registry_alive` of each of ``names`` (PostgreSQL: one read of its locks)."""
        return {name: self._registry_alive(name) for name in names}

    def _hold_registry(self, name: str) -> None:
        """Hold the lock that says this process lives (the local stores' liveness lock)."""
        self._live()

    def _registry_alive(self, name: str) -> bool:
        return self._worker_alive(name)

    def _put_worker(self, name: str, doc: bytes) -> None:
        raise NotImplementedError

    def _drop_worker(self, name: str) -> None:
        raise NotImplementedError

    def _worker_docs(self) -> builtins.list[tuple[str, bytes]]:
        raise NotImplementedError

    def get_many(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """The states of those of ``job_ids`` that exist (one query on the SQL stores)."""
        found = {}
        for job_id in job_ids:
            try:
                found[job_id] = self.get(job_id)
            except JobNotFound:
                continue
        return found

    def stats(self, window: float = 3600.0) -> Stats:
        """A snapshot of the store for ``GET /metrics`` and ``outlast stats``: jobs by
        queue, status and kind, the oldest due job per queue, the wait and run times of the
        jobs that finished in the last ``window`` seconds, busy workers, due schedules."""
        if not isinstance(window, int | float) or not window > 0:
            raise InvalidInput(f"window must be a number of seconds > 0, not {window!r}")
        running = self._running_by_worker()
        stats = self._stats(utcnow(), float(window))
        stats.busy_workers = len(running)
        for worker in self._live_workers(running):
            stats.workers[str(worker.get("kind"))] += 1
        return stats

    def _stats(self, now: datetime, window: float) -> Stats:
        return stats_from_states(self.list(limit=None), now, window, self.schedules())

    def timeline(self, window: float = 3600.0, step: float = 60.0) -> Timeline:
        """Throughput and waiting time over the last ``window`` seconds, in steps of
        ``step`` (aligned to the epoch): the jobs that finished in each step by outcome, and
        the median and 95th percentile of their waits (see :mod:`outlast.store.timeline`;
        steps settled a while ago are read from the store once per store object)."""
        window, step = check_timeline(window, step)
        kept: Kept | None = self.__dict__.get("_timeline_kept")
        if kept is None:
            with _LIVE_LOCK:
                kept = self.__dict__.setdefault("_timeline_kept", Kept())
        assert kept is not None
        return kept.read(utcnow(), window, step, self._finished_since)

    def _finished_since(
        self, since: datetime, until: datetime
    ) -> Iterable[tuple[float, str, float]]:
        """``(finished at, in seconds since the epoch; status; seconds waited)`` of every job
        that finished in ``[since, until)`` (a superset is fine)."""
        for state in self.list(limit=None):
            if state.terminal and state.finished_at is not None and state.finished_at >= since:
                started = state.started_at or state.finished_at
                waited = (started - state.created_at).total_seconds()
                yield state.finished_at.timestamp(), str(state.status), waited

    def list(
        self,
        status: Status | str | None = None,
        label: str | Mapping[str, str] | None = None,
        limit: int | None = 100,
        before: str | None = None,
        *,
        name: str | None = None,
        id_prefix: str | None = None,
    ) -> builtins.list[JobState]:
        """Jobs newest first, filtered; ``before`` is the last id of the previous page.

        ``name``: jobs whose name holds it, ignoring case (a search box's substring match:
        ``resize`` finds ``images.resize``); ``id_prefix``: jobs whose id starts with it,
        exactly. Every filter given must hold (see :mod:`outlast.store.query`). A corrupt
        job is skipped with a warning (logged) instead of failing the listing.
        """
        query = make_filter(status, label, name, id_prefix)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be a whole number >= 1, not {limit!r}")
        if before is not None:
            check_id(before)
        return self._select(query, limit, before)

    def delete(self, job_id: str, force: bool = False) -> None:
        """Remove the job, its events, lock and log. Refuses a live job without ``force``;
        the check and the removal are one atomic step."""
        self._remove(check_id(job_id), force)

    def apply(self, job_id: str, transition: Transition) -> Applied:
        """Apply a pure transition atomically: read the job, ``change = transition(state)``,
        write the change's state and events (numbered after the last) and wake waiters, all
        in one lock or transaction. ``transition`` returning None writes nothing. Returns the
        state as it is now and the events appended. The transition may run more than once
        (a retried transaction): it must not have side effects."""
        return self._apply_one(check_id(job_id), transition)

    def apply_many(self, items: builtins.list[tuple[str, Transition]]) -> builtins.list[Applied]:
        """:meth:`apply` for several jobs, in order (the same job may come back: it sees its
        earlier change). Each change is atomic; adapters write them in one transaction (a pool
        recording the outcomes of many jobs at once). A job that cannot be read (deleted,
        corrupt) is skipped with a warning, so one bad job never loses the others: its item
        has no result (the results are those of the jobs that were there, in order)."""
        for job_id, _ in items:
            check_id(job_id)
        return self._apply_many(items)

    def abandoned(self, state: JobState) -> bool:
        """True when the job is not finished and nobody holds its worker lock any more.

        A running job, or a pending one waiting for its dedicated worker's retry, whose worker
        lock is free was left behind by a dead worker. A job nobody has started is never
        abandoned, nor is a paused one.
        """
        if state.status == Status.RUNNING or (
            state.status == Status.PENDING and state.worker is not None
        ):
            return not self._lock_held(state.id) and not self._worker_alive(state.worker)
        return False

    def worker_holds(self, job_id: str) -> bool:
        """Whether a live process holds the job's worker lock (a supervisor or dedicated
        worker waiting for the job's time, or for a slot of its concurrency key)."""
        return self._lock_held(check_id(job_id))

    def reconcile(self, state: JobState) -> JobState:
        """Turn an abandoned job into its true state (``pending`` to retry, or ``failed``).

        Re-checked inside the write, so a job that a live worker claimed meanwhile is left as
        it is. Returns the state after reconciling. This is the store's part only: the run
        layer's ``outlast.run.reap.reconcile`` also kills what a dead command left running
        and restarts dedicated workers; the CLI, pools and the server use that one.
        """

        fate = self._fate(state)

        def apply(current: JobState) -> Change | None:
            if not self.abandoned(current):
                return None
            return _abandon(current, fate if current.attempts == state.attempts else None)

        return self._apply_one(state.id, apply).state

    def abandoned_jobs(self, thorough: bool = False) -> builtins.list[JobState]:
        """The non-terminal jobs whose worker is gone, for the store's maintainer to
        reconcile. Cheap when nothing died: the local stores look only at their lock files
        (no query) unless ``thorough``; PostgreSQL asks one query joining ``pg_locks``."""
        return [s for s in self._live_jobs() if self.abandoned(s)]

    def journal(self, worker: str, label: str) -> Journal:
        """The attempt journal one process of ``worker`` (a pool, by its name) writes, named
        ``label`` among them (see :mod:`outlast.store.journal`). This store keeps none."""
        return Journal()

    def liveness_fd(self) -> int | None:
        """A file descriptor that keeps this process's jobs alive while any process holds it:
        a pool passes it to its job processes, so that its jobs look abandoned only once
        they are dead too (their journal complete). The local stores' liveness lock; None
        on stores whose job processes hold their own locks (PostgreSQL)."""
        return None

    def _fate(self, state: JobState) -> Fate:
        """What the journal of the job's worker says of its current attempt."""
        return None

    def fate(self, state: JobState) -> Fate:
        """What the attempt journals of the job's worker say of its current attempt:
        ``NOT_STARTED`` (claimed, its function never called), ``STARTED`` (called, no outcome
        journaled), the :class:`~outlast.machine.Outcome` it returned, or None when nothing
        is known. A pool whose job process died by itself reads it: a job never started
        there goes to another process uncounted, and one whose outcome was journaled before
        the process died has that outcome written, not the death."""
        return self._fate(state)

    def maintenance_lock(self) -> MaintenanceLock:
        """A new handle on the store's maintenance lock (see :class:`MaintenanceLock`)."""
        raise NotImplementedError(f"{type(self).__name__} has no maintenance lock")

    def timer_lock(self) -> MaintenanceLock:
        """A new handle on the store's *timer lock*: held by the one process that starts the
        workers of delayed command and spawned jobs at their time (:mod:`outlast.run.timer`),
        freed by the kernel (or the server) when it dies, like :meth:`maintenance_lock`."""
        raise NotImplementedError(f"{type(self).__name__} has no timer lock")

    def timer_running(self) -> bool:
        """Whether a live process holds the store's timer lock (a probe: takes nothing)."""
        raise NotImplementedError(f"{type(self).__name__} has no timer lock")

    def timed(
        self, after: tuple[datetime, str] | None = None, limit: int = 64
    ) -> builtins.list[JobState]:
        """The pending command and spawned jobs with a time of their own (``run_after``)
        that no worker is bound to, in the order of ``(run_after, id)``: the first ``limit``
        of them after the job ``after`` names (its ``(run_after, id)``; None: from the
        first). These are what the store's timer starts the workers of, a moment before
        their time (:mod:`outlast.run.timer`). Read through an index of these jobs alone, so
        a read costs the same with ten of them waiting or a million."""
        if limit < 1:
            raise InvalidInput(f"limit must be at least 1, not {limit}")
        return self._timed(after, limit)

    def next_due(
        self,
        queues: builtins.list[str] | None = None,
        kinds: builtins.list[Kind] | None = None,
    ) -> datetime | None:
        """When the earliest claimable job of ``queues`` and ``kinds`` is due (now, or a past
        time, when one is due already), or None when there is none: an idle pool sleeps
        until then (or a wake-up)."""
        return self._next_due(queues, kinds)

    def claim(
        self,
        worker: str | None = None,
        limit: int = 1,
        queues: builtins.list[str] | None = None,
        kinds: builtins.list[Kind] | None = None,
        journal: Journal | None = None,
    ) -> builtins.list[Task]:
        """Atomically take up to ``limit`` due pending jobs of ``queues`` and ``kinds``, higher
        ``priority`` first, then the earliest due, as this process (``worker`` may only name
        it); ``journal`` (a pool's) records each claimed attempt before the claim is written.

        Two claimers never get the same job. The jobs stay alive while this process lives: on
        the local stores its liveness lock covers them, on PostgreSQL each task holds an
        advisory lock (drop it with ``release_worker_locks`` once the outcome is written). Each
        task carries its attempt token, so its writes are refused once it loses the job.
        """
        if not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be >= 1")
        me = worker_name()
        if worker not in (None, me):
            raise InvalidInput(f"a claim is made as this process ({me}), not {worker!r}")
        self._live()
        claimed = self._claim(me, limit, queues, kinds, utcnow(), journal or Journal())
        return [Task(self, s.id, attempt=s.attempts, lock=lock, snapshot=s) for s, lock in claimed]

    def events(
        self, job_id: str, after: int = 0, limit: int | None = None
    ) -> builtins.list[ProgressEvent]:
        """The job's events with ``seq > after``, in order."""
        check_id(job_id)
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise InvalidInput(f"after must be a whole number >= 0, not {after!r}")
        return self._events(job_id, after, limit)

    def watch(
        self,
        job_id: str,
        after: int = 0,
        timeout: float | None = None,
        reconcile: Reconciler | None = None,
    ) -> Iterator[ProgressEvent]:
        """Yield the job's events after ``after`` as they land; end after the terminal one.

        Woken by the store's notification; a job whose worker died is reconciled (by
        ``reconcile``; by default the run layer's when it is loaded, see
        :func:`use_reconciler`) after a quiet second, so the iteration ends with the job's
        true outcome instead of waiting for a write that never comes.
        ``timeout`` (seconds) bounds the whole wait and ends the iteration quietly. A bad id
        or an unknown job raises here, before iteration starts.
        """
        self.get(job_id)
        updates = follow(self, job_id, after, timeout, reconcile=reconcile or self._reconciler())
        return (event for _, events in updates for event in events)

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        reconcile: Reconciler | None = None,
        *,
        through_pause: bool = False,
    ) -> JobState:
        """Block until the job is terminal or paused (or ``timeout``); returns its latest
        state.

        A paused job waits for a person's answer, so the wait returns on it (check
        ``state.status``) unless ``through_pause``, which waits on through pauses for the end.
        A canceled job is returned once no process holds its worker lock (its worker has
        stopped what the job ran), waiting at most its grace period and a few seconds more.
        A job whose worker died is reconciled as in :meth:`watch`: with no attempts left it
        ends ``failed``/``abandoned`` within about a second of the death.
        """
        check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        updates = follow(
            self,
            job_id,
            timeout=timeout,
            reconcile=reconcile or self._reconciler(),
            events=False,
            until=None if through_pause else settled,
        )
        state = deque(updates, maxlen=1)[0][0]  # the last update's state
        if state.status == Status.CANCELED:
            wait_released(self, state, deadline)
        return state

    # ----------------------------------------------------------------------- schedules
    def add_schedule(self, schedule: Schedule, replace: bool = False) -> Schedule:
        """Store a new schedule (made by :func:`outlast.cron.new_schedule`). One of that name
        raises :class:`ScheduleExists`, unless ``replace``: then it takes the new definition,
        keeping its history, whether it is paused and, if its timing is the same, its next
        fire time. Returns the schedule as stored."""
        if not isinstance(schedule, Schedule):
            raise InvalidInput("add_schedule takes an outlast.model.Schedule")
        now = utcnow()

        def put(old: Schedule | None) -> Schedule:
            if old is None:
                return schedule
            if not replace:
                raise ScheduleExists(
                    f"a schedule named {schedule.id!r} exists; remove it first, or replace "
                    "it (--replace)"
                )
            return cron.redefine(old, schedule, now)

        return self._write_schedule(check_id(schedule.id), put)  # type: ignore[return-value]

    def get_schedule(self, name: str) -> Schedule:
        """The schedule ``name``, or :class:`ScheduleNotFound`."""
        return self._read_schedule(check_id(name))

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name."""
        return sorted(self._list_schedules(), key=lambda s: s.id)

    def update_schedule(self, name: str, change: Callable[[Schedule], Schedule]) -> Schedule:
        """Apply ``change`` (pure) to the schedule atomically; returns it as stored."""

        def apply(old: Schedule | None) -> Schedule:
            if old is None:
                raise ScheduleNotFound(f"no schedule {name}")
            return change(old)

        return self._write_schedule(check_id(name), apply)  # type: ignore[return-value]

    def pause_schedule(self, name: str, paused: bool = True) -> Schedule:
        """Pause (or resume) a schedule. A resumed schedule fires from its next fire time
        after now: what came while it was paused is not caught up."""
        now = utcnow()

        def flip(s: Schedule) -> Schedule:
            if s.paused == paused:
                return s
            changes: dict[str, Any] = {"paused": paused, "updated_at": now}
            if not paused and s.next_at is not None and s.next_at <= now:
                changes["next_at"] = cron.next_fire(s, now)
            return s.evolve(**changes)

        return self.update_schedule(name, flip)

    def remove_schedule(self, name: str) -> None:
        """Remove the schedule (the jobs it made stay)."""

        def drop(old: Schedule | None) -> object:
            if old is None:
                raise ScheduleNotFound(f"no schedule {name}")
            return REMOVE

        self._write_schedule(check_id(name), drop)

    def fire_schedules(self, now: datetime | None = None) -> builtins.list[JobState]:
        """Fire every due schedule (the store's maintainer does this): each fire time makes
        at most one job, inserted with the schedule's move to its next fire time in one
        transaction (see :mod:`outlast.cron`). Returns the jobs made."""
        return self._fire(now or utcnow(), None)

    def run_schedule_now(self, name: str) -> JobState:
        """Make one job of the schedule now (``run-now``), whatever its times and even when
        it is paused; its next fire time stays."""
        made = self._fire(utcnow(), check_id(name))
        if not made:
            raise ScheduleNotFound(f"no schedule {name}")
        return made[0]

    def next_fire(self) -> datetime | None:
        """When the earliest schedule that is not paused fires next, or None."""
        return self._next_fire()

    # ----------------------------------------------------------------------- retention
    def expired(
        self, now: datetime | None = None, keep: float | None = None, limit: int = 500
    ) -> builtins.list[JobState]:
        """Finished jobs past their time: their own ``keep`` after they finished, else
        ``keep`` seconds (the store-wide ``$OUTLAST_KEEP``; None: kept). Oldest first."""
        now = now or utcnow()
        cutoff = None if keep is None else now - timedelta(seconds=keep)
        return self._expired(now, cutoff, limit)

    def prune(
        self, now: datetime | None = None, keep: float | None = None, limit: int = 500
    ) -> builtins.list[str]:
        """Remove up to ``limit`` jobs :meth:`expired` lists, each with its events and log in
        its own short transaction (claims never wait behind a long one); returns their ids.
        A job that is not finished any more, or gone, is skipped."""
        removed = []
        for state in self.expired(now, keep, limit):
            try:
                self._remove(state.id, False)
            except (JobNotFound, JobActive):  # gone, or retried meanwhile
                continue
            removed.append(state.id)
        return removed

    def unclaimed(self, now: datetime | None = None) -> builtins.list[JobState]:
        """Pending command and spawned jobs without a concurrency key that no worker holds,
        due at ``now`` (default: the clock's): each has a worker of its own on its way to
        take it; one still untaken a while after its time lost its worker (the maintainer
        starts another, see ``outlast.run.reap``). Those not due yet wait for the store's
        timer: :meth:`timed`. Those of a concurrency key wait for a slot with no worker:
        :meth:`parked`."""
        return [
            s
            for s in self._unclaimed(now or utcnow())
            if (s.kind == Kind.COMMAND or s.queue == DEDICATED)
            and s.worker is None
            and s.limit_key is None
        ]

    def parked(self, key: str) -> builtins.list[JobState]:
        """The jobs of concurrency ``key`` whose workers should start now: pending command
        and spawned jobs of the key that are due and that no worker holds, in claim order
        (highest priority first, then the earliest due, then the id), as many as the key has
        free slots (its slots set, else the first job's own ``limit``, else 1, less the jobs
        of the key running now).

        A command or spawned job whose key is full waits *parked*: its worker lets it go and
        exits, so a thousand jobs queued in a group of two hold two processes, not a
        thousand. Whoever frees a slot starts the workers of what this returns
        (``outlast.run.reap.start_parked``); each start counts the key's jobs again, under
        its lock, so a worker started once too often finds the key full and parks the job
        again."""
        machine.check_limit(key, None)
        slots, running = self._key_usage(key)
        now = utcnow()
        want = PARKED_SLACK + (1 if slots is None else max(0, slots - running))
        waiting = self._parked(key, now, want) if slots is None or slots > running else []
        if not waiting:
            return []
        free = (slots if slots is not None else waiting[0].limit or 1) - running
        if free > len(waiting) and len(waiting) == want:  # a job's own limit above the slack
            waiting = self._parked(key, now, free + PARKED_SLACK)
        chosen: builtins.list[JobState] = []
        for state in waiting:
            if len(chosen) >= free:
                break
            if state.kind != Kind.COMMAND and state.queue != DEDICATED:
                continue  # a pool's to claim
            if state.worker is None and not self._lock_held(state.id):
                chosen.append(state)
        return chosen

    def parked_keys(self) -> builtins.list[str]:
        """The concurrency keys that have pending command or spawned jobs no worker is bound
        to (a superset of the keys :meth:`parked` returns jobs for), sorted."""
        return sorted(self._parked_keys())

    def change_watch(self) -> ChangeWatch:
        """A new :class:`ChangeWatch` on this store (close it when done)."""
        return ChangeWatch()

    def _reconciler(self) -> Reconciler:
        """How waits reconcile: the run layer's when it is loaded (see :func:`use_reconciler`),
        else the store's own for the jobs it can finish alone."""
        if _reconcilers:
            return _reconcilers[0](self)
        return self._reconcile_alone

    def _reconcile_alone(self, state: JobState) -> JobState:
        """:meth:`reconcile`, except for jobs only the run layer can finish: a command (its
        processes may still run) and a spawned job (a retry needs its worker restarted),
        which are left to it (``outlast status``, any pool or server)."""
        if state.kind == Kind.COMMAND or state.queue == DEDICATED:
            return state
        return self.reconcile(state)

    def log_path(self, job_id: str) -> Path:
        """Where a local worker writes the job's output (stdout and stderr)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no local logs")

    def worker_output_path(self, job_id: str) -> Path:
        """Where a detached worker started on this machine (a command's supervisor, a
        spawned job's worker) writes what it prints itself: on a local store the job's log
        (so its messages are read with the job's output)."""
        return self.log_path(job_id)

    def log_writer(self, job_id: str) -> LogSink:
        """A writer of the job's log (see :mod:`outlast.store.joblog`), appending to what is
        there; nothing is made before its first byte."""
        return LogWriter(self.log_path(job_id), lazy=True)

    def log_cursor(self, job_id: str) -> LogCursor:
        """A reader of the job's log: everything at the first ``read_new()``, then what was
        appended since."""
        return FileCursor(self.log_path(job_id))

    def log_tail(self, job_id: str, lines: int) -> str | None:
        """The last ``lines`` lines of the job's log (at most about a MiB), or None when it
        has none."""
        return tail_file(self.log_path(job_id), lines)

    def log_read(self, job_id: str, offset: int = 0, limit: int = 65536) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of the job's log from byte ``offset``, and the log's size now
        (read on from ``offset + len(data)``; at ``size`` there is nothing more yet).
        Offsets count from the oldest byte kept: only a log that passed its cap
        (``OUTLAST_LOG_MAX_BYTES``) drops its oldest part, and then they start again lower
        (an offset past ``size`` reads nothing)."""
        check_range(offset, limit)
        return read_range(self.log_path(check_id(job_id)), offset, limit)

    def close(self) -> None:  # noqa: B027 - adapters without resources need not override
        """Release the store's connections and descriptors. Local worker locks stay held until
        the process exits; PostgreSQL's live on a connection, so closing releases them."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def release_worker_locks(self, tasks: builtins.list[Task]) -> None:
        """Drop the worker locks of several finished tasks at once (a pool after writing their
        outcomes; one round trip on PostgreSQL)."""
        items = [(t.id, t._lock) for t in tasks if t._lock is not None]
        for task in tasks:
            task._lock = None
        if items:
            self._lock_release_many(items)

    def check_locks(self) -> None:  # noqa: B027 - only stores whose locks can be lost act
        """Take note of a lost lock connection after :meth:`lock_fileno` became readable."""

    def lock_fileno(self) -> int | None:
        """An fd that becomes readable when this process may have lost worker locks (the
        PostgreSQL lock connection), for a worker's ``select``; None when locks cannot be
        lost. After it is readable, check ``Task.lock_alive()`` of each task."""
        return None

    @abc.abstractmethod
    def listen(
        self,
        job_ids: builtins.list[str] | None = None,
        queue: bool = False,
        interrupts: bool = False,
    ) -> Listener:
        """A listener woken by changes of ``job_ids`` (all jobs when None), if ``queue`` when
        a job becomes claimable, and if ``interrupts`` when a running job is canceled or
        deleted (what its worker must act on). A pool listens with ``[]``, ``queue`` and
        ``interrupts``: neither its own claims and outcomes nor other jobs' changes wake
        it."""

    def listen_key(self, job_id: str) -> str:
        """What an asynchronous listener of the job hears, as a name: ``alisten(store,
        [job_id])`` (:mod:`outlast.store.aio`) is woken by the changes of every job with the
        same key, so one process may share one such listener between those jobs and look at
        its own job when woken (the server's streams do: :class:`~outlast.store.aio.Shared`).
        The job's id itself on a store whose listeners hear one job only."""
        return job_id

    # ------------------------------------------------------------- the adapter interface
    @abc.abstractmethod
    def _insert(self, state: JobState) -> JobState | None:
        """Write a new job and wake the waiters of its queue (in the same transaction where
        the engine can); None, or (writing nothing) the live job that holds its unique
        key."""

    def _insert_on(self, connection: Any, state: JobState) -> JobState | None:
        """:meth:`_insert` in the caller's open transaction (PostgreSQL)."""
        raise InvalidInput(
            f"connection= inserts a job in your PostgreSQL transaction; this is a "
            f"{type(self).__name__} (use a postgresql:// store)"
        )

    def _insert_many(self, states: Sequence[JobState]) -> builtins.list[JobState | None]:
        """:meth:`_insert` of several jobs (SQL stores: in one transaction)."""
        return [self._insert(state) for state in states]

    @abc.abstractmethod
    def _retries_of(self, job_id: str) -> builtins.list[str]: ...

    @abc.abstractmethod
    def _set_slots(self, key: str, slots: int | None) -> None: ...

    @abc.abstractmethod
    def _slot_usage(self) -> dict[str, tuple[int | None, int]]: ...

    @abc.abstractmethod
    def _start_one(self, job_id: str, worker: str, now: datetime) -> Applied:
        """Start the pending job as ``worker``'s attempt (:func:`machine.start`), a job of a
        concurrency key only while the key has a free slot, counted in the same transaction
        (or under the key's lock); no change otherwise."""

    @abc.abstractmethod
    def _read(self, job_id: str) -> JobState: ...

    def _apply_one(self, job_id: str, fn: Transition) -> Applied:
        """Like :meth:`_apply_many` of one job, but a job that cannot be read raises."""
        [result] = self._apply_many([(job_id, fn)], strict=True)
        return result

    @abc.abstractmethod
    def _apply_many(
        self, items: builtins.list[tuple[str, Transition]], strict: bool = False
    ) -> builtins.list[Applied]:
        """See :meth:`apply_many`; ``strict``: a job that cannot be read raises instead."""

    @abc.abstractmethod
    def _select(
        self, query: Filter, limit: int | None, before: str | None
    ) -> builtins.list[JobState]: ...

    @abc.abstractmethod
    def _remove(self, job_id: str, force: bool) -> None: ...

    @abc.abstractmethod
    def _claim(
        self,
        worker: str,
        limit: int,
        queues: builtins.list[str] | None,
        kinds: builtins.list[Kind] | None,
        now: datetime,
        journal: Journal,
    ) -> builtins.list[tuple[JobState, Any]]:
        """Claim as :meth:`claim` says, calling ``journal.claimed`` with each attempt before
        the write that claims it."""

    @abc.abstractmethod
    def _events(
        self, job_id: str, after: int, limit: int | None
    ) -> builtins.list[ProgressEvent]: ...

    @abc.abstractmethod
    def _next_due(
        self, queues: builtins.list[str] | None, kinds: builtins.list[Kind] | None
    ) -> datetime | None: ...

    @abc.abstractmethod
    def _live_jobs(self) -> builtins.list[JobState]:
        """The jobs a worker may hold: running, or pending and bound to a worker."""

    # schedules: every adapter keeps them beside its jobs
    @abc.abstractmethod
    def _write_schedule(self, name: str, change: ScheduleChange) -> Schedule | None:
        """Read the schedule (None if there is none), apply ``change`` and write what it
        returns (nothing for None; remove it for :data:`REMOVE`), atomically; returns the
        schedule as it is now (None once removed)."""

    @abc.abstractmethod
    def _read_schedule(self, name: str) -> Schedule: ...

    @abc.abstractmethod
    def _list_schedules(self) -> builtins.list[Schedule]: ...

    @abc.abstractmethod
    def _fire(self, now: datetime, manual: str | None) -> builtins.list[JobState]:
        """Fire the due schedules (or, with ``manual``, that one schedule now, see
        :func:`fire_one`): each in one transaction with the jobs it makes, a job whose id
        exists already not made again. Returns the jobs made."""

    @abc.abstractmethod
    def _next_fire(self) -> datetime | None: ...

    @abc.abstractmethod
    def _expired(
        self, now: datetime, cutoff: datetime | None, limit: int
    ) -> builtins.list[JobState]:
        """Finished jobs with ``now`` past their own ``finished_at + keep``, or without a
        ``keep`` of their own and finished before ``cutoff`` (None: only the first)."""

    @abc.abstractmethod
    def _unclaimed(self, now: datetime) -> builtins.list[JobState]:
        """Pending command and spawned jobs that no worker holds, due at ``now`` (a superset
        is fine)."""

    @abc.abstractmethod
    def _timed(self, after: tuple[datetime, str] | None, limit: int) -> builtins.list[JobState]:
        """:meth:`timed`, exactly (the timer pages through them by their last row)."""

    @abc.abstractmethod
    def _key_usage(self, key: str) -> tuple[int | None, int]:
        """``(the slots set for the key, or None; how many of its jobs run now)``."""

    @abc.abstractmethod
    def _parked(self, key: str, now: datetime, limit: int) -> builtins.list[JobState]:
        """Up to ``limit`` pending jobs of the key that no worker is bound to, due at
        ``now``, command and spawned ones (a few others are fine), in claim order."""

    @abc.abstractmethod
    def _waiting_by_key(self) -> dict[str, int]:
        """How many pending command and spawned jobs no worker is bound to each key has."""

    @abc.abstractmethod
    def _parked_keys(self) -> Iterable[str]:
        """The distinct keys of pending command and spawned jobs no worker is bound to."""

    @abc.abstractmethod
    def _lock_acquire(self, job_id: str) -> Any:
        """Take the job's worker lock or raise :class:`WorkerLockHeld`; returns a handle."""

    @abc.abstractmethod
    def _lock_held(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    def _lock_release(self, job_id: str, handle: Any) -> None: ...

    # Liveness: a worker process holds one lock for its whole life, named by its ``host:pid``;
    # a job it claimed is alive while that lock is held. Adapters without it keep per-job locks.
    def _hold_liveness(self, worker: str) -> bool:
        """Hold this process's liveness lock; True when taken just now."""
        return False

    def _worker_alive(self, worker: str | None) -> bool:
        return False

    def _lock_alive(self, job_id: str, handle: Any) -> bool:
        """Whether this process still holds the lock behind ``handle`` (a database can take
        it away: a killed connection); local locks live as long as the process."""
        return True

    def _lock_release_many(self, items: builtins.list[tuple[str, Any]]) -> None:
        for job_id, handle in items:
            self._lock_release(job_id, handle)

    def _live(self) -> None:
        """Make this process a live worker of the store (once), first failing over the jobs of
        a dead process that had the same ``host:pid`` (a reused PID), which the new lock
        would otherwise make look alive. Other threads wait until that sweep is done, so it
        never touches a job this process has claimed."""
        me = worker_name()
        if getattr(self, "_live_as", None) == (os.getpid(), me):
            return
        with _LIVE_LOCK:
            if getattr(self, "_live_as", None) == (os.getpid(), me):
                return
            if self._hold_liveness(me):
                for state in self._held_by(me):
                    fate = self._fate(state)
                    try:
                        self._apply_one(state.id, partial(_namesake, me=me, old=state, fate=fate))
                    except JobNotFound:
                        continue
            self._live_as = (os.getpid(), me)

    def _held_by(self, worker: str) -> builtins.list[JobState]:
        """The running and pending jobs that name ``worker``."""
        return [s for s in self._live_jobs() if s.worker == worker]


def _namesake(state: JobState, me: str, old: JobState, fate: Fate) -> Change | None:
    if state.worker != me or state.status not in (Status.RUNNING, Status.PENDING):
        return None
    log.info(
        "job %s was held by a dead process named %s like this one: failing it over", state.id, me
    )
    return _abandon(state, fate if state.attempts == old.attempts else None)


def _abandon(state: JobState, fate: Fate) -> Change | None:
    """The change that reconciles an abandoned job, given what its worker journaled of its
    current attempt: given back if it never started, its outcome if it returned one, else
    abandoned (:func:`outlast.machine.abandon`)."""
    now = utcnow()
    change = None
    if fate == NOT_STARTED:
        change = machine.give_back(state, now)
    elif isinstance(fate, machine.Outcome) and (
        state.cancel_requested or fate.verb not in ("cancel", "abort")
    ):  # a job stopped with no cancel asked was stopped for a lost lock: abandoned
        change = machine.record(state, fate, state.attempts, now, config.retry_delay())
        if change is not None:
            log.info("job %s: the outcome its dead worker journaled is written", state.id)
    return change if change is not None else machine.abandon(state, now)


def fire_one(
    schedule: Schedule, now: datetime, manual: bool, last_live: bool
) -> tuple[Schedule, builtins.list[JobState]]:
    """What one schedule does in a fire (the adapters' shared rule): the schedule to write
    and the jobs to insert."""
    if manual:
        new, fired = cron.manual(schedule, now)
        return new, [cron.make_job(schedule, fired, now)]
    new, fires = cron.plan(schedule, now, last_live)
    return new, [cron.make_job(schedule, f, now) for f in fires]


def live(status: str | None) -> bool:
    """Whether a job of this status (None: gone) is live, for ``overlap=False``."""
    return status is not None and Status(status) not in TERMINAL


def expires_at(state: JobState) -> datetime | None:
    """When a finished job with a ``keep`` of its own is due for removal, else None."""
    if state.keep is None or state.finished_at is None or not state.terminal:
        return None
    return state.finished_at + timedelta(seconds=state.keep)
