"""A claim reads an index in the claim's order whatever queues it serves, so its cost does
not grow with the jobs waiting (the plans are checked, not timed: BENCHMARKS.md, issue #18,
has the times). Before, a claim of several queues, or of every queue, sorted every claimable
job of them for each claim."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from outlast.model import Kind, utcnow
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


def test_next_due_is_the_earliest_claimable_job_of_any_priority(store: Store) -> None:
    """``next_due`` (when an idle pool looks again): the earliest due of the claimable jobs
    of its queues and kinds, whatever their priority, skipping those whose limit key has
    no free slot; None when there is none, and a time already past when one is due."""
    now = utcnow()
    assert store.next_due() is None
    store.create(name="far", queue="a", run_after=now + timedelta(hours=3))
    store.create(name="near", queue="a", run_after=now + timedelta(hours=2), priority=5)
    store.create(name="other", queue="b", run_after=now + timedelta(hours=1))
    store.create(name="fn", queue="a", kind=Kind.FUNCTION, run_after=now + timedelta(hours=4))
    assert store.next_due(["a"]) == now + timedelta(hours=2)
    assert store.next_due(["a", "b"]) == store.next_due() == now + timedelta(hours=1)
    assert store.next_due(["a"], [Kind.FUNCTION]) == now + timedelta(hours=4)
    assert store.next_due(["c"]) is None
    # a job whose key has no free slot is not due, whenever it was to run
    store.create(name="held", queue="c", limit_key="k", limit=1)
    [running] = store.claim(None, 1, ["c"])
    store.create(name="waits", queue="c", limit_key="k", limit=1, priority=9)
    store.create(name="later", queue="c", run_after=now + timedelta(hours=5))
    assert store.next_due(["c"]) == now + timedelta(hours=5)
    running.succeed(None)
    due = store.next_due(["c"])
    assert due is not None and due <= utcnow()


def test_a_sqlite_next_due_reads_the_first_job_of_each_priority_from_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a sort of the queue's claimable jobs (a pool asks after every claim that took all
    there was): one step of ``jobs_due`` per priority, and the first row there."""
    tmp_path.chmod(0o700)
    path = tmp_path / "s.db"
    later = utcnow() + timedelta(days=1)
    with open_store(f"sqlite://{path}") as store:
        assert isinstance(store, SQLiteStore)
        store.create_many([{"priority": i % 3} for i in range(BACKLOG)], {"run_after": later})
        asked: list[tuple[str, Any]] = []
        real = store._query

        def query(what: str, sql: str, params: Any) -> Any:
            asked.append((sql, params))
            return real(what, sql, params)

        monkeypatch.setattr(store, "_query", query)
        assert store.next_due(["default"]) == later
    [(sql, params)] = asked
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    finally:
        conn.close()
    shown = "; ".join(detail for _, _, _, detail in plan)
    reads = [detail for _, _, _, detail in plan if " jobs " in f"{detail} " or " j " in detail]
    assert reads and all(d.startswith("SEARCH") for d in reads), shown  # no scan of jobs
    # the jobs it orders are read a priority at a time (each its first), not the queue's
    firsts = [d for _, _, _, d in plan if d.startswith("SEARCH j ")]
    assert firsts == ["SEARCH j USING INDEX jobs_due (queue=? AND priority=?)"], shown
    assert [p for _, p, _, d in plan if "TEMP B-TREE" in d] == [0], shown  # the firsts only


def test_an_empty_list_of_queues_is_every_queue(store: Store) -> None:
    """As a filter of none, on every store: claims and ``next_due`` of ``[]`` are of all."""
    now = utcnow()
    later = store.create(name="later", queue="a", run_after=now + timedelta(hours=1))
    assert store.next_due([]) == now + timedelta(hours=1)
    job = store.create(name="now", queue="b")
    [task] = store.claim(None, 1, [])
    assert task.id == job.id and store.claim(None, 1, []) == []
    assert store.get(later.id).status == "pending"


def test_a_files_claim_counts_the_store_once_per_key_not_once_per_waiting_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of a concurrency key is started under the key's lock after a fresh count of
    its running jobs (a scan of the store). Each waiting job of a full key had its own
    count: a claim behind 2,000 of them took 14 s. The claim's own scan skips them now; a
    key that seems to have room is counted once."""
    from outlast.store.files import FilesStore

    tmp_path.chmod(0o700)
    with open_store(f"files://{tmp_path / 'jobs'}") as store:
        assert isinstance(store, FilesStore)
        store.create_many([{} for _ in range(30)], {"name": "w", "limit_key": "k", "limit": 1})
        [held] = store.claim(None, 1)
        free = store.create(name="free")
        scans = 0
        real = store._scan

        def scan(*args: Any, **kwargs: Any) -> Any:
            nonlocal scans
            scans += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "_scan", scan)
        assert [t.id for t in store.claim(None, 4)] == [free.id]
        assert scans == 1, scans  # the claim's own: the key is full in it
        held.succeed(None)
        scans = 0
        [nxt] = store.claim(None, 4)  # one of the key's (one slot): one fresh count of k
        assert scans == 2, scans
        assert store.get(nxt.id).limit_key == "k"
        assert store.claim(None, 4) == []
