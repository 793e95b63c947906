"""PostgreSQL for the tests: a fresh schema per store, dropped afterwards.

The server is ``$OUTLAST_TEST_POSTGRESQL`` (default ``postgresql://postgres@127.0.0.1:5432/test``).
When it cannot be reached (or psycopg is not installed), :func:`make_url` returns None and the
PostgreSQL tests are skipped. Importing this module does not import psycopg.
Every schema made here is dropped by :func:`drop_schema` (per test) or, at the latest, when the
test process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

BASE_URL = os.environ.get("OUTLAST_TEST_POSTGRESQL", "postgresql://postgres@127.0.0.1:5432/test")
_counter = itertools.count()
_made: set[str] = set()
_available: bool | None = None


def available() -> bool:
    global _available
    if _available is None:
        try:
            connect().close()
            _available = True
        except Exception:  # no psycopg, or no server
            _available = False
    return _available


def schema_of(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query))["schema"]


def make_url(base: Path | None = None) -> str | None:
    """The URL of a fresh, empty store in a schema of its own (None without a server)."""
    if not available():
        return None
    schema = f"t{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"
    _made.add(schema)
    sep = "&" if "?" in BASE_URL else "?"
    return f"{BASE_URL}{sep}schema={schema}"


def connect() -> Any:
    """An autocommit psycopg connection to the test server."""
    import psycopg

    return psycopg.connect(BASE_URL, autocommit=True, connect_timeout=3)


def write_raw(url: str, job_id: str, raw: bytes) -> None:
    """Overwrite a job's stored document behind the store's back."""
    with connect() as conn:
        cur = conn.execute(
            f'UPDATE "{schema_of(url)}".jobs SET doc = %s WHERE id = %s', (raw, job_id)
        )
        assert cur.rowcount == 1, f"no row for job {job_id}"


@contextlib.contextmanager
def statements_sent() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Every statement (and its parameters) the stores send through ``_pgwire.Pipe`` (their
    transactions) while the block runs."""
    from outlast.store import _pgwire

    sent: list[tuple[str, tuple[Any, ...]]] = []
    real = _pgwire.Pipe.run

    def run(self: _pgwire.Pipe, statements: Any) -> Any:
        sent.extend((sql, tuple(params)) for sql, params in statements)
        return real(self, statements)

    _pgwire.Pipe.run = run  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        _pgwire.Pipe.run = real  # type: ignore[method-assign]


def explain(sql: str, params: Sequence[Any]) -> str:
    """The plan the test server makes for ``sql`` (not run: rolled back whatever it is)."""
    with connect() as conn:
        conn.execute("BEGIN")
        try:
            return "\n".join(row[0] for row in conn.execute(f"EXPLAIN {sql}", params))
        finally:
            conn.execute("ROLLBACK")


def explain_generic(sql: str, params: Sequence[Any]) -> str:
    """The generic plan the test server makes for ``sql`` as a prepared statement, as the
    lock connections run claims (``plan_cache_mode=force_generic_plan``, ``_pg.LOCK_SESSION``);
    not run."""
    from psycopg import sql as psql

    from outlast.store import _pgwire

    text = _pgwire.statement(sql, params).decode()
    with connect() as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE outlast_explained AS {text}")
        values = ", ".join(psql.Literal(p).as_string(conn) for p in params)
        rows = conn.execute(f"EXPLAIN EXECUTE outlast_explained({values})")
        return "\n".join(row[0] for row in rows)


def drop_schema(url: str) -> None:
    schema = schema_of(url)
    with contextlib.suppress(Exception), connect() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    _made.discard(schema)


@atexit.register
def _drop_all() -> None:
    if not _made:
        return
    with contextlib.suppress(Exception), connect() as conn:
        for schema in list(_made):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    _made.clear()
