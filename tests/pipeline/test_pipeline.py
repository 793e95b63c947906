"""The async job watcher as an outlast pipeline: end to end, and every way it can fail.

Workers are real processes: a dedicated detached worker (``Pipeline.spawn``), an
``outlast worker`` subprocess, or an in-process pool whose jobs run in job processes.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from examples.async_job_watcher import actions
from examples.async_job_watcher.pipeline import pipeline as seed_pipeline

from outlast.model import JobState, ProgressEvent, Status
from tests.pipeline import pipelines
from tests.pipeline.conftest import (
    TIMEOUT,
    Env,
    assert_stage_events,
    export_alive,
    status_files,
    steps_of,
    wait_until,
)

STAGES = [actions.SPAWN, actions.AWAIT, actions.VERIFY, actions.CLEANUP]


def assert_succeeded(state: JobState, events: list[ProgressEvent], status_file: Path) -> None:
    """A finished, successful run: events in order, outputs and checkpoints in the payload."""
    assert state.status == Status.SUCCEEDED, state.error
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert (events[0].step, str(events[0].status)) == ("job", "started")
    assert (events[-1].step, str(events[-1].status)) == ("job", "completed")
    # Each stage: started … completed, and the stages one after the other in the seed's order.
    order = [e.step for e in events[1:-1]]
    assert [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s] == STAGES
    for stage in STAGES:
        assert_stage_events(events, stage)
    ticks = [e for e in events if e.step == actions.AWAIT and str(e.status) == "progress"]
    assert ticks and ticks[-1].message == "READY 100%"
    assert all(str(e.status) != "progress" for e in events if e.step != actions.AWAIT)

    payload = state.payload
    for stage in STAGES:
        record = state.to_dict()["pipeline"]["stages"][stage]
        assert record["status"] == "succeeded"
        completed = [e for e in events if e.step == stage and str(e.status) == "completed"]
        assert record["message"] == completed[0].message  # the event's message is the stage's
    outputs = payload["outputs"]
    spawned = outputs[actions.SPAWN]
    assert spawned["status_file"] == str(status_file)
    assert isinstance(spawned["worker_pid"], int)
    ready = outputs[actions.AWAIT]
    assert ready["job_status"] == "READY" and ready["progress_pct"] == 100
    assert ready["artifact_rows"] > 0 and len(ready["artifact_sha256"]) == 64
    assert outputs[actions.VERIFY] == {
        "verified": True,
        "artifact_rows": ready["artifact_rows"],
        "artifact_sha256": ready["artifact_sha256"],
    }
    assert outputs[actions.CLEANUP]["removed"]
    assert state.result == {"outputs": outputs}
    assert status_files(status_file) == []
    assert Path(f"{status_file}.csv").exists()  # the verified artifact is the deliverable


def test_seed_pipeline_in_a_detached_worker(env: Env) -> None:
    """The seed's exact timings (poll every 1.0 s up to 30.0 s, delay 1.0) in ``spawn``."""
    _, poll_stage, _, cleanup = seed_pipeline.stages
    assert (poll_stage.interval, poll_stage.timeout) == (1.0, 30.0)
    assert cleanup.trigger == "all_done" and poll_stage.until is not None
    assert seed_pipeline.spec.attempts == 1

    status = env.status_file()
    task = seed_pipeline.spawn({"delay_seconds": 1.0, "status_file": str(status)})
    state = env.wait_terminal(task.id)
    events = env.events(task.id)
    assert_succeeded(state, events, status)
    assert state.kind == "pipeline" and state.name == "async_job_watcher"
    assert state.attempts == 1
    ticks = [e.at for e in events if e.step == actions.AWAIT and str(e.status) == "progress"]
    assert len(ticks) >= 2  # a 1.0 s export is not ready at the first look
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # polled every 1.0 s
    # The CLI reads the same document (what SKILL.md tells an agent to do).
    doc = env.cli_json("status", task.id)
    assert doc["status"] == "succeeded" and doc["error"] is None
    assert doc["payload"]["outputs"] == state.payload["outputs"]
    assert doc["pipeline"]["stages"][actions.CLEANUP]["status"] == "succeeded"


def test_pipeline_through_an_outlast_worker_process(env: Env) -> None:
    status = env.status_file()
    task = seed_pipeline.submit(env.payload(delay=0.5))
    worker = env.start_worker("examples.async_job_watcher.pipeline")
    assert worker.wait(TIMEOUT) == 0
    state = env.store.get(task.id)
    assert_succeeded(state, env.events(task.id), status)
    waited = env.cli("wait", task.id, "--json", "--timeout", "5")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["payload"]["outputs"][actions.VERIFY]["verified"] is True
    assert env.cli("rm", task.id).returncode == 0
    gone = env.cli("status", task.id)
    assert gone.returncode == 2 and task.id in gone.stderr


def test_submit_with_a_payload_from_the_cli(env: Env) -> None:
    """The SKILL.md recipe: ``outlast submit NAME --payload JSON --import MODULE``."""
    status = env.status_file()
    payload = json.dumps(env.payload(delay=0.3))
    module = "examples.async_job_watcher.pipeline"
    done = env.cli("submit", "async_job_watcher", "--payload", payload, "--import", module)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert env.start_worker(module).wait(TIMEOUT) == 0
    doc = env.cli_json("status", job_id)
    assert doc["status"] == "succeeded", doc["error"]
    assert doc["payload"]["outputs"][actions.VERIFY]["verified"] is True
    assert status_files(status) == []


def assert_failed_with_cleanup(state: JobState, status_file: Path, code: str = "error") -> None:
    assert state.status == Status.FAILED
    assert state.error is not None and state.error.code == code, state.error
    cleanup = state.to_dict()["pipeline"]["stages"][actions.CLEANUP]
    assert cleanup["status"] == "succeeded", cleanup
    assert status_files(status_file) == []


@pytest.mark.parametrize(
    ("knob", "match"),
    [
        ({"rows": 0}, "artifact_rows=0"),
        ({"empty_sha": True}, "artifact_sha256 is empty"),
        ({"corrupt_sha": True}, "checksum mismatch"),
        ({"tamper_artifact": True}, "checksum mismatch"),
    ],
    ids=["zero-rows", "empty-checksum", "wrong-checksum", "tampered-artifact"],
)
def test_verify_failure_fails_the_pipeline_and_cleans_up(
    env: Env, knob: dict[str, Any], match: str
) -> None:
    status = env.status_file()
    task = pipelines.FAST.submit(env.payload(delay=0.2, **knob))
    env.run_pool()
    state = env.store.get(task.id)
    assert_failed_with_cleanup(state, status)
    assert state.error is not None and state.error.type == "RuntimeError"
    assert match.split("=")[0] in state.error.message
    assert state.to_dict()["pipeline"]["stages"][actions.VERIFY]["status"] == "failed"
    assert state.to_dict()["pipeline"]["stages"][actions.AWAIT]["status"] == "succeeded"
    assert actions.VERIFY not in state.payload["outputs"]
    events = env.events(state.id)
    assert_stage_events(events, actions.VERIFY, end="failed")
    assert_stage_events(events, actions.CLEANUP)
    assert not Path(f"{status}.csv").exists()  # a rejected artifact is removed
    assert state.attempts == 1  # the seed retries nothing


def test_never_ready_times_out_and_cleans_up(env: Env) -> None:
    status = env.status_file()
    task = pipelines.FAST.submit(env.payload(delay=0.2, never_ready=True))
    env.run_pool()
    state = env.store.get(task.id)
    assert_failed_with_cleanup(state, status, code="timeout")
    assert "not ready after 3s" in state.error.message  # type: ignore[union-attr]
    stages = state.to_dict()["pipeline"]["stages"]
    assert stages[actions.AWAIT]["status"] == "failed"
    assert stages[actions.VERIFY]["status"] == "skipped"
    last_tick = state.payload["outputs"][actions.AWAIT]
    assert last_tick["job_status"] == "RUNNING" and last_tick["progress_pct"] < 100
    events = env.events(state.id)
    assert steps_of(events, actions.AWAIT).count("progress") >= 10
    assert steps_of(events, actions.VERIFY) == ["skipped"]
    # Cleanup stopped the export, which would otherwise keep rewriting the status file.
    pid = state.payload["outputs"][actions.SPAWN]["worker_pid"]
    assert state.payload["outputs"][actions.CLEANUP]["stopped_pid"] == pid
    assert not export_alive(pid)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda env: {"delay_seconds": 1.0}, "status_file'] is missing"),
        (lambda env: env.payload(delay=-1), "delay_seconds'] must be >= 0"),
        (lambda env: env.payload(delay="soon"), "delay_seconds'] must be a number"),
        (
            lambda env: {"status_file": str(env.work / "no" / "such" / "dir" / "s.json")},
            "does not exist",
        ),
    ],
    ids=["missing-status-file", "negative-delay", "non-numeric-delay", "missing-directory"],
)
def test_bad_payload_fails_clearly_and_cleanup_is_safe(env: Env, make: Any, match: str) -> None:
    task = pipelines.FAST.submit(make(env))
    env.run_pool()
    state = env.store.get(task.id)
    assert state.status == Status.FAILED
    assert state.error is not None and state.error.type == "ValueError"
    assert match in state.error.message
    stages = state.to_dict()["pipeline"]["stages"]
    assert stages[actions.SPAWN]["status"] == "failed"
    assert match in stages[actions.SPAWN]["message"]
    assert stages[actions.AWAIT]["status"] == stages[actions.VERIFY]["status"] == "skipped"
    assert stages[actions.CLEANUP]["status"] == "succeeded"
    assert stages[actions.CLEANUP]["message"].startswith("nothing to clean")
    assert list(env.work.iterdir()) == []  # nothing was started, nothing was written


def test_pipelines_side_by_side(env: Env) -> None:
    """Two pool processes, four pipelines, each with its own status file."""
    payloads = [env.payload(f"job{i}", delay=0.3) for i in range(4)]
    tasks = [pipelines.FAST.submit(p) for p in payloads]
    env.run_pool(concurrency=2)
    for task, payload in zip(tasks, payloads, strict=True):
        state = env.store.get(task.id)
        assert_succeeded(state, env.events(task.id), Path(payload["status_file"]))
    pids = {env.store.get(t.id).payload["outputs"][actions.SPAWN]["worker_pid"] for t in tasks}
    assert len(pids) == 4
    wait_until(lambda: not any(export_alive(p) for p in pids), what="the exports to exit")
