"""Running one attempt of a function or pipeline job in this process, and recording it.

``run_attempt`` calls the job and returns its :class:`Outcome` without writing it, so a pool's
job process can hand the outcome to the pool, which writes the outcomes of several jobs in one
transaction. ``record`` writes one outcome through the job's task, whose attempt token makes
sure it never lands on a job that was canceled or taken away meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from outlast import config, machine
from outlast.errors import Canceled, Fail, OutlastError, Pause
from outlast.frozen import thaw
from outlast.machine import Outcome
from outlast.model import JobState, Kind, utcnow
from outlast.run import context, registry
from outlast.run.pipeline import run_pipeline
from outlast.store import Store, Task, Transition

log = logging.getLogger("outlast.worker")


def _call(spec: registry.JobSpec, task: Task, state: JobState) -> Any:
    if state.kind == Kind.PIPELINE:
        return run_pipeline(spec, task, state)
    if state.call is None:
        raise Fail("the job has no call (module, args, kwargs) to run")
    # the function gets its own copies: what it does to them never reaches the stored state
    return spec.fn(*thaw(state.call.args), **thaw(state.call.kwargs))


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
    (else it is read from the store); ``on_start`` is called just before the job's function
    (a pool's job process journals the start there): if it says False, the function is not
    called and the attempt is given back (``release``); ``on_return`` the moment the function
    returns or raises, before anything else."""
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
        if on_start is not None and not on_start():
            return Outcome("release")
        try:
            try:
                result = _call(spec, task, state)
            finally:
                if on_return is not None:
                    on_return()
        except Pause as exc:
            return Outcome("pause", exc.question)
        except Canceled:
            return Outcome("cancel")
        except Fail as exc:
            return Outcome("fail", error=machine.error_info(exc), retry=False)
        except Exception as exc:
            return Outcome("fail", error=machine.error_info(exc))
        try:
            machine.check_json(result, "the job's result")
        except OutlastError as exc:
            return Outcome("fail", error=machine.error_info(Fail(str(exc))), retry=False)
        return Outcome("succeed", result)
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
