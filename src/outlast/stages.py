"""The pure rules of pipelines: stages, trigger rules and checkpoint transitions. No I/O.

A pipeline is a job made of named stages run in order (:mod:`outlast.run.pipeline` runs
them). A stage function takes the payload and returns ``(out_dict, message)``; ``out_dict``
lands in ``payload["outputs"][stage]`` (the seed's convention: the outputs are the user's
data) and the stage's checkpoint in the job's typed ``pipeline.stages`` field, so a retried or
resumed pipeline does not redo finished stages.

Trigger rules, evaluated against the stages before this one, as in Airflow:

- ``ALL_SUCCESS`` (default): all succeeded (skipped stages count as neither).
- ``ALL_DONE``: always runs, whatever happened before: success, failure, timeout or cancel.
  It is the cleanup rule.
- ``ONE_FAILED``: at least one failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from outlast import machine
from outlast.errors import Fail, InvalidInput
from outlast.machine import Change
from outlast.model import JSON, JobState, PipelineState, StageRecord

ALL_SUCCESS = "all_success"
ALL_DONE = "all_done"
ONE_FAILED = "one_failed"
TRIGGERS = (ALL_SUCCESS, ALL_DONE, ONE_FAILED)

#: The payload key under which each stage's output is kept.
OUTPUTS = "outputs"

StageFn = Callable[[dict[str, Any]], tuple[dict[str, Any], str]]


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


def rule_holds(trigger: str, results: list[str]) -> bool:
    """Whether a stage with ``trigger`` runs after stages that ended as ``results``
    (``succeeded``, ``failed``, ``skipped`` or ``canceled``)."""
    if trigger == ALL_DONE:
        return True
    if trigger == ONE_FAILED:
        return "failed" in results
    return "failed" not in results and "canceled" not in results


def cleanup_names(stages: list[Stage]) -> tuple[str, ...]:
    """The ``ALL_DONE`` stages: they run even if the pipeline's worker dies."""
    return tuple(s.name for s in stages if s.trigger == ALL_DONE)


def check_output(stage: Stage, value: Any) -> tuple[dict[str, Any], str]:
    """``value`` if it is ``(out_dict, message)``, else :class:`Fail` saying what it was."""
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not isinstance(value[0], dict)
        or not isinstance(value[1], str)
    ):
        raise Fail(f"stage {stage.name!r} must return (out_dict, message), not {value!r:.80}")
    return value


def checkpoint(
    state: JobState,
    attempt: int | None,
    stage: str,
    status: str,
    message: JSON,
    output: JSON,
    now: datetime,
) -> Change | None:
    """Record a finished stage: its checkpoint, and its output (when not None) under
    ``payload["outputs"]``; refused once the job is no longer this attempt's."""
    if machine.fenced_out(state, attempt):
        return None
    pipeline = state.pipeline or PipelineState()
    stages = {**pipeline.stages, stage: StageRecord(status, message)}
    changes: dict[str, Any] = {"pipeline": replace(pipeline, stages=stages), "updated_at": now}
    if output is not None:
        outputs = state.payload.get(OUTPUTS)
        outputs = dict(outputs) if isinstance(outputs, dict) else {}
        outputs[stage] = machine.check_json(output, f"the output of stage {stage!r}")
        changes["payload"] = {**state.payload, OUTPUTS: outputs}
    return Change(state.evolve(**changes))
