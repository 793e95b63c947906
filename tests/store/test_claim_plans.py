"""A claim reads an index in the claim's order whatever queues it serves, so its cost does
not grow with the jobs waiting (the plans are checked, not timed: BENCHMARKS.md, issue #18,
has the times). Before ``jobs_due_all``, a pool of every queue sorted every claimable job
for each claim."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from outlast.model import utcnow
from outlast.store import Store, open_store
from outlast.store.sqlite import SQLiteStore
from tests.pg import support

BACKLOG = 2000


def test_a_claim_of_every_queue_takes_the_highest_priority_first(store: Store) -> None:
    """The order is the claim's across queues: priority, then due, then id."""
    low = store.create(name="low", queue="a")
    high = store.create(name="high", queue="b", priority=5)
    other = store.create(name="other", queue="c", priority=5)
    [first] = store.claim(None, 1)
    [second] = store.claim(None, 1, ["a", "c"])
    [third] = store.claim(None, 1, ["a"])
    assert (first.id, second.id, third.id) == (high.id, other.id, low.id)


@pytest.mark.parametrize(
    ("queues", "index"),
    [(None, "jobs_due_all"), (["a", "b"], "jobs_due_all"), (["a"], "jobs_due")],
)
def test_a_sqlite_claim_reads_its_jobs_in_order_from_an_index(
    tmp_path: Path, queues: list[str] | None, index: str
) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "s.db"
    with open_store(f"sqlite://{path}") as store:
        assert isinstance(store, SQLiteStore)
        store.create_many([{"queue": "ab"[i % 2]} for i in range(BACKLOG)], {"name": "w"})
        sql, params = store._due_query(queues, None, utcnow())
    conn = sqlite3.connect(path)
    try:
        plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (*params, 2)))
    finally:
        conn.close()
    assert f"USING INDEX {index}" in plan and "TEMP B-TREE" not in plan, plan


@pytest.mark.parametrize("queues", [None, ["a"]])
def test_a_postgresql_claim_reads_its_jobs_in_order_from_an_index(
    queues: list[str] | None,
) -> None:
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    schema = support.schema_of(url)
    try:
        with open_store(url) as store:
            store.create_many([{"queue": "ab"[i % 2]} for i in range(BACKLOG)], {"name": "w"})
            with support.connect() as conn:
                conn.execute(f'ANALYZE "{schema}".jobs')
            with support.statements_sent() as sent:
                assert len(store.claim(None, 2, queues)) == 2
        [(sql, params)] = [(s, p) for s, p in sent if s.startswith("WITH c AS")]
        plan = support.explain(sql, params)
        index = "jobs_due_all" if queues is None else "jobs_due"
        assert index in plan and "Seq Scan on jobs" not in plan, plan
    finally:
        support.drop_schema(url)
