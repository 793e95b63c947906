"""Bugs found while making the seed real; each was fixed and keeps its test."""

from __future__ import annotations

import signal

from examples.async_job_watcher import actions

from outlast.model import Status
from outlast.pipeline import Pipeline, Stage
from tests.pipeline import pipelines
from tests.pipeline.conftest import TIMEOUT, Env, status_files, wait_until
from tests.pipeline.test_recovery import export_pid, polling
from tests.waiting import until_abandoned


def _noop(payload: dict[str, object]) -> tuple[dict[str, object], str]:
    return {}, "ok"


def test_a_pipeline_name_can_be_registered_again_by_its_module() -> None:
    Pipeline("ajw_twice", [Stage("only", _noop)])
    Pipeline("ajw_twice", [Stage("only", _noop)])  # e.g. a module re-run, or build() twice


def test_cancel_records_the_cleanup_stage(env: Env) -> None:
    task = pipelines.SLOW.spawn(env.payload(delay=30.0))
    polling(env, task)
    assert env.cli("cancel", task.id).returncode == 0
    wait_until(lambda: not status_files(env.status_file()), what="the cleanup")
    # the files are gone, then the stage ends, then the job: not at once
    state = env.wait_state(task.id, lambda s: s.terminal, what="the cancel to end")
    assert state.status == Status.CANCELED
    assert state.to_dict()["pipeline"]["stages"][actions.CLEANUP]["status"] == "succeeded"


def test_a_burst_pool_reconciles_what_a_dead_pool_left(env: Env) -> None:
    task = pipelines.SLOW.submit(env.payload(delay=30.0))
    pool = env.start_worker(burst=False)
    polling(env, task)
    pool.send_signal(signal.SIGKILL)
    pool.wait(TIMEOUT)
    # (A burst pool started the moment the pool was reaped once found the job alive, in a
    # fresh-clone run: its job processes still held the pool's liveness lock.)
    until_abandoned(env.store, task.id)
    env.run_pool()
    state = env.store.get(task.id)
    assert state.status == Status.FAILED and state.error is not None
    assert state.error.code == "abandoned"


def test_a_pipeline_killed_for_its_timeout_still_cleans_up(env: Env) -> None:
    task = pipelines.DEADLINE.submit(env.payload(delay=30.0))
    env.run_pool()
    state = env.store.get(task.id)
    assert state.status == Status.FAILED and state.error is not None
    assert state.error.code == "timeout"
    assert state.to_dict()["pipeline"]["stages"][actions.CLEANUP]["status"] == "succeeded"
    assert status_files(env.status_file()) == []


def test_a_pipeline_whose_job_process_dies_still_cleans_up(env: Env) -> None:
    task = pipelines.CRASH.submit(env.payload(delay=30.0))
    env.run_pool()
    state = env.store.get(task.id)
    assert state.status == Status.FAILED
    pid = export_pid(state)
    assert state.to_dict()["pipeline"]["stages"][actions.CLEANUP]["status"] == "succeeded", pid
    assert status_files(env.status_file()) == []


def test_a_cancel_whose_cleanup_outlives_the_grace_ends_canceled_in_a_pool(env: Env) -> None:
    """Issue 12, item 7: the pool killed the cleanup after its grace period and wrote
    nothing, so the job stayed running with a cancel in progress."""
    import threading

    from outlast.run.pool import Pool

    task = pipelines.STUBBORN_CLEANUP.submit({})
    pool = Pool(env.store, 1, imports=[pipelines.MODULE], grace=1.0)
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        env.wait_state(task.id, lambda s: s.step == "work", "the work stage")
        assert env.store.open(task.id).cancel().cancel_requested
        # (under load the pool's one-second grace may end before the cleanup reports its
        # start: the job must end canceled either way)
        env.wait_state(task.id, lambda s: s.step == "cleanup" or s.terminal, "the cleanup to start")
        state = env.wait_state(task.id, lambda s: s.terminal, "the job to end")
    finally:
        pool.stop()
        runner.join(60)
    assert state.status == Status.CANCELED and state.error is not None
    assert "cleanup did not finish" in state.error.message
