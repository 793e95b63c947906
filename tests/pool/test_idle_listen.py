"""A pool listens to the queue and to interrupts only (a running job canceled or deleted):
other queues' jobs never wake it, yet it takes its own queue's jobs at once, a cancel of a
job it runs reaches it, and a job it claimed ahead that was canceled before it started is
never started; on every store that pushes notifications."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from outlast.model import Kind, Status
from outlast.run import pool as pool_module
from outlast.run.api import create_job
from outlast.run.pool import Pool
from outlast.store import open_store
from tests.pool import jobs_for_tests
from tests.pool.conftest import read_lines
from tests.waiting import until


def _settled(pool: Pool) -> None:
    """Until the pool's loop has not turned for 0.3 s (what woke it has been handled)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        before = pool.loops
        time.sleep(0.3)
        if pool.loops == before:
            return
    raise AssertionError("the pool kept turning")


@pytest.mark.timeout(120)
def test_a_pool_sleeps_through_other_queues_jobs(tmp_path: Path, url: str) -> None:
    with open_store(url) as store:
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        runner = threading.Thread(target=pool.run)
        runner.start()
        try:
            first = create_job(store, "pt.noop", [1], {}, queue="mine").id
            until(lambda: store.get(first).terminal or None, 30, "the first job")
            with open_store(url) as other:  # another process's jobs, another queue
                made = [
                    other.create(kind=Kind.FUNCTION, name="x", queue="theirs").id for _ in range(30)
                ]  # (a new job wakes every idle pool: the queue channel is one)
                _settled(pool)
                before = pool.loops
                for job_id in made:
                    [claimed] = other.claim(limit=1, queues=["theirs"])
                    claimed.reporter().report("half", "progress")
                    claimed.succeed(None)
                    assert claimed.id in made and job_id in made
            turns = pool.loops - before
            assert turns < 10, f"90 changes of other jobs woke the idle pool {turns} times"
            # its own queue still wakes it, and a cancel of its job still reaches it
            marks = tmp_path / "marks.txt"
            job = create_job(store, "pt.cooperative", [str(marks)], {}, queue="mine").id
            until(lambda: read_lines(marks) == ["started"] or None, 30, "the job to start")
            store.open(job).cancel()
            until(lambda: "stopped" in read_lines(marks) or None, 30, "the cancel to reach it")
            assert store.get(job).status == Status.CANCELED
        finally:
            pool.stop()
            runner.join(60)


@pytest.mark.timeout(120)
def test_a_job_canceled_while_claimed_ahead_never_starts(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short jobs are claimed ahead of the free processes, and one is sent ahead to each
    busy process; a cancel of one of those (it is ``running``, not started) drops it from
    the pool's hand: it never runs, whether it was sent ahead or held by the pool."""
    monkeypatch.setattr(pool_module, "AHEAD_BEHIND_MAX", 600.0)  # behind the blocker
    with open_store(url) as store:
        blocker_marks, marker_marks = tmp_path / "blocker.txt", tmp_path / "marker.txt"
        # claimed in this order: a short job (then the pool claims ahead), the blocker, the
        # markers (claimed with the blocker: one sent ahead to its process, one held)
        first = create_job(store, "pt.noop", [1], {}, queue="mine", priority=2).id
        blocker = create_job(
            store, "pt.cooperative", [str(blocker_marks)], {}, queue="mine", priority=1
        ).id
        markers = [
            create_job(store, "pt.mark_start", [str(marker_marks)], {}, queue="mine").id
            for _ in range(2)
        ]
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        runner = threading.Thread(target=pool.run)
        runner.start()

        def at_hand() -> tuple[list[str], list[str]]:
            return [s.ahead.id for s in pool.slots if s.ahead], [t.id for t in pool.backlog]

        try:
            until(lambda: read_lines(blocker_marks) == ["started"] or None, 30, "the blocker")
            assert store.get(first).status == Status.SUCCEEDED
            until(lambda: at_hand() == ([markers[0]], [markers[1]]) or None, 10, "the claim")
            assert all(store.get(m).status == Status.RUNNING for m in markers)  # not started
            for marker in markers:
                store.open(marker).cancel()
            until(lambda: at_hand() == ([], []) or None, 30, "the canceled jobs to be dropped")
            store.open(blocker).cancel()
            until(lambda: store.get(blocker).terminal or None, 30, "the blocker to stop")
            _settled(pool)
            assert read_lines(marker_marks) == [], "a canceled job was started"
            assert all(store.get(m).status == Status.CANCELED for m in markers)
            # the claims' journal records are let go (nothing of the jobs is left to write)
            assert all((m, 1) not in getattr(pool.journal, "_keep", {}) for m in markers)
        finally:
            pool.stop()
            runner.join(60)
        assert not runner.is_alive()
