"""Running pipelines: the ``Pipeline`` job definition and the runner that executes its stages.

The rules (trigger rules, checkpoints) are pure and live in :mod:`outlast.stages`; this module
drives them through the job's task: events, fenced checkpoints, cancel checks.

A failure that will be retried (attempts left, not :class:`~outlast.Fail`) stops the attempt
at once: the cleanup stages run when the pipeline is about to finish for good, not before each
retry. A final failure marks the stage failed, runs the stages whose rule still holds (cleanup),
then fails the job with the first error. A cancel runs the ``ALL_DONE`` stages, then stops.
If the pipeline's worker dies, reconciling the job gives it one more run for its pending
``ALL_DONE`` stages only (``pipeline.finalize``), which then ends it.

Events: every stage emits ``started`` then ``completed``, ``skipped`` or ``failed`` (the message
is the stage's ``msg``); a poll stage emits ``progress`` per tick.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from outlast import stages as rules
from outlast.errors import Canceled, Fail, InvalidInput, OutlastError, Pause, PollTimeout
from outlast.frozen import thaw
from outlast.model import ErrorCode, EventStatus, JobState, utcnow
from outlast.run import api, context, registry, tracing
from outlast.stages import ALL_DONE, OUTPUTS, Stage
from outlast.store import Task


class Pipeline:
    """Named stages run in order as one job; registered under ``name`` like ``@outlast.job``."""

    def __init__(
        self,
        name: str,
        stages: Sequence[Stage],
        *,
        attempts: int | None = None,
        timeout: float | None = None,
        queue: str = "default",
        module: str | None = None,
    ) -> None:
        """``module`` is where a worker imports the pipeline from (default: the caller's)."""
        if not stages:
            raise InvalidInput("a pipeline needs at least one stage")
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise InvalidInput(f"pipeline {name!r}: stage names must be unique: {names}")
        registry.check_options(attempts, timeout, queue)
        self.name = name
        self.stages = list(stages)
        origin = module or sys._getframe(1).f_globals.get("__name__")
        self.spec = registry.register(
            registry.JobSpec(
                name,
                self,
                attempts,
                timeout,
                queue,
                "pipeline",
                origin,
                rules.cleanup_names(self.stages),
            )
        )

    @property
    def cleanup_stages(self) -> list[str]:
        """The ``ALL_DONE`` stages: they run even if the pipeline's worker dies."""
        return list(self.spec.cleanup)

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A pipeline is not called like a function: it runs as a job (its stages report and
        checkpoint through the job). Use :meth:`submit` or :meth:`spawn`."""
        raise InvalidInput("a pipeline runs as a job: use .submit(payload) or .spawn(payload)")

    def submit(self, payload: dict[str, Any] | None = None) -> Task:
        """Queue the pipeline as a job for the pools, with ``payload`` as its input."""
        return api.create_job(api.default_store(), self.spec, payload=payload)

    def spawn(self, payload: dict[str, Any] | None = None) -> Task:
        """Run the pipeline in its own detached worker; returns its task at once."""
        return api.spawn_job(api.default_store(), self.spec, payload=payload)


class _Runner:
    """Runs one attempt of a pipeline through its task (fenced writes, events, checkpoints).

    ``payload`` is a working copy the stage functions see (and may change): the job's payload
    with ``outputs`` kept up to date as stages finish.
    """

    def __init__(self, pipeline: Pipeline, task: Task, state: JobState) -> None:
        self.pipeline, self.task = pipeline, task
        self.payload: dict[str, Any] = thaw(state.payload)
        if not isinstance(self.payload.get(OUTPUTS), dict):
            self.payload[OUTPUTS] = {}
        #: The status of every finished stage, by name (checkpointed or done this attempt).
        self.done = (
            {n: r.status for n, r in state.pipeline.stages.items()} if state.pipeline else {}
        )
        #: What an earlier attempt's stages said (their messages), by name.
        self.before = dict(state.pipeline.stages) if state.pipeline else {}
        self.retry_left = state.attempts < state.max_attempts

    def checkpoint(self, stage: Stage, status: str, message: Any, out: Any = None) -> None:
        if out is not None:
            self.payload[OUTPUTS][stage.name] = out
        self.done[stage.name] = status
        attempt = self.task.attempt
        self.task.store.apply(
            self.task.id,
            lambda s: rules.checkpoint(s, attempt, stage.name, status, message, out, utcnow()),
        )

    def call(self, stage: Stage) -> tuple[dict[str, Any], str]:
        out, message = rules.check_output(stage, stage.fn(self.payload))
        if stage.until is None:
            return out, message
        deadline, tick = time.monotonic() + stage.timeout, 0
        while True:
            tick += 1
            self.payload[OUTPUTS][stage.name] = out  # the next tick sees the last one's
            self.task.report(stage.name, EventStatus.PROGRESS, message)
            if stage.until(out):
                return out, message
            if time.monotonic() + stage.interval > deadline:
                raise PollTimeout(
                    f"stage {stage.name!r}: not ready after {stage.timeout:g}s ({tick} ticks)"
                )
            _sleep_unless_canceled(stage.interval)
            out, message = rules.check_output(stage, stage.fn(self.payload))

    def earlier_failure(self) -> BaseException | None:
        """The error of a stage that failed for good in an earlier attempt, if one did: only
        a final failure is checkpointed ``failed`` (see :meth:`run`), so the job ends with
        it, after its cleanup, whichever attempt gets there (its process may have died
        after the checkpoint: a retry then resumes past it)."""
        for name, status in self.done.items():
            if status == "failed":
                if _canceled():
                    return Canceled("the pipeline was canceled")
                message = self.before[name].message
                return Fail(f"{message} (stage {name!r}, in an earlier attempt)")
        return None

    def run(self) -> dict[str, Any]:
        results = list(self.done.values())
        first_error: BaseException | None = self.earlier_failure()
        for stage in self.pipeline.stages:
            if stage.name in self.done:
                continue  # checkpointed by an earlier attempt
            if not rules.rule_holds(stage.trigger, results):
                self.task.report(stage.name, EventStatus.SKIPPED, f"trigger {stage.trigger}")
                self.checkpoint(stage, "skipped", f"trigger {stage.trigger}")
                results.append("skipped")
                continue
            if stage.trigger != ALL_DONE and _canceled():
                results.append("canceled")
                first_error = first_error or Canceled("the pipeline was canceled")
                continue
            self.task.report(stage.name, EventStatus.STARTED)
            try:
                with tracing.stage_span(stage.name):
                    out, message = self.call(stage)
            except Pause:
                raise  # the stage asked a person: it re-runs after the resume
            except Exception as exc:
                final = isinstance(exc, Fail | Canceled) or not self.retry_left
                if not final and first_error is None:
                    raise  # retried: finished stages are checkpointed, cleanup waits
                text = f"{type(exc).__name__}: {exc}"
                self.task.report(stage.name, EventStatus.FAILED, text)
                self.checkpoint(stage, "failed", text, self.payload[OUTPUTS].get(stage.name))
                results.append("canceled" if isinstance(exc, Canceled) else "failed")
                first_error = first_error or exc
                continue
            self.task.report(stage.name, EventStatus.COMPLETED, message)
            self.checkpoint(stage, "succeeded", message, out)
            results.append("succeeded")
        if first_error is not None:
            raise first_error  # final: a Fail, a cancel, or no attempts left
        return {OUTPUTS: self.payload[OUTPUTS]}


def _canceled() -> bool:
    try:
        return context.current().cancel_requested
    except OutlastError:
        return False


def _sleep_unless_canceled(seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
        if _canceled():
            raise Canceled("the pipeline was canceled")


def run_pipeline(spec: registry.JobSpec, task: Task, state: JobState) -> Any:
    """Run (or resume) the pipeline job ``state`` through ``task``."""
    pipeline = spec.fn
    if not isinstance(pipeline, Pipeline):
        raise Fail(f"job {spec.name!r} is not a pipeline")
    final = state.pipeline.finalize if state.pipeline else None
    if final is None:
        return _Runner(pipeline, task, state).run()
    # Its worker died or was stopped: only the cleanup is left to do, then the job ends.
    finalize(pipeline, task, state)
    if final.code == ErrorCode.CANCELED:
        raise Canceled("the pipeline was canceled; the cleanup stages ran")
    error = Fail(f"{final.message}; the cleanup stages ran")
    error.code = final.code or ErrorCode.ABANDONED
    raise error


def finalize(pipeline: Pipeline, task: Task, state: JobState) -> None:
    """Run the ``ALL_DONE`` stages a dead worker left pending (the finalizer's work)."""
    runner = _Runner(pipeline, task, state)
    for stage in pipeline.stages:
        if stage.trigger != ALL_DONE or stage.name in runner.done:
            continue
        task.report(stage.name, EventStatus.STARTED, "after the worker died")
        try:
            out, message = runner.call(stage)
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            task.report(stage.name, EventStatus.FAILED, text)
            runner.checkpoint(stage, "failed", text)
            continue
        task.report(stage.name, EventStatus.COMPLETED, message)
        runner.checkpoint(stage, "succeeded", message, out)
