"""One elected maintainer per store: it reconciles the jobs of dead workers for everyone, the
others only wait for its lock, another takes over at once when it dies, and an idle pool
costs no store query while nothing changes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from outlast.errors import OutlastError
from outlast.model import Status
from outlast.run.maintain import Maintainer
from outlast.run.pool import Pool
from outlast.store import Store, open_store
from tests.pool.conftest import Harness
from tests.store import procs
from tests.store.adapters import ADAPTERS, Adapter
from tests.waiting import until


def _flock_holders(path: Path) -> set[int]:
    """The PIDs holding a flock on ``path`` (from /proc/locks)."""
    inode = os.stat(path).st_ino
    holders = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) == inode:
                holders.add(int(fields[4]))
    return holders


def _dead_worker_job(pool: Harness) -> str:
    """A running job whose worker (a process holding its lock) was SIGKILLed just now."""
    job = pool.store.create(kind="function", name="pt.noop", queue="nobody", max_attempts=1)
    with procs.spawned(procs.hold_lock, pool.url, job.id, True, False) as worker:
        assert worker.recv()[0] == "ready"
        worker.kill()
    # (a live pool's maintainer may have looked already: what it does is the caller's check)
    assert pool.get(job.id).status in (Status.RUNNING, Status.FAILED)
    return job.id


def test_one_pool_maintains_and_another_takes_over_when_it_dies(pool: Harness) -> None:
    first, second = pool.worker(), pool.worker()
    pool.ready()
    lock = pool.tmp / "s.db.d" / "locks" / "@maintenance.lock"
    holders = until(lambda: _flock_holders(lock) or None, 30, "a maintainer")
    assert len(holders) == 1 and holders <= {first.pid, second.pid}
    [maintainer] = holders
    # it reconciles a dead worker's job without anyone asking (store.get never reconciles)
    job = _dead_worker_job(pool)
    state = pool.wait_for(job, {Status.FAILED}, 10, "the maintainer to reconcile")
    assert state.error is not None and state.error.code == "abandoned"
    # the maintainer dies: the other pool takes the lock within a second or so, and maintains
    (dead, alive) = (first, second) if maintainer == first.pid else (second, first)
    dead.kill()
    until(lambda: _flock_holders(lock) == {alive.pid} or None, 10, "the other pool to take over")
    job = _dead_worker_job(pool)
    state = pool.wait_for(job, {Status.FAILED}, 10, "the new maintainer to reconcile")
    assert state.error is not None and state.error.code == "abandoned"


def test_a_maintainer_thread_stops_and_frees_the_lock(tmp_path: Path) -> None:
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        one, two = Maintainer(store, every=0.05).start(), Maintainer(store, every=0.05).start()
        assert one.ready.wait(10) and two.ready.wait(10)
        until(lambda: one.active or two.active or None, 10, "a maintainer")
        assert not (one.active and two.active)  # one lock, one maintainer (in one process too)
        active, waiting = (one, two) if one.active else (two, one)
        active.stop()
        until(lambda: waiting.active or None, 5, "the waiting one to take over")
        waiting.stop()
        assert not waiting.active


# ------------------------------------------------------------------- an idle pool's cost
def _count_queries(store: Store) -> Callable[[], int]:
    """Count the statements the store sends (reads and transactions), from now on."""
    count = [0]
    for name in ("_query", "_tx"):
        if not hasattr(store, name):
            continue
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            count[0] += 1
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    if hasattr(store, "_scan"):  # the files store reads its folder instead
        real_scan = store._scan

        def scan(*args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return real_scan(*args, **kwargs)

        store._scan = scan  # type: ignore[attr-defined]
    return lambda: count[0]


@pytest.fixture(params=ADAPTERS, ids=lambda a: a.name)
def idle_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    adapter: Adapter = request.param
    url = adapter.make_url(tmp_path)
    if url is None:
        pytest.skip(f"no {adapter.name} store here")
    with open_store(url) as store:
        yield store


def test_an_idle_pool_sends_no_query_while_nothing_changes(idle_store: Store) -> None:
    queries = _count_queries(idle_store)
    pool = Pool(idle_store, concurrency=1)
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        assert pool.maintainer is not None
        until(lambda: (pool.claims >= 1 and pool.maintainer.sweeps >= 1) or None, 30, "a start")
        time.sleep(0.5)  # the start-up's queries are done
        before, sweeps = queries(), pool.maintainer.sweeps
        time.sleep(3.0)
        idle = queries() - before
        sweeps = pool.maintainer.sweeps - sweeps
        assert sweeps >= 2, "the maintainer went on sweeping meanwhile"
        if idle_store.capabilities.spans_hosts:  # PostgreSQL: one query a sweep, no more
            assert idle <= sweeps + 1, f"{idle} queries in 3 s for {sweeps} sweeps"
        else:
            assert idle == 0, f"{idle} queries in 3 s of idling"
        # ...and it is woken at once by a new job
        job = idle_store.create(kind="function", name="no.such.job", max_attempts=1)
        state = until(lambda: idle_store.get(job.id).terminal and idle_store.get(job.id), 30)
        assert state.error is not None and "cannot load job" in state.error.message
    finally:
        pool.stop()
        runner.join(60)
    assert not runner.is_alive()


def test_an_idle_pool_wakes_for_a_delayed_job_at_its_time(idle_store: Store) -> None:
    pool = Pool(idle_store, concurrency=1)
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        until(lambda: pool.claims >= 1 or None, 30, "the first claim")
        due = 1.0
        from datetime import timedelta

        from outlast.model import utcnow

        at = utcnow() + timedelta(seconds=due)
        job = idle_store.create(kind="function", name="no.such.job", run_after=at)
        state = until(lambda: idle_store.get(job.id).started_at and idle_store.get(job.id), 30)
        assert state.started_at is not None and state.started_at >= at
    finally:
        pool.stop()
        runner.join(60)


def test_the_maintainer_survives_a_failing_store(tmp_path: Path) -> None:
    """A sweep that fails (the store is gone) is logged, and the maintainer goes on."""
    with open_store(f"sqlite://{tmp_path}/s.db") as store:

        def broken(thorough: bool = False) -> list[Any]:
            raise OutlastError("the store is unreachable")

        store.abandoned_jobs = broken  # type: ignore[method-assign]
        maintainer = Maintainer(store, every=0.05).start()
        try:
            until(lambda: (maintainer.sweeps == 0 and maintainer.active) or None, 10, "active")
            time.sleep(0.2)
            assert maintainer.active
        finally:
            maintainer.stop()


def test_a_busy_pool_does_not_spin_after_a_delayed_job_came_due(tmp_path: Path) -> None:
    """Before: the due time of a delayed job stayed set once it passed, so a pool busy with
    that job turned its loop hundreds of thousands of times a second."""
    from datetime import timedelta

    from outlast.model import utcnow
    from outlast.run.api import create_job
    from tests.pool import jobs_for_tests

    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        pool = Pool(store, concurrency=1, imports=[jobs_for_tests.MODULE])
        runner = threading.Thread(target=pool.run)
        runner.start()
        try:
            until(lambda: pool.claims >= 1 or None, 30, "the first claim")
            job = create_job(store, "pt.sleep", [2.0], {})
            store.apply(
                job.id,
                lambda s: _delay(s, utcnow() + timedelta(seconds=0.5)),
            )
            until(lambda: store.get(job.id).status == Status.RUNNING or None, 30, "the start")
            before = pool.loops
            time.sleep(1.0)  # the job runs: the pool waits for it
            turns = pool.loops - before
            assert turns < 100, f"the pool turned its loop {turns} times in a second"
            until(lambda: store.get(job.id).terminal or None, 30, "the end")
        finally:
            pool.stop()
            runner.join(60)


def _delay(state: Any, at: Any) -> Any:
    from outlast.machine import Change

    return Change(state.evolve(run_after=at), claimable=True)


def test_one_job_that_cannot_be_reconciled_stops_neither_the_sweep_nor_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: an OSError restarting one job's worker ended the maintainer thread."""
    from outlast.run import reap

    url = f"sqlite://{tmp_path}/s.db"
    with open_store(url) as store:
        jobs = []
        for _ in range(2):
            job = store.create(kind="function", name="f", queue="nobody", max_attempts=1)
            with procs.spawned(procs.hold_lock, url, job.id, True, False) as worker:
                assert worker.recv()[0] == "ready"
                worker.kill()
            jobs.append(job.id)
        real = reap.reconcile

        def fails_for_the_first(store: Store, state: Any) -> Any:
            if state.id == jobs[0]:
                raise OSError("no processes left")
            return real(store, state)

        monkeypatch.setattr(reap, "reconcile", fails_for_the_first)
        seen: list[bool] = []
        abandoned = store.abandoned_jobs

        def recording(thorough: bool = False) -> list[Any]:
            seen.append(thorough)
            return abandoned(thorough)

        store.abandoned_jobs = recording  # type: ignore[method-assign]
        maintainer = Maintainer(store, every=0.05).start()
        try:
            until(lambda: store.get(jobs[1]).status == Status.FAILED or None, 10, "job 2")
            until(lambda: len(seen) >= 3 or None, 10, "more sweeps")
            assert maintainer.active and maintainer._thread is not None
            assert maintainer._thread.is_alive()
            assert all(seen[:3]), "after a failed sweep every one looks at all live jobs"
        finally:
            maintainer.stop()
        assert store.get(jobs[0]).status == Status.RUNNING  # left for the next sweep


@pytest.mark.parametrize("thorough", [False, True])
def test_the_files_store_lists_its_documents_only_in_a_thorough_sweep(
    tmp_path: Path, thorough: bool
) -> None:
    with open_store(f"files://{tmp_path}/jobs") as store:
        stale = tmp_path / "jobs" / "0123456789abcdef.worker.lock"
        stale.write_bytes(b"")
        assert store.abandoned_jobs(thorough) == []
        assert stale.exists() != thorough
