"""Running one attempt of a function or pipeline job in this process, and recording it.

``run_attempt`` calls the job and returns its :class:`Outcome` without writing it, so a pool's
job process can hand the outcome to the pool, which writes the outcomes of several jobs in one
transaction. ``record`` writes one outcome through the job's task, whose attempt token makes
sure it never lands on a job that was canceled or taken away meanwhile.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from outlast import config, machine
from outlast.errors import Canceled, Fail, InvalidInput, OutlastError, Pause, TimedOut
from outlast.frozen import thaw
from outlast.machine import Outcome
from outlast.model import Call, JobState, Kind, utcnow
from outlast.run import context, registry, tracing
from outlast.run.pipeline import run_pipeline
from outlast.store import Store, Task, Transition

log = logging.getLogger("outlast.worker")


def _call(
    spec: registry.JobSpec, task: Task, state: JobState, on_start: Callable[[], bool] | None
) -> Any:
    call = state.call
    # the function gets its own copies: what it does to them never reaches the stored state
    args, kwargs = ([], {}) if call is None else (thaw(call.args), thaw(call.kwargs))
    is_async = spec.is_async  # (a cached property: a Python call the first time)
    _start(on_start)  # the last thing before the call: see run_attempt
    if state.kind == Kind.PIPELINE:
        return run_pipeline(spec, task, state)
    if call is None:
        raise Fail("the job has no call (module, args, kwargs) to run")
    if is_async:
        _arguments(spec, call)
        return run_async(spec.fn, args, kwargs)
    try:
        return spec.fn(*args, **kwargs)
    except TypeError as exc:
        # raised by the call itself, not inside the function: the arguments do not fit it
        # (checked only then, so a call that fits costs nothing)
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
            _arguments(spec, call)
        raise


def _start(on_start: Callable[[], bool] | None) -> None:
    if on_start is not None and not on_start():
        raise _NotStarted


class _NotStarted(Exception):
    """``on_start`` said no: the function is not called, the attempt is given back."""


def _arguments(spec: registry.JobSpec, call: Call) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments, checked against the function (:class:`_BadCall` when they do
    not fit: it changed since the job was submitted). The function gets its own copies: what
    it does to them never reaches the stored state."""
    args, kwargs = thaw(call.args), thaw(call.kwargs)
    try:
        registry.bind(spec, args, kwargs)
    except InvalidInput as exc:
        raise _BadCall(f"{exc} (was the function changed since the job was submitted?)") from None
    return args, kwargs


class _BadCall(Fail):
    """The job's arguments do not fit its function: not retried, no traceback."""


def run_async(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run an ``async def`` job on a new event loop: a cancel of the job cancels its task
    (``asyncio.CancelledError`` at its current ``await``), and its timeout does too, a
    little before its process would be killed for it (``TimeoutError``: code ``timeout``)."""
    import asyncio  # here: a pool of plain functions never loads it (BENCHMARKS.md, #18)

    job = context.current_or_none()

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        if job is not None:
            job.on_cancel(lambda: loop.call_soon_threadsafe(me.cancel))
        left = None if job is None else job.time_left()
        try:
            async with asyncio.timeout(left):
                return await fn(*args, **kwargs)
        except TimeoutError:
            if job is not None and job.time_left() == 0:
                raise TimedOut("the job ran past its timeout") from None
            raise

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        raise Canceled("the job was canceled") from None
    finally:
        if job is not None:
            job.on_cancel(None)


def _attempt(
    spec: registry.JobSpec,
    task: Task,
    state: JobState,
    on_start: Callable[[], bool] | None,
    on_return: Callable[[], None] | None,
) -> Outcome:
    try:
        try:
            result = _call(spec, task, state, on_start)
        finally:
            if on_return is not None:
                on_return()
    except _NotStarted:
        return Outcome("release")
    except Exception as exc:
        return outcome_of(exc)
    return succeeded(result)


def _error_of(outcome: Outcome) -> tuple[str | None, str | None]:
    error = outcome.error
    return (None, None) if error is None else (error.type, error.message)


def outcome_of(exc: Exception) -> Outcome:
    """How an attempt that raised ``exc`` ended: paused, canceled, or failed (retried unless
    it raised :class:`Fail` or its arguments do not fit), with the traceback kept."""
    if isinstance(exc, Pause):
        return Outcome("pause", exc.question)
    if isinstance(exc, Canceled):
        return Outcome("cancel")
    if isinstance(exc, _BadCall | TimedOut):  # a timeout is retried, as the pool's kill is
        return Outcome("fail", error=machine.error_info(exc), retry=isinstance(exc, TimedOut))
    error = machine.error_info(exc, traceback=_traceback(exc))
    return Outcome("fail", error=error, retry=not isinstance(exc, Fail))


def succeeded(result: Any) -> Outcome:
    """The outcome of an attempt that returned ``result`` (which must be JSON)."""
    try:
        machine.check_json(result, "the job's result")
    except OutlastError as exc:
        return Outcome("fail", error=machine.error_info(Fail(str(exc))), retry=False)
    return Outcome("succeed", result)


async def arun_attempt(spec: registry.JobSpec, task: Task, state: JobState) -> Outcome:
    """An attempt in an async pool, in the running asyncio task (whose job context is set):
    an ``async def`` function is awaited here, with its timeout (a cancel of the job cancels
    this task: ``CancelledError`` at the function's current ``await``); any other job runs in
    a thread (its cancel is cooperative, ``check_cancel()``; its timeout is not enforced)."""
    with tracing.job_span(state) as span:
        outcome = await _aattempt(spec, task, state)
        if span is not None:
            tracing.end_attempt(span, outcome.verb, *_error_of(outcome))
    return outcome


async def _aattempt(spec: registry.JobSpec, task: Task, state: JobState) -> Outcome:
    import asyncio

    job = context.current()
    try:
        if spec.is_async and state.kind == Kind.FUNCTION and state.call is not None:
            args, kwargs = _arguments(spec, state.call)
            try:
                async with asyncio.timeout(job.time_left()):
                    result = await spec.fn(*args, **kwargs)
            except TimeoutError:
                if job.time_left() == 0:
                    raise TimedOut("the job ran past its timeout") from None
                raise
        else:
            result = await asyncio.to_thread(_call, spec, task, state, None)
    except asyncio.CancelledError:
        return Outcome("cancel")
    except Exception as exc:
        return outcome_of(exc)
    return succeeded(result)


def _traceback(exc: BaseException) -> str:
    """``exc``'s traceback from the job's own code on (this module's frames left out)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run_attempt(
    store: Store,
    job_id: str,
    attempt: int,
    state: JobState | None = None,
    on_start: Callable[[], bool] | None = None,
    on_return: Callable[[], None] | None = None,
) -> Outcome:
    """Run attempt ``attempt`` of ``job_id`` here and say how it ended (nothing is written
    but what the job reports itself). ``state``: the job as claimed, when the caller has it
    (else it is read from the store); ``on_start`` is called just before the job's function,
    once its arguments are ready, with nothing but the call after it (a pool's job process
    journals the start there, and dies with its pool from then on: the shorter the moment
    between the record and the function's first line, the rarer an attempt counted but
    never started); if it says False, the function is not called and the attempt is given
    back (``release``); ``on_return`` the moment the function returns or raises, before
    anything else."""
    task = Task(store, job_id, attempt=attempt)
    if state is None:
        try:
            state = store.get(job_id)
        except OutlastError as exc:
            log.warning("cannot run job %s: %s", job_id, exc)
            return Outcome("gone")
    context.enter(context.JobContext(task, state))
    try:
        try:
            spec = registry.resolve(state)
        except Exception as exc:  # an unknown name, or a module that fails to import
            return Outcome(
                "fail", error=machine.error_info(Fail(f"cannot load job: {exc}")), retry=False
            )
        with tracing.job_span(state) as span:
            outcome = _attempt(spec, task, state, on_start, on_return)
            if span is not None:
                tracing.end_attempt(span, outcome.verb, *_error_of(outcome))
        return outcome
    finally:
        context.enter(None)


def transition(outcome: Outcome, attempt: int, keep_worker: bool = False) -> Transition | None:
    """The store transition that records ``outcome`` (None for nothing to write)."""
    if outcome.verb == "gone":
        return None
    base = config.retry_delay()
    return lambda s: machine.record(s, outcome, attempt, utcnow(), base, keep_worker)


def execute(store: Store, job_id: str, attempt: int, dedicated: bool = False) -> None:
    """Run one attempt here and record its outcome (dedicated workers).

    ``dedicated``: this process retries the job itself, so a failure keeps the job bound to it.
    """
    fn = transition(run_attempt(store, job_id, attempt), attempt, keep_worker=dedicated)
    if fn is not None:
        store.apply(job_id, fn)
