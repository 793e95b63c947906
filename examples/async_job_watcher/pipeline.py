"""The async job watcher as an outlast pipeline, registered as ``async_job_watcher``.

Importing this module registers it, so a worker started with
``--import examples.async_job_watcher.pipeline`` can run it::

    spawn_background_job  ->  await_job_completion (poll every 1.0 s, up to 30.0 s, until READY)
        ->  verify_exported_artifact  ->  cleanup_job_status_file (ALL_DONE: always runs)

The payload is the seed's: ``{"delay_seconds": 1.0, "status_file": "/abs/path/status.json"}``.
Each stage's output lands in ``payload["outputs"][stage]`` and its checkpoint in
the job's ``pipeline.stages[stage]``. One attempt (the seed retries nothing); the cleanup runs on
success, failure, poll timeout and cancel, and after the worker was killed (reconcile).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from examples.async_job_watcher import actions

from outlast.pipeline import ALL_DONE, Pipeline, Stage, poll
from outlast.run import registry

NAME = "async_job_watcher"
INTERVAL = 1.0  # seconds between polls of the status file
TIMEOUT = 30.0  # seconds the poll stage may take before the pipeline fails with "timeout"


def is_ready(out: dict[str, Any]) -> bool:
    """The poll stage's condition: the export says READY."""
    return bool(out["job_status"] == actions.READY)


def stages(interval: float = INTERVAL, timeout: float = TIMEOUT) -> list[Stage]:
    """The four stages in the seed's order."""
    return [
        Stage(actions.SPAWN, actions.spawn_background_job),
        poll(
            actions.AWAIT,
            actions.check_job_status_file,
            until=is_ready,
            interval=interval,
            timeout=timeout,
        ),
        Stage(actions.VERIFY, actions.verify_exported_artifact),
        Stage(actions.CLEANUP, actions.cleanup_job_status_file, trigger=ALL_DONE),
    ]


def build(
    interval: float = INTERVAL,
    timeout: float = TIMEOUT,
    *,
    name: str = NAME,
    attempts: int = 1,
    module: str | None = None,
) -> Pipeline:
    """Build and register the pipeline under ``name`` (e.g. with a shorter poll for tests).

    A worker that does not know ``name`` yet imports the module the job names; that is
    ``module``, by default the module that calls ``build`` (so call it at import time of an
    importable module, as this one does below).
    """
    pipeline = Pipeline(name, stages(interval, timeout), attempts=attempts)
    origin = module or sys._getframe(1).f_globals.get("__name__")
    if origin and origin != pipeline.spec.module:
        # Pipeline() takes the module of its direct caller (here, this one).
        pipeline.spec = registry.register(dataclasses.replace(pipeline.spec, origin=origin))
    return pipeline


#: The pipeline with the seed's timings: poll every 1.0 s, up to 30.0 s.
pipeline = build()
