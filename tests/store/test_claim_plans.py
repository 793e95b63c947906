"""A claim reads an index in the claim's order whatever queues it serves, so its cost does
not grow with the jobs waiting (the plans are checked, not timed: BENCHMARKS.md, issue #18,
has the times). Before, a claim of several queues, or of every queue, sorted every claimable
job of them for each claim."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from outlast.model import Kind, utcnow
from outlast.store import Store, open_store
from outlast.store.sql import window
from outlast.store.sqlite import SQLiteStore
from tests.pg import support

BACKLOG = 2000
POOL = [Kind.FUNCTION, Kind.PIPELINE]  # the kinds a pool claims


@contextlib.contextmanager
def _pg_store() -> Iterator[tuple[Store, str]]:
    """A fresh PostgreSQL store of its own schema, and the schema (dropped after)."""
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    try:
        with open_store(url) as store:
            yield store, support.schema_of(url)
    finally:
        support.drop_schema(url)


def test_a_claim_of_every_queue_takes_the_highest_priority_first(store: Store) -> None:
    """The order is the claim's across queues: priority, then due, then id."""
    low = store.create(name="low", queue="a")
    high = store.create(name="high", queue="b", priority=5)
    other = store.create(name="other", queue="c", priority=5)
    [first] = store.claim(None, 1)
    [second] = store.claim(None, 1, ["a", "c"])
    [third] = store.claim(None, 1, ["a"])
    assert (first.id, second.id, third.id) == (high.id, other.id, low.id)


def test_a_claim_reads_the_priorities_below_when_the_highest_runs_short(store: Store) -> None:
    """A claim takes the due jobs of a queue's highest priority, then those of the next
    one down, and so on, in one claim; a job not yet due is passed over at any priority,
    and each queue of a claim of several is read so."""
    now = utcnow()
    store.create(name="later", queue="a", priority=9, run_after=now + timedelta(hours=1))
    top = store.create(name="top", queue="a", priority=5)
    store.create(name="later", queue="a", priority=5, run_after=now + timedelta(hours=1))
    mid = [store.create(name="mid", queue="a", priority=2) for _ in range(2)]
    low = store.create(name="low", queue="a")
    other = store.create(name="other", queue="b", priority=3)
    assert [t.id for t in store.claim(None, 3, ["a"])] == [top.id, mid[0].id, mid[1].id]
    assert [t.id for t in store.claim(None, 3, ["a", "b"])] == [other.id, low.id]
    assert store.claim(None, 3) == []
    assert store.next_due(["a"]) == now + timedelta(hours=1)


@pytest.mark.parametrize("queues", [None, ["a", "b"], ["a"]])
def test_a_sqlite_claim_reads_the_due_range_of_each_queues_highest_priority(
    tmp_path: Path, queues: list[str] | None
) -> None:
    """``jobs_due`` holds the claimable jobs queue by queue, priority by priority, in the
    order they fall due: a pool's claim reads the due range of each queue's highest
    priority (of every queue that holds one, when it names none), and sorts only the rows
    it read. The jobs waiting behind the due ones, delayed or of other queues, are not
    read, nor the command jobs that wait in its queues (their supervisors start them). The
    jobs of a concurrency key are in an index of their own, read in a window."""
    tmp_path.chmod(0o700)
    path = tmp_path / "s.db"
    with open_store(f"sqlite://{path}") as store:
        assert isinstance(store, SQLiteStore)
        jobs = [{"queue": "ab"[i % 2]} for i in range(BACKLOG)]
        store.create_many(jobs, {"name": "w", "kind": Kind.FUNCTION})
        later = utcnow() + timedelta(days=1)
        store.create_many(jobs, {"name": "w", "kind": Kind.FUNCTION, "run_after": later})
        store.create_many(jobs, {"name": "c"})  # commands
        queues = queues or store._claimable_queues(POOL)
        sql, params = store._due_query(queues, POOL, utcnow(), 16)
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    finally:
        conn.close()
    keyed = "SEARCH jobs USING INDEX jobs_due_keyed (queue=? AND priority=? AND <expr><?)"
    reads = [d for _, _, _, d in plan if d.startswith(("SEARCH j ", "SCAN j ")) or d == keyed]
    ranges = ["SEARCH j USING INDEX jobs_due (queue=? AND priority=? AND <expr><?)", keyed]
    assert reads == ranges * len(queues or "ab"), plan
    assert not [detail for _, _, _, detail in plan if "TEMP B-TREE" in detail], plan


@pytest.mark.parametrize("queues", [None, ["a"]])
def test_a_postgresql_claim_reads_the_due_range_of_the_highest_priority_from_an_index(
    queues: list[str] | None,
) -> None:
    """A pool's claim: in the claim's order, and only the due ones: the delayed jobs behind
    them are not read (nor sorted, as a bitmap scan would), nor the command jobs waiting in
    its queues."""
    with _pg_store() as (store, schema):
        jobs = [{"queue": "ab"[i % 2]} for i in range(BACKLOG)]
        store.create_many(jobs, {"name": "w", "kind": Kind.FUNCTION})
        later = utcnow() + timedelta(days=1)
        store.create_many(jobs, {"name": "w", "kind": Kind.FUNCTION, "run_after": later})
        store.create_many(jobs, {"name": "c"})  # commands
        with support.connect() as conn:
            conn.execute(f'ANALYZE "{schema}".jobs')
        with support.statements_sent() as sent:
            assert len(store.claim(None, 2, queues, POOL)) == 2
        [(sql, params)] = [(s, p) for s, p in sent if s.startswith("WITH s AS")]
        plan = support.explain(sql, params)  # while the schema is there
        generic = support.explain_generic(sql, params)  # the plan the lock connections use
    index = "jobs_due_all" if queues is None else "jobs_due"
    for shown in (plan, generic):
        assert f"Index Scan using {index} on jobs" in shown, shown
        assert "Seq Scan on jobs" not in shown and "Bitmap" not in shown, shown
        ranges = [line for line in shown.splitlines() if "Index Cond" in line and "<=" in line]
        assert ranges and "COALESCE(run_after, created_at) <=" in ranges[0], shown


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
        jobs = [{"priority": i % 3} for i in range(BACKLOG)]
        store.create_many(jobs, {"run_after": later, "kind": Kind.FUNCTION})
        store.create_many(jobs, {"name": "c"})  # commands, due now: not a pool's
        asked: list[tuple[str, Any]] = []
        real = store._query

        def query(what: str, sql: str, params: Any) -> Any:
            asked.append((sql, params))
            return real(what, sql, params)

        monkeypatch.setattr(store, "_query", query)
        assert store.next_due(["default"], POOL) == later
    [(sql, params), (keyed, keyed_params)] = asked  # the jobs of no key, then of a key
    conn = sqlite3.connect(path)
    try:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
        keyed_plan = conn.execute(f"EXPLAIN QUERY PLAN {keyed}", keyed_params).fetchall()
    finally:
        conn.close()
    shown = "; ".join(detail for _, _, _, detail in plan + keyed_plan)
    both = plan + keyed_plan
    reads = [detail for _, _, _, detail in both if " jobs " in f"{detail} " or " j " in detail]
    assert reads and all(d.startswith("SEARCH") for d in reads), shown  # no scan of jobs
    # the jobs it orders are read a priority at a time (each its first), not the queue's
    firsts = [d for _, _, _, d in plan if d.startswith("SEARCH j ")]
    assert firsts == ["SEARCH j USING INDEX jobs_due (queue=? AND priority=?)"], shown
    assert [p for _, p, _, d in plan if "TEMP B-TREE" in d] == [0], shown  # the firsts only
    # the keyed jobs' in a window of each priority (the window, and its count), whose rows
    # alone are sorted (at most sql.window(1))
    window = "SEARCH jobs USING INDEX jobs_due_keyed (queue=? AND priority=?)"
    assert [d for _, _, _, d in keyed_plan if d == window] == [window] * 2, shown
    assert len([d for _, _, _, d in keyed_plan if "TEMP B-TREE" in d]) == 1, shown


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


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_job_made_by_a_clock_ahead_is_claimed_within_the_skew_the_claim_allows(
    tmp_path: Path, engine: str
) -> None:
    """A job without ``run_after`` is due from its ``created_at``, which the host that made
    it wrote: a claim reads up to ``SKEW`` past its own clock, so a job from a clock ahead
    by less is claimed at once, and one from a clock further ahead when it comes within
    ``SKEW`` (which ``next_due`` says, so an idle pool waits for it rather than spins)."""
    from outlast.store.sql import SKEW

    if engine == "sqlite":
        tmp_path.chmod(0o700)
        url: str | None = f"sqlite://{tmp_path / 's.db'}"
    else:
        url = support.make_url()
        if url is None:
            pytest.skip("no PostgreSQL server here")
    assert url is not None
    try:
        with open_store(url) as store:
            near = store.create(name="near", queue="a")
            far = store.create(name="far", queue="b")
            now = utcnow()
            ahead = {near.id: now + SKEW / 2, far.id: now + SKEW * 6}
            if engine == "sqlite":
                assert isinstance(store, SQLiteStore)
                conn = sqlite3.connect(tmp_path / "s.db")
                with conn:
                    for job_id, at in ahead.items():
                        sql = "UPDATE jobs SET created_at = ? WHERE id = ?"
                        conn.execute(sql, (store.dialect.time(at), job_id))
                conn.close()
            else:
                with support.connect() as conn:
                    for job_id, at in ahead.items():
                        conn.execute(
                            f'UPDATE "{support.schema_of(url)}".jobs SET created_at = %s'
                            " WHERE id = %s",
                            (at, job_id),
                        )
            [task] = store.claim(None, 2)
            assert task.id == near.id
            assert store.claim(None, 2) == []
            due = store.next_due(["b"])
            assert due is not None and abs((due - (ahead[far.id] - SKEW)).total_seconds()) < 1e-3
    finally:
        if engine == "postgresql" and url is not None:
            support.drop_schema(url)


def _sqlite_work(store: SQLiteStore, call: Any) -> int:
    """SQLite's own count of the work ``call`` makes it do (VM instructions, in hundreds)."""
    conn = store._conn()
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(step, 100)
    try:
        call()
    finally:
        conn.set_progress_handler(None, 100)
    return steps


def _pool_work(store: SQLiteStore, job_id: str) -> list[int]:
    """The work of a pool's ``next_due``, then of its claim, which takes ``job_id``."""
    calls = [
        lambda: store.next_due(["default"], POOL),
        lambda: store.claim(None, 4, ["default"], POOL),
    ]
    work = [_sqlite_work(store, call) for call in calls]
    assert store.get(job_id).status == "running"
    return work


def _assert_flat(work: list[list[int]]) -> None:
    """Ten times as many jobs waiting must not cost half as much again, call by call."""
    small, big = work
    for before, after in zip(small, big, strict=True):
        assert after < 1.5 * before + 10, work


def test_a_pools_claim_does_not_read_the_jobs_waiting_behind_its_due_ones(tmp_path: Path) -> None:
    """The work of a pool's claim (and of its ``next_due``) does not grow with the jobs that
    wait in its queue and are not its to take now: delayed ones, and command jobs (a full
    group's, their supervisors' to start). Counted by SQLite itself, not timed: ten times
    as many of them must not cost half as much again. Before, each claim that ran short
    walked them all (56 ms with 100,000 delayed jobs, BENCHMARKS.md)."""
    tmp_path.chmod(0o700)
    work = []
    for n in (200, 2000):
        with open_store(f"sqlite://{tmp_path / f'{n}.db'}") as store:
            assert isinstance(store, SQLiteStore)
            later = utcnow() + timedelta(days=1)
            store.create_many([{}] * n, {"name": "w", "kind": Kind.FUNCTION, "run_after": later})
            store.create_many([{}] * n, {"name": "c", "limit_key": "g"})  # a group's commands
            job = store.create(name="now", kind=Kind.FUNCTION)
            work.append(_pool_work(store, job.id))
    _assert_flat(work)


def test_a_keys_parked_jobs_are_read_from_their_own_index(tmp_path: Path) -> None:
    """A group's hand-off reads the key's first parked jobs, and the maintainer the keys
    with parked jobs, from ``jobs_parked`` (per key, in claim order): ten times as many
    parked jobs, of that key and of others, must not cost half as much again. Counted by
    SQLite itself. Before, each read went through every pending job and sorted the key's
    (6.4 ms with 10,000 parked, BENCHMARKS.md)."""
    tmp_path.chmod(0o700)
    work = []
    for n in (200, 2000):
        with open_store(f"sqlite://{tmp_path / f'{n}.db'}") as store:
            assert isinstance(store, SQLiteStore)
            store.create_many([{}] * n, {"name": "c", "limit_key": "g"})
            store.create_many([{"limit_key": f"t{i % 50}"} for i in range(n)], {"name": "c"})
            store.create_many([{}] * n, {"name": "w", "kind": Kind.FUNCTION, "limit_key": "g"})
            store.set_slots("g", 2)
            assert len(store.parked("g")) == 2 and len(store.parked_keys()) == 51
            calls = [lambda: store.parked("g"), store.parked_keys]
            work.append([_sqlite_work(store, call) for call in calls])
    _assert_flat(work)


def test_a_postgresql_hand_off_reads_the_keys_parked_jobs_from_their_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _pg_store() as (store, schema):
        store.create_many([{}] * BACKLOG, {"name": "c", "limit_key": "g"})
        store.create_many([{}] * BACKLOG, {"name": "c", "limit_key": "h"})
        store.create_many([{}] * BACKLOG, {"name": "w", "kind": Kind.FUNCTION})
        sent = _analyzed_and_recorded(store, schema, monkeypatch)
        assert len(store.parked("g")) == 1
        [(sql, params)] = [(s, p) for s, p in sent if "ORDER BY" in s and "limit_key =" in s]
        plan = support.explain(sql, params)  # while the schema is there
    assert "Index Scan using jobs_parked on jobs" in plan, plan
    assert "Seq Scan" not in plan and "Bitmap" not in plan and "Sort" not in plan, plan


def _analyzed_and_recorded(
    store: Store, schema: str, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, Any]]:
    """``ANALYZE`` the store's jobs; then every query the store sends, ``(sql, params)``,
    is added to the list returned."""
    with support.connect() as conn:
        conn.execute(f'ANALYZE "{schema}".jobs')
    sent: list[tuple[str, Any]] = []
    real = store._query  # type: ignore[attr-defined]

    def query(what: str, sql: str, params: Any = ()) -> Any:
        sent.append((sql, params))
        return real(what, sql, params)

    monkeypatch.setattr(store, "_query", query)
    return sent


FULL = 300  # more jobs of a full key than a claim's window (sql.window) walks


def _behind_a_full_key(store: Store) -> dict[str, str]:
    """A key of one slot, taken, with ``FULL`` jobs waiting first in claim order; behind
    them a key of three free slots with four jobs, a job of no key and one of a lower
    priority. Their ids by name."""
    store.create(name="holder", kind=Kind.FUNCTION, limit_key="full", limit=1)
    [holder] = store.claim(None, 1, ["default"], POOL)
    store.create_many([{}] * FULL, {"name": "stuck", "kind": Kind.FUNCTION, "limit_key": "full"})
    ids = {"holder": holder.id}
    for i in range(4):
        ids[f"wide{i}"] = store.create(
            name=f"wide{i}", kind=Kind.FUNCTION, limit_key="wide", limit=3
        ).id
    ids["plain"] = store.create(name="plain", kind=Kind.FUNCTION).id
    ids["low"] = store.create(name="low", kind=Kind.FUNCTION, priority=-1).id
    return ids


def test_a_claim_takes_the_jobs_behind_a_full_keys_in_claim_order(store: Store) -> None:
    """The jobs of a key with no free slot are passed over, however many wait first: a
    claim takes the other keys' jobs as far as their slots go, the jobs of no key and those
    of lower priorities, in claim order; and ``next_due`` does not count the full key's."""
    ids = _behind_a_full_key(store)
    taken = [t.id for t in store.claim(None, 10, ["default"], POOL)]
    want = [ids["wide0"], ids["wide1"], ids["wide2"], ids["plain"], ids["low"]]
    assert taken == want
    assert store.claim(None, 10, ["default"], POOL) == []
    assert store.next_due(["default"], POOL) is None
    store.open(ids["wide0"]).succeed(None)  # a slot of the wide key again
    due = store.next_due(["default"], POOL)
    assert due is not None and due <= utcnow()
    assert [t.id for t in store.claim(None, 10, None, POOL)] == [ids["wide3"]]
    store.open(ids["holder"]).succeed(None)  # and the full key's: its first job next
    [first] = store.claim(None, 10, ["default"], POOL)
    assert first.state().name == "stuck" and store.claim(None, 1, ["default"], POOL) == []


def test_a_claim_behind_a_full_key_does_not_walk_its_jobs(tmp_path: Path) -> None:
    """SQLite's own count of a claim's and a ``next_due``'s work behind 200 and behind 2,000
    jobs of a full key: ten times as many must not cost half as much again. Before, each
    claim checked every one of them (107 ms on SQLite with 100,000, BENCHMARKS.md)."""
    tmp_path.chmod(0o700)
    work = []
    for n in (200, 2000):
        with open_store(f"sqlite://{tmp_path / f'{n}.db'}") as store:
            assert isinstance(store, SQLiteStore)
            store.create(name="holder", kind=Kind.FUNCTION, limit_key="full", limit=1)
            assert len(store.claim(None, 1, ["default"], POOL)) == 1
            store.create_many([{}] * n, {"name": "w", "kind": Kind.FUNCTION, "limit_key": "full"})
            store.create_many([{"limit_key": f"t{i}"} for i in range(20)], {"name": "t"})
            job = store.create(name="now", kind=Kind.FUNCTION, limit_key="other")
            work.append(_pool_work(store, job.id))
    _assert_flat(work)


def test_a_postgresql_claim_behind_a_full_key_reads_a_window_then_the_keys() -> None:
    """On PostgreSQL, the rows a claim's read takes from the keyed jobs' index are at most
    its window, however many jobs of the full key wait; the keys are then read one by one
    (one index step each)."""
    with _pg_store() as (store, schema):
        _behind_a_full_key(store)
        store.create_many(
            [{}] * BACKLOG, {"name": "stuck", "kind": Kind.FUNCTION, "limit_key": "full"}
        )
        with support.connect() as conn:
            conn.execute(f'ANALYZE "{schema}".jobs')
        with support.statements_sent() as sent:
            assert len(store.claim(None, 2, ["default"], POOL)) == 2
        [(sql, params)] = [(s, p) for s, p in sent if s.startswith("WITH s AS")][:1]
        with support.connect() as conn:
            conn.execute("BEGIN")
            plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN ANALYZE {sql}", params))
            conn.execute("ROLLBACK")
        heads = [s for s, _ in sent if s.startswith("WITH RECURSIVE p(v)")]
    assert heads, sent  # the window was all the full key's: the keys one by one
    keyed = [  # its own queue's index, or the one across queues: the planner's choice
        line
        for line in plan.splitlines()
        if "Index Scan using jobs_due_keyed" in line
        or "Index Scan using jobs_due_all_keyed" in line
    ]
    assert keyed, plan
    rows = [int(line.split("rows=")[-1].split()[0]) for line in keyed]
    assert max(rows) <= window(2), plan


def test_the_timers_read_and_the_maintainers_do_not_walk_the_jobs_waiting_for_their_time(
    tmp_path: Path,
) -> None:
    """The store's timer reads the next jobs waiting for their time from ``jobs_timed``,
    and the maintainer's look for jobs nobody took reads only the due ones: ten times as
    many delayed commands must not cost half as much again (counted by SQLite itself).
    Before, the maintainer read and decoded every delayed command's document on each look
    (each held a sleeping supervisor then, so few could wait)."""
    tmp_path.chmod(0o700)
    work = []
    for n in (200, 2000):
        with open_store(f"sqlite://{tmp_path / f'{n}.db'}") as store:
            assert isinstance(store, SQLiteStore)
            later = utcnow() + timedelta(days=1)
            store.create_many([{}] * n, {"name": "c", "run_after": later})
            store.create_many([{}] * n, {"name": "w", "kind": Kind.FUNCTION, "run_after": later})
            soon = store.create(name="soon", run_after=utcnow() + timedelta(hours=1)).id
            assert [s.id for s in store.timed(limit=1)] == [soon]
            assert store.unclaimed() == []
            calls = [lambda: store.timed(limit=1), store.unclaimed]
            work.append([_sqlite_work(store, call) for call in calls])
    _assert_flat(work)


def test_a_postgresql_timer_reads_the_jobs_waiting_for_their_time_from_their_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _pg_store() as (store, schema):
        later = utcnow() + timedelta(days=1)
        store.create_many([{}] * BACKLOG, {"name": "c", "run_after": later})
        store.create_many([{}] * BACKLOG, {"name": "c"})
        store.create_many([{}] * BACKLOG, {"name": "w", "kind": Kind.FUNCTION})
        sent = _analyzed_and_recorded(store, schema, monkeypatch)
        [first] = store.timed(limit=1)
        assert first.run_after is not None
        assert len(store.timed((first.run_after, first.id), 5)) == 5
        assert len(store.unclaimed()) == BACKLOG  # the commands of no time: all due
        plans = [support.explain(sql, params) for sql, params in sent]
    assert len(plans) == 3, sent
    for plan in plans:
        assert "Seq Scan" not in plan and "Bitmap" not in plan and "Sort" not in plan, plan
    assert "Index Scan using jobs_timed on jobs" in plans[0], plans[0]
    assert "Index Scan using jobs_timed on jobs" in plans[1], plans[1]
    assert "using jobs_unclaimed on jobs" in plans[2], plans[2]
    assert "using jobs_timed on jobs" in plans[2], plans[2]
