"""The job document, its status machine and progress events: pure data, no I/O.

Everything here is a frozen dataclass. ``to_dict()`` gives exactly the JSON shape of
DESIGN.md ("The job document"), and ``from_dict()`` reads it back losslessly; a document that
is not of that shape raises :class:`~outlast.errors.CorruptJob` with a message naming the field.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from outlast.errors import CorruptJob, InvalidTransition
from outlast.frozen import (
    EMPTY_DICT,
    EMPTY_LIST,
    FrozenDict,
    FrozenList,
    freeze,
    frozen_dict,
    thaw,
)

JSON = Any
"""Any value that ``json.dumps`` accepts: dict, list, str, int, float, bool or None."""

_SET = object.__setattr__


class Status(enum.StrEnum):
    """Where a job is in its life. ``SUCCEEDED``, ``FAILED`` and ``CANCELED`` are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELED})

#: The legal moves of the status machine, all of them. A terminal status has none.
TRANSITIONS: Mapping[Status, frozenset[Status]] = {
    # pending -> failed: reconcile of a job whose dedicated worker died with no attempts left.
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELED, Status.FAILED}),
    Status.RUNNING: frozenset(
        {Status.SUCCEEDED, Status.FAILED, Status.CANCELED, Status.PAUSED, Status.PENDING}
    ),
    Status.PAUSED: frozenset({Status.PENDING, Status.CANCELED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELED: frozenset(),
}


def check_transition(job_id: str, old: Status, new: Status) -> None:
    """Raise :class:`InvalidTransition` unless ``old -> new`` is a move of the status machine."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"job {job_id}: cannot go from {old} to {new}")


class EventStatus(enum.StrEnum):
    """The status carried by a progress event (the seed's vocabulary)."""

    STARTED = "started"
    PROGRESS = "progress"
    COMPLETED = "completed"
    SKIPPED = "skipped"
    PAUSED = "paused"
    FAILED = "failed"


class Kind(enum.StrEnum):
    COMMAND = "command"
    FUNCTION = "function"
    PIPELINE = "pipeline"


class ErrorCode(enum.StrEnum):
    CANCELED = "canceled"
    ABANDONED = "abandoned"
    TIMEOUT = "timeout"
    ERROR = "error"


def utcnow() -> datetime:
    return datetime.now(UTC)


def format_time(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with microseconds, e.g. ``2026-11-29T18:11:10.123456+00:00``."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")


def parse_time(value: object, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise CorruptJob(f"{what} must be an ISO 8601 string, not {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise CorruptJob(f"{what} is not an ISO 8601 time: {value!r}") from exc
    if parsed.tzinfo is UTC:
        return parsed
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a job failed or was canceled."""

    #: One of :class:`ErrorCode` (``canceled``, ``abandoned``, ``timeout``, ``error``).
    code: str
    #: Human-readable, secret-redacted text.
    message: str
    #: What the user might do about it, or None.
    hint: str | None = None
    #: The exception type's qualified name for ``error``, else None.
    type: str | None = None
    #: The formatted traceback of an exception raised by the job's code (redacted, at most
    #: ``TRACEBACK_MAX`` characters: the innermost frames are kept), else None.
    traceback: str | None = None

    def __post_init__(self) -> None:
        if type(self.code) is not str:  # an ErrorCode member: the document holds plain text
            _SET(self, "code", str(self.code))

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
            "type": self.type,
            "traceback": self.traceback,
        }

    @classmethod
    def from_dict(cls, data: object) -> ErrorInfo:
        if not isinstance(data, dict):
            raise CorruptJob("error must be an object or null")
        code, message = data.get("code"), data.get("message")
        hint, type_, tb = data.get("hint"), data.get("type"), data.get("traceback")
        if not isinstance(code, str) or not isinstance(message, str):
            raise CorruptJob("error.code and error.message must be strings")
        if not all(v is None or isinstance(v, str) for v in (hint, type_, tb)):
            raise CorruptJob("error.hint, error.type and error.traceback must be strings or null")
        return cls(code=code, message=message, hint=hint, type=type_, traceback=tb)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """One progress report of a job. ``seq`` counts 1, 2, 3… per job with no gaps."""

    #: The job this event belongs to.
    job_id: str
    #: Position in the job's event log, starting at 1, assigned by the store.
    seq: int
    #: When the store recorded it.
    at: datetime
    #: The step (stage) the event is about.
    step: str
    #: One of :class:`EventStatus`.
    status: EventStatus
    #: Free JSON (usually a string or an object), secret-redacted; None when absent.
    message: JSON = None

    def __post_init__(self) -> None:
        _SET(self, "message", freeze(self.message))

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "seq": self.seq,
            "at": format_time(self.at),
            "step": self.step,
            "status": str(self.status),
            "message": thaw(self.message),
        }

    @classmethod
    def from_dict(cls, data: object) -> ProgressEvent:
        if not isinstance(data, dict):
            raise CorruptJob("an event must be a JSON object")
        try:
            job_id, seq, step = data["job_id"], data["seq"], data["step"]
            status = EventStatus(data["status"])
        except (KeyError, ValueError) as exc:
            raise CorruptJob(f"malformed event: {exc}") from exc
        if not isinstance(job_id, str) or not isinstance(step, str):
            raise CorruptJob("event job_id and step must be strings")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise CorruptJob("event seq must be a positive integer")
        at = parse_time(data.get("at"), "event.at")
        if at is None:
            raise CorruptJob("event.at is missing")
        return cls(job_id, seq, at, step, status, data.get("message"))


_TIME_FIELDS = ("run_after", "created_at", "started_at", "updated_at", "finished_at")


@dataclass(frozen=True, slots=True)
class Call:
    """How a function or pipeline job is called: what its worker imports and passes."""

    #: The module that registers the job; a worker that does not know the name imports it.
    module: str
    #: Positional JSON arguments (a pipeline takes none: its input is the payload).
    args: list[Any] = field(default_factory=lambda: EMPTY_LIST)
    #: Keyword JSON arguments.
    kwargs: dict[str, Any] = field(default_factory=lambda: EMPTY_DICT)
    #: The folder that holds the module's top package, as the creating process found it
    #: (None: unknown, or an installed module). A worker that cannot import the module from
    #: its own path searches there last: a dedicated worker restarted by a resume or a
    #: reconcile started from another folder still finds ``--import jobs/tasks.py``.
    path: str | None = None

    def __post_init__(self) -> None:
        _SET(self, "args", freeze(self.args))
        _SET(self, "kwargs", freeze(self.kwargs))

    def to_dict(self) -> dict[str, Any]:
        out = {"module": self.module, "args": thaw(self.args), "kwargs": thaw(self.kwargs)}
        if self.path is not None:
            out["path"] = self.path
        return out

    @classmethod
    def from_dict(cls, data: object) -> Call:
        if not isinstance(data, dict):
            raise CorruptJob("call must be an object or null")
        module, args, kwargs = data.get("module"), data.get("args", []), data.get("kwargs", {})
        path = data.get("path")
        if not isinstance(module, str):
            raise CorruptJob("call.module must be a string")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise CorruptJob("call.args must be a list and call.kwargs an object")
        if path is not None and not isinstance(path, str):
            raise CorruptJob("call.path must be a string or null")
        return cls(module, args, kwargs, path)


@dataclass(frozen=True, slots=True)
class StageRecord:
    """The checkpoint of one finished pipeline stage."""

    #: ``succeeded``, ``failed`` or ``skipped``.
    status: str
    #: The stage's message (its ``msg``, or why it failed or was skipped).
    message: JSON = None

    def __post_init__(self) -> None:
        _SET(self, "message", freeze(self.message))

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "message": thaw(self.message)}


@dataclass(frozen=True, slots=True)
class PipelineState:
    """What the system keeps about a pipeline job's stages (its outputs are the user's, in
    ``payload["outputs"]``)."""

    #: The ``ALL_DONE`` stages, in order: they run even when the pipeline's worker dies.
    cleanup: tuple[str, ...] = ()
    #: The checkpoint of every finished stage, by name, in the order they finished.
    stages: dict[str, StageRecord] = field(default_factory=lambda: EMPTY_DICT)
    #: Set when only the cleanup stages are left to run, after which the job ends with this
    #: error (its worker died or was stopped with no attempts left, or it was canceled).
    finalize: ErrorInfo | None = None

    def __post_init__(self) -> None:
        _SET(self, "cleanup", tuple(self.cleanup))
        if type(self.stages) is not FrozenDict:
            _SET(self, "stages", frozen_dict(self.stages))

    @property
    def cleanup_pending(self) -> bool:
        """True while some ``ALL_DONE`` stage has not run."""
        return any(name not in self.stages for name in self.cleanup)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cleanup": list(self.cleanup),
            "stages": {name: record.to_dict() for name, record in self.stages.items()},
            "finalize": self.finalize.to_dict() if self.finalize else None,
        }

    @classmethod
    def from_dict(cls, data: object) -> PipelineState:
        if not isinstance(data, dict):
            raise CorruptJob("pipeline must be an object or null")
        cleanup, stages = data.get("cleanup", []), data.get("stages", {})
        if not isinstance(cleanup, list) or not all(isinstance(n, str) for n in cleanup):
            raise CorruptJob("pipeline.cleanup must be a list of stage names")
        if not isinstance(stages, dict):
            raise CorruptJob("pipeline.stages must be an object")
        records = {}
        for name, record in stages.items():
            if not isinstance(record, dict) or not isinstance(record.get("status"), str):
                raise CorruptJob(f"pipeline.stages[{name!r}] must be an object with a status")
            records[name] = StageRecord(record["status"], record.get("message"))
        final = data.get("finalize")
        return cls(tuple(cleanup), records, None if final is None else ErrorInfo.from_dict(final))


@dataclass(frozen=True, slots=True)
class Fired:
    """The schedule that made a job, and for which of its fire times: with the schedule's
    id, the unique key of the fire (a fire time makes at most one job)."""

    #: The schedule's id (its name).
    schedule: str
    #: The fire time the job was made for (UTC).
    fire_at: datetime
    #: ``on_time``; ``catch_up`` (the one run for fires missed while no process maintained
    #: the store, with ``misfire="once"``); ``manual`` (``outlast schedule run-now``).
    reason: str = "on_time"

    def to_dict(self) -> dict[str, Any]:
        fire_at = format_time(self.fire_at)
        return {"schedule": self.schedule, "fire_at": fire_at, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: object) -> Fired:
        if not isinstance(data, dict):
            raise CorruptJob("fired must be an object or null")
        schedule, reason = data.get("schedule"), data.get("reason", "on_time")
        fire_at = parse_time(data.get("fire_at"), "fired.fire_at")
        if not isinstance(schedule, str) or not isinstance(reason, str) or fire_at is None:
            raise CorruptJob("fired needs a schedule, a fire_at time and a reason")
        return cls(schedule, fire_at, reason)


@dataclass(frozen=True)
class JobState:
    """The durable document of one job, as stored and as every interface shows it.

    Immutable all the way down: nested dicts and lists are :mod:`outlast.frozen` containers,
    so a state handed to one caller can never be changed by another. ``payload`` is the
    user's; what the system keeps about how to run the job has a typed field of its own.
    """

    #: Opaque id assigned by the store; a single clean name.
    id: str
    #: ``command``, ``function`` or ``pipeline``.
    kind: Kind
    #: The registered function or pipeline name, or a human name for a command.
    name: str
    #: The argv of a command job, else None.
    command: list[str] | None = None
    #: How a function or pipeline job is called (module, args, kwargs), else None.
    call: Call | None = None
    #: Free ``str -> str`` labels for listing and filtering.
    labels: dict[str, str] = field(default_factory=lambda: EMPTY_DICT)
    #: The queue a pool claims the job from.
    queue: str = "default"
    #: Higher first: claims take due jobs by (priority descending, due time, id).
    priority: int = 0
    #: Where the job is in the status machine.
    status: Status = Status.PENDING
    #: Coarse phase (the last reported step's status), or None.
    phase: str | None = None
    #: The last reported step, or None.
    step: str | None = None
    #: Percent done, 0-100, or None when unknown.
    progress: float | None = None
    #: The user's input, as given (a pipeline's stage outputs land in ``payload["outputs"]``).
    payload: dict[str, Any] = field(default_factory=lambda: EMPTY_DICT)
    #: What a succeeded job returned (JSON), else None.
    result: JSON = None
    #: Why the job failed or was canceled, else None.
    error: ErrorInfo | None = None
    #: Attempts started so far (a claim counts one); doubles as the fencing token of a worker.
    attempts: int = 0
    #: Attempts allowed before a failure is final.
    max_attempts: int = 1
    #: Seconds an attempt may run before it is stopped (code ``timeout``), or None.
    timeout: float | None = None
    #: Seconds between asking the work to stop (SIGTERM, SIGUSR1) and killing it, or None
    #: for the worker's default.
    grace: float | None = None
    #: Not to be claimed before this time (a delay, a retry's backoff), or None.
    run_after: datetime | None = None
    #: What a paused job asks a person, else None.
    question: JSON = None
    #: The person's answer after a resume, else None.
    answer: JSON = None
    #: A cancel is in progress: the worker runs the cleanup it must, then records ``canceled``.
    cancel_requested: bool = False
    #: A pipeline job's stage checkpoints, else None.
    pipeline: PipelineState | None = None
    #: Seconds the finished job is kept before maintenance removes it (with its events and
    #: log), or None for the store's ``$OUTLAST_KEEP`` (default: kept until deleted).
    keep: float | None = None
    #: The schedule and fire time that made the job, else None.
    fired: Fired | None = None
    #: The finished job this one retries (``outlast retry``), else None.
    retry_of: str | None = None
    #: While this job is live (pending, running or paused), no other job with this key can
    #: be created: submitting again returns this one (or raises ``DuplicateJob``).
    unique_key: str | None = None
    #: A concurrency key (``tenant:42``, a command group): at most ``limit`` jobs of the key
    #: run at once (the store's slots for the key win, see ``outlast group set``).
    limit_key: str | None = None
    #: Slots of ``limit_key`` when the store has none set for it; None: 1.
    limit: int | None = None
    #: The W3C ``traceparent`` of the span that created the job (OpenTelemetry installed
    #: and a span current), which the worker's span for the job joins; else None.
    trace: str | None = None
    #: The OS process doing the work (a command job's process-group leader), or None.
    pid: int | None = None
    #: The kernel's start time of ``pid``, so a reused PID is never mistaken for the job's.
    pid_started_at: datetime | None = None
    #: Who holds the job: ``host:pid`` of the supervisor or pool, or None.
    worker: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    #: When the current (last) attempt started.
    started_at: datetime | None = None
    updated_at: datetime = field(default_factory=utcnow)
    finished_at: datetime | None = None

    def __post_init__(self) -> None:
        for name in _NESTED:
            value = getattr(self, name)
            if type(value) not in _SCALAR_OR_FROZEN:
                _SET(self, name, freeze(value))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def evolve(self, **changes: Any) -> JobState:
        """A copy with ``changes`` applied (like ``dataclasses.replace``, without its
        per-call introspection: this is on every transition's path). New nested values are
        frozen; the unchanged ones are shared, which is safe because they cannot change."""
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"JobState has no fields {sorted(unknown)}")
        for name in _NESTED.intersection(changes):
            if type(changes[name]) not in _SCALAR_OR_FROZEN:
                changes[name] = freeze(changes[name])
        new = object.__new__(JobState)
        own = new.__dict__  # in field order (orjson writes them in this order)
        own.update(self.__dict__)
        own.update(changes)
        return new

    def to_dict(self) -> dict[str, Any]:
        """The job document (DESIGN.md), as plain JSON values the caller owns."""
        return {
            "id": self.id,
            "kind": str(self.kind),
            "name": self.name,
            "command": list(self.command) if self.command is not None else None,
            "call": self.call.to_dict() if self.call else None,
            "labels": dict(self.labels),
            "queue": self.queue,
            "priority": self.priority,
            "status": str(self.status),
            "phase": self.phase,
            "step": self.step,
            "progress": self.progress,
            "payload": thaw(self.payload),
            "result": thaw(self.result),
            "error": self.error.to_dict() if self.error else None,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "grace": self.grace,
            "run_after": format_time(self.run_after),
            "question": thaw(self.question),
            "answer": thaw(self.answer),
            "cancel_requested": self.cancel_requested,
            "pipeline": self.pipeline.to_dict() if self.pipeline else None,
            "keep": self.keep,
            "fired": self.fired.to_dict() if self.fired else None,
            "retry_of": self.retry_of,
            "unique_key": self.unique_key,
            "limit_key": self.limit_key,
            "limit": self.limit,
            "trace": self.trace,
            "pid": self.pid,
            "pid_started_at": format_time(self.pid_started_at),
            "worker": self.worker,
            "created_at": format_time(self.created_at),
            "started_at": format_time(self.started_at),
            "updated_at": format_time(self.updated_at),
            "finished_at": format_time(self.finished_at),
        }

    @classmethod
    def from_dict(cls, data: object) -> JobState:
        """Read a document back; raises :class:`CorruptJob` saying what is wrong. A field
        that is missing (a document written before it existed) reads as its default."""
        if not isinstance(data, dict):
            raise CorruptJob(f"a job document must be a JSON object, not {type(data).__name__}")
        unknown = data.keys() - _FIELD_NAMES
        if unknown:
            raise CorruptJob(f"unknown fields {sorted(unknown)}")
        values: dict[str, Any] = dict(data)
        values.update(kind=_enum(data, "kind", _KINDS), status=_enum(data, "status", _STATUSES))
        if not isinstance(data.get("id"), str) or not isinstance(data.get("name"), str):
            raise CorruptJob("fields 'id' and 'name' must be strings")
        for name in _PARSED_TIMES.intersection(data):
            values[name] = parse_time(data[name], name)
        for name in ("created_at", "updated_at"):
            if values.get(name, 0) is None:
                del values[name]
        for name in _NESTED_READERS.keys() & data.keys():
            if data[name] is not None:
                values[name] = _NESTED_READERS[name](data[name])
        _check_shapes(values)
        return cls.build(values)

    @classmethod
    def build(cls, values: dict[str, Any]) -> JobState:
        """What ``JobState(**values)`` makes, several times faster (this is on the path of
        every read and every new job), for values of the right types (``from_dict`` checks
        them; the store's ``create`` makes them). Nested values are frozen here."""
        for name in _NESTED.intersection(values):
            if type(values[name]) not in _SCALAR_OR_FROZEN:
                values[name] = freeze(values[name])
        new = object.__new__(JobState)
        own = new.__dict__
        own.update(_DEFAULTS)  # every field, in field order (orjson writes this order)
        if "created_at" not in values or "updated_at" not in values:
            own["created_at"] = own["updated_at"] = utcnow()
        own.update(values)
        return new


def _enum(data: dict[str, Any], name: str, members: dict[str, Any]) -> Any:
    value = data.get(name)
    if not isinstance(value, str):
        raise CorruptJob(f"field {name!r} must be a string")
    member = members.get(value)
    if member is None:
        raise CorruptJob(f"{value!r} is not a valid {name}")
    return member


_NESTED_READERS: dict[str, Any] = {
    "error": ErrorInfo.from_dict,
    "call": Call.from_dict,
    "pipeline": PipelineState.from_dict,
    "fired": Fired.from_dict,
}
_FIELD_ORDER = tuple(f.name for f in fields(JobState))
_FIELD_NAMES = frozenset(_FIELD_ORDER)
_KINDS = {k.value: k for k in Kind}
_STATUSES = {s.value: s for s in Status}
_PARSED_TIMES = frozenset({*_TIME_FIELDS, "pid_started_at"})
#: The fields that can hold dicts and lists, frozen when a state is made.
_NESTED = frozenset({"command", "labels", "payload", "result", "question", "answer"})
_SCALAR_OR_FROZEN = frozenset({FrozenDict, FrozenList, str, int, float, bool, type(None)})


#: Every field's default, in field order (the times are set when a document lacks them).
_DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not MISSING else None for f in fields(JobState)
}
_DEFAULTS.update(labels=EMPTY_DICT, payload=EMPTY_DICT)


def _check_shapes(values: dict[str, Any]) -> None:
    command = values.get("command")
    if command is not None and (
        not isinstance(command, list) or not all(isinstance(a, str) for a in command)
    ):
        raise CorruptJob("command must be a list of strings or null")
    labels = values.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise CorruptJob("labels must be an object of strings")
    if not isinstance(values.get("payload", {}), dict):
        raise CorruptJob("payload must be an object")
    for name in ("attempts", "max_attempts"):
        value = values.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptJob(f"{name} must be a non-negative integer")
    priority = values.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise CorruptJob("priority must be an integer")
    _check_scalars(values)


def _check_scalars(values: dict[str, Any]) -> None:
    progress = values.get("progress")
    if progress is not None and not _is_number(progress, 0, 100):
        raise CorruptJob("progress must be a number from 0 to 100 or null")
    for name in ("timeout", "grace", "keep"):
        value = values.get(name)
        if value is not None and not _is_number(value, 0, math.inf):
            raise CorruptJob(f"{name} must be a number of seconds >= 0 or null")
    pid = values.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        raise CorruptJob("pid must be an integer or null")
    if not isinstance(values.get("cancel_requested", False), bool):
        raise CorruptJob("cancel_requested must be true or false")
    if "queue" in values and not isinstance(values["queue"], str):
        raise CorruptJob("queue must be a string")
    limit = values.get("limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise CorruptJob("limit must be a whole number >= 1 or null")
    for name in ("phase", "step", "worker", "retry_of", "unique_key", "limit_key", "trace"):
        if values.get(name) is not None and not isinstance(values[name], str):
            raise CorruptJob(f"{name} must be a string or null")


def _is_number(value: object, low: float, high: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and low <= value <= high
        and (value != math.inf or high == math.inf)
    )


def clamp_progress(value: float | None) -> float | None:
    """Progress as stored: a finite number clamped to 0..100, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"progress must be a number from 0 to 100, not {value!r}")
    return float(min(100.0, max(0.0, value)))


MISFIRE_POLICIES = ("once", "skip")


@dataclass(frozen=True, slots=True)
class JobTemplate:
    """What each job a schedule fires is made from: the arguments of ``Store.create``."""

    #: ``command``, ``function`` or ``pipeline``.
    kind: Kind
    #: The registered job's name, or a name for a command.
    name: str
    #: A command's argv, else None.
    command: list[str] | None = None
    #: A function or pipeline job's call (module, args, kwargs), else None.
    call: Call | None = None
    payload: dict[str, Any] = field(default_factory=lambda: EMPTY_DICT)
    labels: dict[str, str] = field(default_factory=lambda: EMPTY_DICT)
    queue: str = "default"
    max_attempts: int = 1
    timeout: float | None = None
    grace: float | None = None
    keep: float | None = None
    priority: int = 0
    #: The folder a command runs in (None: the firing process's).
    cwd: str | None = None
    #: A pipeline's ``ALL_DONE`` stages.
    cleanup: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("command", "payload", "labels"):
            _SET(self, name, freeze(getattr(self, name)))
        _SET(self, "cleanup", tuple(self.cleanup))
        if type(self.kind) is not Kind:
            _SET(self, "kind", Kind(self.kind))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "name": self.name,
            "command": thaw(self.command),
            "call": self.call.to_dict() if self.call else None,
            "payload": thaw(self.payload),
            "labels": thaw(self.labels),
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "grace": self.grace,
            "keep": self.keep,
            "priority": self.priority,
            "cwd": self.cwd,
            "cleanup": list(self.cleanup),
        }

    @classmethod
    def from_dict(cls, data: object) -> JobTemplate:
        if not isinstance(data, dict):
            raise CorruptJob("a schedule's job must be an object")
        values = dict(data)
        values["kind"] = _enum(data, "kind", _KINDS)
        if data.get("call") is not None:
            values["call"] = Call.from_dict(data["call"])
        if not isinstance(values.get("name"), str):
            raise CorruptJob("a schedule's job needs a name")
        cleanup = values.get("cleanup", [])
        if not isinstance(cleanup, list) or not all(isinstance(n, str) for n in cleanup):
            raise CorruptJob("a schedule's job cleanup must be a list of stage names")
        values["cleanup"] = tuple(cleanup)
        unknown = values.keys() - {f.name for f in fields(cls)}
        if unknown:
            raise CorruptJob(f"a schedule's job has unknown fields {sorted(unknown)}")
        _check_shapes(values)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A durable schedule: when to fire (``cron`` in ``tz``, or ``every`` seconds) and the
    job each fire makes. Fired by the store's maintainer, each fire time exactly once."""

    #: Its name, unique in the store (the rule of ids).
    id: str
    job: JobTemplate
    #: A five-field cron expression matched against wall-clock time in ``tz``, or None.
    cron: str | None = None
    #: Seconds between fires (from the schedule's creation), or None.
    every: float | None = None
    #: The IANA time zone of ``cron`` (``Europe/Berlin``); ``UTC`` by default.
    tz: str = "UTC"
    #: After fires were missed (no process maintained the store): ``once`` makes one
    #: catch-up job, ``skip`` none.
    misfire: str = "once"
    #: False: a fire is skipped while the last job it made is still live.
    overlap: bool = True
    paused: bool = False
    #: The next fire time (UTC).
    next_at: datetime | None = None
    #: The last fire time that made a job, and that job's id.
    last_fire_at: datetime | None = None
    last_job: str | None = None
    #: Jobs made so far; and times fires made no job of their own (missed fire times,
    #: even when a catch-up job stood in for them, or ``overlap=False``).
    fires: int = 0
    skipped: int = 0
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)

    def evolve(self, **changes: Any) -> Schedule:
        from dataclasses import replace

        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cron": self.cron,
            "every": self.every,
            "tz": self.tz,
            "misfire": self.misfire,
            "overlap": self.overlap,
            "paused": self.paused,
            "job": self.job.to_dict(),
            "next_at": format_time(self.next_at),
            "last_fire_at": format_time(self.last_fire_at),
            "last_job": self.last_job,
            "fires": self.fires,
            "skipped": self.skipped,
            "created_at": format_time(self.created_at),
            "updated_at": format_time(self.updated_at),
        }

    @classmethod
    def from_dict(cls, data: object) -> Schedule:
        """Read a stored schedule back; :class:`CorruptJob` says what is wrong."""
        if not isinstance(data, dict):
            raise CorruptJob("a schedule must be a JSON object")
        values = dict(data)
        unknown = values.keys() - {f.name for f in fields(cls)}
        if unknown:
            raise CorruptJob(f"a schedule has unknown fields {sorted(unknown)}")
        if not isinstance(values.get("id"), str):
            raise CorruptJob("a schedule needs an id")
        values["job"] = JobTemplate.from_dict(values.get("job"))
        for name in ("next_at", "last_fire_at", "created_at", "updated_at"):
            if name in values:
                values[name] = parse_time(values[name], f"schedule.{name}")
        for name in ("created_at", "updated_at"):
            if values.get(name, 0) is None:
                del values[name]
        _check_schedule(values)
        try:
            return cls(**values)
        except TypeError as exc:
            raise CorruptJob(f"malformed schedule: {exc}") from exc


def _check_schedule(values: dict[str, Any]) -> None:
    if values.get("misfire", "once") not in MISFIRE_POLICIES:
        raise CorruptJob(f"schedule misfire must be once or skip, not {values['misfire']!r}")
    for name in ("overlap", "paused"):
        if not isinstance(values.get(name, False), bool):
            raise CorruptJob(f"schedule {name} must be true or false")
    for name in ("fires", "skipped"):
        value = values.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptJob(f"schedule {name} must be a whole number")
    if (values.get("cron") is None) == (values.get("every") is None):
        raise CorruptJob("a schedule has either a cron expression or an interval")
