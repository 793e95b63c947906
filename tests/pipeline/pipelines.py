"""Pipelines the tests run, registered at import (workers import this module by name).

``FAST`` and ``SLOW`` are the async job watcher with shorter polls; the others wrap its actions
to count side effects, fail once, or ask a question.
"""

from __future__ import annotations

import os
from typing import Any

from examples.async_job_watcher import actions
from examples.async_job_watcher.pipeline import build, is_ready, stages

import outlast
from outlast.pipeline import ALL_DONE, Pipeline, Stage, poll

MODULE = __name__

#: Poll every 0.1 s, time out after 3 s: for the failure paths.
FAST = build(0.1, 3.0, name="ajw_fast")
#: Poll every 0.1 s for up to 60 s: a poll stage that lasts until it is interrupted.
SLOW = build(0.1, 60.0, name="ajw_slow")


def _append(path: str, line: str) -> int:
    with open(path, "a") as f:
        f.write(line + "\n")
    with open(path) as f:
        return len(f.read().splitlines())


def counted_spawn(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Stage 1 with a visible side effect: one line in ``payload["spawn_log"]`` per call."""
    _append(payload["spawn_log"], f"attempt {outlast.current().attempt}")
    return actions.spawn_background_job(payload)


def flaky_check(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The poll stage, failing on the job's first attempt only."""
    if outlast.current().attempt == 1:
        raise RuntimeError("the status file could not be read (transient, first attempt)")
    return actions.check_job_status_file(payload)


def approve(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Ask a person before verifying; after the resume, record their answer."""
    context = outlast.current()
    _append(payload["approve_log"], repr(context.answer))
    if context.answer is None:
        raise outlast.Pause({"question": "verify and publish the export?", "choices": ["yes"]})
    return {"answer": context.answer}, f"approved: {context.answer!r}"


def _watcher(first: Stage, second: Stage, *extra: Stage) -> list[Stage]:
    return [
        first,
        second,
        *extra,
        Stage(actions.VERIFY, actions.verify_exported_artifact),
        Stage(actions.CLEANUP, actions.cleanup_job_status_file, trigger=ALL_DONE),
    ]


#: Attempt 1 fails in the poll stage; attempt 2 must not spawn a second export.
RETRY = Pipeline(
    "ajw_retry",
    _watcher(
        Stage(actions.SPAWN, counted_spawn),
        poll(actions.AWAIT, flaky_check, until=is_ready, interval=0.1, timeout=10.0),
    ),
    attempts=2,
)

#: Pauses after the poll stage for an approval; the resume runs from the approval on.
PAUSE = Pipeline(
    "ajw_pause",
    _watcher(
        Stage(actions.SPAWN, counted_spawn),
        poll(actions.AWAIT, actions.check_job_status_file, until=is_ready, interval=0.1),
        Stage("approve", approve),
    ),
    attempts=1,
)


def crash(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A poll stage whose process dies (a segfault, an OOM kill, ``os._exit``)."""
    os._exit(3)


#: The watcher with a job timeout (1.5 s) shorter than its export: the pool kills the attempt.
DEADLINE = Pipeline("ajw_deadline", stages(0.1, 60.0), attempts=1, timeout=1.5)

#: The watcher whose poll stage kills its own process.
CRASH = Pipeline(
    "ajw_crash",
    _watcher(Stage(actions.SPAWN, actions.spawn_background_job), Stage(actions.AWAIT, crash)),
    attempts=1,
)


def work_until_canceled(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A long stage that stops at a cancel, as a well-behaved one does."""
    import time

    for _ in range(600):
        outlast.current().check_cancel()
        time.sleep(0.05)
    return {}, "worked"


def cleanup_forever(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A cleanup stage that takes far longer than any grace period."""
    import time

    time.sleep(60)
    return {}, "cleaned"


#: A cancel runs the cleanup, which outlives the pool's grace period.
STUBBORN_CLEANUP = Pipeline(
    "stubborn_cleanup",
    [Stage("work", work_until_canceled), Stage("cleanup", cleanup_forever, trigger=ALL_DONE)],
    attempts=1,
)
