"""A pool killed at any moment, on every store: the attempts it claimed ahead are given back
(``attempts`` counts starts), and an outcome its job process returned but the pool had not
written is written by whoever reconciles the job, without running the function again (the
attempt journal, :mod:`outlast.store.journal`)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outlast.model import Status
from outlast.run import reap
from outlast.store import Store
from tests.pool.conftest import Harness, read_lines
from tests.waiting import until


@pytest.fixture
def any_pool(store_url: str, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, url=store_url)
    try:
        yield harness
    finally:
        harness.close()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def _reconcile_all(store: Store, count: int) -> None:
    """Reconcile until no job is left running (a dead PostgreSQL backend may take a moment
    to drop its locks)."""

    def settled() -> bool:
        reap.reconcile_all(store, store.abandoned_jobs(thorough=True))
        return not any(s.status == Status.RUNNING for s in store.list(limit=None))

    until(settled, 30, "the killed pool's jobs to be reconciled")


@pytest.mark.timeout(120)
def test_a_killed_pool_burns_no_claimed_attempt_and_loses_no_returned_outcome(
    any_pool: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = any_pool
    monkeypatch.setenv("WORKER_MAX_RETRIES", "1")  # one attempt each: a burned one fails
    out = pool.tmp / "starts.txt"
    # short jobs first, so the pool claims ahead; then one that stops its pool as it returns
    ids = [pool.submit("pt.record", str(out)) for _ in range(12)]
    stopper = pool.submit("pt.stop_pool", str(out))
    ids += [pool.submit("pt.record", str(out)) for _ in range(24)]
    worker = pool.worker("-c", "1")
    until(lambda: _stopped(worker.pid), 60, f"the pool to be stopped\n{pool.describe()}")
    time.sleep(0.3)  # the job process journals the outcome and hands it to the stopped pool
    worker.kill()

    held = [s for s in pool.store.list(limit=None) if s.status == Status.RUNNING]
    assert _journal_records(pool) > 0
    _reconcile_all(pool.store, len(ids) + 1)

    done = pool.get(stopper)
    assert done.status == Status.SUCCEEDED, done
    assert done.result == f"stopped by {stopper}"
    started = set(read_lines(out))
    given_back = [pool.get(s.id) for s in held if s.id not in started]
    assert given_back, "the pool held no job claimed ahead: the test proves nothing"
    for state in given_back:  # claimed, never started: pending again, the attempt uncounted
        assert state.status == Status.PENDING, state
        assert (state.attempts, state.max_attempts) == (1, 2), state
    for state in [pool.get(s.id) for s in held if s.id in started]:  # returned, unwritten
        assert state.status == Status.SUCCEEDED, state
    assert not [s for s in pool.store.list(limit=None) if s.status == Status.FAILED]

    pool.worker("-c", "2", "--burst").wait(60)
    states = pool.wait_all(len(ids) + 1)
    assert Counter(s.status for s in states) == {Status.SUCCEEDED: len(ids) + 1}
    starts = Counter(read_lines(out))
    assert set(starts) == {*ids, stopper}
    assert max(starts.values()) == 1, "a function that returned ran again"
    for state in states:  # attempts counted (those given back are not) = starts
        counted = state.attempts - (state.max_attempts - 1)
        assert counted == 1, state
    pool.store.abandoned_jobs(thorough=True)  # a sweep forgets the dead pool's journal
    assert _journal_records(pool) == 0


def _journal_records(pool: Harness) -> int:
    if pool.url.startswith("postgresql"):
        store: Any = pool.store
        return int(store._query("count", f'SELECT count(*) FROM "{store.schema}".journal')[0][0])
    return len(list(pool.store.parts.journals.iterdir()))  # type: ignore[attr-defined]


def test_a_pool_that_stops_leaves_no_journal(pool: Harness) -> None:
    out = pool.tmp / "out.txt"
    for _ in range(30):
        pool.submit("pt.record", str(out))
    assert pool.worker("-c", "2", "--burst").wait(60) == 0
    assert len(read_lines(out)) == 30
    assert not list((pool.tmp / "s.db.d" / "journal").iterdir())
