"""Cleanup that always runs, and work that is never redone: kills, retries, pauses, cancels."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from examples.async_job_watcher import actions

from outlast.model import JobState, Status
from outlast.store import Task
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
from tests.waiting import until_abandoned


def polling(env: Env, task: Task) -> JobState:
    """Wait until the job's poll stage has seen the export running; returns its state."""

    def ticked() -> JobState | None:
        ticks = [
            e.message
            for e in env.events(task.id)
            if e.step == actions.AWAIT and str(e.status) == "progress"
        ]
        running = len(ticks) >= 2 and str(ticks[-1]).startswith("RUNNING")
        return env.store.get(task.id) if running else None

    return wait_until(ticked, what="the poll stage to tick")


def worker_pid(state: JobState) -> int:
    assert state.worker, state
    host, _, pid = state.worker.rpartition(":")
    assert host == os.uname().nodename
    return int(pid)


def export_pid(state: JobState) -> int:
    pid: int = state.payload["outputs"][actions.SPAWN]["worker_pid"]
    return pid


def reconciled_by_status(env: Env, job_id: str) -> dict[str, Any]:
    """Call ``outlast status ID --json`` until the job is terminal (each call reconciles)."""

    def terminal() -> dict[str, Any] | None:
        doc = env.cli_json("status", job_id)
        return doc if doc["status"] in ("succeeded", "failed", "canceled") else None

    return wait_until(terminal, interval=0.2, what=f"job {job_id} to end")


def assert_abandoned_and_cleaned(env: Env, doc: dict[str, Any], status: Path, pid: int) -> None:
    assert doc["status"] == "failed"
    assert doc["error"]["code"] == "abandoned", doc["error"]
    stages = doc["pipeline"]["stages"]
    assert stages[actions.SPAWN]["status"] == "succeeded"
    assert actions.AWAIT not in stages  # interrupted: it never finished
    assert actions.VERIFY not in stages
    assert stages[actions.CLEANUP]["status"] == "succeeded"
    assert doc["payload"]["outputs"][actions.CLEANUP]["stopped_pid"] == pid
    assert status_files(status) == []
    assert not export_alive(pid)
    events = env.events(doc["id"])
    assert_stage_events(events, actions.CLEANUP)
    assert [str(e.status) for e in events if e.step == "job"][-1] == "failed"


def test_killed_dedicated_worker_is_reconciled_and_cleanup_runs(env: Env) -> None:
    status = env.status_file()
    task = pipelines.SLOW.spawn(env.payload(delay=30.0))  # the poll stage would last 30 s
    state = polling(env, task)
    pid = export_pid(state)
    os.kill(worker_pid(state), signal.SIGKILL)
    assert status.exists() and export_alive(pid)  # the export outlives the pipeline's worker
    doc = reconciled_by_status(env, task.id)
    assert_abandoned_and_cleaned(env, doc, status, pid)
    assert doc["attempts"] == 2  # the pipeline's attempt, then the finalizer's


def test_killed_pool_is_reconciled_and_cleanup_runs(env: Env) -> None:
    status = env.status_file()
    task = pipelines.SLOW.submit(env.payload(delay=30.0))
    pool = env.start_worker(burst=False)
    state = polling(env, task)
    assert worker_pid(state) == pool.pid
    pid = export_pid(state)
    pool.send_signal(signal.SIGKILL)
    pool.wait(TIMEOUT)
    # Another pool notices the dead worker within a second, and runs the cleanup.
    second = env.start_worker(burst=False)
    state = env.wait_state(task.id, lambda s: s.terminal, what="the second pool to reconcile")
    second.send_signal(signal.SIGTERM)
    assert second.wait(TIMEOUT) == 0
    assert_abandoned_and_cleaned(env, state.to_dict(), status, pid)


def test_killed_pool_then_status_then_burst_pool(env: Env) -> None:
    """``outlast status`` reconciles (the cleanup is queued), a burst pool then runs it."""
    status = env.status_file()
    task = pipelines.SLOW.submit(env.payload(delay=30.0))
    pool = env.start_worker(burst=False)
    state = polling(env, task)
    pid = export_pid(state)
    pool.send_signal(signal.SIGKILL)
    pool.wait(TIMEOUT)
    until_abandoned(env.store, task.id)  # its job processes die a moment after it
    doc = env.cli_json("status", task.id)
    assert doc["status"] == "pending" and doc["error"]["code"] == "abandoned"
    env.run_pool()
    assert_abandoned_and_cleaned(env, env.store.get(task.id).to_dict(), status, pid)


@pytest.mark.parametrize("how", ["pool", "dedicated"])
def test_retry_skips_finished_stages(env: Env, how: str) -> None:
    status = env.status_file()
    spawn_log = env.tmp / "spawn.log"
    payload = env.payload(delay=0.3, spawn_log=str(spawn_log))
    if how == "pool":
        task = pipelines.RETRY.submit(payload)
        env.run_pool()
        state = env.store.get(task.id)
        if not state.terminal:  # the retry's backoff outlasted the burst pool
            env.run_pool()
        state = env.wait_terminal(task.id)
    else:
        task = pipelines.RETRY.spawn(payload)
        state = env.wait_terminal(task.id)
    assert state.status == Status.SUCCEEDED, state.error
    assert state.attempts == 2
    assert spawn_log.read_text().splitlines() == ["attempt 1"]  # stage 1 ran once
    events = env.events(task.id)
    assert steps_of(events, actions.SPAWN) == ["started", "completed"]
    assert steps_of(events, actions.AWAIT)[:2] == ["started", "started"]  # failed, then again
    assert steps_of(events, actions.CLEANUP) == ["started", "completed"]  # once, at the end
    job = [(str(e.status), e.message) for e in events if e.step == "job"]
    assert [s for s, _ in job] == ["started", "failed", "started", "completed"]
    assert "transient" in job[1][1]["error"]["message"]
    assert state.to_dict()["pipeline"]["stages"][actions.AWAIT]["status"] == "succeeded"
    assert state.payload["outputs"][actions.VERIFY]["verified"] is True
    assert status_files(status) == []


def _pause_payload(env: Env) -> dict[str, Any]:
    return env.payload(
        delay=0.3, spawn_log=str(env.tmp / "spawn.log"), approve_log=str(env.tmp / "approve.log")
    )


def _assert_paused(env: Env, state: JobState) -> None:
    assert state.status == Status.PAUSED
    assert state.question == {"question": "verify and publish the export?", "choices": ["yes"]}
    assert state.to_dict()["pipeline"]["stages"][actions.AWAIT]["status"] == "succeeded"
    assert "approve" not in state.to_dict()["pipeline"]["stages"]
    assert env.status_file().exists()  # not cleaned up: the pipeline has not finished


def _assert_resumed(env: Env, state: JobState) -> None:
    assert state.status == Status.SUCCEEDED, state.error
    assert (env.tmp / "spawn.log").read_text().splitlines() == ["attempt 1"]
    assert (env.tmp / "approve.log").read_text().splitlines() == ["None", "'yes'"]
    assert state.payload["outputs"]["approve"] == {"answer": "yes"}
    assert state.to_dict()["pipeline"]["stages"]["approve"]["message"] == "approved: 'yes'"
    events = env.events(state.id)
    assert steps_of(events, actions.SPAWN) == ["started", "completed"]
    assert steps_of(events, actions.AWAIT).count("started") == 1
    assert steps_of(events, "approve") == ["started", "started", "completed"]
    assert [str(e.status) for e in events if e.step == "job"] == [
        "started",
        "paused",
        "progress",  # resumed
        "started",
        "completed",
    ]
    assert status_files(env.status_file()) == []


def test_pause_then_resume_at_that_stage_in_a_pool(env: Env) -> None:
    task = pipelines.PAUSE.submit(_pause_payload(env))
    env.run_pool()
    _assert_paused(env, env.store.get(task.id))
    resumed = env.cli("resume", task.id, "--answer", '"yes"')
    assert resumed.returncode == 0, resumed.stderr
    env.run_pool()
    _assert_resumed(env, env.store.get(task.id))


def test_pause_then_resume_at_that_stage_in_a_detached_worker(env: Env) -> None:
    task = pipelines.PAUSE.spawn(_pause_payload(env))
    state = env.wait_state(task.id, lambda s: s.status == Status.PAUSED, what="the pause")
    _assert_paused(env, state)
    resumed = env.cli("resume", task.id, "--answer", '"yes"')
    assert resumed.returncode == 0, resumed.stderr
    _assert_resumed(env, env.wait_terminal(task.id, timeout=4))


def _assert_canceled_and_cleaned(env: Env, task: Task, pid: int) -> None:
    status = env.status_file()
    state = env.wait_terminal(task.id)
    assert state.status == Status.CANCELED
    assert state.error is not None and state.error.code == "canceled"
    wait_until(lambda: not status_files(status), what="the cleanup stage to remove the files")
    wait_until(lambda: not export_alive(pid), what="the cleanup stage to stop the export")
    assert actions.VERIFY not in state.payload["outputs"]


def test_cancel_during_the_poll_stage_runs_cleanup_dedicated(env: Env) -> None:
    task = pipelines.SLOW.spawn(env.payload(delay=30.0))
    pid = export_pid(polling(env, task))
    canceled = env.cli("cancel", task.id)
    assert canceled.returncode == 0, canceled.stderr
    _assert_canceled_and_cleaned(env, task, pid)


def test_cancel_during_the_poll_stage_runs_cleanup_pool(env: Env) -> None:
    task = pipelines.SLOW.submit(env.payload(delay=30.0))
    pool = env.start_worker(burst=False)
    pid = export_pid(polling(env, task))
    canceled = env.cli("cancel", task.id)
    assert canceled.returncode == 0, canceled.stderr
    _assert_canceled_and_cleaned(env, task, pid)
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(TIMEOUT) == 0


def test_cancel_while_paused_runs_cleanup_pool(env: Env) -> None:
    """The seed's watcher paused for its approval, its export begun, then canceled: the
    cleanup stage still removes the files and stops the export (one more run, for the
    cleanup only), and the job is canceled. It was canceled at once, the export left."""
    task = pipelines.PAUSE.submit(_pause_payload(env))
    env.run_pool()
    paused = env.store.get(task.id)
    _assert_paused(env, paused)
    canceled = env.cli("cancel", task.id)
    assert canceled.returncode == 0, canceled.stderr
    env.run_pool()
    _assert_canceled_and_cleaned(env, task, export_pid(paused))
    assert steps_of(env.events(task.id), "approve") == ["started"]  # not asked again


def test_cancel_while_paused_runs_cleanup_dedicated(env: Env) -> None:
    """The same, spawned: the cancel starts a dedicated worker for the cleanup (pools never
    claim a spawned job; without it, whoever reconciles the job would, a few seconds on)."""
    task = pipelines.PAUSE.spawn(_pause_payload(env))
    paused = env.wait_state(task.id, lambda s: s.status == Status.PAUSED, what="the pause")
    _assert_paused(env, paused)
    canceled = env.cli("cancel", task.id)
    assert canceled.returncode == 0, canceled.stderr
    _assert_canceled_and_cleaned(env, task, export_pid(paused))


def test_cancel_while_waiting_for_a_retry_runs_cleanup_dedicated(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned, its first attempt spawned the export and failed in the poll stage; its
    dedicated worker waits out a long backoff for the retry. Canceled then, the worker runs
    the cleanup at once (not after the backoff), and the job is canceled."""
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "60")
    task = pipelines.RETRY.spawn(env.payload(delay=0.3, spawn_log=str(env.tmp / "spawn.log")))
    waiting = env.wait_state(
        task.id,
        lambda s: s.status == Status.PENDING and s.attempts == 1 and s.run_after is not None,
        what="the retry's backoff",
    )
    canceled = env.cli("cancel", task.id)
    assert canceled.returncode == 0, canceled.stderr
    _assert_canceled_and_cleaned(env, task, export_pid(waiting))
    events = env.events(task.id)
    assert steps_of(events, actions.AWAIT) == ["started"]  # never polled again
    assert steps_of(events, actions.CLEANUP) == ["started", "completed"]
    assert env.store.get(task.id).attempts == 2  # the cleanup's run
