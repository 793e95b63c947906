"""A claim reads an index in the claim's order whatever queues it serves, so its cost does
not grow with the jobs waiting (the plans are checked, not timed: BENCHMARKS.md, issue #18,
has the times). Before, a claim of several queues, or of every queue, sorted every claimable
job of them for each claim."""

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


@pytest.mark.parametrize("queues", [None, ["a", "b"], ["a"]])
def test_a_sqlite_claim_reads_the_first_jobs_of_each_queue_from_its_index(
    tmp_path: Path, queues: list[str] | None
) -> None:
    """``jobs_due`` holds the claimable jobs queue by queue: a claim reads the first rows of
    each of its queues (every queue that holds one, when it names none) and sorts only
    those."""
    tmp_path.chmod(0o700)
    path = tmp_path / "s.db"
    with open_store(f"sqlite://{path}") as store:
        assert isinstance(store, SQLiteStore)
        store.create_many([{"queue": "ab"[i % 2]} for i in range(BACKLOG)], {"name": "w"})
        sql, params = store._due_query(queues, None, utcnow(), 16)
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    finally:
        conn.close()
    reads = [detail for _, _, _, detail in plan if detail.startswith(("SEARCH j", "SCAN j"))]
    assert reads == ["SEARCH j USING INDEX jobs_due (queue=?)"] * len(queues or "ab"), plan
    sorts = [parent for _, parent, _, detail in plan if "TEMP B-TREE" in detail]
    assert sorts == ([0] if len(queues or "ab") > 1 else []), plan  # of the firsts only


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
