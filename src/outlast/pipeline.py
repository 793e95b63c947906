"""Pipelines: a job made of named stages that run in order under Airflow-style trigger rules.

A stage function takes the payload and returns ``(out_dict, message)``; ``out_dict`` lands in
``payload["outputs"][stage]`` and each finished stage is checkpointed in
``payload["stages"][stage]`` (``{"status": "succeeded" | "failed" | "skipped", "message": …}``),
so a retried or resumed pipeline does not redo finished stages. Both keys are reserved.

Trigger rules, evaluated against the stages before this one:

- ``ALL_SUCCESS`` (default): all succeeded (skipped stages count as neither).
- ``ALL_DONE``: always runs, whatever happened before: success, failure, timeout or cancel.
  It is the cleanup rule.
- ``ONE_FAILED``: at least one failed.

A failure that will be retried (attempts left, not :class:`~outlast.Fail`) stops the attempt
at once: the cleanup stages run when the pipeline is about to finish for good, not before each
retry. A final failure marks the stage failed, runs the stages whose rule still holds (cleanup),
then fails the job with the first error. A cancel runs the ``ALL_DONE`` stages, then stops.
If the pipeline's worker dies, reconciling the job (``outlast status``, a pool, the HTTP
server) hands its pending ``ALL_DONE`` stages to a detached finalizer.

Events: every stage emits ``started`` then ``completed``, ``skipped`` or ``failed`` (the message
is the stage's ``msg``); a poll stage emits ``progress`` per tick.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outlast.errors import Canceled, Fail, InvalidInput, OutlastError, Pause
from outlast.model import ErrorCode, EventStatus, JobState
from outlast.run import context, registry
from outlast.store import Task

ALL_SUCCESS = "all_success"
ALL_DONE = "all_done"
ONE_FAILED = "one_failed"
TRIGGERS = (ALL_SUCCESS, ALL_DONE, ONE_FAILED)

StageFn = Callable[[dict[str, Any]], tuple[dict[str, Any], str]]


class PollTimeout(OutlastError):
    """A poll stage's condition did not hold before its timeout."""

    code = ErrorCode.TIMEOUT


@dataclass(frozen=True)
class Stage:
    """One step of a pipeline: ``fn(payload) -> (out_dict, message)``."""

    #: Unique within the pipeline; the key of its output and checkpoint.
    name: str
    #: The stage's work.
    fn: StageFn
    #: When it runs: ``ALL_SUCCESS``, ``ALL_DONE`` or ``ONE_FAILED``.
    trigger: str = ALL_SUCCESS
    #: For a poll stage: the condition on ``out_dict`` that ends the polling.
    until: Callable[[dict[str, Any]], bool] | None = None
    #: Seconds between ticks of a poll stage.
    interval: float = 1.0
    #: Seconds a poll stage may take before it fails with code ``timeout``.
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name in ("job",):
            raise InvalidInput(
                f"a stage name is a non-empty string other than 'job': {self.name!r}"
            )
        if not callable(self.fn):
            raise InvalidInput(f"stage {self.name!r}: fn must be callable")
        if self.trigger not in TRIGGERS:
            raise InvalidInput(f"stage {self.name!r}: trigger must be one of {', '.join(TRIGGERS)}")
        if not self.interval > 0 or not self.timeout > 0:
            raise InvalidInput(f"stage {self.name!r}: interval and timeout must be > 0")


def poll(
    name: str,
    fn: StageFn,
    until: Callable[[dict[str, Any]], bool],
    interval: float = 1.0,
    timeout: float = 30.0,
    trigger: str = ALL_SUCCESS,
) -> Stage:
    """A stage that calls ``fn`` every ``interval`` seconds until ``until(out_dict)`` holds,
    failing with code ``timeout`` after ``timeout`` seconds. Its last tick's output is kept."""
    if not callable(until):
        raise InvalidInput(f"poll stage {name!r}: until must be callable")
    return Stage(name, fn, trigger, until, interval, timeout)


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
        self.name = name
        self.stages = list(stages)
        origin = module or sys._getframe(1).f_globals.get("__name__")
        self.spec = registry.register(
            registry.JobSpec(name, self, attempts, timeout, queue, "pipeline", origin)
        )

    @property
    def cleanup_stages(self) -> list[str]:
        """The ``ALL_DONE`` stages: they run even if the pipeline's worker dies."""
        return [s.name for s in self.stages if s.trigger == ALL_DONE]

    def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A pipeline is not called like a function: it runs as a job (its stages report and
        checkpoint through the job). Use :meth:`submit` or :meth:`spawn`."""
        raise InvalidInput("a pipeline runs as a job: use .submit(payload) or .spawn(payload)")

    def submit(self, payload: dict[str, Any] | None = None, **options: Any) -> Task:
        """Queue the pipeline as a job for the pools, with ``payload`` as its input."""
        from outlast.run.api import create_job, default_store

        return create_job(default_store(), self.spec, [], {}, payload=payload, **options)

    def spawn(self, payload: dict[str, Any] | None = None) -> Task:
        """Run the pipeline in its own detached worker; returns its task at once."""
        from outlast.run.api import spawn_spec

        return spawn_spec(self.spec, [], {}, payload=payload)


def _rule_holds(trigger: str, results: list[str]) -> bool:
    if trigger == ALL_DONE:
        return True
    if trigger == ONE_FAILED:
        return "failed" in results
    return "failed" not in results and "canceled" not in results


class _Runner:
    """Runs one attempt of a pipeline through its task (fenced writes, events, checkpoints)."""

    def __init__(self, pipeline: Pipeline, task: Task, state: JobState) -> None:
        self.pipeline, self.task = pipeline, task
        self.payload: dict[str, Any] = dict(state.payload)
        self.payload.setdefault("outputs", {})
        self.payload.setdefault("stages", {})
        self.retry_left = state.attempts < state.max_attempts

    def checkpoint(self, stage: Stage, status: str, message: Any, out: Any = None) -> None:
        record = {"status": status, "message": message}
        self.payload["stages"][stage.name] = record
        if out is not None:
            self.payload["outputs"][stage.name] = out

        def update(payload: dict[str, Any]) -> dict[str, Any]:
            payload.setdefault("stages", {})[stage.name] = record
            if out is not None:
                payload.setdefault("outputs", {})[stage.name] = out
            return payload

        self.task.update_payload(update)

    def call(self, stage: Stage) -> tuple[dict[str, Any], str]:
        out, message = _checked(stage, stage.fn(self.payload))
        if stage.until is None:
            return out, message
        deadline, tick = time.monotonic() + stage.timeout, 0
        while True:
            tick += 1
            self.payload["outputs"][stage.name] = out  # the next tick sees the last one's
            self.task.report(stage.name, EventStatus.PROGRESS, message)
            if stage.until(out):
                return out, message
            if time.monotonic() + stage.interval > deadline:
                raise PollTimeout(
                    f"stage {stage.name!r}: not ready after {stage.timeout:g}s ({tick} ticks)"
                )
            _sleep_unless_canceled(stage.interval)
            out, message = _checked(stage, stage.fn(self.payload))

    def run(self) -> dict[str, Any]:
        results = [r["status"] for r in self.payload["stages"].values()]
        first_error: BaseException | None = None
        for stage in self.pipeline.stages:
            if stage.name in self.payload["stages"]:
                continue  # checkpointed by an earlier attempt
            if not _rule_holds(stage.trigger, results):
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
                out, message = self.call(stage)
            except Pause:
                raise  # the stage asked a person: it re-runs after the resume
            except Exception as exc:
                final = isinstance(exc, Fail | Canceled) or not self.retry_left
                if not final and first_error is None:
                    raise  # retried: finished stages are checkpointed, cleanup waits
                text = f"{type(exc).__name__}: {exc}"
                self.task.report(stage.name, EventStatus.FAILED, text)
                self.checkpoint(stage, "failed", text, self.payload["outputs"].get(stage.name))
                results.append("canceled" if isinstance(exc, Canceled) else "failed")
                first_error = first_error or exc
                continue
            self.task.report(stage.name, EventStatus.COMPLETED, message)
            self.checkpoint(stage, "succeeded", message, out)
            results.append("succeeded")
        if first_error is not None:
            raise first_error  # final: a Fail, a cancel, or no attempts left
        return {"outputs": self.payload["outputs"]}


def _checked(stage: Stage, value: Any) -> tuple[dict[str, Any], str]:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not isinstance(value[0], dict)
        or not isinstance(value[1], str)
    ):
        raise Fail(f"stage {stage.name!r} must return (out_dict, message), not {value!r:.80}")
    return value


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
    final = state.payload.get("finalize")
    if final is not None:  # its worker died or was stopped: only the cleanup is left to do
        finalize(spec, task, state)
        known = isinstance(final, dict) and isinstance(final.get("message"), str)
        error = Fail(
            f"{final['message'] if known else 'the pipeline was stopped'}; the cleanup stages ran"
        )
        code = final.get("code") if isinstance(final, dict) else None
        if code == ErrorCode.CANCELED:
            raise Canceled("the pipeline was canceled; the cleanup stages ran")
        error.code = code if isinstance(code, str) else ErrorCode.ABANDONED
        raise error
    return _Runner(pipeline, task, state).run()


def finalize(spec: registry.JobSpec, task: Task, state: JobState) -> None:
    """Run the ``ALL_DONE`` stages a dead worker left pending (the finalizer's work)."""
    pipeline = spec.fn
    if not isinstance(pipeline, Pipeline):
        return
    runner = _Runner(pipeline, task, state)
    for stage in pipeline.stages:
        if stage.trigger != ALL_DONE or stage.name in runner.payload["stages"]:
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
