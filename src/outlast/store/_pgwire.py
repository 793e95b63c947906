"""A transaction's statements sent through libpq's pipeline mode directly (psycopg's
documented ``psycopg.pq`` wrapper), for the one transaction on the way from ``submit`` to a
job's start that runs on every job: the claim (BENCHMARKS.md, issue #18).

psycopg's own pipeline costs ~70 µs of CPU a statement here (its cursors, adapters and
generators are Python); a claim of one job sends four (``BEGIN`` and its read, then its
fused writes and ``COMMIT``), and a claim's CPU is on the latency path. :class:`Pipe` sends
the same statements prepared (once per session, under a name made from their text), with
parameters encoded here and rows asked for in binary, for the handful of types a claim's
statements use: anything else is refused with a ``TypeError``, so a statement that needs
more fails in the tests, never silently.

A failure is psycopg's error class for the server's SQLSTATE (so :func:`translated` applies)
and leaves the connection out of pipeline mode, every answer read: the caller's ``ROLLBACK``
works as after psycopg's own pipeline. An exception that cuts a run off (a signal handler's)
does the same on its way out, or closes the connection when it cannot.
"""

from __future__ import annotations

import re
import select
import struct
import weakref
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import pq

Row = tuple[Any, ...]

_PLACEHOLDER = re.compile(r"%%|%s")
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # PostgreSQL's binary time zero
_int2, _int4, _int8, _float8 = (struct.Struct(f) for f in ("!h", "!i", "!q", "!d"))

#: Binary result decoders by type OID: the types a claim's statements return.
_DECODE: dict[int, Callable[[bytes], Any]] = {
    16: lambda b: b == b"\x01",  # bool
    17: bytes,  # bytea
    20: lambda b: _int8.unpack(b)[0],  # int8
    21: lambda b: _int2.unpack(b)[0],  # int2
    23: lambda b: _int4.unpack(b)[0],  # int4
    25: lambda b: b.decode(),  # text
    1043: lambda b: b.decode(),  # varchar
    701: lambda b: _float8.unpack(b)[0],  # float8
    1184: lambda b: _EPOCH + timedelta(microseconds=_int8.unpack(b)[0]),  # timestamptz
    2278: lambda b: None,  # void (pg_notify, pg_advisory_xact_lock)
}

#: The prepared statements of each connection: a new session starts with none.
_PREPARED: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


def statement(sql: str) -> tuple[bytes, bytes]:
    """``(name, text)`` of ``sql`` written with psycopg's ``%s`` placeholders: the text with
    ``$1``… in their place (``%%`` is ``%``), the name made from it."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    text = _PLACEHOLDER.sub(number, sql).encode()
    return b"outlast_w%08x" % zlib.crc32(text), text


def encode(value: Any) -> tuple[bytes | None, int]:
    """A parameter as ``(bytes, format)``: bytes in binary (a ``bytea``), the rest as text."""
    if value is None:
        return None, 0
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), 1
    return _text(value).encode(), 0


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise TypeError("a time without a time zone is not a parameter here")
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "{" + ",".join(_element(v) for v in value) + "}"
    raise TypeError(f"{type(value).__name__} is not a parameter of a direct statement")


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = _text(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def error_of(result: pq.abc.PGresult) -> psycopg.Error:
    """The server's error in ``result`` as psycopg's class for its SQLSTATE."""
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    message = result.error_message.decode(errors="replace").strip()
    try:
        cls: type[psycopg.Error] = psycopg.errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message or "the statement failed")


def _rows(result: pq.abc.PGresult) -> list[Row]:
    decoders = []
    for column in range(result.nfields):
        oid = result.ftype(column)
        if oid not in _DECODE:
            raise TypeError(f"a direct statement cannot read a column of type oid {oid}")
        decoders.append(_DECODE[oid])
    rows = []
    for n in range(result.ntuples):
        row = []
        for column, decode in enumerate(decoders):
            value = result.get_value(n, column)
            row.append(None if value is None else decode(value))
        rows.append(tuple(row))
    return rows


class Pipe:
    """The statements of one round trip of a transaction, sent in libpq's pipeline mode on
    ``conn``: each prepared on the session's first use of it, all then executed, one sync."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._prepared = _PREPARED.setdefault(conn, set())
        self._syncs = 0  # syncs sent whose answer is not read yet

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Row]:
        """Run ``statements`` in one round trip; the rows of the last one (none for a
        statement that returns none). The first failure is raised once all answers are in:
        the statements after it did not run."""
        pg = self.conn.pgconn
        steps: list[bytes | None] = []  # what each answer is: a prepare (its name), or a query
        pg.enter_pipeline_mode()
        try:
            for sql, params in statements:
                name, text = statement(sql)
                if name not in self._prepared and name not in steps:
                    pg.send_prepare(name, text)
                    steps.append(name)
                encoded = [encode(p) for p in params]
                pg.send_query_prepared(
                    name, [v for v, _ in encoded], [f for _, f in encoded], pq.Format.BINARY
                )
                steps.append(None)
            pg.pipeline_sync()
            self._syncs += 1
            rows, failed = self._read(pg, steps)
            pg.exit_pipeline_mode()
        except BaseException:
            self._recover(pg)
            raise
        if failed is not None:
            raise error_of(failed)
        return rows

    def _read(self, pg: pq.abc.PGconn, steps: list[bytes | None]) -> tuple[list[Row], Any]:
        self._flush(pg)
        rows: list[Row] = []
        failed = None
        for step in steps:
            result = self._next(pg)
            if result is None or self._next(pg) is not None:  # each answer, then a None
                raise psycopg.InternalError("a direct statement gave no result, or two")
            status = result.status
            if status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
                if step is not None:
                    self._prepared.add(step)
                else:
                    rows = _rows(result) if status == pq.ExecStatus.TUPLES_OK else []
            elif status != pq.ExecStatus.PIPELINE_ABORTED and failed is None:
                failed = result
        result = self._next(pg)
        if result is None or result.status != pq.ExecStatus.PIPELINE_SYNC:
            raise psycopg.InternalError("a direct pipeline's sync did not come back")
        self._syncs -= 1
        return rows, failed

    @staticmethod
    def _flush(pg: pq.abc.PGconn) -> None:
        """Send what libpq holds, reading what comes meanwhile (the server must never wait
        on a full socket for us while we wait on it)."""
        while pg.flush():
            readable, _, _ = select.select([pg.socket], [pg.socket], [])
            if readable:
                pg.consume_input()

    @staticmethod
    def _next(pg: pq.abc.PGconn) -> Any:
        pg.consume_input()
        while pg.is_busy():
            select.select([pg.socket], [], [])
            pg.consume_input()
        return pg.get_result()

    def _recover(self, pg: pq.abc.PGconn) -> None:
        """After a run cut off: read every answer still to come, up to the last sync, and
        leave pipeline mode; close the connection when that cannot be done (its session's
        state would be unknown)."""
        try:
            if pg.pipeline_status == pq.PipelineStatus.OFF:
                return
            pg.pipeline_sync()
            self._syncs += 1
            self._flush(pg)
            nothing = 0
            while self._syncs and nothing < 2:  # two Nones in a row: nothing is left
                result = self._next(pg)
                nothing = nothing + 1 if result is None else 0
                if result is not None and result.status == pq.ExecStatus.PIPELINE_SYNC:
                    self._syncs -= 1
            pg.exit_pipeline_mode()
        except BaseException:
            self._syncs = 0
            self.conn.close()
