"""The rules of schedules, as pure functions: when a schedule fires next, what a due schedule
fires now (and what it skips), and the job each fire makes.

**Cron** expressions have five fields (minute hour day-of-month month day-of-week, as in
crontab(5); ``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly`` too), parsed by
`croniter <https://pypi.org/project/croniter/>`_ and matched against **wall-clock time** in the
schedule's IANA time zone (``zoneinfo``). Daylight saving time, as Debian's cron does it:

- a wall time that a clock change skips (02:30 on the night clocks go forward in
  Europe/Berlin) fires at the instant that wall time would have been (03:30 summer time);
- a wall time that happens twice (02:30 on the night clocks go back) fires once, the first
  time it comes;
- so ``every=`` (plain seconds, no wall clock) or ``tz="UTC"`` is the way to say "strictly
  every hour".

**Intervals** (``every``, at least one second) fire at the creation time plus whole
multiples of the interval.

**Misfires.** The maintainer normally fires a schedule within milliseconds of its time. A fire
time counts as *missed* when a later fire time has also come by the time it is fired, or it
is more than :data:`MISFIRE_GRACE` seconds late (no process maintained the store: every pool
and server was down, or the machine was off). Missed fire times make no job of their own:
``misfire="once"`` makes one catch-up job, for the latest of them; ``"skip"`` makes none.
With ``overlap=False`` a fire is skipped while the job of the last fire is still live
(pending, running or paused).

**Exactly once.** The job of a fire has the id ``<schedule>.<fire time>`` (for example
``nightly.20261224T030000Z``), inserted in the same transaction that moves the schedule to its
next fire time (on the files store: a job that exists already is never made again), so a fire
time makes at most one job, whatever the number of maintainers, crashes and restarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from outlast import machine
from outlast.errors import InvalidInput
from outlast.ids import check_id
from outlast.model import (
    MISFIRE_POLICIES,
    Call,
    Fired,
    JobState,
    JobTemplate,
    Kind,
    Schedule,
)

#: Seconds a lone fire time may be late and still be on time (see the module docstring).
MISFIRE_GRACE = 60.0
#: The shortest interval: one second.
MIN_EVERY = 1.0
#: A schedule's name is part of its jobs' ids (``<name>.<YYYYmmddTHHMMSS>Z``, 17 more).
MAX_NAME = 100
_STEPS = 1000  # cron iterations at most to step over a clock change


def zone(tz: object) -> ZoneInfo:
    """The time zone named ``tz``, or :class:`InvalidInput` naming it."""
    if not isinstance(tz, str) or not tz:
        raise InvalidInput(f"a time zone is an IANA name like Europe/Berlin, not {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"unknown time zone {tz!r}: use an IANA name like Europe/Berlin or UTC"
        ) from None


def check_cron(expr: object) -> str:
    """``expr`` if it is a five-field cron expression (or ``@daily``…), else
    :class:`InvalidInput` saying what is wrong."""
    from croniter import croniter

    if not isinstance(expr, str) or not expr.strip():
        raise InvalidInput(f"a cron expression is like '0 3 * * *', not {expr!r}")
    text = " ".join(expr.split())
    if not text.startswith("@") and len(text.split()) != 5:
        raise InvalidInput(
            f"cron expression {expr!r} has {len(text.split())} fields; it needs 5: "
            "minute hour day-of-month month day-of-week, like '0 3 * * *'"
        )
    try:
        croniter(text, datetime(2026, 1, 1)).get_next(datetime)
    except Exception as exc:  # croniter's errors (bad field, impossible date) and ValueError
        raise InvalidInput(f"invalid cron expression {expr!r}: {exc}") from None
    return text


def _local(at: datetime, tz: ZoneInfo) -> datetime:
    return at.astimezone(tz).replace(tzinfo=None)


def _utc(wall: datetime, tz: ZoneInfo) -> datetime:
    return wall.replace(tzinfo=tz).astimezone(UTC)  # fold=0: see the module docstring


def next_fire(schedule: Schedule, after: datetime) -> datetime:
    """The first fire time of ``schedule`` strictly after ``after`` (UTC)."""
    if schedule.every is not None:
        anchor = schedule.next_at or schedule.created_at
        steps = (after - anchor).total_seconds() // schedule.every + 1
        return anchor + timedelta(seconds=max(steps, 0) * schedule.every)
    from croniter import croniter

    tz = zone(schedule.tz)
    it = croniter(schedule.cron or "", _local(after, tz))
    for _ in range(_STEPS):
        candidate = _utc(it.get_next(datetime), tz)
        if candidate > after:
            return candidate
    raise InvalidInput(f"schedule {schedule.id}: no fire time after {after}")  # pragma: no cover


def latest_fire(schedule: Schedule, at: datetime) -> datetime | None:
    """The last fire time of ``schedule`` at or before ``at``, not before its ``next_at``
    (None when ``next_at`` is still to come)."""
    first = schedule.next_at
    if first is None or first > at:
        return None
    if schedule.every is not None:
        steps = (at - first).total_seconds() // schedule.every
        return first + timedelta(seconds=steps * schedule.every)
    following = next_fire(schedule, first)
    if following > at:
        return first  # the usual case: only one fire time has come
    from croniter import croniter

    tz = zone(schedule.tz)
    it = croniter(schedule.cron or "", _local(at, tz) + timedelta(seconds=1))
    for _ in range(_STEPS):
        candidate = _utc(it.get_prev(datetime), tz)
        if candidate <= at:
            return max(candidate, first)
    return first  # pragma: no cover


def upcoming(schedule: Schedule, count: int, after: datetime) -> list[datetime]:
    """The next ``count`` fire times after ``after`` (for people: ``schedule ls``)."""
    out: list[datetime] = []
    at = after
    for _ in range(count):
        at = next_fire(schedule, at)
        out.append(at)
    return out


def job_id(schedule_id: str, fire_at: datetime, manual: bool = False) -> str:
    """The id of the job of one fire: the unique key of (schedule, fire time). A run asked
    for by hand is not a fire time's (any number may be asked for): its id has the
    microseconds too."""
    base = f"{schedule_id}.{fire_at.astimezone(UTC):%Y%m%dT%H%M%S}Z"
    return f"{base}.{fire_at:%f}" if manual else base


def plan(schedule: Schedule, now: datetime, last_live: bool) -> tuple[Schedule, list[Fired]]:
    """What a due schedule does at ``now``: its new state (next fire time, counters) and the
    fires that make a job (none or one). ``last_live``: the job of its last fire is still
    live (for ``overlap=False``). A schedule that is paused or not due is returned as is."""
    if schedule.paused or schedule.next_at is None or schedule.next_at > now:
        return schedule, []
    latest = latest_fire(schedule, now)
    assert latest is not None
    missed = latest > schedule.next_at or (now - latest).total_seconds() > MISFIRE_GRACE
    fires: list[Fired] = []
    if not missed:
        fires = [Fired(schedule.id, latest, "on_time")]
    elif schedule.misfire == "once":
        fires = [Fired(schedule.id, latest, "catch_up")]
    skipped = schedule.skipped + (0 if fires and not missed else 1)
    if fires and not schedule.overlap and last_live:
        fires = []
        skipped = schedule.skipped + 1
    changes: dict[str, Any] = {
        "next_at": next_fire(schedule, latest),
        "skipped": skipped,
        "updated_at": now,
    }
    if fires:
        changes.update(
            last_fire_at=latest,
            last_job=job_id(schedule.id, latest),
            fires=schedule.fires + 1,
        )
    return schedule.evolve(**changes), fires


def manual(schedule: Schedule, now: datetime) -> tuple[Schedule, Fired]:
    """A fire asked for by a person (``run-now``): one job now, the schedule's times as
    they were."""
    fired = Fired(schedule.id, now, "manual")
    new = schedule.evolve(
        last_fire_at=now,
        last_job=job_id(schedule.id, now, manual=True),
        fires=schedule.fires + 1,
        updated_at=now,
    )
    return new, fired


def make_job(schedule: Schedule, fired: Fired, now: datetime) -> JobState:
    """The pending job of one fire."""
    t = schedule.job
    job = job_id(schedule.id, fired.fire_at, manual=fired.reason == "manual")
    pipeline = None
    if t.kind == Kind.PIPELINE:
        from outlast.model import PipelineState

        pipeline = PipelineState(cleanup=tuple(t.cleanup))
    return machine.new_job(
        job_id=job,
        kind=t.kind,
        name=t.name,
        command=t.command,
        call=t.call,
        labels=t.labels,
        queue=t.queue,
        payload=t.payload,
        max_attempts=t.max_attempts,
        timeout=t.timeout,
        grace=t.grace,
        keep=t.keep,
        priority=t.priority,
        pipeline=pipeline,
        fired=fired,
        now=now,
    )


def new_schedule(
    name: str,
    job: JobTemplate,
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str | None = None,
    misfire: str = "once",
    overlap: bool = True,
    paused: bool = False,
    now: datetime | None = None,
) -> Schedule:
    """A checked new schedule, its first fire time computed; :class:`InvalidInput` says what
    is wrong (nothing is stored)."""
    check_id(name)
    if len(name) > MAX_NAME:
        raise InvalidInput(f"a schedule's name has at most {MAX_NAME} characters")
    if (cron is None) == (every is None):
        raise InvalidInput("a schedule needs either a cron expression or an interval (every)")
    if every is not None:
        if not isinstance(every, int | float) or isinstance(every, bool) or every < MIN_EVERY:
            raise InvalidInput(f"every must be at least {MIN_EVERY:.0f} second, not {every!r}")
        if tz is not None and tz != "UTC":
            raise InvalidInput("a time zone applies to cron expressions, not to intervals")
    if cron is not None:
        cron = check_cron(cron)
    tz = tz or "UTC"
    zone(tz)
    if misfire not in MISFIRE_POLICIES:
        raise InvalidInput(f"misfire is 'once' or 'skip', not {misfire!r}")
    if not isinstance(overlap, bool) or not isinstance(paused, bool):
        raise InvalidInput("overlap and paused are true or false")
    now = now or datetime.now(UTC)
    schedule = Schedule(
        id=name,
        job=job,
        cron=cron,
        every=None if every is None else float(every),
        tz=tz,
        misfire=misfire,
        overlap=overlap,
        paused=paused,
        created_at=now,
        updated_at=now,
    )
    first = now + timedelta(seconds=every) if every is not None else next_fire(schedule, now)
    return schedule.evolve(next_at=first)


def same_timing(a: Schedule, b: Schedule) -> bool:
    return (a.cron, a.every, a.tz) == (b.cron, b.every, b.tz)


def redefine(old: Schedule, new: Schedule, now: datetime) -> Schedule:
    """``old`` given ``new``'s definition (the job, its timing and policies), keeping its
    history and whether it is paused; its next fire time is kept unless the timing changed."""
    keep: dict[str, Any] = {
        "paused": old.paused,
        "last_fire_at": old.last_fire_at,
        "last_job": old.last_job,
        "fires": old.fires,
        "skipped": old.skipped,
        "created_at": old.created_at,
        "updated_at": now,
    }
    if same_timing(old, new):
        keep["next_at"] = old.next_at
    return new.evolve(**keep)


def template(
    kind: Kind | str,
    name: str,
    *,
    command: Sequence[str] | None = None,
    call: Call | None = None,
    payload: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    queue: str = "default",
    max_attempts: int = 1,
    timeout: float | None = None,
    grace: float | None = None,
    keep: float | None = None,
    cwd: str | None = None,
    cleanup: Sequence[str] = (),
    priority: int = 0,
) -> JobTemplate:
    """A checked job template (the checks of ``Store.create``)."""
    checked = machine.new_job(
        kind=kind,
        name=name,
        command=list(command) if command is not None else None,
        labels=labels,
        queue=queue,
        payload=payload,
        max_attempts=max_attempts,
        call=call,
        timeout=timeout,
        grace=grace,
        keep=keep,
        priority=priority,
        now=datetime.now(UTC),
    )
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
    return JobTemplate(
        kind=checked.kind,
        name=checked.name,
        command=checked.command,
        call=checked.call,
        payload=checked.payload,
        labels=checked.labels,
        queue=checked.queue,
        max_attempts=checked.max_attempts,
        timeout=checked.timeout,
        grace=checked.grace,
        keep=checked.keep,
        priority=checked.priority,
        cwd=cwd,
        cleanup=tuple(cleanup),
    )
