"""Real processes: watching another process's progress, exact crash detection, notification."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from outlast.errors import WorkerLockHeld
from outlast.model import Status
from outlast.store import Store
from tests.store import procs

pytestmark = pytest.mark.timeout(60)


def test_watch_yields_events_from_another_process_as_they_land(
    store: Store, store_url: str
) -> None:
    job = store.create(name="watched")
    n = 5
    seen = []
    with procs.spawned(procs.report_with_acks, store_url, job.id, n) as child:
        # The child waits for an ack after each report, so every report must reach this
        # watcher while the job is still running, not in a batch at the end.
        for event in store.watch(job.id, timeout=30):
            seen.append(event)
            if event.step == "work":
                child.send("ack")
        child.expect("done")
        child.join()
    assert [e.seq for e in seen] == list(range(1, n + 3))
    assert [(e.step, str(e.status)) for e in seen] == [
        ("job", "started"),
        *[("work", "progress")] * n,
        ("job", "completed"),
    ]
    assert [e.message for e in seen[1:-1]] == [f"r{i}" for i in range(n)]
    assert store.get(job.id).status == Status.SUCCEEDED
    # Watching a finished job replays its events and ends.
    assert list(store.watch(job.id, timeout=5)) == seen
    assert list(store.watch(job.id, after=3, timeout=5)) == seen[3:]


def test_wait_returns_when_another_process_finishes_the_job(store: Store, store_url: str) -> None:
    job = store.create(name="waited")
    with procs.spawned(procs.start_then_succeed, store_url, job.id, 0.3) as child:
        child.expect("started")
        started = time.monotonic()
        state = store.wait(job.id, timeout=20)
        assert time.monotonic() - started < 10
        assert state.status == Status.SUCCEEDED and state.result == "ok"
        child.expect("done")
        child.join()


def test_wait_times_out_on_a_live_job(store: Store) -> None:
    job = store.create(name="never")
    started = time.monotonic()
    state = store.wait(job.id, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 5
    assert state.status == Status.PENDING


@pytest.mark.parametrize(("max_attempts", "outcome"), [(1, "failed"), (2, "pending")])
def test_killed_worker_is_abandoned_at_once(
    store: Store, store_url: str, max_attempts: int, outcome: str
) -> None:
    job = store.create(name="doomed", max_attempts=max_attempts)
    with procs.spawned(procs.hold_lock, store_url, job.id, True, False) as child:
        assert child.recv()[0] == "ready"
        live = store.get(job.id)
        assert live.status == Status.RUNNING
        # A live holder is never abandoned, and reconcile leaves its job alone.
        assert not store.abandoned(live)
        assert store.reconcile(live) == live
        assert store.get(job.id) == live
        child.kill()
    state = store.get(job.id)
    assert store.abandoned(state)  # at once: no timeout, no heartbeat
    reconciled = store.reconcile(state)
    assert str(reconciled.status) == outcome
    assert reconciled == store.get(job.id)
    assert reconciled.error is not None and reconciled.error.code == "abandoned"
    assert not store.abandoned(reconciled)
    assert store.events(job.id)[-1].step == "job"
    assert str(store.events(job.id)[-1].status) == "failed"
    # Reconciling again changes nothing.
    assert store.reconcile(reconciled) == reconciled
    if outcome == "pending":
        [again] = store.claim()
        assert again.id == job.id and again.attempt == 2
    else:
        assert reconciled.finished_at is not None
        assert store.claim() == []


def test_killed_pool_leaves_its_claimed_job_abandoned(store: Store, store_url: str) -> None:
    job = store.create(name="pooled", max_attempts=2)
    with procs.spawned(procs.claim_and_park, store_url) as pool:
        assert pool.recv() == ("ready", [job.id])
        live = store.get(job.id)
        assert live.status == Status.RUNNING and live.worker is not None
        assert not store.abandoned(live)
        assert store.reconcile(live) == live
        pool.kill()
    state = store.get(job.id)
    assert store.abandoned(state)
    reconciled = store.reconcile(state)
    assert reconciled.status == Status.PENDING
    assert reconciled.error is not None and reconciled.error.code == "abandoned"
    [again] = store.claim()
    assert again.id == job.id and again.attempt == 2


def test_a_job_nobody_started_is_not_abandoned(store: Store) -> None:
    job = store.create(name="idle")
    state = store.get(job.id)
    assert not store.abandoned(state)
    assert store.reconcile(state) == state
    assert store.get(job.id) == state
    assert store.events(job.id) == []


def test_second_lock_holder_is_refused_while_the_first_lives(store: Store, store_url: str) -> None:
    job = store.create(name="locked")
    with procs.spawned(procs.hold_lock, store_url, job.id, True, False) as holder:
        assert holder.recv()[0] == "ready"
        with procs.spawned(procs.try_lock, store_url, job.id) as other:
            other.expect("held")
            other.join()
        task = store.open(job.id)
        with pytest.raises(WorkerLockHeld):
            task.hold_worker_lock()
        holder.kill()
    # Death frees the lock: the next worker gets it.
    with procs.spawned(procs.try_lock, store_url, job.id) as other:
        other.expect("acquired")
        other.join()


def test_a_command_started_by_the_worker_does_not_inherit_the_lock(
    store: Store, store_url: str
) -> None:
    job = store.create(name="parent-of-sleep")
    grandchild = None
    try:
        with procs.spawned(procs.hold_lock, store_url, job.id, True, True) as holder:
            word, grandchild = holder.recv()
            assert word == "ready" and isinstance(grandchild, int)
            assert not store.abandoned(store.get(job.id))
            holder.kill()
        os.kill(grandchild, 0)  # still alive (raises if not)
        assert store.abandoned(store.get(job.id)), "the command kept the worker lock"
    finally:
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)


def test_listen_is_woken_by_a_write_from_another_process(store: Store, store_url: str) -> None:
    job = store.create(name="listened")
    other = store.create(name="other")
    with (
        procs.spawned(procs.write_on_go, store_url, job.id) as child,
        store.listen([job.id]) as listener,
    ):
        child.expect("ready")
        if store.capabilities.pushes_notifications:
            assert not listener.wait(0.05), "woken with nothing written"
        child.send("go")
        assert listener.wait(2.0), "not woken within 2 s of the write"
        child.expect("done")
        child.join()
    assert store.events(job.id)[-1].message == "hello"
    assert store.events(other.id) == []


def test_a_pools_listener_hears_new_jobs_and_interrupts_only(store: Store) -> None:
    """``listen([], queue=True, interrupts=True)``, a pool's: woken when a job becomes
    claimable and when a running job is canceled or deleted (``interrupted``), never by a
    running job's reports or outcome (a pool's own writes, other pools' jobs)."""
    if not store.capabilities.pushes_notifications:
        pytest.skip("this store does not push notifications")
    for name in "abc":
        store.create(name=name, queue="q")
    claimed = {task.state().name: task for task in store.claim(limit=3, queues=["q"])}
    assert sorted(claimed) == ["a", "b", "c"]
    with store.listen([], queue=True, interrupts=True) as listener:
        assert not listener.wait(0.1), "woken with nothing written"
        claimed["a"].reporter().report("half", "progress")
        claimed["a"].succeed(None)
        claimed["b"].relabel("k", "v")
        assert not listener.wait(0.3), "woken by running jobs' reports, labels and outcomes"
        store.create(name="new", queue="q")
        assert listener.wait(2.0), "not woken by a new job"
        assert not listener.interrupted
        store.open(claimed["a"].id).cancel()  # finished: nothing to interrupt
        assert not listener.wait(0.3), "woken by the cancel of a finished job"
        store.open(claimed["b"].id).cancel()
        assert listener.wait(2.0), "not woken by the cancel of a running job"
        assert listener.interrupted
        store.delete(claimed["c"].id, force=True)
        assert listener.wait(2.0), "not woken by the delete of a running job"
        assert listener.interrupted
