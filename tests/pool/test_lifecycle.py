"""The pool's life: SIGTERM under load, requeue after the grace period, reconciling the jobs of
dead workers, and waking up at once when work arrives."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from outlast.model import EventStatus, Status
from tests.pool.conftest import Harness, read_lines
from tests.waiting import alive, until

CLAIMER = """
import sys, time
from outlast.store import open_store
store = open_store(sys.argv[1])
(task,) = store.claim(limit=1)
print(task.id, flush=True)
time.sleep(300)
"""


@pytest.mark.timeout(120)
def test_sigterm_under_load_loses_nothing(pool: Harness) -> None:
    out = pool.tmp / "ids.txt"
    ids = [pool.submit("pt.record", str(out), 0.05) for _ in range(200)]
    worker = pool.worker("-c", "2", "--grace", "1")
    until(lambda: len(read_lines(out)) >= 30, 60, "30 jobs to be done")

    worker.popen.send_signal(signal.SIGTERM)

    assert worker.wait(20) == 0, pool.describe()
    assert "job(s) processed" in worker.stderr()
    states = pool.all()
    counts = Counter(s.status for s in states)
    assert set(counts) == {Status.SUCCEEDED, Status.PENDING}, counts
    for state in states:
        if state.status == Status.PENDING:  # never run, or given back without the attempt
            # attempts only goes up (it fences the old worker); a released attempt is given
            # back by raising max_attempts, so none of the allowance was used
            assert state.max_attempts - state.attempts == 3 and state.worker is None, state
        else:
            assert state.attempts == 1, state
    done = {s.id for s in states if s.status == Status.SUCCEEDED}
    assert sorted(read_lines(out)) == sorted(done), "a job ran without its outcome recorded"

    drain = pool.worker("-c", "2", "--burst")
    assert drain.wait(60) == 0, pool.describe()

    states = pool.all()
    assert Counter(s.status for s in states) == {Status.SUCCEEDED: 200}
    # a released attempt still counts in `attempts` (the fencing token) but not against the limit
    assert {s.attempts - (s.max_attempts - 3) for s in states} == {1}
    lines = read_lines(out)
    assert len(lines) == 200 and set(lines) == set(ids)


@pytest.mark.timeout(90)
def test_sigterm_past_the_grace_period_requeues_running_jobs_uncounted(pool: Harness) -> None:
    out = pool.tmp / "attempts.txt"
    jobs = [pool.submit("pt.timed", str(out), 60) for _ in range(3)]
    worker = pool.worker("-c", "2", "--grace", "0.5")
    until(lambda: len(read_lines(out)) == 2, 60, "two jobs to start")
    children = worker.children()
    assert len(children) == 2

    start = time.monotonic()
    worker.popen.send_signal(signal.SIGTERM)

    assert worker.wait(20) == 0, pool.describe()
    assert time.monotonic() - start < 15
    assert not any(alive(pid) for pid in children)
    running = {line.split()[1] for line in read_lines(out)}
    assert len(running) == 2
    for job in jobs:
        state = pool.get(job)
        assert state.status == Status.PENDING, state
        assert state.worker is None, state
        released = [e for e in pool.store.events(job) if (e.message or {}) == {"released": True}]
        if job in running or state.attempts:  # started (or claimed ahead): given back uncounted
            assert state.attempts == 1 and state.max_attempts == 11, state
            assert len(released) == 1, pool.store.events(job)
        else:  # long jobs are not claimed ahead: the third was never taken
            assert state.attempts == 0 and state.max_attempts == 10 and not released, state
    assert all(line.startswith("S ") for line in read_lines(out))  # none finished


@pytest.mark.timeout(90)
def test_sigterm_past_the_grace_period_kills_what_the_running_job_started(
    pool: Harness,
) -> None:
    """The job's own child ignores SIGTERM: once the grace is over it goes with the job's
    process, not left running after the pool (nor kept from a pool that runs the job again)."""
    out = pool.tmp / "pids.txt"
    job = pool.submit("pt.tree", str(out), 60)
    worker = pool.worker("-c", "1", "--grace", "0.5")
    until(lambda: len(read_lines(out)) == 2, 60, "the job and its child to start")
    child, job_process = (int(pid) for pid in read_lines(out))

    worker.popen.send_signal(signal.SIGTERM)

    assert worker.wait(20) == 0, pool.describe()
    until(lambda: not alive(child) and not alive(job_process), 10, "the job's tree to be gone")
    assert pool.get(job).status == Status.PENDING


@pytest.mark.timeout(90)
def test_the_pool_reconciles_a_job_whose_claimer_died(pool: Harness) -> None:
    out = pool.tmp / "ids.txt"
    job = pool.submit("pt.record", str(out))
    claimer = pool.background(CLAIMER, pool.url)
    assert claimer.stdout is not None
    assert claimer.stdout.readline().strip() == job
    claimed = pool.get(job)
    assert claimed.status == Status.RUNNING
    assert claimed.worker is not None and claimed.worker.endswith(f":{claimer.pid}")
    pool.worker()
    pool.ready()
    assert pool.get(job).status == Status.RUNNING  # the live claimer keeps its job

    os.kill(claimer.pid, signal.SIGKILL)
    claimer.wait()
    dead = time.monotonic()

    def abandoned() -> bool:
        return any(
            e.status == EventStatus.FAILED and e.message["error"]["code"] == "abandoned"
            for e in pool.store.events(job)
        )

    until(abandoned, 10, "the pool to reconcile the job")
    elapsed = time.monotonic() - dead
    assert elapsed < 3.0, f"reconciled {elapsed:.1f}s after its worker died"
    state = pool.wait_for(job, timeout=30)
    assert state.status == Status.SUCCEEDED, state
    assert state.attempts == 2
    assert read_lines(out) == [job]


@pytest.mark.timeout(90)
def test_an_idle_worker_is_woken_by_a_new_job(pool: Harness) -> None:
    """Submit → start takes milliseconds, not a poll interval.

    Polling alone would take up to a second (the pool wakes at least once a second to
    reconcile; its backoff is longer by then): each sample waits out a random idle period, so
    a pool that only polled would miss the 0.25 s mark three times in four.
    """
    marks = pool.tmp / "starts.txt"
    pool.worker(env={"WORKER_POLL_MIN": "0.05", "WORKER_POLL_MAX": "2"})
    pool.ready()
    rng = random.Random()
    latencies = []
    for _ in range(5):
        time.sleep(1.2 + rng.random())  # idle: the poll backoff climbs past a second
        submitted = time.time()
        job = pool.submit("pt.mark_start", str(marks))
        line = until(
            lambda job=job: [x for x in read_lines(marks) if x.startswith(job)], 10, "the job"
        )[0]
        latencies.append(float(line.split()[1]) - submitted)
        pool.wait_for(job)

    assert max(latencies) < 1.5, latencies
    assert sum(1 for x in latencies if x < 0.25) >= 4, latencies


@pytest.mark.timeout(60)
def test_a_job_gets_its_arguments_exactly_even_beyond_64_bits(pool: Harness) -> None:
    """The job process receives the claimed document from the pool: numbers that orjson
    would read back as floats still arrive as the exact integers (and come back so)."""
    pool.worker("-c", "1")
    values = [2**64 + 1, -(2**63) - 1, 10**30, 1.5, "12345678901234567890123"]
    jobs = {pool.submit("pt.noop", value): value for value in values}
    for job, value in jobs.items():
        state = pool.wait_for(job, timeout=30)
        assert state.status == Status.SUCCEEDED, pool.describe()
        assert type(state.result) is type(value) and state.result == value


@pytest.mark.timeout(90)
def test_long_jobs_are_not_claimed_ahead(pool: Harness) -> None:
    """Claiming ahead is for short jobs: a pool that has not seen its jobs be short claims
    only for its idle process, so the rest of a queue of long jobs stays ``pending`` for any
    other pool (while one job's outcome waits to be written, the next may already run)."""
    out = pool.tmp / "ids.txt"
    jobs = [pool.submit("pt.record", str(out), 0.4) for _ in range(5)]
    pool.worker("-c", "1")
    most = 0
    while len(read_lines(out)) < len(jobs):
        states = [pool.get(j) for j in jobs]
        most = max(most, sum(s.status == Status.RUNNING for s in states))
        time.sleep(0.02)
    assert most >= 1 and most <= 2, f"{most} jobs were running at once with -c 1"
    assert all(pool.wait_for(j, timeout=30).status == Status.SUCCEEDED for j in jobs)


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add(link)
    return found


@pytest.mark.timeout(60)
def test_the_first_job_processes_are_forked_and_a_replacement_spawned(pool: Harness) -> None:
    """``outlast worker -c 2`` forks its two job processes (their command line is the pool's:
    no interpreter started, nothing imported again); neither keeps a socket of the pool's
    open (the second would hold the pool's end of the first's).
    A job process that dies is replaced by a spawned one (``python -m outlast.run.jobproc``)."""
    worker = pool.worker("-c", "2")
    assert pool.wait_for(pool.submit("pt.noop", 1), timeout=30).status == Status.SUCCEEDED
    # what a worker imports before its first job, none of which it needs for a function job
    # (~40 ms of its start-up here, BENCHMARKS.md issue #18): its job processes show it
    heavy = ["multiprocessing", "psutil"]
    assert pool.wait_for(pool.submit("pt.modules", heavy), timeout=30).result == []
    children = until(lambda: len(worker.children()) == 2 and worker.children(), 10, "two")
    pool_cmdline = _cmdline(worker.pid)
    for pid in children:
        assert _cmdline(pid) == pool_cmdline
    pools = _sockets(worker.pid)  # its ends of the job processes' sockets among them
    for pid in children:  # each holds its own end, and none of the pool's
        assert _sockets(pid) and not _sockets(pid) & pools, (pid, _sockets(pid), pools)
    out = pool.tmp / "poison.txt"
    pool.wait_for(pool.submit("pt.poison", str(out)), {Status.FAILED}, timeout=30)
    fresh = until(
        lambda: [p for p in worker.children() if p not in children] or None, 10, "a new one"
    )
    assert all(b"outlast.run.jobproc" in _cmdline(p) for p in fresh)
    assert pool.wait_for(pool.submit("pt.noop", 2), timeout=30).status == Status.SUCCEEDED


@pytest.mark.timeout(120)
def test_jobs_claimed_ahead_go_back_when_every_process_runs_long(pool: Harness) -> None:
    """A pool whose jobs have been short claims jobs ahead; if every one of its processes
    then runs a long job, what it holds goes back to the queue for another pool to run, not
    waiting there until one of those ends. (It waited: a test's probe job sat behind two
    30 s jobs of a pool while another pool idled.)"""
    marks = pool.tmp / "long.txt"
    holder = pool.worker("-c", "1")
    pool.ready()  # a short job: the holder now claims ahead
    long_job = pool.submit("pt.slow_stop", str(marks), cleanup=0.0)
    until(lambda: read_lines(marks) == ["started"], 30, "the long job to start")
    quick = pool.submit("pt.noop", "quick")
    # the holder claims it ahead (a machine so loaded that even the probe ran over 50 ms
    # makes the holder leave it in the queue, which is right too: then nothing is shown)
    with contextlib.suppress(AssertionError):
        until(lambda: pool.get(quick).status != Status.PENDING, 5, "the holder to claim it")
    other = pool.worker("-c", "1")
    state = pool.wait_for(quick, {Status.SUCCEEDED}, 20, "the quick job, given back, to run")
    assert state.worker is not None and state.worker.endswith(f":{other.pid}"), state.worker
    # given back unstarted, the attempt is given back: attempts (the fencing token) never
    # goes down, max_attempts goes up (2 of 4, or 1 of 3 had the holder not claimed it)
    assert state.max_attempts - state.attempts == 2, state
    assert pool.get(long_job).status == Status.RUNNING  # it ran beside the long job
    assert holder.popen.poll() is None
    pool.store.open(long_job).cancel()
    pool.wait_for(long_job, {Status.CANCELED}, 30)
