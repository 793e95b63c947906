"""Queueing many jobs at once (``outlast.submit_many``, ``Store.create_many``): every job
checked before any is written, batches of ``CREATE_BATCH`` per transaction, on every store;
and a real pool runs what was queued."""

from __future__ import annotations

from pathlib import Path

import pytest

import outlast
from outlast.errors import InvalidInput
from outlast.model import Status
from outlast.run import api
from outlast.run.bulk import create_lines, read_jsonl, submit_many
from outlast.store import Store
from tests.pool import jobs_for_tests
from tests.pool.conftest import Harness


def test_submit_many_queues_each_call_in_order(store: Store, tmp_path: Path) -> None:
    calls: list[object] = [[str(tmp_path / "a")], {"path": str(tmp_path / "b"), "sleep": 0}]
    tasks = submit_many(jobs_for_tests.record.options(labels={"batch": "1"}), calls, store=store)
    states = [t.state() for t in tasks]
    assert [s.status for s in states] == [Status.PENDING, Status.PENDING]
    assert [s.call.args if s.call else None for s in states] == [[str(tmp_path / "a")], []]
    assert states[1].call is not None and states[1].call.kwargs["path"] == str(tmp_path / "b")
    assert all(s.labels == {"batch": "1"} and s.name == "pt.record" for s in states)
    # one batch shares its creation time: listed together, in no promised order
    assert {s.id for s in store.list(label="batch=1")} == {t.id for t in tasks}


def test_more_than_one_batch(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(store), "CREATE_BATCH", 7)
    tasks = submit_many(jobs_for_tests.noop, ([i] for i in range(30)), store=store)
    assert len({t.id for t in tasks}) == 30
    listed = store.list(limit=None)
    assert sorted(s.call.args[0] for s in listed if s.call) == list(range(30))


def test_a_bad_call_writes_nothing_and_names_the_job(store: Store) -> None:
    with pytest.raises(InvalidInput, match=r"job 3: .*too many positional arguments"):
        submit_many(jobs_for_tests.noop, [[1], [2], [3, 4, 5]], store=store)
    with pytest.raises(InvalidInput, match="job 2: a call is a list"):
        submit_many(jobs_for_tests.noop, [[1], "oops"], store=store)
    with pytest.raises(InvalidInput, match="same unique key"):
        submit_many(jobs_for_tests.noop.options(unique_key="k"), [[1], [2]], store=store)
    with pytest.raises(InvalidInput, match="no raise"):
        submit_many(jobs_for_tests.noop.options(unique_key="k", on_conflict="raise"), [[1]])
    assert store.list(limit=None) == []


def test_a_live_holder_of_a_unique_key_is_returned(store: Store) -> None:
    first = store.create(name="holder", unique_key="only")
    [task] = store.create_many([{"name": "again", "unique_key": "only"}])
    assert task.id == first.id and task.existing
    assert len(store.list(limit=None)) == 1


def test_lines_of_a_file(store: Store) -> None:
    lines = read_jsonl('{"args": [1]}\n\n{"kwargs": {"value": 2}, "labels": {"k": "v"}}\n')
    tasks = create_lines(store, "pt.noop", lines)
    assert [t.state().labels for t in tasks] == [{}, {"k": "v"}]
    for text, message in [
        ('{"args": [1]}\n[1]\n', "line 2: a JSON object"),
        ("{nope\n", "line 1: not JSON"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            read_jsonl(text)
    with pytest.raises(InvalidInput, match=r"job 1: unknown keys \['argz'\]"):
        create_lines(store, "pt.noop", [{"argz": [1]}])
    with pytest.raises(InvalidInput, match=r"job 2: .*delay"):
        create_lines(store, "pt.noop", [{}, {"delay": "10 parsecs"}])
    with pytest.raises(InvalidInput, match="no jobs"):
        create_lines(store, "pt.noop", [])
    assert len(store.list(limit=None)) == 2


def test_a_pool_runs_what_submit_many_queued(pool: Harness) -> None:
    saved = api._default
    outlast.use_store(pool.store)
    marks = pool.tmp / "marks"
    try:
        tasks = outlast.submit_many(jobs_for_tests.record, ([str(marks)] for _ in range(200)))
    finally:
        api._default = saved
    pool.worker("-c", "2")
    states = pool.wait_all(200, timeout=120)
    assert {s.status for s in states} == {Status.SUCCEEDED}
    assert sorted(marks.read_text().split()) == sorted(t.id for t in tasks)
