"""A person in the loop: pause → resume with an answer, and cancel in every live status."""

from __future__ import annotations

import json

import pytest

from outlast.errors import InvalidTransition
from outlast.model import Status
from tests.pool.conftest import Harness, read_lines
from tests.waiting import alive, until


@pytest.mark.timeout(60)
def test_pause_then_resume_with_an_answer_the_job_receives_it(pool: Harness) -> None:
    runs = pool.tmp / "runs.txt"
    pool.worker()
    job = pool.submit("pt.ask", "proceed?", str(runs))

    paused = pool.wait_for(job, {Status.PAUSED}, timeout=30)
    assert paused.question == "proceed?"
    assert paused.worker is None
    pool.store.open(job).resume({"go": [1, 2]})
    state = pool.wait_for(job, timeout=30)

    assert state.status == Status.SUCCEEDED, state
    assert state.result == {"answer": {"go": [1, 2]}}
    assert state.answer == {"go": [1, 2]}
    assert read_lines(runs) == ["run 1", "run 2"]


@pytest.mark.timeout(60)
def test_resume_from_the_cli_with_an_answer(pool: Harness) -> None:
    pool.worker()
    job = pool.submit("pt.ask", "ok?")
    pool.wait_for(job, {Status.PAUSED}, timeout=30)

    result = pool.cli("resume", job, "--answer", '{"ok": true}', "--json")

    assert result.returncode == 0, result
    assert json.loads(result.stdout)["status"] in ("pending", "running", "succeeded")
    state = pool.wait_for(job, timeout=30)
    assert state.status == Status.SUCCEEDED, state
    assert state.result == {"answer": {"ok": True}}


@pytest.mark.timeout(60)
def test_cancel_of_a_pending_job_never_runs_it(pool: Harness) -> None:
    out = pool.tmp / "ids.txt"
    canceled = pool.submit("pt.record", str(out))
    kept = pool.submit("pt.record", str(out))
    result = pool.cli("cancel", canceled)
    assert result.returncode == 0, result

    worker = pool.worker("--burst")
    assert worker.wait(60) == 0, pool.describe()

    state = pool.get(canceled)
    assert state.status == Status.CANCELED
    assert state.attempts == 0
    assert state.error is not None and state.error.code == "canceled"
    assert pool.get(kept).status == Status.SUCCEEDED
    assert read_lines(out) == [kept]


@pytest.mark.timeout(60)
def test_cancel_of_a_running_job_that_checks_for_it_stops_it(pool: Harness) -> None:
    marks = pool.tmp / "marks.txt"
    worker = pool.worker("-c", "1")
    job = pool.submit("pt.cooperative", str(marks))
    until(lambda: read_lines(marks) == ["started"], 30, "the job to start")

    result = pool.cli("cancel", job)

    assert result.returncode == 0, result
    until(lambda: "stopped" in read_lines(marks), 10, "the job to see the cancel and stop")
    assert pool.get(job).status == Status.CANCELED
    # The pool carries on with the next job.
    after = pool.submit("pt.noop", 1)
    assert pool.wait_for(after, timeout=30).status == Status.SUCCEEDED
    assert pool.get(job).status == Status.CANCELED
    assert worker.popen.poll() is None


@pytest.mark.timeout(60)
def test_cancel_of_a_running_job_that_ignores_it_kills_its_process(pool: Harness) -> None:
    marks = pool.tmp / "pid.txt"
    worker = pool.worker("-c", "1", "--grace", "1")
    job = pool.submit("pt.stubborn", str(marks))
    pid = int(until(lambda: read_lines(marks), 30, "the job to start")[0])

    pool.store.open(job).cancel()

    until(lambda: not alive(pid), 12, "the pool to kill the job's process")
    assert pool.get(job).status == Status.CANCELED
    assert read_lines(marks) == [str(pid)]  # never woke up
    # The pool keeps working afterwards, with a fresh job process.
    after = pool.submit("pt.noop", 2)
    assert pool.wait_for(after, timeout=30).status == Status.SUCCEEDED
    assert pool.get(job).status == Status.CANCELED
    assert worker.popen.poll() is None
    assert pid not in worker.children()


@pytest.mark.timeout(60)
def test_cancel_of_a_paused_job(pool: Harness) -> None:
    pool.worker()
    job = pool.submit("pt.ask", "really?")
    pool.wait_for(job, {Status.PAUSED}, timeout=30)

    result = pool.cli("cancel", job, "--json")

    assert result.returncode == 0, result
    assert json.loads(result.stdout)["status"] == "canceled"
    assert pool.get(job).status == Status.CANCELED
    with pytest.raises(InvalidTransition):
        pool.store.open(job).resume("too late")
    refused = pool.cli("resume", job, "--answer", "1")
    assert refused.returncode == 2
    assert refused.stderr.startswith("outlast: error:")
    assert pool.get(job).status == Status.CANCELED


@pytest.mark.timeout(90)
def test_a_job_ignoring_cancel_is_killed_within_ten_seconds_even_with_a_long_grace(
    pool: Harness,
) -> None:
    marks = pool.tmp / "pid.txt"
    pool.worker("-c", "1")  # the default --grace is 30 s; a cancel waits 10 s at most
    job = pool.submit("pt.stubborn", str(marks))
    pid = int(until(lambda: read_lines(marks), 30, "the job to start")[0])

    pool.store.open(job).cancel()

    until(lambda: not alive(pid), 14, "the pool to kill the job's process")
    assert pool.get(job).status == Status.CANCELED
