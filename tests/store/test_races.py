"""Races between real processes: outcomes stay consistent, nothing is lost, torn or repeated."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from outlast.model import Status
from outlast.store import Store
from tests.store import procs

# The files adapter makes three fsyncs per write: thousands of writes take tens of seconds on a
# loaded machine, so these tests get more room than the default.
pytestmark = pytest.mark.timeout(300)
SLOW = 280


def test_cancel_races_succeed(store: Store, store_url: str) -> None:
    rounds = 200
    for i in range(rounds):
        store.create(name=f"race{i}")
    tasks = store.claim(limit=rounds)
    assert len(tasks) == rounds
    jobs = [(t.id, t.attempt) for t in tasks]
    barrier = procs.CTX.Barrier(2)
    with (
        procs.spawned(procs.race, store_url, jobs, barrier, "cancel") as canceler,
        procs.spawned(procs.race, store_url, jobs, barrier, "succeed") as succeeder,
    ):
        cancel_results, cancel_errors = canceler.recv(SLOW)
        succeed_results, succeed_errors = succeeder.recv(SLOW)
        canceler.join()
        succeeder.join()
    assert cancel_errors == [] and succeed_errors == []
    seen_by = {"cancel": dict(cancel_results), "succeed": dict(succeed_results)}
    outcomes: Counter[str] = Counter()
    for job_id, _ in jobs:
        state = store.get(job_id)
        outcomes[str(state.status)] += 1
        assert state.status in (Status.CANCELED, Status.SUCCEEDED), state
        # Both racers returned the final state: whoever lost saw the winner's outcome.
        assert seen_by["cancel"][job_id] == str(state.status)
        assert seen_by["succeed"][job_id] == str(state.status)
        events = store.events(job_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        ends = [e for e in events if e.step == "job" and str(e.status) in ("completed", "failed")]
        assert len(ends) == 1, f"{job_id}: {events}"
        assert ends[0] == events[-1]
        if state.status == Status.SUCCEEDED:
            assert str(ends[0].status) == "completed"
            assert state.result == {"by": "worker"} and state.error is None
        else:
            assert str(ends[0].status) == "failed"
            assert state.error is not None and state.error.code == "canceled"
            assert state.result is None
        assert state.finished_at is not None
    assert sum(outcomes.values()) == rounds


def test_concurrent_reports_lose_nothing(store: Store, store_url: str) -> None:
    workers, per_worker = 8, 500
    job = store.create(name="busy")
    children = [
        procs.Child(procs.report_many, store_url, job.id, k, per_worker) for k in range(workers)
    ]
    try:
        for child in children:
            child.expect("ready")
        for child in children:
            child.send("go")
        for child in children:
            assert child.recv(SLOW) == ("done", 0), "a report on a live job was refused"
            child.join()
    finally:
        for child in children:
            child.close()
    events = store.events(job.id)
    total = workers * per_worker
    assert [e.seq for e in events] == list(range(1, total + 1))
    assert Counter(e.message for e in events) == Counter(
        f"w{k}-{i}" for k in range(workers) for i in range(per_worker)
    )
    for k in range(workers):
        mine = [e.message for e in events if e.step == f"w{k}"]
        assert mine == [f"w{k}-{i}" for i in range(per_worker)], "a worker's order was changed"
    assert [e.seq for e in store.events(job.id, after=total - 3)] == [total - 2, total - 1, total]


def test_concurrent_claims_take_each_job_once(store: Store, store_url: str) -> None:
    n, claimers = 1000, 4
    created = {store.create(name=f"c{i}").id for i in range(n)}
    children = [procs.Child(procs.claim_all, store_url, 3) for _ in range(claimers)]
    claimed: list[str] = []
    try:
        for child in children:
            child.expect("ready")
        for child in children:
            child.send("go")
        for child in children:
            claimed += child.recv(SLOW)
            child.join()
    finally:
        for child in children:
            child.close()
    duplicates = [job_id for job_id, count in Counter(claimed).items() if count > 1]
    assert duplicates == []
    assert len(claimed) == n
    assert set(claimed) == created
    assert store.list(status="pending", limit=None) == []
    assert store.claim() == []
    for job_id in list(created)[:20]:
        state = store.get(job_id)
        assert state.status == Status.RUNNING and state.attempts == 1
        assert len(store.events(job_id)) == 1


def test_reader_never_sees_a_partial_document(store: Store, store_url: str) -> None:
    writes = 1000
    job = store.create(name="durable", labels={"n": "0"})
    reads, errors, last = 0, [], (0, 0)
    with procs.spawned(procs.write_many, store_url, job.id, writes) as writer:
        writer.expect("ready")
        writer.send("go")
        deadline = time.monotonic() + SLOW
        while not writer.conn.poll() and time.monotonic() < deadline:
            try:
                state = store.get(job.id)
            except Exception as exc:  # any error at all is a failure of the store
                errors.append(repr(exc))
                continue
            reads += 1
            # Writes alternate: odd i reports step s<i> with progress i/10, even i sets
            # label n=i. A whole document is at most one write "ahead" on either side.
            step = int(state.step[1:]) if state.step else 0
            label = int(state.labels["n"])
            assert state.step is None or state.progress == pytest.approx(step / 10)
            assert abs(step - label) <= 1 or (step, label) == (0, 0), state
            assert (step, label) >= last, f"went back in time: {last} -> {(step, label)}"
            last = (step, label)
        writer.expect("done")
        writer.join()
    assert errors == []
    assert reads >= 20, f"only {reads} reads overlapped the writes"
    final = store.get(job.id)
    assert final.step == f"s{writes - 1}" and final.labels["n"] == str(writes)
    assert len(store.events(job.id)) == writes // 2
