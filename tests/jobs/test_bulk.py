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


def _plain(a, b, c=1, d=2):  # type: ignore[no-untyped-def]
    return a


def _mixed(a, /, b, *rest, c, **more):  # type: ignore[no-untyped-def]
    return a


@pytest.mark.parametrize("fn", [_plain, _mixed])
def test_the_fast_call_check_agrees_with_binding(fn: object) -> None:
    """``registry.check_call`` (counting names for plain signatures) refuses exactly what
    ``inspect.Signature.bind`` refuses, over every small shape of call."""
    import inspect
    import itertools

    from outlast.run import registry

    spec = registry.JobSpec(name="t.fn", fn=fn)  # type: ignore[arg-type]
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    names = ["a", "b", "c", "d", "e"]
    checked = 0
    for n in range(6):
        for keys in itertools.chain.from_iterable(
            itertools.combinations(names, k) for k in range(4)
        ):
            args, kwargs = list(range(n)), {k: 0 for k in keys}
            try:
                sig.bind(*args, **kwargs)
                ok = True
            except TypeError:
                ok = False
            if ok:
                registry.check_call(spec, args, kwargs)
            else:
                with pytest.raises(InvalidInput, match=r"takes t\.fn"):
                    registry.check_call(spec, args, kwargs)
            checked += 1
    assert checked == 6 * 26


def test_a_batch_makes_the_jobs_submit_makes(store: Store) -> None:
    """The batch's shared fields are checked once and copied: each job is what ``submit``
    with the same options would have made, apart from its id and times."""
    options = jobs_for_tests.noop.options(
        queue="q1", labels={"team": "a"}, priority=3, timeout=9, attempts=2
    )
    outlast.use_store(store)
    saved = api._default
    try:
        one = outlast.submit(options, 5).state()
    finally:
        api._default = saved
    many = [t.state() for t in submit_many(options, [[6], {"value": 7}], store=store)]
    volatile = {"id", "created_at", "updated_at", "call"}
    for state in many:
        assert {k: v for k, v in state.to_dict().items() if k not in volatile} == {
            k: v for k, v in one.to_dict().items() if k not in volatile
        }
    assert [s.call.args for s in many if s.call] == [[6], []]
    assert many[1].call is not None and dict(many[1].call.kwargs) == {"value": 7}
    assert len({s.id for s in many}) == 2


def test_a_batch_checks_each_jobs_own_parts(store: Store) -> None:
    """Past the first job, each job's arguments, payload and limit key are still checked."""
    with pytest.raises(InvalidInput, match=r"job 2: .*must be JSON"):
        submit_many(jobs_for_tests.noop, [[1], [float("nan")]], store=store)
    with pytest.raises(InvalidInput, match="job 2: payload must be JSON"):
        store.create_many(
            [{"payload": {"ok": 1}}, {"payload": {"bad": {1, 2}}}], common={"name": "p"}
        )
    with pytest.raises(InvalidInput, match="job 2: a limit key"):
        store.create_many([{"limit_key": "k"}, {"limit_key": ""}], common={"name": "p", "limit": 2})
    # an item with options of its own is made whole, under the shared fields
    tasks = store.create_many([{}, {"priority": 5}, {}], common={"name": "p", "priority": 1})
    assert [t.state().priority for t in tasks] == [1, 5, 1]
    assert len(store.list(limit=None)) == 3


def test_a_call_may_be_any_sequence_or_mapping(store: Store) -> None:
    """A tuple, a range or a read-only mapping is a call as a list or a dict is; a string
    is not (it would be a call of its characters)."""
    from types import MappingProxyType

    calls = [(1,), range(2, 3), MappingProxyType({"value": 4})]
    states = [t.state() for t in submit_many(jobs_for_tests.noop, calls, store=store)]
    assert [(list(s.call.args), dict(s.call.kwargs)) for s in states if s.call] == [
        ([1], {}),
        ([2], {}),
        ([], {"value": 4}),
    ]
    with pytest.raises(InvalidInput, match=r"job 1: a call is a list .* not str"):
        submit_many(jobs_for_tests.noop, ["7"], store=store)
    assert len(store.list(limit=None)) == 3
