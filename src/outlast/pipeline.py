"""Pipelines, for users: ``from outlast.pipeline import Pipeline, Stage, poll, ALL_DONE``.

A pipeline is a job made of named stages that run in order under Airflow-style trigger rules
(``ALL_SUCCESS``, ``ALL_DONE`` — cleanup that always runs — and ``ONE_FAILED``). This module
is the public face only: the pure rules live in :mod:`outlast.stages` and the code that runs a
pipeline in :mod:`outlast.run.pipeline`.
"""

from __future__ import annotations

from outlast.errors import PollTimeout
from outlast.run.pipeline import Pipeline
from outlast.stages import ALL_DONE, ALL_SUCCESS, ONE_FAILED, TRIGGERS, Stage, StageFn, poll

__all__ = [
    "ALL_DONE",
    "ALL_SUCCESS",
    "ONE_FAILED",
    "TRIGGERS",
    "Pipeline",
    "PollTimeout",
    "Stage",
    "StageFn",
    "poll",
]
