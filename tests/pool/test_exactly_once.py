"""Many jobs, several pools: every job runs to success exactly once, even with pools killed -9."""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from outlast.model import Status
from tests.pool.conftest import Harness, read_lines
from tests.waiting import alive, until

N = 1000


@pytest.mark.timeout(180)
def test_two_workers_run_every_job_exactly_once(pool: Harness) -> None:
    out = pool.tmp / "ids.txt"
    workers = [pool.worker("-c", "1"), pool.worker("-c", "1")]
    ids = [pool.submit("pt.record", str(out)) for _ in range(N)]

    states = pool.wait_all(N, timeout=150)

    assert all(w.popen.poll() is None for w in workers), f"a worker died\n{pool.describe()}"

    lines = read_lines(out)
    assert len(lines) == N, f"{len(lines)} lines for {N} jobs: some ran twice or never"
    assert set(lines) == set(ids)
    assert Counter(s.status for s in states) == {Status.SUCCEEDED: N}
    assert {s.attempts for s in states} == {1}
    assert all(s.result == s.id for s in states)
    # Both pools took part (a second pool that claims nothing would not test the claim).
    assert len({s.worker for s in states}) == 2


@dataclass
class Attempt:
    job: str
    number: int
    pid: int
    start: float
    end: float | None = None


def parse_attempts(path: Path) -> dict[str, list[Attempt]]:
    """``S id attempt pid t`` / ``E id attempt pid t`` lines → each job's attempts by start."""
    attempts: dict[tuple[str, int], Attempt] = {}
    for line in read_lines(path):
        kind, job, number, pid, t = line.split()
        key = (job, int(number))
        if kind == "S":
            assert key not in attempts, f"attempt {number} of {job} started twice"
            attempts[key] = Attempt(job, int(number), int(pid), float(t))
        else:
            assert key in attempts, f"attempt {number} of {job} ended without a start"
            attempt = attempts[key]
            assert attempt.pid == int(pid) and attempt.end is None
            attempt.end = float(t)
    by_job: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts.values():
        by_job[attempt.job].append(attempt)
    for runs in by_job.values():
        runs.sort(key=lambda a: a.start)
    return by_job


def overlaps(by_job: dict[str, list[Attempt]], kills: list[tuple[float, float]]) -> list[str]:
    """Attempts that started before the previous attempt of the same job had ended.

    ``kills`` are ``(before, after)``: the time just before a pool was sent SIGKILL and the time
    its job processes were all seen dead. An attempt with no end line was killed with its pool,
    the next one killed after its start, so it ended no earlier than ``max(start, before)``.
    """
    found = []
    for job, runs in by_job.items():
        for first, then in itertools.pairwise(runs):
            end = first.end
            if end is None:
                later = [before for before, after in kills if after > first.start]
                assert later, f"attempt {first} has no end and no kill explains it"
                end = max(first.start, later[0])
            if then.start < end:
                found.append(f"{job}: {then} started before {first} ended ({end})")
    return found


@pytest.mark.timeout(180)
def test_sigkill_of_a_worker_five_times_loses_nothing_and_never_overlaps(pool: Harness) -> None:
    out = pool.tmp / "attempts.txt"
    # Mostly short jobs, and every 10th a longer one, so that kills land mid-job; ~45 s of
    # work in all, so that the survivor alone cannot drain the queue before the fifth kill.
    ids = [pool.submit("pt.timed", str(out), 0.2 if i % 10 == 0 else 0.03) for i in range(N)]
    pool.worker("-c", "1")  # the survivor
    kills: list[tuple[float, float]] = []
    for _ in range(5):
        victim = pool.worker("-c", "2")

        def running_here(victim=victim) -> bool:  # type: ignore[no-untyped-def]
            """The victim is in the middle of a job (started, not ended)."""
            assert victim.popen.poll() is None, f"the worker died\n{pool.describe()}"
            pids = set(victim.children())
            unfinished: dict[tuple[str, str], int] = {}
            for line in read_lines(out):
                if len(line.split()) != 5:  # a line being written right now
                    continue
                kind, job, number, pid, _ = line.split()
                if kind == "S":
                    unfinished[job, number] = int(pid)
                else:
                    unfinished.pop((job, number), None)
            return bool(pids & set(unfinished.values()))

        until(running_here, 60, "the restarted worker to be running a job")
        children = victim.children()
        before = time.time()
        victim.kill()
        # Its job processes die with it (parent-death signal): none is left running unobserved.
        until(lambda c=children: not any(alive(p) for p in c), 10, "the job processes to die")
        kills.append((before, time.time()))
    pool.worker("-c", "2")  # restarted once more, to help drain

    states = pool.wait_all(N, timeout=150)

    counts = Counter(s.status for s in states)
    assert counts == {Status.SUCCEEDED: N}, counts
    by_job = parse_attempts(out)
    assert set(by_job) == set(ids)
    for state in states:
        finished = [a for a in by_job[state.id] if a.end is not None]
        assert any(a.number == state.attempts for a in finished), (
            f"{state.id}: the recorded attempt {state.attempts} never ran to its end"
        )
        assert state.attempts <= 10
    assert overlaps(by_job, kills) == []
    # The kills hit running jobs: some attempts never finished and were retried elsewhere.
    assert any(a.end is None for runs in by_job.values() for a in runs)


def test_the_overlap_check_catches_overlaps(tmp_path: Path) -> None:
    """The checker itself: an attempt that starts before the previous one ended is caught."""
    path = tmp_path / "attempts.txt"
    path.write_text(
        "S a 1 10 1.0\nE a 1 10 2.0\nS a 2 11 1.5\nE a 2 11 2.5\n"  # a: 2 starts before 1 ends
        "S b 1 10 1.0\nE b 1 10 2.0\nS b 2 11 2.1\nE b 2 11 2.5\n"  # b: fine
        "S c 1 12 3.0\nS c 2 13 3.2\nE c 2 13 3.3\n"  # c: 1 killed at 3.5 at the earliest
        "S d 1 12 3.0\nS d 2 13 3.6\nE d 2 13 3.7\n"  # d: fine
    )
    found = overlaps(parse_attempts(path), kills=[(3.5, 3.55)])
    assert [line.split(":")[0] for line in found] == ["a", "c"]
