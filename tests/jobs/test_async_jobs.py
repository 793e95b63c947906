"""``async def`` jobs: on an event loop in a process pool's job process, and many at once
in an async pool (``outlast worker --async``), with cancel, timeouts, logs, a SIGKILL and a
SIGTERM handled as for any job."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from outlast.model import Status
from tests.jobs import pyjobs
from tests.pool.conftest import Harness
from tests.waiting import until


def _async_worker(pool: Harness, *args: str, env: dict[str, str] | None = None) -> object:
    return pool.worker("--async", *args, env=env)


@pytest.mark.parametrize("mode", ["process", "async"])
def test_an_async_job_runs_and_returns(pool: Harness, mode: str) -> None:
    job_id = pool.submit("py.anap", 0.05)
    said = pool.submit("py.aprint", "hello from a coroutine")
    pool.worker("--import", pyjobs.MODULE, *(["--async"] if mode == "async" else []))
    state = pool.wait_for(job_id)
    assert (state.status, state.result) == (Status.SUCCEEDED, 0.05)
    assert pool.wait_for(said).status == Status.SUCCEEDED
    assert pool.cli("logs", said).stdout == "hello from a coroutine\n"
    assert [e.step for e in pool.store.events(said)][1:2] == ["said"]


def test_an_async_pool_runs_a_plain_function_in_a_thread(pool: Harness) -> None:
    # its outcomes as in a process pool: a return, a failure with its traceback
    fine = pool.submit("py.one", 41)
    bad = pool.submit("py.boom", "not this")
    _async_worker(pool, "--import", pyjobs.MODULE)
    state = pool.wait_for(fine)
    assert (state.status, state.result) == (Status.SUCCEEDED, 41)
    failed = pool.wait_for(bad)
    assert failed.status == Status.FAILED and failed.error is not None
    assert "not this" in failed.error.message and "_deep" in (failed.error.traceback or "")


@pytest.mark.parametrize("mode", ["process", "async"])
def test_cancel_cancels_the_coroutine(pool: Harness, tmp_path: Path, mode: str) -> None:
    marker = tmp_path / "marker"
    pool.worker("--import", pyjobs.MODULE, *(["--async"] if mode == "async" else []))
    job_id = pool.submit("py.anap", 60, str(marker))
    pool.wait_for(job_id, {Status.RUNNING})
    time.sleep(0.2)
    assert pool.cli("cancel", job_id).returncode == 0
    # written with write_text: the file exists a moment before its text does
    until(lambda: marker.exists() and marker.read_text(), 10, "the CancelledError seen")
    assert marker.read_text() == "cancelled"
    assert pool.get(job_id).status == Status.CANCELED
    # a job that swallows the CancelledError stops at its own check_cancel()
    checked = tmp_path / "checked"
    other = pool.submit("py.acheck", str(checked))
    pool.wait_for(other, {Status.RUNNING})
    time.sleep(0.2)
    pool.cli("cancel", other)
    until(lambda: checked.exists() and checked.read_text(), 10, "check_cancel() to raise")
    assert checked.read_text() == "Canceled"


@pytest.mark.parametrize("mode", ["process", "async"])
def test_a_timeout_cancels_the_coroutine_and_is_retried(pool: Harness, mode: str) -> None:
    job_id = pool.submit("py.ato")
    pool.worker("--import", pyjobs.MODULE, *(["--async"] if mode == "async" else []))
    state = pool.wait_for(job_id, timeout=30)
    assert state.status == Status.FAILED
    assert state.attempts == 2, "a timed-out attempt is retried while attempts are left"
    assert state.error is not None and state.error.code == "timeout"


def test_an_async_pool_runs_a_thousand_sleeps_at_once(pool: Harness) -> None:
    ids = [pool.submit("py.anap", 0.1) for _ in range(1000)]
    started = time.monotonic()
    worker = pool.worker("--import", pyjobs.MODULE, "--async", "-c", "200", "--burst")
    assert worker.wait(120) == 0, worker.stderr()
    took = time.monotonic() - started
    states = [pool.get(job_id) for job_id in ids]
    assert all(s.status == Status.SUCCEEDED for s in states)
    # how many ran at once: the most runs that overlap one moment
    moments = sorted(
        [(s.started_at, 1) for s in states] + [(s.finished_at, -1) for s in states],
        key=lambda m: (m[0], m[1]),
    )
    running = most = 0
    for _, step in moments:
        running += step
        most = max(most, running)
    assert most > 100, f"at most {most} at once"
    assert took < 60, took  # 1,000 x 0.1 s one at a time would be 100 s


def test_a_sigkilled_async_pool_is_reconciled_like_any(pool: Harness, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    ids = [pool.submit("py.anap_once", 60, 0.01, str(starts)) for _ in range(5)]
    first = pool.worker("--import", pyjobs.MODULE, "--async", "-c", "10")
    for job_id in ids:
        pool.wait_for(job_id, {Status.RUNNING})
    until(lambda: starts.exists() and len(starts.read_text().split()) == 5, 10, "all five to start")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    pool.worker("--import", pyjobs.MODULE, "--async", "-c", "10")
    for job_id in ids:
        state = pool.wait_for(job_id, timeout=60)
        assert (state.status, state.result) == (Status.SUCCEEDED, 2), state
    assert sorted(starts.read_text().split()) == ["1"] * 5 + ["2"] * 5


def test_sigterm_gives_running_async_jobs_back_uncounted(pool: Harness, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    ids = [pool.submit("py.anap_once", 60, 0.01, str(starts)) for _ in range(3)]
    worker = pool.worker("--import", pyjobs.MODULE, "--async", "--grace", "0.5")
    for job_id in ids:
        pool.wait_for(job_id, {Status.RUNNING})
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()
    for job_id in ids:
        state = pool.get(job_id)
        # given back: the attempt does not count against the limit (attempts is the fencing
        # token, it only goes up; max_attempts gives the attempt back)
        assert (state.status, state.attempts, state.max_attempts) == (Status.PENDING, 1, 4)
        released = [e for e in pool.store.events(job_id) if e.message == {"released": True}]
        assert len(released) == 1


def test_an_async_pool_on_postgresql(tmp_path: Path) -> None:
    from tests.pg.support import make_url

    url = make_url(tmp_path)
    if url is None:
        pytest.skip("no PostgreSQL here")
    pool = Harness(tmp_path, url)
    try:
        ids = [pool.submit("py.anap", 0.2) for _ in range(50)]
        said = pool.submit("py.aprint", "from the database")
        worker = pool.worker("--import", pyjobs.MODULE, "--async", "-c", "50", "--burst")
        assert worker.wait(60) == 0, worker.stderr()
        assert all(pool.get(job_id).status == Status.SUCCEEDED for job_id in ids)
        assert pool.cli("logs", said).stdout == "from the database\n"
    finally:
        pool.close()
