"""Failing jobs: retries with every error kept, poison jobs, segfaults, timeouts."""

from __future__ import annotations

import time

import pytest

from outlast.model import EventStatus, Status
from tests.pool.conftest import Harness, read_lines
from tests.waiting import alive


def failures(pool: Harness, job_id: str) -> list[dict]:  # type: ignore[type-arg]
    """The ``failed`` job events: one per failed attempt, each with its error."""
    return [
        e.message
        for e in pool.store.events(job_id)
        if e.step == "job" and e.status == EventStatus.FAILED
    ]


@pytest.mark.timeout(90)
def test_fails_twice_then_succeeds_with_three_attempts(pool: Harness) -> None:
    calls = pool.tmp / "calls.txt"
    job = pool.submit("pt.flaky3", str(calls), 2)
    pool.worker()

    state = pool.wait_for(job)

    assert state.status == Status.SUCCEEDED, state
    assert state.attempts == 3
    assert state.result == 3
    assert state.error is None
    assert len(read_lines(calls)) == 3
    errors = failures(pool, job)
    assert [e["attempt"] for e in errors] == [1, 2]
    assert [e["error"]["type"] for e in errors] == ["RuntimeError", "RuntimeError"]
    assert [e["error"]["message"] for e in errors] == ["flaky failure #1", "flaky failure #2"]
    assert all(e["error"]["code"] == "error" for e in errors)


@pytest.mark.timeout(90)
def test_fails_twice_with_two_attempts_ends_failed(pool: Harness) -> None:
    calls = pool.tmp / "calls.txt"
    job = pool.submit("pt.flaky2", str(calls), 2)
    pool.worker()

    state = pool.wait_for(job)

    assert state.status == Status.FAILED, state
    assert state.attempts == 2
    assert state.error is not None
    assert state.error.code == "error"
    assert state.error.type == "RuntimeError"
    assert state.error.message == "flaky failure #2"
    assert len(read_lines(calls)) == 2  # no third call
    assert [e["error"]["message"] for e in failures(pool, job)] == [
        "flaky failure #1",
        "flaky failure #2",
    ]


@pytest.mark.timeout(90)
def test_fail_fails_at_once_without_retry(pool: Harness) -> None:
    calls = pool.tmp / "calls.txt"
    job = pool.submit("pt.fail_fast", str(calls))
    pool.worker()

    state = pool.wait_for(job)

    assert state.status == Status.FAILED, state
    assert state.attempts == 1 and state.max_attempts == 3
    assert state.error is not None and state.error.message == "no point retrying"
    assert state.error.type == "outlast.errors.Fail"
    assert read_lines(calls) == ["call"]


def test_worker_max_retries_is_the_default_attempt_limit(
    pool: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_MAX_RETRIES", "5")
    assert pool.get(pool.submit("pt.noop")).max_attempts == 5  # no attempts= of its own
    assert pool.get(pool.submit("pt.flaky2", "x", 0)).max_attempts == 2  # its own wins
    monkeypatch.delenv("WORKER_MAX_RETRIES")
    assert pool.get(pool.submit("pt.noop")).max_attempts == 3


@pytest.mark.timeout(90)
def test_a_burst_worker_waits_for_the_retries_of_its_jobs(pool: Harness) -> None:
    """``--burst`` exits once nothing is pending: a job waiting out its retry backoff is
    pending, so the burst worker runs the retry before exiting."""
    calls = pool.tmp / "calls.txt"
    job = pool.submit("pt.flaky3", str(calls), 1)
    worker = pool.worker("--burst")

    assert worker.wait(60) == 0, pool.describe()

    state = pool.get(job)
    assert state.status == Status.SUCCEEDED, f"{state}\n{pool.describe()}"
    assert state.attempts == 2


@pytest.mark.timeout(90)
def test_a_poison_job_fails_after_its_attempts_without_stalling_the_pool(pool: Harness) -> None:
    died = pool.tmp / "poison.txt"
    out = pool.tmp / "ids.txt"
    poison = pool.submit("pt.poison", str(died))
    others = [pool.submit("pt.record", str(out)) for _ in range(30)]
    worker = pool.worker("-c", "2")

    pool.wait_all(31)

    state = pool.get(poison)
    assert state.status == Status.FAILED, state
    assert state.attempts == 3
    assert state.error is not None and state.error.type == "WorkerDied"
    assert "exit code 1" in state.error.message
    assert len(read_lines(died)) == 3
    assert len(set(read_lines(died))) == 3, "each attempt runs in a fresh job process"
    errors = [e["error"] for e in failures(pool, poison)]
    assert len(errors) == 3
    assert all(e["type"] == "WorkerDied" and "exit code 1" in e["message"] for e in errors), errors
    assert all(pool.get(j).status == Status.SUCCEEDED for j in others)
    assert sorted(read_lines(out)) == sorted(others)
    assert worker.popen.poll() is None, "the pool itself died"
    # The pool still takes work.
    after = pool.submit("pt.noop", 7)
    assert pool.wait_for(after).result == 7


@pytest.mark.timeout(90)
def test_a_segfault_kills_only_its_own_job(pool: Harness) -> None:
    died = pool.tmp / "segv.txt"
    out = pool.tmp / "ids.txt"
    others = [pool.submit("pt.record", str(out), 0.05) for _ in range(3)]
    segv = pool.submit("pt.segfault", str(died))
    others += [pool.submit("pt.record", str(out)) for _ in range(10)]
    worker = pool.worker("-c", "2")

    pool.wait_all(14)

    state = pool.get(segv)
    assert state.status == Status.FAILED, state
    assert state.attempts == 1
    assert state.error is not None and state.error.type == "WorkerDied"
    assert "signal 11" in state.error.message
    (pid,) = read_lines(died)
    assert not alive(int(pid))
    assert all(pool.get(j).status == Status.SUCCEEDED for j in others)
    assert sorted(read_lines(out)) == sorted(others)
    assert worker.popen.poll() is None


@pytest.mark.timeout(60)
def test_a_job_past_its_timeout_is_killed_and_fails_with_code_timeout(pool: Harness) -> None:
    out = pool.tmp / "slow.txt"
    pool.worker()
    pool.ready()
    start = time.monotonic()
    job = pool.submit("pt.slow", str(out), 5.0)

    state = pool.wait_for(job, timeout=30)

    elapsed = time.monotonic() - start
    assert state.status == Status.FAILED, state
    assert state.error is not None and state.error.code == "timeout"
    assert elapsed < 4.5, f"the 0.5 s timeout took {elapsed:.1f}s to act"
    assert read_lines(out) == ["started"]
    after = pool.submit("pt.noop", "still working")
    assert pool.wait_for(after).status == Status.SUCCEEDED
