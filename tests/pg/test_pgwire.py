"""Transactions' statements through libpq's pipeline mode directly (``outlast.store._pgwire``):
parameters and rows as psycopg gives them, the server's errors as psycopg's classes, a
bounded number of prepared statements, and a connection left usable by a failure, a refused
parameter or an interrupting signal."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from outlast.store import _pgwire
from tests.pg import support

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    try:
        connection = support.connect()
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL here: {exc}")
    try:
        yield connection
    finally:
        connection.close()


def test_parameters_and_rows_come_back_as_psycopg_gives_them(
    conn: psycopg.Connection[Any],
) -> None:
    when = datetime(2026, 12, 6, 3, 4, 5, 678901, tzinfo=UTC)
    odd = ['a"b', "c\\d", "e,f", "{g}", "h i", "ü", ""]
    sql = (
        "SELECT %s::text, %s::bytea, %s::int8, %s::int4, %s::bool, %s::timestamptz,"
        " %s::text[], %s::int8[], %s::float8, NULL::text, '{\"a\": 1}'::jsonb, %s, 'a%%b'"
    )
    params = [
        "zwölf 'quoted'",
        b"\x00\xffbytes",
        -(2**63),
        2**31 - 1,
        False,
        when.astimezone(timezone(timedelta(hours=-5))),
        odd,
        [1, -2],
        0.5,
        7,
    ]
    expected = conn.execute(sql, params).fetchone()  # psycopg's own
    pipe = _pgwire.Pipe(conn)
    for _ in range(3):  # unnamed, then prepared, then prepared already
        [row] = pipe.run([("BEGIN", ()), (sql, params)])
        assert row == expected
        assert row[5] == when and row[6] == odd and row[10] == {"a": 1} and row[12] == "a%b"
        assert pipe.run([("COMMIT", ())]) == []
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pipe.run([("SELECT '100%%'", ())]) == [("100%%",)]  # no parameters: as it is


def test_a_failure_is_psycopgs_class_and_stops_what_follows(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("CREATE TEMP TABLE t (x int)")
    pipe = _pgwire.Pipe(conn)
    with pytest.raises(psycopg.errors.DivisionByZero, match="division by zero"):
        pipe.run(
            [
                ("BEGIN", ()),
                ("INSERT INTO t VALUES (%s)", [1]),
                ("SELECT 1 / %s", [0]),
                ("INSERT INTO t VALUES (%s)", [2]),
            ]
        )
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    conn.execute("ROLLBACK")  # psycopg's own statements work again on the connection
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert pipe.run([("SELECT %s::int4 + 1", [41])]) == [(42,)]


def test_a_statement_that_does_not_parse_is_not_taken_as_prepared(
    conn: psycopg.Connection[Any],
) -> None:
    pipe = _pgwire.Pipe(conn)
    for _ in range(3):  # each time the server's own error, never "does not exist"
        with pytest.raises(psycopg.errors.SyntaxError):
            pipe.run([("SELEC %s", [1])])
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pipe.run([("SELECT %s::int4 + 1", [1])]) == [(2,)]


def prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'outlast_p%'")
    return [r[0] for r in rows]


def test_a_statement_is_prepared_on_its_second_use_and_a_session_holds_a_bounded_number(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = "SELECT %s::int4 * 2"
    pipe = _pgwire.Pipe(conn)
    assert pipe.run([(sql, [1])]) == [(2,)]
    assert prepared(conn) == []  # once: unnamed
    assert pipe.run([(sql, [2]), (sql, [3])]) == [(6,)]  # twice in one run: one prepare
    assert len(prepared(conn)) == 1
    for n in range(3):  # another Pipe on the session uses what it prepared
        assert _pgwire.Pipe(conn).run([(sql, [n])]) == [(n * 2,)]
    assert len(prepared(conn)) == 1
    with support.connect() as fresh:  # a new session prepares afresh
        assert _pgwire.Pipe(fresh).run([(sql, [5])]) == [(10,)]
    monkeypatch.setattr(_pgwire, "MAX_PREPARED", 3)
    for n in range(10):  # one-off texts, each used twice: only up to the bound prepared
        text = f"SELECT %s::int4 + {n}"
        assert pipe.run([(text, [1])]) == pipe.run([(text, [1])]) == [(n + 1,)]
    assert len(prepared(conn)) == 3


def test_a_parameter_psycopg_cannot_adapt_is_refused_before_anything_is_sent(
    conn: psycopg.Connection[Any],
) -> None:
    pipe = _pgwire.Pipe(conn)
    with pytest.raises(psycopg.ProgrammingError, match="dict"):
        pipe.run([("BEGIN", ()), ("SELECT %s", [{"a": 1}])])
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # no BEGIN ran
    with pytest.raises(psycopg.ProgrammingError, match="placeholders"):
        pipe.run([("SELECT %s, %s", [1])])
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert pipe.run([("SELECT 2::int4", ())]) == [(2,)]


def test_a_run_cut_off_by_a_signal_leaves_the_connection_usable(
    conn: psycopg.Connection[Any],
) -> None:
    class Cut(Exception):
        pass

    def cut(signum: int, frame: object) -> None:
        raise Cut

    previous = signal.signal(signal.SIGALRM, cut)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(Cut):
            _pgwire.Pipe(conn).run([("BEGIN", ()), ("SELECT pg_sleep(%s::float8)", [0.5])])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not conn.closed
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT 3").fetchone() == (3,)
    assert _pgwire.Pipe(conn).run([("SELECT 4::int4", ())]) == [(4,)]


def test_answers_larger_than_the_sockets_buffers_never_wedge_the_pipeline(
    conn: psycopg.Connection[Any],
) -> None:
    """The server answers while the client still sends: the client reads as it sends."""
    big = "x" * 20_000
    statements = [("SELECT repeat(%s, 10)", [big])] * 300  # ~6 MB each way
    [row] = _pgwire.Pipe(conn).run(statements)
    assert row == (big * 10,)


def test_a_rolled_back_transaction_leaves_the_statements_prepared_for_later_ones() -> None:
    """psycopg answers a ``ROLLBACK`` it runs with ``DEALLOCATE ALL`` once it has prepared
    a statement of its own (a read run five times, as a polled ``get`` is), which took the
    statements ``Pipe`` had prepared with it: after any transaction that failed (here a
    cancel of a corrupt job), the next ``create`` failed with "prepared statement
    "outlast_p1" does not exist". Found when a twelfth schema migration made the store's
    own opening prepare one; the store now rolls back past psycopg."""
    from outlast.errors import CorruptJob
    from outlast.store import open_store

    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    try:
        with open_store(url) as store:
            first = store.create(name="first")
            store.create(name="second")  # the insert is prepared now (its second use)
            for _ in range(6):  # and psycopg prepares this read of its own
                store.get(first.id)
            bad = store.create(name="bad")
            support.write_raw(url, bad.id, b"")
            with pytest.raises(CorruptJob):
                store.open(bad.id).cancel()  # a transaction rolled back
            for _ in range(3):
                assert store.create(name="later").state().name == "later"
    finally:
        support.drop_schema(url)


def test_a_session_that_lost_its_prepared_statements_prepares_them_again(
    conn: psycopg.Connection[Any],
) -> None:
    """Whatever dropped them (a ``DEALLOCATE ALL`` not the store's, a pooler between), the
    run that finds a statement gone fails, and the next one prepares it afresh."""
    sql = "SELECT %s::int4 + 1"
    pipe = _pgwire.Pipe(conn)
    assert pipe.run([(sql, [1])]) == [(2,)] and pipe.run([(sql, [2])]) == [(3,)]
    assert len(prepared(conn)) == 1
    conn.pgconn.exec_(b"DEALLOCATE ALL")
    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
        pipe.run([(sql, [3])])
    assert pipe.run([(sql, [4])]) == [(5,)]
    assert pipe.run([(sql, [5])]) == [(6,)]
    assert len(prepared(conn)) == 1
