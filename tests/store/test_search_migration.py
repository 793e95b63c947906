"""The migration that added the name search and the timeline's columns (SQLite's schema
version 6, PostgreSQL's 7): a store written by the version before reads, searches and
counts its old jobs as if they were new, and goes on working (through every migration
after it too)."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from outlast import codec, machine
from outlast.model import JobState, Kind, Status, utcnow
from outlast.store import open_store
from outlast.store import postgresql as pg
from outlast.store import sqlite as sq
from outlast.store.sql import Dialect, SqlStore
from tests.pg import support

#: The schema versions before the search's migration.
SQLITE_BEFORE, POSTGRESQL_BEFORE = 5, 6
_OLD_COLUMNS = (
    "status, kind, queue, worker, run_after, created_at, finished_at, expires_at, priority,"
    " retry_of, unique_key, limit_key, limit_slots, doc, id"
)


def _old_jobs() -> list[JobState]:
    """A pending job, and one that waited 2.5 s and finished a minute ago."""
    now = utcnow()
    pending = machine.new_job(kind=Kind.FUNCTION, name="Legacy.Resize", now=now)
    created = now - timedelta(seconds=90)
    done = machine.new_job(kind=Kind.FUNCTION, name="Straße.report", now=created).evolve(
        status=Status.SUCCEEDED,
        attempts=1,
        started_at=created + timedelta(seconds=2.5),
        finished_at=created + timedelta(seconds=30),
        updated_at=created + timedelta(seconds=30),
    )
    return [pending, done]


def _check(url: str, states: list[JobState]) -> None:
    pending, done = states
    with open_store(url) as store:
        assert [s.id for s in store.list(name="RESIZE")] == [pending.id]
        assert [s.id for s in store.list(name="strasse")] == [done.id]
        assert [s.id for s in store.list(id_prefix=done.id)] == [done.id]
        line = store.timeline().to_dict()
        assert sum(line["finished"]["succeeded"]) == 1
        assert [w for w in line["wait_seconds"]["p50"] if w is not None] == [2.5]
        # and it goes on: the old job moves on, a new one is found beside it
        task = store.open(pending.id)
        task.start()
        task.succeed(None)
        store.create(kind="function", name="new.resize")
        assert [s.name for s in store.list(name="resize")] == ["new.resize", "Legacy.Resize"]
        assert sum(store.timeline().to_dict()["finished"]["succeeded"]) == 2


def _columns(dialect: Dialect, state: JobState) -> tuple[object, ...]:
    """The queried columns of the job's row, as the version before wrote them."""
    return SqlStore._columns(SimpleNamespace(dialect=dialect), state)  # type: ignore[arg-type]


def test_a_sqlite_store_of_the_version_before(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    before = sq.MIGRATIONS[:SQLITE_BEFORE]
    for statements in before:
        for statement in statements:
            assert isinstance(statement, str)  # the old versions are statements only
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {len(before)}")
    states = _old_jobs()
    conn.executemany(
        f"INSERT INTO jobs ({_OLD_COLUMNS}) VALUES ({', '.join('?' * 15)})",
        [(*_columns(sq.DIALECT, s), codec.encode(s), s.id) for s in states],
    )
    conn.commit()
    conn.close()
    _check(f"sqlite://{path}", states)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sq.SCHEMA_VERSION
        rows = dict(conn.execute("SELECT id, name_key FROM jobs").fetchall())
        assert rows[states[1].id] == "strasse.report"
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"jobs_name", "jobs_finished"} <= indexes
    finally:
        conn.close()


def test_a_postgresql_store_of_the_version_before() -> None:
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    from outlast.store import _pg

    schema = support.schema_of(url)
    steps = pg.migrations(schema)
    states = _old_jobs()
    try:
        with support.connect() as conn:
            _pg.migrate(conn, schema, steps[:POSTGRESQL_BEFORE])
            d = pg.dialect(schema)
            for s in states:
                columns = _columns(d, s)
                conn.execute(
                    f"INSERT INTO {d.jobs} ({_OLD_COLUMNS}, lock_key)"
                    f" VALUES ({', '.join(['%s'] * 16)})",
                    (*columns, codec.encode(s), s.id, pg.lock_key(schema, s.id)),
                )
        _check(url, states)
        with support.connect() as conn:
            rows = conn.execute(f'SELECT max(version) FROM "{schema}".schema_version').fetchone()
            assert rows is not None and rows[0] == len(steps)
    finally:
        support.drop_schema(url)
