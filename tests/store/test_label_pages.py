"""A listing of a label walks that label's jobs newest first and stops after a page
(``labels_kv`` holds each job's ``created_at``; outlast.store._sqllist): the pages are right
with every other filter beside the label, on every store; the SQL stores' plans read the
index in order, with no sort (checked, not timed: BENCHMARKS.md, issue #18, has the times);
and a store of the version before, whose label rows have no time, is listed the same."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from outlast.model import JobState
from outlast.store import Store, open_store
from outlast.store import postgresql as pg
from outlast.store import sqlite as sq
from tests.pg import support


def _fill(store: Store) -> list[str]:
    """Twelve jobs, every other one labeled team=billing (every fourth also tier=gold), some
    succeeded; the ids of all, oldest first."""
    ids = []
    for i in range(12):
        labels = {"team": "billing"} if i % 2 else {"team": "ops"}
        if i % 4 == 1:
            labels["tier"] = "gold"
        ids.append(store.create(name=f"charge.{i}" if i % 3 else f"refund.{i}", labels=labels).id)
    for job_id in ids[::3]:
        task = store.open(job_id)
        task.start()
        task.succeed(None)
    return ids


def _pages(list_page: Callable[..., list[JobState]], size: int) -> list[str]:
    """Every job of the listing, page by page through the ``before`` cursor."""
    seen: list[str] = []
    while True:
        page = list_page(limit=size, before=seen[-1] if seen else None)
        seen += [state.id for state in page]
        if len(page) < size:
            return seen


def _expected(store: Store, ids: list[str], **filters: Any) -> list[str]:
    """The ids of the jobs that match, newest first, from each job's own document."""
    states = [store.get(job_id) for job_id in ids]
    label = filters.get("label", {})
    return [
        s.id
        for s in sorted(states, key=lambda s: (s.created_at, s.id), reverse=True)
        if all(s.labels.get(k) == v for k, v in label.items())
        and filters.get("status") in (None, str(s.status))
        and filters.get("name", "") in s.name
    ]


@pytest.mark.parametrize(
    "filters",
    [
        {"label": {"team": "billing"}},
        {"label": {"team": "billing", "tier": "gold"}},
        {"label": {"team": "billing"}, "status": "pending"},
        {"label": {"team": "billing"}, "status": "succeeded"},
        {"label": {"team": "billing"}, "name": "refund"},
        {"label": {"team": "nobody"}},
    ],
    ids=lambda filters: ",".join(f"{k}={v}" for k, v in filters.items()),
)
def test_a_label_is_listed_newest_first_page_by_page_with_every_filter(
    store: Store, filters: dict[str, Any]
) -> None:
    ids = _fill(store)
    want = _expected(store, ids, **filters)
    assert [s.id for s in store.list(limit=None, **filters)] == want
    for size in (1, 2, 5):
        assert _pages(lambda **kw: store.list(**kw, **filters), size) == want, size
    assert [s.id for s in store.list(limit=2, **filters)] == want[:2]


def test_jobs_created_many_at_once_are_listed_by_label_in_order(store: Store) -> None:
    """``create_many`` writes its labels in one statement (PostgreSQL: a binary ``COPY``):
    their times too."""
    first = store.create(name="one", labels={"team": "billing"})
    many = store.create_many(
        [{"name": f"bulk.{i}", "labels": {"team": "billing" if i % 2 else "ops"}} for i in range(6)]
    )
    last = store.create(name="last", labels={"team": "billing"})
    ids = [first.id, *(t.id for t in many), last.id]
    want = _expected(store, ids, label={"team": "billing"})  # (many share one time)
    assert len(want) == 5 and want[0] == last.id and want[-1] == first.id
    assert _pages(lambda **kw: store.list(label={"team": "billing"}, **kw), 2) == want


def test_a_label_with_an_id_prefix(store: Store) -> None:
    ids = _fill(store)
    billing = _expected(store, ids, label={"team": "billing"})
    target = billing[1]
    found = store.list(label={"team": "billing"}, id_prefix=target)
    assert [s.id for s in found] == [target]


def _label_sql(store: Store, **filters: Any) -> tuple[str, list[Any]]:
    """The statement a page of the listing runs, and its parameters."""
    seen: list[tuple[str, list[Any]]] = []
    query = store._query  # type: ignore[attr-defined]

    def spy(what: str, sql: str, params: Any = ()) -> Any:
        seen.append((sql, list(params)))
        return query(what, sql, params)

    store._query = spy  # type: ignore[attr-defined]
    try:
        store.list(limit=50, **filters)
    finally:
        del store._query  # type: ignore[attr-defined]
    return seen[-1]


_PLANNED = [
    {"label": {"team": "billing"}},
    {"label": {"team": "billing", "tier": "gold"}, "status": "pending"},
]


def test_a_label_page_reads_labels_kv_in_order_on_sqlite(tmp_path: Path) -> None:
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        ids = _fill(store)
        for filters in [*_PLANNED, {"label": {"team": "billing"}, "before": ids[-1]}]:
            sql, params = _label_sql(store, **filters)
            conn = sqlite3.connect(tmp_path / "s.db")
            try:
                plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            finally:
                conn.close()
            assert "labels_kv" in plan[0], plan  # the label's index drives the walk
            assert not any("TEMP B-TREE" in step for step in plan), plan  # and nothing sorts


def test_a_label_page_reads_labels_kv_in_order_on_postgresql() -> None:
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    try:
        with open_store(url) as store:
            _fill(store)
            for filters in _PLANNED:
                sql, params = _label_sql(store, **filters)
                plan = support.explain(sql, params)
                assert "Index Only Scan Backward using labels_kv" in plan, plan
                assert "Sort" not in plan, plan
    finally:
        support.drop_schema(url)


def _check_old(store: Store, ids: list[str]) -> None:
    want = _expected(store, ids, label={"team": "billing"})
    assert _pages(lambda **kw: store.list(label={"team": "billing"}, **kw), 2) == want
    new = store.create(name="new", labels={"team": "billing"})
    assert [s.id for s in store.list(label={"team": "billing"}, limit=2)] == [new.id, *want[:1]]


def test_a_sqlite_store_of_the_version_before_lists_its_labels(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with open_store(f"sqlite://{path}") as store:
        ids = _fill(store)
    conn = sqlite3.connect(path)
    with conn:  # as the version before left it: labels of key and value only
        conn.execute("DROP INDEX labels_kv")
        conn.execute("ALTER TABLE labels DROP COLUMN created_at")
        conn.execute("CREATE INDEX labels_kv ON labels (key, value)")
        conn.execute(f"PRAGMA user_version = {sq.SCHEMA_VERSION - 1}")
    conn.close()
    with open_store(f"sqlite://{path}") as store:
        _check_old(store, ids)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sq.SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM labels WHERE created_at IS NULL").fetchone() == (
            0,
        )
    finally:
        conn.close()


def test_a_postgresql_store_of_the_version_before_lists_its_labels() -> None:
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    s = f'"{support.schema_of(url)}"'
    try:
        with open_store(url) as store:
            ids = _fill(store)
        with support.connect() as conn:  # as the version before left it
            conn.execute(f"ALTER TABLE {s}.labels DROP COLUMN created_at")  # and its index
            conn.execute(f"CREATE INDEX labels_kv ON {s}.labels (key, value)")
            latest = len(pg.migrations(support.schema_of(url)))
            conn.execute(f"DELETE FROM {s}.schema_version WHERE version = %s", (latest,))
        with open_store(url) as store:
            _check_old(store, ids)
        with support.connect() as conn:
            nulls = conn.execute(f"SELECT count(*) FROM {s}.labels WHERE created_at IS NULL")
            assert nulls.fetchone() == (0,)
    finally:
        support.drop_schema(url)


def test_a_job_created_in_the_callers_postgresql_transaction_is_listed_by_label() -> None:
    """``create(connection=…)`` writes its labels in the caller's transaction: their time
    too, so the job is on the label's pages once the transaction commits."""
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    try:
        with open_store(url) as store, support.connect() as conn:
            older = store.create(name="older", labels={"team": "billing"})
            with conn.transaction():
                mine = store.create(name="mine", labels={"team": "billing"}, connection=conn)
            newer = store.create(name="newer", labels={"team": "billing"})
            want = [newer.id, mine.id, older.id]
            assert _pages(lambda **kw: store.list(label={"team": "billing"}, **kw), 1) == want
    finally:
        support.drop_schema(url)
