"""The seed's semantics: terminal outcomes stick, delete is guarded, listing pages cleanly."""

from __future__ import annotations

import pytest

from outlast.errors import InvalidInput, JobActive, JobNotFound
from outlast.model import Status
from outlast.store import Store, Task


def claim_one(store: Store) -> Task:
    tasks = store.claim()
    assert len(tasks) == 1, tasks
    return tasks[0]


def events_or_none(store: Store, job_id: str) -> list[object]:
    try:
        return list(store.events(job_id))
    except JobNotFound:
        return []


def test_succeed_after_cancel_is_a_noop(store: Store) -> None:
    store.create(name="j")
    task = claim_one(store)
    canceled = store.open(task.id).cancel()
    events = store.events(task.id)
    state = task.succeed({"late": True})
    assert state.status == Status.CANCELED
    assert store.get(task.id) == canceled
    assert canceled.result is None
    assert store.events(task.id) == events
    # Unfenced handles (no attempt token) are refused too.
    assert store.open(task.id).succeed("x").status == Status.CANCELED
    assert store.get(task.id) == canceled


def test_fail_after_cancel_keeps_canceled(store: Store) -> None:
    store.create(name="j", max_attempts=3)
    task = claim_one(store)
    canceled = store.open(task.id).cancel()
    events = store.events(task.id)
    assert task.fail(RuntimeError("worker noticed the cancel")).status == Status.CANCELED
    assert store.open(task.id).fail("late", retry=False).status == Status.CANCELED
    state = store.get(task.id)
    assert state == canceled
    assert state.error is not None and state.error.code == "canceled"
    assert store.events(task.id) == events


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "canceled"])
def test_late_report_never_changes_a_terminal_job(store: Store, outcome: str) -> None:
    store.create(name="j")
    task = claim_one(store)
    task.report("s", "progress", "before", progress=30)
    if outcome == "succeeded":
        task.succeed(1)
    elif outcome == "failed":
        task.fail(RuntimeError("x"))
    else:
        task.cancel()
    final = store.get(task.id)
    assert str(final.status) == outcome
    events = store.events(task.id)
    assert task.report("s", "progress", "late", progress=90) is None
    assert store.open(task.id).report("s", "failed", "late too") is None
    assert task.reporter().report("other", "completed") is None
    assert store.get(task.id) == final
    assert store.events(task.id) == events
    # Nor does a second cancel or a resume.
    assert store.open(task.id).cancel() == final
    assert store.get(task.id) == final


def test_delete_refuses_a_live_job_without_force(store: Store) -> None:
    store.create(name="r")
    running = claim_one(store)
    pending = store.create(name="p")
    for job_id in (pending.id, running.id):
        with pytest.raises(JobActive):
            store.delete(job_id)
        assert store.get(job_id).status in (Status.PENDING, Status.RUNNING)
    running.report("s", "progress", "still here")
    assert len(store.events(running.id)) == 2

    for job_id in (pending.id, running.id):
        store.delete(job_id, force=True)
        with pytest.raises(JobNotFound):
            store.get(job_id)
        assert events_or_none(store, job_id) == []
    assert store.list() == []


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "canceled"])
def test_delete_removes_a_terminal_job_and_its_events(store: Store, outcome: str) -> None:
    store.create(name="j")
    task = claim_one(store)
    keep = store.create(name="keep")
    keep.report("s", "progress", "kept")
    task.report("s", "progress", "x")
    if outcome == "succeeded":
        task.succeed(1)
    elif outcome == "failed":
        task.fail(RuntimeError("done"))
    else:
        task.cancel()
    assert str(store.get(task.id).status) == outcome
    store.delete(task.id)
    with pytest.raises(JobNotFound):
        store.get(task.id)
    assert events_or_none(store, task.id) == []
    assert [s.id for s in store.list()] == [keep.id]
    with pytest.raises(JobNotFound):
        store.delete(task.id)
    with pytest.raises(JobNotFound):
        store.open(task.id).report("s", "progress", "after delete")
    assert [e.message for e in store.events(keep.id)] == ["kept"]


def test_list_is_newest_first(store: Store) -> None:
    ids = [store.create(name=f"j{i}").id for i in range(8)]
    assert [s.id for s in store.list()] == ids[::-1]
    assert [s.id for s in store.list(limit=3)] == ids[::-1][:3]
    assert [s.id for s in store.list(limit=None)] == ids[::-1]


def test_list_filters_by_status_and_label(store: Store) -> None:
    a = store.create(name="a", labels={"team": "x", "env": "prod"})
    b = store.create(name="b", labels={"team": "x", "env": "dev"})
    c = store.create(name="c", labels={"team": "y"})
    d = store.create(name="d")
    claimed = store.claim(limit=2)  # a and b, oldest first
    assert [t.id for t in claimed] == [a.id, b.id]
    claimed[1].succeed()

    def ids(**kwargs: object) -> list[str]:
        return [s.id for s in store.list(**kwargs)]  # type: ignore[arg-type]

    assert ids(status="pending") == [d.id, c.id]
    assert ids(status=Status.RUNNING) == [a.id]
    assert ids(status="succeeded") == [b.id]
    assert ids(status="failed") == []
    assert ids(label="team=x") == [b.id, a.id]
    assert ids(label={"team": "x"}) == [b.id, a.id]
    assert ids(label={"team": "x", "env": "prod"}) == [a.id]
    assert ids(label="env=staging") == []
    assert ids(label="nokey=x") == []
    assert ids(status="pending", label="team=y") == [c.id]
    assert ids(status="running", label="team=y") == []
    assert ids(label="team=x", limit=1) == [b.id]
    for state in store.list(label="team=x"):
        assert state.labels["team"] == "x"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": "bogus"},
        {"label": "novalue"},
        {"label": "=v"},
        {"label": {"k": 1}},
        {"limit": 0},
        {"limit": -3},
    ],
)
def test_list_refuses_bad_filters(store: Store, kwargs: dict[str, object]) -> None:
    store.create(name="j")
    with pytest.raises(InvalidInput):
        store.list(**kwargs)  # type: ignore[arg-type]


def test_list_before_pages_without_duplicates_or_gaps(store: Store) -> None:
    ids = [store.create(name=f"j{i}", labels={"odd": str(i % 2)}).id for i in range(23)]
    everything = [s.id for s in store.list(limit=None)]
    assert everything == ids[::-1]

    def pages(size: int, **kwargs: object) -> list[list[str]]:
        out: list[list[str]] = []
        before = None
        while True:
            page = [s.id for s in store.list(limit=size, before=before, **kwargs)]  # type: ignore[arg-type]
            if not page:
                return out
            assert len(page) <= size
            out.append(page)
            before = page[-1]
            assert len(out) < 50, "paging does not end"

    got = pages(5)
    assert [len(p) for p in got] == [5, 5, 5, 5, 3]
    assert [i for p in got for i in p] == everything
    odd = pages(4, label="odd=1")
    assert [i for p in odd for i in p] == [i for n, i in enumerate(ids) if n % 2][::-1]
    assert [s.id for s in store.list(before=ids[0])] == []
    assert [s.id for s in store.list(before=ids[5], limit=2)] == [ids[4], ids[3]]
