"""The PostgreSQL adapter's own promises: migrations, exactly-once claims across processes,
exact death detection through advisory locks, fencing after a cut connection, LISTEN/NOTIFY
wake-ups, fork safety, and bad input."""

from __future__ import annotations

import logging
import os
import select
import signal
import stat
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outlast import codec
from outlast.errors import CorruptJob, InvalidInput, JobNotFound, StoreError, WorkerLockHeld
from outlast.machine import Outcome
from outlast.model import Status
from outlast.run.execute import transition
from outlast.store import _pglocks, open_store
from outlast.store import postgresql as pg
from outlast.store.postgresql import PostgresStore
from tests.pg import support, workers
from tests.store import procs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def url(store_url: str) -> str:
    return store_url


@pytest.fixture
def pgstore(url: str) -> Iterator[PostgresStore]:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    try:
        yield store
    finally:
        store.close()


def until(condition: object, timeout: float, step: float = 0.005) -> float:
    """Poll ``condition()`` until true; returns the seconds it took (fails after timeout)."""
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - started > timeout:
            pytest.fail(f"not true within {timeout}s")
        time.sleep(step)
    return time.monotonic() - started


# ------------------------------------------------------------------------------ migrations
def versions(url: str) -> list[int]:
    with support.connect() as conn:
        rows = conn.execute(
            f'SELECT version FROM "{support.schema_of(url)}".schema_version ORDER BY version'
        ).fetchall()
    return [int(r[0]) for r in rows]  # type: ignore[call-overload]


def test_migrations_are_idempotent(url: str) -> None:
    with open_store(url) as store:
        job = store.create(name="kept")
    assert versions(url) == list(range(1, len(pg.migrations("any")) + 1))
    for _ in range(3):
        with open_store(url) as store:
            assert store.get(job.id).name == "kept"
    assert versions(url) == list(range(1, len(pg.migrations("any")) + 1))


def test_the_binary_copy_types_are_the_columns_types(url: str) -> None:
    """A bulk insert is a binary ``COPY`` whose column types are written down
    (``pg.COPY_TYPES``): a type that drifted from the migrations' would fail every
    ``submit_many``, or, for two integer widths, write wrong numbers."""
    import psycopg

    types = psycopg.adapters.types  # the built-in names of psycopg
    with open_store(url) as store:
        labelled = store.create_many([{"name": "bulk", "labels": {"team": "a"}}] * 3)
        assert [store.get(t.id).labels for t in labelled] == [{"team": "a"}] * 3
    schema = support.schema_of(url)
    with support.connect() as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname, a.atttypid FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname IN ('jobs', 'labels')"
            " AND a.attnum > 0 AND NOT a.attisdropped",
            (schema,),
        ).fetchall()
    assert {table for table, _, _ in rows} == {"jobs", "labels"}
    for table, column, oid in rows:
        assert types[pg.COPY_TYPES[column]].oid == oid, (table, column)


def test_migrations_from_four_processes_at_once(url: str) -> None:
    barrier = procs.CTX.Barrier(4)
    children = [procs.Child(workers.open_together, url, barrier) for _ in range(4)]
    try:
        for child in children:
            child.expect("opened", 60)
            child.join()
    finally:
        for child in children:
            child.close()
    assert versions(url) == list(range(1, len(pg.migrations("any")) + 1))
    with open_store(url) as store:
        assert store.list() == []


def test_a_schema_newer_than_the_code_is_refused(url: str) -> None:
    open_store(url).close()
    with support.connect() as conn:
        conn.execute(f'INSERT INTO "{support.schema_of(url)}".schema_version VALUES (999)')
    with pytest.raises(StoreError, match="newer"):
        open_store(url)


# ----------------------------------------------------------------------------- exactly once
def test_four_workers_two_thousand_jobs_each_exactly_once(url: str, pgstore: PostgresStore) -> None:
    n = 2000
    created = {pgstore.create(name=f"j{i}", queue="default").id for i in range(n)}
    children = [procs.Child(workers.claim_and_succeed, url, 4) for _ in range(4)]
    done: list[str] = []
    try:
        for child in children:
            child.expect("ready")
        for child in children:
            child.send("go")
        for child in children:
            got = child.recv(170)
            assert got, "a worker got nothing: the claims were not shared"
            done += got
            child.join()
    finally:
        for child in children:
            child.close()
    counts = Counter(done)
    assert [job for job, c in counts.items() if c > 1] == []
    assert set(done) == created and len(done) == n
    states = pgstore.list(limit=None)
    assert Counter(str(s.status) for s in states) == {"succeeded": n}
    assert all(s.attempts == 1 for s in states)
    for job_id in list(created)[:50]:
        assert [(e.seq, str(e.status)) for e in pgstore.events(job_id)] == [
            (1, "started"),
            (2, "completed"),
        ]


def test_a_claim_and_an_outcome_commit_their_writes_as_one_statement(
    pgstore: PostgresStore,
) -> None:
    """The commit round trip of a claim (journal records, events, the job's row, the
    notifications) is one statement and ``COMMIT``: the writes as data-modifying ``WITH``
    queries, all of them done; the outcome of the job this store object claimed is one
    guarded statement (``_pgguard``), its own transaction."""
    job = pgstore.create(name="fused", queue="default")
    runs: list[list[str]] = []
    guarded: list[set[str]] = []
    real, real_results = pg._Script.run, pg.guard.results

    def run(self: pg._Script, conn: object, pipe: object = None) -> object:
        runs.append([sql for sql, _ in self.statements])
        return real(self, conn, pipe)  # type: ignore[arg-type]

    def results(taken: Any, written: set[str], cache: Any) -> Any:
        guarded.append(written)
        return real_results(taken, written, cache)

    pg._Script.run = run  # type: ignore[method-assign]
    pg.guard.results = results  # type: ignore[assignment]
    try:
        with pgstore.listen([job.id]) as listener:
            [task] = pgstore.claim(None, 1, journal=pgstore.journal("pool", "token"))
            assert listener.wait(10)  # the fused statement's notification arrived
            listener.drain()
            task.succeed({"x": 1})
            assert listener.wait(10)  # and the guarded statement's
    finally:
        pg._Script.run = real  # type: ignore[method-assign]
        pg.guard.results = real_results
    commits = [r for r in runs if r[-1] == "COMMIT"]
    assert len(commits) == 1, runs  # the claim's; the outcome needs none
    [claim] = commits
    assert len(claim) == 2, claim
    assert claim[0].startswith("WITH w0 AS (") and "pg_notify" in claim[0]
    assert ".journal" in claim[0] and ".events" in claim[0] and ".jobs" in claim[0]
    assert guarded == [{job.id}]
    state = pgstore.get(job.id)
    assert state.status == Status.SUCCEEDED and state.result == {"x": 1}
    assert [e.status for e in pgstore.events(job.id)][-2:] == ["started", "completed"]
    # the job's moves counted by the trigger on its row, written inside a WITH query
    counts = {k: n for k, n in pgstore.stats().jobs.items() if n}
    assert counts == {("default", "succeeded", "command"): 1}, counts


def test_a_pools_outcomes_are_one_guarded_statement_and_a_changed_row_is_read_again(
    url: str, pgstore: PostgresStore
) -> None:
    """A batch of outcomes of jobs this store object claimed is one statement, no read
    first (``_pgguard``): each row written only if it holds what was claimed. A row another
    store object changed since (the job's own report, a label, a delete) is refused by the
    guard and goes the ordinary way (read, rule, write), so nothing written meanwhile is
    lost; the events, the notifications and the trigger-kept counts are those of the
    ordinary way."""
    ids = [pgstore.create(kind="function", name=f"g{i}", queue="g").id for i in range(5)]
    claimed = {t.id: t for t in pgstore.claim(None, 5, ["g"], None)}
    assert set(claimed) == set(ids)
    other = open_store(url)
    try:
        other.open(ids[1]).reporter().report("half", "progress", message="mine")
        other.open(ids[2]).relabel("kept", "yes")
        other.delete(ids[3], force=True)
        runs: list[list[tuple[str, tuple[object, ...]]]] = []
        real = pg._Script.run

        def run(self: pg._Script, conn: object, pipe: object = None) -> object:
            runs.append(list(self.statements))
            return real(self, conn, pipe)  # type: ignore[arg-type]

        items = [
            (job_id, transition(Outcome("succeed", value=n), claimed[job_id].attempt))
            for n, job_id in enumerate(ids)
        ]
        pg._Script.run = run  # type: ignore[method-assign]
        try:
            with other.listen([ids[0], ids[4]]) as listener:
                out = pgstore.apply_many(items)
                assert listener.wait(10), "no notification of the guarded write"
        finally:
            pg._Script.run = real  # type: ignore[method-assign]
        # only the rows that changed went the ordinary way: one read of them, one commit
        assert len(runs) == 2, runs
        read, params = runs[0][-1]
        assert read.startswith("SELECT id, doc, seq"), runs
        write = [sql for sql, _ in runs[1]]  # the ordinary way's writes: one fused statement
        assert len(write) == 2 and write[0].startswith("WITH w0 AS (") and write[1] == "COMMIT"
        assert all(t in write[0] for t in (".events", ".jobs", "pg_notify")), write
        assert sorted(str(p) for p in params[0]) == sorted(ids[1:4]), params  # type: ignore[union-attr]
        assert [a.state.id for a in out] == [ids[0], ids[1], ids[2], ids[4]]  # in order
        for n, job_id in enumerate(ids):
            if n == 3:
                continue
            state = other.get(job_id)
            assert state.status == Status.SUCCEEDED and state.result == n
            statuses = [str(e.status) for e in other.events(job_id)]
            assert statuses == (
                ["started", "progress", "completed"] if n == 1 else ["started", "completed"]
            ), (n, statuses)
            assert [e.seq for e in out[n if n < 3 else 3].events] == [len(statuses)]
        assert other.get(ids[2]).labels == {"kept": "yes"}
        counts = {k: n for k, n in other.stats().jobs.items() if n}
        assert counts == {("g", "succeeded", "function"): 4}, counts
        # a second outcome of a finished job writes nothing, whichever way it goes
        again = pgstore.apply_many([(ids[0], items[0][1])])
        assert again[0].events == [] and other.get(ids[0]).result == 0
    finally:
        other.close()


def test_an_outcome_record_sent_ahead_is_in_once_settled_even_if_its_session_dies(
    pgstore: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A job process sends its outcome's record (``send_returned``) and hands the outcome
    to its pool while it is on its way; once ``settle`` returns, the record is in and the
    job's shared lock is gone with it. A record whose session the server ends while it is
    on its way goes again, once, on a new session: in, and nothing logged."""
    job = pgstore.create(name="j")
    journal = pgstore.journal("host:1", "tok+1")
    key = (job.id, 1)
    pair = _pglocks.lock_pair(_pglocks.lock_key(pgstore.schema, job.id))

    def line() -> str | None:
        rows = pgstore._query(
            "line", f'SELECT line FROM "{pgstore.schema}".journal WHERE id = %s', (job.id,)
        )
        return str(rows[0][0]) if rows else None

    def shared_held() -> bool:
        sql = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid"
        )
        return bool(
            pgstore._query("locks", sql, (pair[0] & 0xFFFFFFFF, pair[1] & 0xFFFFFFFF))[0][0]
        )

    assert journal.started(key) and shared_held()
    assert (line() or "").startswith("s ")
    journal.send_returned(key, Outcome("succeed", value=1))
    journal.settle()
    assert (line() or "").startswith("o ") and not shared_held()
    # the connection lost while a record is on its way
    assert journal.started((job.id, 2))
    backend = journal._conn.info.backend_pid  # type: ignore[attr-defined]
    journal.send_returned((job.id, 2), Outcome("succeed", value=2))
    with support.connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    caplog.set_level(logging.WARNING)
    journal.settle()  # answered before the end, or sent again on a new session
    assert not journal._direct.pending  # type: ignore[attr-defined]
    assert (line() or "").startswith("o ")
    assert journal.started((job.id, 3))  # on a new session
    assert journal._conn.info.backend_pid != backend  # type: ignore[attr-defined]
    assert (line() or "").startswith("s ")
    assert not [r for r in caplog.records if "cannot" in r.getMessage()]
    journal._conn.close()  # type: ignore[attr-defined]  # (a job process's ends with it)


def test_a_journal_whose_idle_session_the_server_ended_goes_on_on_a_new_one(
    pgstore: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The server ends a job process's idle journal session (a restart, an idle timeout,
    an administrator): the next record goes again, once, on a new session, and is in,
    with nothing logged; it is not lost for the attempt."""
    job = pgstore.create(name="j")
    journal = pgstore.journal("host:1", "tok+1")
    assert journal.started((job.id, 1))
    backend = journal._conn.info.backend_pid  # type: ignore[attr-defined]
    with support.connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        for _ in range(100):  # until the server has ended it
            alive = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
            ).fetchone()
            if alive == (0,):
                break
            time.sleep(0.02)
    caplog.set_level(logging.WARNING)
    journal.send_returned((job.id, 1), Outcome("succeed", value=1))
    journal.settle()
    assert journal._conn.info.backend_pid != backend  # type: ignore[attr-defined]
    rows = pgstore._query(
        "line", f'SELECT line FROM "{pgstore.schema}".journal WHERE id = %s', (job.id,)
    )
    assert rows and str(rows[0][0]).startswith("o ")  # the outcome's record is in
    assert not [r for r in caplog.records if "cannot" in r.getMessage()]
    journal.close()


def test_statements_sent_through_libpq_directly_answer_and_fail_as_psycopgs() -> None:
    """``_pg.Direct`` (a job process's journal statements): a statement is prepared once
    per session (the same text prepared by an earlier helper on that session is reused),
    its answer is read by ``wait`` (one sent ahead is answered before the next goes), the
    server's error comes back as psycopg's class for its SQLSTATE and the session stays
    usable; a wait cut off by a signal handler's exception goes on where it stopped."""
    from outlast.store import _pg

    with support.connect() as conn:
        conn.autocommit = True
        conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY, v text)")
        direct = _pg.Direct(conn)
        insert = "INSERT INTO t VALUES ($1::int4, $2::text)"
        direct.send(insert, ["1", "one"])
        assert direct.pending
        direct.send(insert, ["2", "two"])  # after the first one's answer
        direct.wait()
        assert not direct.pending
        direct.wait()  # nothing out: nothing to read
        with pytest.raises(psycopg.errors.UniqueViolation, match="duplicate key"):
            direct.run(insert, ["1", "again"])
        with pytest.raises(psycopg.errors.DivisionByZero):
            direct.run("SELECT 1 / $1::int4", ["0"])
        again = _pg.Direct(conn)  # a new helper on the same session: prepared already
        again.run(insert, ["3", "three"])
        rows = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
        assert rows == [(1, "one"), (2, "two"), (3, "three")]
        prepared = conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'outlast_%'"
        ).fetchone()
        assert prepared == (2,)
        # cut off while it waits (a signal handler's exception): the next wait goes on
        slow = _pg.Direct(conn)
        slow.send("SELECT pg_sleep($1::float8)", ["0.3"])

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(KeyboardInterrupt):
                slow.wait()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert slow.pending
        slow.wait()
        assert not slow.pending
        slow.run(insert, ["4", "four"])
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (4,)


def test_fusing_keeps_the_order_and_never_joins_two_writes_of_one_table() -> None:
    """``_Script.fuse``: a run of writes to different tables (and the notification after
    it) becomes one statement, parameters in order; a second write of a table already in
    the run starts a new one; any other statement stays where it was, alone."""
    writes = {"INSERT a": "a", "INSERT b": "b", "UPDATE a": "a"}
    script = pg._Script().add("BEGIN")
    script.add("INSERT a", 1).add("INSERT b", 2, 3).add("UPDATE a", 4).add("NOTIFY", 5)
    script.add("SET LOCAL x").add("INSERT b", 6).add("COMMIT")
    script.fuse(writes, "NOTIFY")
    assert script.statements == [
        ("BEGIN", ()),
        ("WITH w0 AS (INSERT a), w1 AS (INSERT b) SELECT 1", (1, 2, 3)),
        ("WITH w0 AS (UPDATE a) NOTIFY", (4, 5)),
        ("SET LOCAL x", ()),
        ("INSERT b", (6,)),
        ("COMMIT", ()),
    ]
    alone = pg._Script().add("NOTIFY", 1).add("COMMIT")
    alone.fuse(writes, "NOTIFY")
    assert alone.statements == [("NOTIFY", (1,)), ("COMMIT", ())]


def test_a_batch_of_transitions_is_one_statement_with_every_column_written(
    pgstore: PostgresStore, url: str
) -> None:
    """A claim of many jobs and their outcomes written together: the claim's per-job UPDATE
    and event INSERT go as one statement each (the rows as one JSON parameter), the
    outcomes as one guarded statement (``_pgguard``), NULLs and all, and leave each row
    exactly as a transition of one job does: every column, the time to the microsecond,
    and the document's exact bytes (a result of any character)."""
    import psycopg

    alone = pgstore.create(name="alone", queue="default")
    ids = [pgstore.create(name=f"b{i}", queue="default").id for i in range(5)]
    [one] = pgstore.claim(None, 1)
    assert one.id == alone.id
    sent: list[str] = []
    guarded: list[set[str]] = []
    real, real_results = pg._Script.add, pg.guard.results

    def add(self: object, statement: str, *params: object) -> object:
        sent.append(statement)
        return real(self, statement, *params)  # type: ignore[arg-type]

    def results(taken: Any, written: set[str], cache: Any) -> Any:
        guarded.append(written)
        return real_results(taken, written, cache)

    pg._Script.add = add  # type: ignore[method-assign]
    pg.guard.results = results  # type: ignore[assignment]
    try:
        tasks = pgstore.claim(None, 10)
        assert sorted(t.id for t in tasks) == sorted(ids)  # ids of one millisecond: any order
        value = {"x": 1, "text": 'é ✓ \\ " \u0000 \U0001f600'}
        done = [transition(Outcome("succeed", value), t.attempt or 0) for t in tasks]
        pgstore.apply_many([(t.id, fn) for t, fn in zip(tasks, done, strict=True) if fn])
    finally:
        pg._Script.add = real  # type: ignore[method-assign]
        pg.guard.results = real_results
    one.succeed({"x": 1})  # the ordinary way: the reference row
    updates = [s for s in sent if s.startswith(f'UPDATE "{pgstore.schema}".jobs')]
    inserts = [s for s in sent if s.startswith(f'INSERT INTO "{pgstore.schema}".events')]
    batch = "jsonb_array_elements"
    assert len(updates) == 1 and all(batch in s for s in updates)  # the claim
    assert len(inserts) == 1 and all(batch in s for s in inserts)
    assert guarded == [set(ids)]  # the outcomes: one guarded statement wrote all five
    columns = "status, worker, run_after, finished_at, expires_at, started_at IS NULL, seq"
    with psycopg.connect(url.split("?")[0]) as conn:
        rows = {
            job_id: rest
            for job_id, *rest in conn.execute(
                f'SELECT id, {columns} FROM "{pgstore.schema}".jobs'
            ).fetchall()
        }
    reference = rows.pop(alone.id)
    for job_id in ids:
        state = pgstore.get(job_id)
        assert state.status == Status.SUCCEEDED and state.attempts == 1
        assert [(e.seq, str(e.status)) for e in pgstore.events(job_id)] == [
            (1, "started"),
            (2, "completed"),
        ]
        status, worker, run_after, finished_at, expires_at, no_start, seq = rows[job_id]
        assert (status, run_after, expires_at, no_start, seq) == (
            reference[0],
            reference[2],
            reference[4],
            reference[5],
            reference[6],
        )
        assert worker == reference[1] is not None
        assert finished_at is not None and finished_at == state.finished_at
        assert state.result == value
        with psycopg.connect(url.split("?")[0]) as conn:
            [(doc,)] = conn.execute(
                f'SELECT doc FROM "{pgstore.schema}".jobs WHERE id = %s', (job_id,)
            ).fetchall()
        assert bytes(doc) == codec.encode(state)  # the bytes written, exactly


def test_a_batchs_updates_find_their_rows_by_the_primary_key_among_analyzed_jobs(
    pgstore: PostgresStore, url: str
) -> None:
    """The planner counts 100 rows for ``jsonb_array_elements``: among a few thousand jobs
    whose statistics are known, it read and hashed the whole table for each batch (a claim's
    starts, a pool's guarded outcomes: 2 ms a batch among 3,200 jobs). The statements carry
    the rows' ids too, so each goes through the primary key whatever the table's size."""
    pgstore.create_many([{}] * 2000, common={"name": "many"})
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(f'ANALYZE "{pgstore.schema}".jobs')
    with support.statements_sent() as sent:
        tasks = pgstore.claim(None, 10)
        done = [transition(Outcome("succeed", 1), t.attempt or 0) for t in tasks]
        pgstore.apply_many([(t.id, fn) for t, fn in zip(tasks, done, strict=True) if fn])
    assert len(tasks) == 10 and all(pgstore.get(t.id).status == Status.SUCCEEDED for t in tasks)
    batches = [
        (sql, params)
        for sql, params in sent
        if f'UPDATE "{pgstore.schema}".jobs AS j' in sql and "jsonb_array_elements" in sql
    ]
    assert len(batches) == 2  # the claim's starts, the guarded outcomes
    for sql, params in batches:
        plan = support.explain(sql, params)
        assert "jobs_pkey" in plan and "Seq Scan on jobs" not in plan, plan


# ---------------------------------------------------------------------- death and fencing
def test_sigkilled_worker_frees_its_lock_within_a_second(url: str, pgstore: PostgresStore) -> None:
    job = pgstore.create(name="doomed", max_attempts=2)
    with procs.spawned(procs.hold_lock, url, job.id, True, False) as child:
        assert child.recv()[0] == "ready"
        assert pgstore._lock_held(job.id)
        assert not pgstore.abandoned(pgstore.get(job.id))
        child.kill()
        took = until(lambda: not pgstore._lock_held(job.id), 1.0)
    assert took < 1.0
    assert pgstore.abandoned(pgstore.get(job.id))
    assert pgstore.reconcile(pgstore.get(job.id)).status == Status.PENDING
    [again] = pgstore.claim()
    assert again.id == job.id and again.attempt == 2


def test_a_dead_local_holder_is_abandoned_once_its_backend_lets_go(
    url: str, pgstore: PostgresStore
) -> None:
    """A killed worker's backend holds its lock until it sees the client gone (here: busy in
    a query for 0.6 s). ``abandoned`` knows the holder's process is gone (the lock
    connection names it) and waits the backend out, rather than calling the job alive."""
    job = pgstore.create(name="doomed", max_attempts=2)
    with procs.spawned(procs.hold_lock_busy, url, job.id, 0.6) as child:
        child.expect("ready")
        assert not pgstore.abandoned(pgstore.get(job.id))
        child.kill()
        started = time.monotonic()
        assert pgstore.abandoned(pgstore.get(job.id))
        assert time.monotonic() - started < _pglocks.DYING_FOR  # freed, not given up on
    assert pgstore.reconcile(pgstore.get(job.id)).status == Status.PENDING


def test_terminated_lock_connection_is_abandoned_and_the_late_write_refused(
    url: str, pgstore: PostgresStore
) -> None:
    job = pgstore.create(name="cut", max_attempts=2)
    with procs.spawned(workers.claim_and_hold, url) as child:
        job_id, attempt, backend = child.recv()
        assert (job_id, attempt) == (job.id, 1)
        child.send("alive?")
        assert child.recv() is True
        with support.connect() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
        until(lambda: pgstore.abandoned(pgstore.get(job.id)), 1.0)
        # The old worker notices at once, without a round trip.
        child.send("alive?")
        assert child.recv() is False
        # Reconciled and claimed again: attempt 2 belongs to another worker now.
        assert pgstore.reconcile(pgstore.get(job.id)).status == Status.PENDING
        [new] = pgstore.claim()
        assert new.attempt == 2
        events = pgstore.events(job.id)
        child.send("late")
        event, status, attempts, result = child.recv()
    assert event is None
    assert (status, attempts, result) == ("running", 2, None)
    assert pgstore.events(job.id) == events
    assert new.succeed("fresh").result == "fresh"
    assert [str(e.status) for e in pgstore.events(job.id)] == [
        "started",
        "failed",
        "started",
        "completed",
    ]


def test_a_forked_child_does_not_keep_its_parents_locks(url: str, pgstore: PostgresStore) -> None:
    job = pgstore.create(name="forked")
    grandchild = None
    try:
        with procs.spawned(workers.claim_then_fork, url) as child:
            job_id, grandchild = child.recv()
            assert job_id == job.id and pgstore._lock_held(job.id)
            child.kill()
        os.kill(grandchild, 0)  # the fork lives on...
        until(lambda: not pgstore._lock_held(job.id), 1.0)  # ...but not the lock
    finally:
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)


def test_a_lock_is_not_taken_twice_in_one_process(pgstore: PostgresStore) -> None:
    job = pgstore.create(name="once")
    task = pgstore.open(job.id)
    task.hold_worker_lock()
    with pytest.raises(WorkerLockHeld):
        pgstore.open(job.id).hold_worker_lock()
    task.release_worker_lock()
    pgstore.open(job.id).hold_worker_lock()


def test_colliding_lock_keys_delay_a_job_but_never_double_it(
    pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pglocks, "lock_key", lambda schema, job_id: 42)
    monkeypatch.setattr(pg, "lock_key", lambda schema, job_id: 42)  # the rows' keys too
    first, second = pgstore.create(name="a"), pgstore.create(name="b")
    [task] = pgstore.claim(limit=2)
    assert task.id == first.id
    assert pgstore.get(second.id).status == Status.PENDING
    assert not pgstore.abandoned(pgstore.get(first.id))
    assert session_locks(url, pgstore) == Counter({42: 1})  # the second hold let go
    task.succeed(1)
    task.release_worker_lock()
    assert session_locks(url, pgstore) == Counter()
    [later] = pgstore.claim(limit=2)
    assert later.id == second.id


def session_locks(url: str, store: PostgresStore) -> Counter[int]:
    """The worker locks the store's lock connection holds (read from another session):
    each key, and how many rows ``pg_locks`` shows of it (one per lock, whatever its count)."""
    with support.connect() as conn:
        rows = conn.execute(
            "SELECT (classid::int8 << 32) | objid::int8 FROM pg_locks WHERE locktype = 'advisory'"
            " AND pid = %s AND objsubid = 1 AND granted",
            (store._locks.backend,),
        ).fetchall()
    return Counter(r[0] for r in rows)


def test_a_claim_reads_its_rows_and_takes_their_locks_in_one_round_trip(
    url: str, pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #18: the claim runs on the lock connection; its first round trip reads the
    rows and tries their locks, its second writes and commits; nothing else is sent."""
    jobs = [pgstore.create(name=f"j{i}") for i in range(3)]
    opener = pgstore.open(jobs[0].id)
    opener.hold_worker_lock()  # opens the lock connection
    opener.release_worker_lock()
    runs: list[list[str]] = []
    real = pg._Script.run

    def run(self: pg._Script, conn: Any, pipe: Any = None) -> object:
        assert conn is pgstore._locks.conn and pipe is not None  # libpq directly
        runs.append([sql for sql, _ in self.statements])
        return real(self, conn, pipe)

    def no(*args: object) -> object:
        raise AssertionError("a round trip of its own for the locks")

    monkeypatch.setattr(pg._Script, "run", run)
    monkeypatch.setattr(pgstore, "_try_locks", no)
    tasks = pgstore.claim(limit=5, journal=pgstore.journal("pool", "token"))
    assert [t.id for t in tasks] == [j.id for j in jobs]  # the claim's order
    assert len(runs) == 2, runs
    assert runs[0][0] == "BEGIN" and "pg_try_advisory_lock" in runs[0][1]
    assert runs[1][-1] == "COMMIT"
    keys = {pg.lock_key(pgstore.schema, j.id) for j in jobs}
    assert set(session_locks(url, pgstore)) == keys
    assert all(t.lock_alive() for t in tasks)
    for task in tasks:
        assert not pgstore.abandoned(pgstore.get(task.id))


@pytest.mark.parametrize("where", ["after the read", "in the commit"])
def test_a_claim_that_fails_lets_go_of_the_locks_it_took_and_only_those(
    url: str, pgstore: PostgresStore, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Session locks outlive a rolled-back transaction: a claim that fails once its rows'
    locks are taken lets go of them, and keeps the locks of the jobs it runs already."""
    running = pgstore.create(name="running")
    [held] = pgstore.claim(limit=1)
    waiting = [pgstore.create(name=f"w{i}") for i in range(3)]
    if where == "after the read":

        def fail(*args: object, **kwargs: object) -> object:
            raise RuntimeError("cut off half way")

        monkeypatch.setattr(pgstore, "_starts", fail)
        with pytest.raises(RuntimeError, match="half way"):
            pgstore.claim(limit=5)
    else:
        real = pgstore._commit

        def fail_commit(tx: Any) -> None:
            tx.conn.execute("SELECT 1 / 0")  # a real server error, in the transaction

        monkeypatch.setattr(pgstore, "_commit", fail_commit)
        with pytest.raises(StoreError, match="division by zero"):
            pgstore.claim(limit=5)
        monkeypatch.setattr(pgstore, "_commit", real)
    monkeypatch.undo()
    assert session_locks(url, pgstore) == Counter({pg.lock_key(pgstore.schema, running.id): 1})
    assert held.lock_alive() and not pgstore.abandoned(pgstore.get(running.id))
    assert {pgstore.get(j.id).status for j in waiting} == {Status.PENDING}
    other = open_store(url)
    try:  # their locks are free: another process claims them
        assert sorted(t.id for t in other.claim(limit=5)) == sorted(j.id for j in waiting)
    finally:
        other.close()


def test_rows_a_claim_does_not_start_have_their_locks_let_go(
    url: str, pgstore: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A corrupt row and a row whose concurrency key has no free slot are locked by the
    claim's read, then left: their locks go in the claim's write round trip."""
    first = pgstore.create(name="a", limit_key="k")
    second = pgstore.create(name="b", limit_key="k")  # one slot: waits for the first
    bad = pgstore.create(name="bad")
    support.write_raw(url, bad.id, b"{")
    caplog.set_level(logging.WARNING)
    [task] = pgstore.claim(limit=5)
    assert task.id == first.id
    assert session_locks(url, pgstore) == Counter({pg.lock_key(pgstore.schema, first.id): 1})
    assert pgstore.get(second.id).status == Status.PENDING
    pgstore.delete(bad.id, force=True)


def test_a_row_without_a_lock_key_is_claimed_with_its_lock(
    url: str, pgstore: PostgresStore
) -> None:
    """A row written before rows kept their keys (or by such a version) is locked by key
    computed here, in the claim's transaction, and counts as alive."""
    job = pgstore.create(name="old")
    with support.connect() as conn:
        conn.execute(f'UPDATE "{pgstore.schema}".jobs SET lock_key = NULL WHERE id = %s', (job.id,))
    [task] = pgstore.claim(limit=2)
    assert task.id == job.id and task.lock_alive()
    assert session_locks(url, pgstore) == Counter({pg.lock_key(pgstore.schema, job.id): 1})
    assert pgstore._lock_held(job.id)


def test_the_lock_connection_has_server_side_keepalives(pgstore: PostgresStore) -> None:
    job = pgstore.create(name="k")
    pgstore.open(job.id).hold_worker_lock()
    conn = pgstore._locks.conn
    assert conn is not None
    settings = {
        name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
        for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
    }
    assert settings == {
        "tcp_keepalives_idle": "10",
        "tcp_keepalives_interval": "5",
        "tcp_keepalives_count": "3",
    }
    assert conn.info.get_parameters()["keepalives_idle"] == "5"


# --------------------------------------------------------------------------- notification
def test_listen_wakes_a_waiter_in_another_process_within_a_second(
    url: str, pgstore: PostgresStore
) -> None:
    job = pgstore.create(name="listened")
    with procs.spawned(workers.listen_for, url, job.id, False) as child:
        child.expect("ready")
        time.sleep(0.1)
        sent = time.monotonic()
        pgstore.open(job.id).report("ping", "progress")
        woke, at = child.recv()
    assert woke and 0 <= at - sent < 1.0


def test_queue_listener_is_woken_by_a_new_job(url: str, pgstore: PostgresStore) -> None:
    with procs.spawned(workers.listen_for, url, None, True) as child:
        child.expect("ready")
        sent = time.monotonic()
        pgstore.create(name="new")
        woke, at = child.recv()
    assert woke and at - sent < 1.0


def test_a_listener_ignores_other_jobs_of_its_shard(pgstore: PostgresStore) -> None:
    mine = pgstore.create(name="mine")
    other = pgstore.create(name="other")
    while pgstore._channel(other.id) != pgstore._channel(mine.id):
        pgstore.delete(other.id, force=True)
        other = pgstore.create(name="other")
    with pgstore.listen([mine.id]) as listener:
        other.report("s", "progress")
        assert not listener.wait(0.3)
        mine.report("s", "progress")
        assert listener.wait(2.0)


def test_a_listener_survives_a_terminated_connection(pgstore: PostgresStore) -> None:
    job = pgstore.create(name="j")
    with pgstore.listen([job.id]) as listener, support.connect() as admin:
        conn = listener._conn
        assert conn is not None
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        assert listener.wait(2.0)  # woken (the caller re-checks), reconnected
        assert listener._conn is not conn
        job.report("s", "progress")
        assert listener.wait(2.0)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("schema", ["Upper", "a-b", "1abc", "x" * 49, "", "a;drop"])
def test_bad_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(InvalidInput):
        open_store(f"{support.BASE_URL}?schema={schema}")


def test_an_unreachable_server_is_a_store_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match="cannot connect"):
        open_store("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert time.monotonic() - started < 5


def test_a_corrupt_row_is_named_skipped_in_lists_and_by_claims(
    url: str, pgstore: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    bad = pgstore.create(name="bad")  # the oldest: a claim of one must look past it
    good = pgstore.create(name="good")
    support.write_raw(url, bad.id, b'{"id": "' + bad.id.encode() + b'", "kind": ')
    with pytest.raises(CorruptJob, match=bad.id):
        pgstore.get(bad.id)
    caplog.set_level(logging.WARNING)
    assert [s.id for s in pgstore.list()] == [good.id]
    assert any(bad.id in r.getMessage() for r in caplog.records)
    assert [t.id for t in pgstore.claim(limit=1)] == [good.id]
    pgstore.delete(bad.id, force=True)
    with pytest.raises(JobNotFound):
        pgstore.get(bad.id)


def test_logs_live_on_this_machine_in_a_private_folder(pgstore: PostgresStore) -> None:
    job = pgstore.create(name="logged")
    path = pgstore.log_path(job.id)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not pgstore.capabilities.local_logs and pgstore.capabilities.spans_hosts
    Path(path).write_text("output\n")
    job.cancel()
    pgstore.delete(job.id)
    assert not path.exists()


def test_a_lost_lock_connection_is_seen_on_its_fileno_and_replaced(pgstore: PostgresStore) -> None:
    first, second = pgstore.create(name="a"), pgstore.create(name="b")
    [task] = pgstore.claim()
    fd = pgstore.lock_fileno()
    assert fd is not None
    assert not select.select([fd], [], [], 0)[0]
    with support.connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pgstore._locks.backend,))
    assert select.select([fd], [], [], 2.0)[0], "the lock connection's socket did not wake"
    assert not pgstore._lock_alive(task.id, task._lock)
    assert pgstore.lock_fileno() is None
    assert pgstore.abandoned(pgstore.get(first.id))
    task.release_worker_lock()  # a no-op: that lock is gone with its connection
    [other] = pgstore.claim()  # on a new lock connection
    assert other.id == second.id and pgstore._lock_alive(other.id, other._lock)
    assert not pgstore.abandoned(pgstore.get(second.id))
