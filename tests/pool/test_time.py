"""Time with real pools and workers: delayed jobs start at their time (and survive a pool
restart), timeouts end a job and everything it started, spawned jobs honour their timeout,
and a job can see its deadline."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from outlast.ids import DEDICATED
from outlast.model import Call, Kind, Status
from outlast.run.api import create_job
from outlast.run.spawn import spawn_dedicated
from tests.pool.conftest import JOBS, Harness, read_lines
from tests.waiting import alive, until

DUE: dict[str, datetime] = {}


def _delayed(pool: Harness, seconds: float, *args: object, name: str = "pt.noop") -> str:
    """Submit a job due ``seconds`` from now; its due time is kept in ``DUE`` (the claim
    clears ``run_after``, and ``created_at`` is stamped a moment after the due time is read)."""
    due = datetime.now(UTC) + timedelta(seconds=seconds)
    job_id = create_job(pool.store, name, list(args), run_after=due).id
    DUE[job_id] = due
    return job_id


@pytest.mark.timeout(90)
def test_delayed_jobs_start_at_their_time_in_order(pool: Harness) -> None:
    pool.worker("-c", "2")
    pool.ready()
    later = _delayed(pool, 2.0, "later")
    sooner = _delayed(pool, 1.0, "sooner")
    now = _delayed(pool, 0, "now")
    assert pool.get(later).status == Status.PENDING
    states = {j: pool.wait_for(j, {Status.SUCCEEDED}, 30) for j in (later, sooner, now)}
    for job_id in (later, sooner):
        state = states[job_id]
        assert state.run_after is None  # cleared by the claim
        assert state.started_at is not None
    # each started after its time (never before), and soon after it (loosely: a noisy box)
    for job_id, seconds in ((sooner, 1.0), (later, 2.0)):
        state = states[job_id]
        assert state.started_at is not None
        lateness = (state.started_at - DUE[job_id]).total_seconds()
        assert 0 <= lateness < 1.0, (job_id, seconds, lateness)
    started = sorted(states.values(), key=lambda s: s.started_at or s.created_at)
    assert [s.id for s in started] == [now, sooner, later]


@pytest.mark.timeout(90)
def test_a_delayed_job_survives_a_pool_restart(pool: Harness) -> None:
    first = pool.worker()
    pool.ready()
    job = _delayed(pool, 2.0, "after the restart")
    first.popen.send_signal(signal.SIGKILL)
    first.wait()
    assert pool.get(job).status == Status.PENDING
    pool.worker()
    state = pool.wait_for(job, {Status.SUCCEEDED}, 30)
    assert state.started_at is not None
    assert state.started_at >= DUE[job]


@pytest.mark.timeout(90)
def test_a_timed_out_job_is_killed_with_what_it_started_and_retried(pool: Harness) -> None:
    pids = pool.tmp / "pids.txt"
    pool.worker()
    pool.ready()
    job = create_job(pool.store, "pt.tree", [str(pids), 60.0], timeout=1.0, attempts=2).id
    state = pool.wait_for(job, {Status.FAILED}, 30)
    assert state.error is not None and state.error.code == "timeout"
    assert state.attempts == 2  # retried once, timed out again
    failures = [e for e in pool.store.events(job) if e.status == "failed"]
    assert len(failures) == 2
    assert all(e.message["error"]["code"] == "timeout" for e in failures)
    started = [int(p) for p in read_lines(pids)]
    assert len(started) == 4  # a child and the job's process, per attempt
    until(lambda: not any(alive(p) for p in started[::2]), 10, "the stubborn children to die")


@pytest.mark.timeout(60)
def test_a_job_sees_its_deadline(pool: Harness) -> None:
    pool.worker()
    pool.ready()
    job = create_job(pool.store, "pt.time_left", [], timeout=30.0).id
    result = pool.wait_for(job, {Status.SUCCEEDED}, 30).result
    assert 25 < result["left"] <= 30 and result["deadline"]
    none = create_job(pool.store, "pt.time_left", []).id
    assert pool.wait_for(none, {Status.SUCCEEDED}, 30).result == {"left": None, "deadline": None}


@pytest.mark.timeout(60)
def test_a_spawned_job_honours_its_timeout_and_its_tree_dies(pool: Harness) -> None:
    """Before this issue a spawned job's timeout was never read: it ran to its end."""
    pids = pool.tmp / "pids.txt"
    task = pool.store.create(
        kind=Kind.FUNCTION,
        name="pt.tree",
        call=Call(JOBS, [str(pids), 60.0], {}),
        queue=DEDICATED,
        timeout=1.0,
        grace=0.5,
    )
    begun = time.monotonic()
    spawn_dedicated(pool.store, task.id)
    state = pool.wait_for(task.id, {Status.FAILED}, 30)
    took = time.monotonic() - begun
    assert state.error is not None and state.error.code == "timeout", state
    assert "timeout of 1s" in state.error.message
    started = [int(p) for p in read_lines(pids)]
    assert len(started) == 2
    until(lambda: not any(alive(p) for p in started), 10, "the job's tree to die")
    assert took < 1.0 + 0.5 + 8.0  # interpreter start-up is most of it on a loaded box


@pytest.mark.timeout(60)
def test_a_spawned_job_that_times_out_is_retried_by_a_fresh_worker(pool: Harness) -> None:
    pids = pool.tmp / "pids.txt"
    task = pool.store.create(
        kind=Kind.FUNCTION,
        name="pt.tree",
        call=Call(JOBS, [str(pids), 60.0], {}),
        queue=DEDICATED,
        timeout=1.0,
        grace=0.2,
        max_attempts=2,
    )
    spawn_dedicated(pool.store, task.id)
    state = pool.wait_for(task.id, {Status.FAILED}, 40)
    assert state.attempts == 2 and state.error is not None and state.error.code == "timeout"
    assert len(read_lines(pids)) == 4
