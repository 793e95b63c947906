"""The status machine's transitions as pure functions: ``(state, …) -> Change | None``.

Every store adapter applies these inside one lock or one transaction, so the rules live here
once: a terminal job is never changed; a write fenced by an attempt token is refused once the job
was reclaimed, released or finished; each transition appends its job-level event (step ``job``)
in the same write as the state, so a watcher that sees a terminal state also sees its event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from outlast.errors import InvalidInput, InvalidTransition
from outlast.frozen import FrozenList, freeze
from outlast.ids import DEDICATED, check_queue, new_id
from outlast.model import (
    JSON,
    Call,
    ErrorCode,
    ErrorInfo,
    EventStatus,
    Fired,
    JobState,
    Kind,
    PipelineState,
    ProgressEvent,
    Status,
    check_transition,
)
from outlast.redact import redact, redact_text

JOB_STEP = "job"
MAX_BACKOFF = 3600.0
#: Seconds ahead beyond which a command or spawned job waits for its time *parked*, with no
#: process of its own: the store's timer starts its worker shortly before then
#: (:mod:`outlast.run.timer`). A nearer time is waited for by the job's own worker.
PARK_AFTER = 5.0


def parks_at(run_after: datetime | None, now: datetime) -> bool:
    """Whether a command or spawned job due at ``run_after`` waits for it parked, with no
    process (it is more than :data:`PARK_AFTER` seconds ahead of ``now``)."""
    return run_after is not None and (run_after - now).total_seconds() > PARK_AFTER


@dataclass(frozen=True)
class NewEvent:
    step: str
    status: EventStatus
    message: JSON = None


def number(
    job_id: str, last_seq: int, events: Iterable[NewEvent], now: datetime
) -> list[ProgressEvent]:
    """The stored form of new events: ``seq`` continuing after ``last_seq``, all at ``now``
    (every adapter numbers events here, inside the write that appends them)."""
    return [
        ProgressEvent(job_id, seq, now, e.step, e.status, e.message)
        for seq, e in enumerate(events, last_seq + 1)
    ]


@dataclass(frozen=True)
class Change:
    """What one transition writes: the new state and the events to append after the last."""

    state: JobState
    events: tuple[NewEvent, ...] = ()
    #: True when the job became claimable (wakes idle pools).
    claimable: bool = False
    #: True when the job's running worker must act on it (a cancel): it wakes the pools
    #: through the store's interrupt channel, the one job channel they listen to.
    interrupts: bool = False


MAX_JSON_DEPTH = 500  # nesting a JSON value may have (the standard library's parser allows ~1000)


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if it is strict JSON, else :class:`InvalidInput` saying what is wrong.

    Strict JSON: ``None``, ``bool``, ``int`` (that Python can write out: at most 4,300 digits
    by default), finite ``float``, ``str``, lists (or tuples) and objects with string keys,
    nested at most ``MAX_JSON_DEPTH`` deep, without cycles.
    ``json.dumps`` would quietly turn ``{1: "a"}`` into ``{"1": "a"}``; such a value is refused
    instead, so what is stored is exactly what was given. A walk over the types, not an
    encoding: this is on every job's path (arguments, results, reports).
    """
    _check_value(value, what, 0)
    return value


_SCALARS = (str, type(None))


def _check_value(value: Any, what: str, depth: int) -> None:
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, int):  # and bool
        if value.bit_length() > 64:
            try:
                int.__repr__(value)  # beyond Python's digit limit it cannot be written out
            except ValueError as exc:
                raise InvalidInput(f"{what} must be JSON: {exc}") from None
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{what} must be JSON: {value!r} is not a JSON number")
        return
    if depth >= MAX_JSON_DEPTH:
        raise InvalidInput(f"{what} must be JSON: nested deeper than {MAX_JSON_DEPTH} (or a cycle)")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{what} must be JSON: object keys are strings, not {key!r}")
            _check_value(item, what, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_value(item, what, depth + 1)
    else:
        kind = type(value).__name__
        raise InvalidInput(f"{what} must be JSON: type {kind} is not JSON ({value!r:.60})")


def check_labels(labels: Any) -> dict[str, str]:
    """``labels`` as a plain dict, if they are ``str -> str`` with non-empty keys (no ``=``)."""
    if labels is not None and not isinstance(labels, Mapping):
        raise InvalidInput(f"labels must be an object of strings, not {type(labels).__name__}")
    checked: dict[str, str] = dict(labels or {})
    for key, value in checked.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise InvalidInput(f"labels are non-empty str keys (no '=') to str values: {key!r}")
    return checked


def seconds(value: object, what: str, positive: bool) -> float | None:
    """A number of seconds of a job option (``timeout``, ``grace``, ``keep``), or None."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        low = "> 0" if positive else ">= 0"
        raise InvalidInput(f"{what} must be a finite number of seconds {low}, not {value!r}")
    return float(value)


#: The range of ``priority`` (higher first).
PRIORITY_RANGE = (-1_000_000, 1_000_000)


def check_priority(value: object) -> int:
    """``value`` if it is a whole number in :data:`PRIORITY_RANGE`, else InvalidInput."""
    low, high = PRIORITY_RANGE
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(
            f"priority must be a whole number from {low:,} to {high:,}, not {value!r}"
        )
    return value


#: The most slots a concurrency key may have.
MAX_SLOTS = 100_000


def check_slots(value: object, what: str = "limit") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SLOTS:
        raise InvalidInput(f"{what} must be a whole number from 1 to {MAX_SLOTS:,}, not {value!r}")
    return value


def check_limit(limit_key: object, limit: object) -> None:
    """A concurrency key is a non-empty string (200 characters at most); a limit needs one."""
    if limit_key is not None and (
        not isinstance(limit_key, str) or not limit_key.strip() or len(limit_key) > 200
    ):
        raise InvalidInput(
            f"a limit key is a non-empty string of 200 characters at most, not {limit_key!r}"
        )
    if limit is not None:
        check_slots(limit)
        if limit_key is None:
            raise InvalidInput("a limit needs a limit key: what is limited")


def new_job(
    *,
    kind: Kind | str = Kind.COMMAND,
    name: str | None = None,
    command: list[str] | None = None,
    labels: Any = None,
    queue: str = "default",
    payload: Any = None,
    max_attempts: int = 1,
    run_after: datetime | None = None,
    call: Call | None = None,
    timeout: float | None = None,
    grace: float | None = None,
    pipeline: PipelineState | None = None,
    keep: float | None = None,
    fired: Fired | None = None,
    job_id: str | None = None,
    priority: int = 0,
    retry_of: str | None = None,
    unique_key: str | None = None,
    limit_key: str | None = None,
    limit: int | None = None,
    trace: str | None = None,
    now: datetime,
) -> JobState:
    """A new pending job, every field checked: :class:`InvalidInput` says what is wrong."""
    try:
        kind = Kind(kind)
    except ValueError:
        raise InvalidInput(f"kind is command, function or pipeline, not {kind!r}") from None
    if command is not None and (
        not isinstance(command, list | tuple | FrozenList)
        or not command
        or not all(isinstance(a, str) for a in command)
    ):
        raise InvalidInput("command must be a non-empty list of strings")
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        raise InvalidInput(f"max_attempts must be a whole number >= 1, not {max_attempts!r}")
    if queue != DEDICATED:  # the queue of spawned jobs, which pools never claim
        check_queue(queue)
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidInput("payload must be a JSON object")
    if call is not None and not isinstance(call, Call):
        raise InvalidInput("call must be an outlast.model.Call")
    if call is not None:
        check_json(call.args, "the job's arguments")
        check_json(call.kwargs, "the job's keyword arguments")
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidInput(f"name must be a non-empty string, not {name!r}")
    if pipeline is not None and not isinstance(pipeline, PipelineState):
        raise InvalidInput("pipeline must be an outlast.model.PipelineState")
    if run_after is not None and (not isinstance(run_after, datetime) or not run_after.tzinfo):
        raise InvalidInput("run_after must be a time with a time zone")
    if unique_key is not None and (
        not isinstance(unique_key, str) or not unique_key.strip() or len(unique_key) > 500
    ):
        raise InvalidInput(
            f"a unique key is a non-empty string of 500 characters at most, not {unique_key!r}"
        )
    check_limit(limit_key, limit)
    if trace is not None and (not isinstance(trace, str) or len(trace) > 512):
        raise InvalidInput("trace must be a traceparent string of 512 characters at most")
    return JobState.build(
        {
            "id": job_id or new_id(),
            "kind": kind,
            "name": name or (command[0] if command else str(kind)),
            "command": list(command) if command else None,
            "call": call,
            "labels": check_labels(labels),
            "queue": queue,
            "priority": check_priority(priority),
            "payload": check_json(dict(payload or {}), "payload"),
            "max_attempts": max_attempts,
            "timeout": seconds(timeout, "timeout", positive=True),
            "grace": seconds(grace, "grace", positive=False),
            "keep": seconds(keep, "keep", positive=False),
            "run_after": run_after,
            "pipeline": pipeline,
            "fired": fired,
            "retry_of": retry_of,
            "unique_key": unique_key,
            "limit_key": limit_key,
            "limit": limit,
            "trace": trace,
            "created_at": now,
            "updated_at": now,
        }
    )


#: The fields of :func:`new_jobs`' items that may differ from job to job on its fast path.
PER_JOB = frozenset({"call", "payload", "limit_key"})


def new_jobs(
    common: Mapping[str, Any], each: Sequence[Mapping[str, Any]], now: datetime
) -> list[JobState]:
    """:func:`new_job` for ``{**common, **item}`` of every item, every field checked.

    A batch's shared fields are checked once: an item that gives only what differs from
    job to job (:data:`PER_JOB`: its call, payload, limit key) is checked for those and made
    from the first job's fields (a new id); any other item is made whole."""
    states: list[JobState] = []
    template: JobState | None = None
    for n, item in enumerate(each):
        try:
            template = _add_job(states, template, common, item, now)
        except InvalidInput as exc:
            raise InvalidInput(f"job {n + 1}: {exc}") from None
    return states


def _add_job(
    states: list[JobState],
    template: JobState | None,
    common: Mapping[str, Any],
    item: Mapping[str, Any],
    now: datetime,
) -> JobState | None:
    """Make ``item``'s job onto ``states``; returns the batch's template (see new_jobs)."""
    if template is None or not PER_JOB.issuperset(item):
        state = new_job(**{**common, **item}, now=now)
        states.append(state)
        return state if template is None and PER_JOB.issuperset(item) else template
    call = item.get("call", template.call)
    if call is not None and call is not template.call:  # the template's was checked
        if not isinstance(call, Call):
            raise InvalidInput("call must be an outlast.model.Call")
        check_json(call.args, "the job's arguments")
        check_json(call.kwargs, "the job's keyword arguments")
    payload = item.get("payload", template.payload)
    if payload is not template.payload:
        if payload is not None and not isinstance(payload, Mapping):
            raise InvalidInput("payload must be a JSON object")
        payload = freeze(check_json(dict(payload or {}), "payload"))
    limit_key = item.get("limit_key", template.limit_key)
    if limit_key is not template.limit_key:
        check_limit(limit_key, template.limit)
    # the template's fields (checked, frozen, in field order) with this job's own: what
    # JobState.build would make of them, without walking every field again
    state = object.__new__(JobState)
    own = state.__dict__
    own.update(template.__dict__)
    own["id"] = new_id()
    own["call"], own["payload"], own["limit_key"] = call, payload, limit_key
    states.append(state)
    return template


def fenced_out(state: JobState, attempt: int | None) -> bool:
    """True when a worker holding ``attempt`` may no longer write this job."""
    if state.terminal:
        return True
    return attempt is not None and (state.status != Status.RUNNING or state.attempts != attempt)


def backoff(attempt: int, base: float) -> float:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)``, times 0.5-1.0, capped."""
    import random  # not at import time: the CLI's fast path never retries

    return min(MAX_BACKOFF, base * 2.0 ** max(0, attempt - 1)) * random.uniform(0.5, 1.0)


def start(state: JobState, worker: str, now: datetime) -> Change | None:
    """Claim: pending and due → running, one more attempt."""
    if state.status != Status.PENDING or (state.run_after is not None and state.run_after > now):
        return None
    attempt = state.attempts + 1
    new = state.evolve(
        status=Status.RUNNING,
        attempts=attempt,
        worker=worker,
        started_at=now,
        updated_at=now,
        run_after=None,
        pid=None,
        pid_started_at=None,
    )
    return Change(new, (NewEvent(JOB_STEP, EventStatus.STARTED, {"attempt": attempt}),))


def report(
    state: JobState,
    attempt: int | None,
    step: str,
    status: EventStatus,
    message: JSON,
    progress: float | None,
    now: datetime,
) -> Change | None:
    """A progress report: ignored once the job is terminal (or fenced out)."""
    if fenced_out(state, attempt):
        return None
    new = state.evolve(
        step=step,
        phase=str(status),
        progress=progress if progress is not None else state.progress,
        updated_at=now,
    )
    return Change(new, (NewEvent(step, status, redact(message)),))


def succeed(state: JobState, attempt: int | None, result: JSON, now: datetime) -> Change | None:
    if fenced_out(state, attempt):
        return None
    check_transition(state.id, state.status, Status.SUCCEEDED)
    new = state.evolve(
        status=Status.SUCCEEDED,
        result=result,
        error=None,
        progress=100.0,
        updated_at=now,
        finished_at=now,
    )
    return Change(new, (NewEvent(JOB_STEP, EventStatus.COMPLETED, None),))


#: Characters of a traceback kept on a job: the innermost frames, where the error is.
TRACEBACK_MAX = 16 * 1024


def error_info(
    exc: BaseException | ErrorInfo, code: str = ErrorCode.ERROR, traceback: str | None = None
) -> ErrorInfo:
    """What is stored about an error: its code, its redacted message, the exception's type,
    and ``traceback`` (formatted text), redacted and cut to its last ``TRACEBACK_MAX``
    characters."""
    if traceback is not None:
        traceback = redact_text(traceback)
        if len(traceback) > TRACEBACK_MAX:
            cut = len(traceback) - TRACEBACK_MAX
            traceback = f"[… {cut} characters cut …]\n" + traceback[-TRACEBACK_MAX:]
    if isinstance(exc, ErrorInfo):
        tb = traceback if traceback is not None else exc.traceback
        return ErrorInfo(exc.code, redact_text(exc.message), exc.hint, exc.type, tb)
    code = getattr(exc, "code", code) if isinstance(getattr(exc, "code", None), str) else code
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    message = redact_text(str(exc)) or kind.__name__
    return ErrorInfo(code=code, message=message, type=name, traceback=traceback)


def fail(
    state: JobState,
    attempt: int | None,
    error: ErrorInfo,
    retry: bool,
    delay_base: float,
    now: datetime,
    keep_worker: bool = False,
) -> Change | None:
    """A failed attempt: back to pending with backoff while attempts are left, else failed.
    A pipeline being canceled is never retried (:func:`_canceled_at_end`); one that failed
    for good before its cancel came (``retry`` false: a stage's ``Fail``) ends failed.

    ``keep_worker`` is for a dedicated worker (a command's supervisor) that will retry the job
    itself: the job stays bound to it, so its death while waiting is detected as abandonment.
    A backoff longer than :data:`PARK_AFTER` unbinds it even so: the worker lets the job go
    and exits, and the store's timer starts one for the retry (a backoff of an hour holds
    no process).
    """
    if fenced_out(state, attempt):
        return None
    if state.status not in (Status.RUNNING, Status.PENDING):
        raise InvalidTransition(f"job {state.id}: cannot fail a {state.status} job")
    message = {"attempt": state.attempts, "error": error.to_dict()}
    if state.cancel_requested and retry:  # its process died while cleaning up after a cancel
        return _canceled_at_end(state, message, now)
    if retry and state.attempts < state.max_attempts:
        delay = backoff(state.attempts, delay_base)
        new = state.evolve(
            status=Status.PENDING,
            error=error,
            run_after=now + timedelta(seconds=delay),
            updated_at=now,
            worker=state.worker if keep_worker and delay <= PARK_AFTER else None,
        )
        message["retry_in"] = round(delay, 3)
        return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, message),), claimable=True)
    finalizing = _finalize(state, error, message, now)
    if finalizing is not None:  # e.g. a pipeline killed for its timeout: cleanup first
        return finalizing
    new = state.evolve(status=Status.FAILED, error=error, updated_at=now, finished_at=now)
    return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, message),))


def cancel(state: JobState, now: datetime) -> Change | None:
    """Cancel from pending, running or paused; a terminal job keeps its outcome.

    A *running* job with cleanup left to run (a pipeline whose ``ALL_DONE`` stages have not
    run) is not made terminal yet: it gets ``cancel_requested``, its worker runs the cleanup
    (recorded like any stage) and then records ``canceled`` (if the worker dies first,
    reconciling finishes it). So does a pipeline canceled *between* attempts (waiting for its
    retry, or paused for an answer) after one started: :func:`_cancel_to_cleanup`.
    """
    if state.terminal:
        return None
    between = state.status in (Status.PENDING, Status.PAUSED) and state.attempts > 0
    if between and _cleanup_pending(state):
        return _cancel_to_cleanup(state, now)
    if state.status == Status.RUNNING and _cleanup_pending(state):
        if state.cancel_requested:
            return None
        new = state.evolve(cancel_requested=True, updated_at=now)
        event = NewEvent(JOB_STEP, EventStatus.PROGRESS, {"cancel_requested": True})
        return Change(new, (event,), interrupts=True)
    error = ErrorInfo(ErrorCode.CANCELED, "the job was canceled")
    new = state.evolve(status=Status.CANCELED, error=error, updated_at=now, finished_at=now)
    event = NewEvent(JOB_STEP, EventStatus.FAILED, {"error": error.to_dict()})
    return Change(new, (event,), interrupts=state.status == Status.RUNNING)


def _cancel_to_cleanup(state: JobState, now: datetime) -> Change | None:
    """A pipeline canceled while it waits between attempts, after one of them started (a
    retry after a death or a failure, a pause for an answer): what that attempt began may
    need its cleanup, so the job gets one more run for its ``ALL_DONE`` stages only (as a
    finalize, :func:`_finalize`; ``cancel_requested`` set, as in a cancel of a running job),
    then ends ``canceled``. A finalize run already queued becomes the cancel's."""
    assert state.pipeline is not None
    finalize = state.pipeline.finalize
    if state.cancel_requested and finalize is not None and finalize.code == ErrorCode.CANCELED:
        return None  # asked already
    error = ErrorInfo(ErrorCode.CANCELED, "the job was canceled")
    new = state.evolve(
        status=Status.PENDING,
        error=error,
        run_after=None,
        cancel_requested=True,
        pipeline=replace(state.pipeline, finalize=error),
        max_attempts=state.max_attempts + (1 if finalize is None else 0),
        updated_at=now,
    )
    message = {"cancel_requested": True, "finalize": True}
    return Change(new, (NewEvent(JOB_STEP, EventStatus.PROGRESS, message),), claimable=True)


def cancel_now(
    state: JobState, attempt: int | None, error: ErrorInfo, now: datetime
) -> Change | None:
    """End a canceled job whose worker had to stop it before its cleanup was done (the
    cleanup outlived the grace period): ``canceled`` now, ``error`` saying so. Only while
    the job is still this attempt's."""
    if fenced_out(state, attempt):
        return None
    new = state.evolve(status=Status.CANCELED, error=error, updated_at=now, finished_at=now)
    return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, {"error": error.to_dict()}),))


def pause(state: JobState, attempt: int | None, question: JSON, now: datetime) -> Change | None:
    if fenced_out(state, attempt):
        return None
    check_transition(state.id, state.status, Status.PAUSED)
    new = state.evolve(
        status=Status.PAUSED, question=question, answer=None, worker=None, updated_at=now
    )
    return Change(new, (NewEvent(JOB_STEP, EventStatus.PAUSED, {"question": question}),))


def resume(state: JobState, answer: JSON, now: datetime) -> Change:
    if state.status != Status.PAUSED:
        raise InvalidTransition(f"job {state.id} is {state.status}, not paused")
    # The paused run asked a question rather than failing: it does not use up an attempt.
    new = state.evolve(
        status=Status.PENDING,
        answer=answer,
        run_after=None,
        updated_at=now,
        max_attempts=state.max_attempts + 1,
    )
    event = NewEvent(JOB_STEP, EventStatus.PROGRESS, {"resumed": True})
    return Change(new, (event,), claimable=True)


def release(state: JobState, attempt: int | None, now: datetime) -> Change | None:
    """Give a running job back to the queue without counting the attempt (graceful stop).

    ``attempts`` never goes down (it is the fencing token of the worker that ran the attempt);
    the released attempt is given back by raising ``max_attempts`` instead.
    """
    if fenced_out(state, attempt) or state.status != Status.RUNNING:
        return None
    return _given_back(state, now, {"released": True})


def _given_back(state: JobState, now: datetime, message: dict[str, Any]) -> Change:
    new = state.evolve(
        status=Status.PENDING,
        max_attempts=state.max_attempts + 1,
        worker=None,
        run_after=None,
        updated_at=now,
    )
    return Change(new, (NewEvent(JOB_STEP, EventStatus.PROGRESS, message),), claimable=True)


def _cleanup_pending(state: JobState) -> bool:
    """A pipeline whose ``ALL_DONE`` stages have not all run."""
    return state.pipeline is not None and state.pipeline.cleanup_pending


def _canceled_at_end(state: JobState, message: dict[str, Any], now: datetime) -> Change:
    """A pipeline canceled while it ran whose attempt then failed or whose worker died (in
    its cleanup): the rest of its cleanup in one more run (:func:`_finalize`), then
    canceled; or canceled now. Never retried: the cancel is final."""
    error = ErrorInfo(ErrorCode.CANCELED, "the job was canceled")
    finalizing = _finalize(state, error, message, now)
    if finalizing is not None:
        return finalizing
    new = state.evolve(status=Status.CANCELED, error=error, updated_at=now, finished_at=now)
    return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, {"error": error.to_dict()}),))


def _finalize(
    state: JobState, error: ErrorInfo, message: dict[str, Any], now: datetime
) -> Change | None:
    """A pipeline about to fail for good with its cleanup not run (its worker died or was
    killed): one more run instead, for the ``ALL_DONE`` stages only, which then fails the job
    with ``error``."""
    if state.pipeline is None or not state.pipeline.cleanup_pending:
        return None
    if state.pipeline.finalize is not None:
        return None
    new = state.evolve(
        status=Status.PENDING,
        error=error,
        worker=None,
        pipeline=replace(state.pipeline, finalize=error),
        max_attempts=state.max_attempts + 1,
        updated_at=now,
    )
    message["finalize"] = True
    return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, message),), claimable=True)


@dataclass(frozen=True)
class Outcome:
    """What one attempt came to: ``succeed``, ``fail``, ``pause``, ``cancel``, ``abort`` (a
    cancel whose cleanup its worker had to cut short), ``release`` (not started after all:
    the attempt is given back) or ``gone`` (nothing to write)."""

    verb: str
    value: JSON = None
    error: ErrorInfo | None = None
    retry: bool = True

    def to_dict(self) -> dict[str, Any]:
        error = None if self.error is None else self.error.to_dict()
        return {"verb": self.verb, "value": self.value, "error": error, "retry": self.retry}

    @classmethod
    def from_dict(cls, data: Any) -> Outcome:
        """Raises ``ValueError`` (or :class:`~outlast.errors.CorruptJob`) for a bad record."""
        verb, error = data["verb"], data.get("error")
        if verb not in OUTCOMES or not isinstance(data.get("retry", True), bool):
            raise ValueError(f"not an outcome: {data!r:.80}")
        info = None if error is None else ErrorInfo.from_dict(error)
        return cls(verb, data.get("value"), info, data.get("retry", True))


OUTCOMES = ("succeed", "fail", "pause", "cancel", "abort", "release", "gone")


def record(
    state: JobState,
    outcome: Outcome,
    attempt: int,
    now: datetime,
    delay_base: float,
    keep_worker: bool = False,
) -> Change | None:
    """The change that records ``outcome`` of attempt ``attempt`` (None: nothing to write, or
    the job is no longer that attempt's)."""
    verb = outcome.verb
    if verb == "succeed":
        return succeed(state, attempt, outcome.value, now)
    if verb == "fail" and outcome.error is not None:
        return fail(state, attempt, outcome.error, outcome.retry, delay_base, now, keep_worker)
    if verb == "pause":
        return pause(state, attempt, outcome.value, now)
    if verb == "cancel":  # only while the job is still this attempt's
        return None if fenced_out(state, attempt) else cancel(state, now)
    if verb == "abort" and outcome.error is not None:
        return cancel_now(state, attempt, outcome.error, now)
    if verb == "release":
        return release(state, attempt, now)
    return None


def give_back(state: JobState, now: datetime) -> Change | None:
    """Reconcile a job claimed by a worker that died before it started the job's function
    (a pool's claim ahead): back to pending with the attempt given back (``max_attempts``
    raised, as :func:`release` does), so ``attempts`` counts starts. A cancel asked
    meanwhile is left to :func:`abandon`."""
    if state.status != Status.RUNNING or state.cancel_requested:
        return None
    message = {
        "attempt": state.attempts,
        "released": True,
        "reason": "its worker died before starting it: the attempt is not counted",
    }
    return _given_back(state, now, message)


def abandon(state: JobState, now: datetime) -> Change | None:
    """Reconcile a job whose worker died: retry while attempts are left, else failed."""
    if state.terminal or state.status == Status.PAUSED:
        return None
    error = ErrorInfo(
        ErrorCode.ABANDONED,
        "worker exited without recording a result",
        hint="the process working on the job died (killed, crashed or its machine went away)",
    )
    message = {"attempt": state.attempts, "error": error.to_dict()}
    if state.cancel_requested:  # its worker died while cleaning up after a cancel
        return _canceled_at_end(state, message, now)
    if state.status == Status.PENDING or state.attempts < state.max_attempts:
        new = state.evolve(status=Status.PENDING, error=error, worker=None, updated_at=now)
        return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, message),), claimable=True)
    finalizing = _finalize(state, error, message, now)
    if finalizing is not None:
        return finalizing
    new = state.evolve(status=Status.FAILED, error=error, updated_at=now, finished_at=now)
    return Change(new, (NewEvent(JOB_STEP, EventStatus.FAILED, message),))


def retry_copy(state: JobState, now: datetime) -> JobState:
    """A new pending job with the definition of the finished ``state`` (what to run, its
    labels, queue, options; fresh attempts, no outcome), linked to it by ``retry_of``; the
    finished job stays as it was. A pipeline starts again from its first stage."""
    if not state.terminal:
        raise InvalidTransition(
            f"job {state.id} is {state.status}: only a finished job can be retried "
            "(a live one retries itself while attempts are left)"
        )
    pipeline = None
    if state.pipeline is not None:
        pipeline = PipelineState(cleanup=state.pipeline.cleanup)
    return new_job(
        kind=state.kind,
        name=state.name,
        command=state.command,
        call=state.call,
        labels=state.labels,
        queue=state.queue,
        payload=state.payload,
        max_attempts=state.max_attempts,  # as it ended (attempts given back raised it)
        timeout=state.timeout,
        grace=state.grace,
        keep=state.keep,
        priority=state.priority,
        pipeline=pipeline,
        retry_of=state.id,
        unique_key=state.unique_key,
        limit_key=state.limit_key,
        limit=state.limit,
        now=now,
    )


def wakes_pools(old: JobState, change: Change) -> bool:
    """Whether a change should wake idle pools: a job became claimable, or a running job of
    a concurrency key stopped running (its slot is free for the key's waiting jobs)."""
    return change.claimable or (
        old.limit_key is not None
        and old.status == Status.RUNNING
        and change.state.status != Status.RUNNING
    )
