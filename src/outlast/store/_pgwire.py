"""A transaction's statements sent through libpq's pipeline mode directly (psycopg's
documented ``psycopg.pq`` wrapper), with psycopg's own adaptation (``psycopg.adapt``'s
``Transformer``, C in psycopg's binary package) for the parameters and the rows.

psycopg's pipeline costs ~70 µs of CPU a statement here: its cursors, its pipeline's queue
and generators are Python. A claim of one job sends four statements (``BEGIN`` and its read,
then its fused writes and ``COMMIT``) and its CPU is on the way from ``submit`` to the job's
start; a ``submit`` sends four too. :class:`Pipe` sends the same statements, prepared from
their second use on a session (as psycopg does from its fifth), with the parameters dumped
and the rows loaded by the same adapters psycopg's cursors use: the values are the ones
psycopg gives (BENCHMARKS.md, issue #18).

A failure is psycopg's error class for the server's SQLSTATE (so :func:`translated` applies)
and leaves the connection out of pipeline mode with every answer read, so a ``ROLLBACK``
after it works as after psycopg's own pipeline. An exception that cuts a run off (a signal
handler's) does the same on its way out, or closes the connection when it cannot.
"""

from __future__ import annotations

import re
import select
import weakref
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

Row = tuple[Any, ...]

_PLACEHOLDER = re.compile(r"%%|%s")
MAX_PREPARED = 128  # prepared statements per session; others go unnamed (parsed each time)


class _Session:
    """What a connection's session has prepared, and what it has seen once."""

    def __init__(self) -> None:
        self.prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self.seen: set[tuple[bytes, tuple[int, ...]]] = set()
        self.names = 0  # names given: one is never given twice, whatever became of it


_SESSIONS: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()


def statement(sql: str, params: Sequence[Any]) -> bytes:
    """``sql`` as the server gets it: psycopg's ``%s`` placeholders as ``$1``…, ``%%`` as
    ``%`` (a statement without parameters goes as it is, as psycopg sends it)."""
    if not params:
        return sql.encode()
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    text = _PLACEHOLDER.sub(number, sql)
    if count != len(params):
        raise psycopg.ProgrammingError(
            f"the statement has {count} placeholders but {len(params)} parameters were given"
        )
    return text.encode()


def error_of(result: pq.abc.PGresult) -> psycopg.Error:
    """The server's error in ``result`` as psycopg's class for its SQLSTATE."""
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    message = result.error_message.decode(errors="replace").strip()
    try:
        cls: type[psycopg.Error] = psycopg.errors.lookup(state)
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message or "the statement failed")


def rollback(conn: psycopg.Connection[Any]) -> None:
    """``ROLLBACK`` on ``conn``, sent past psycopg's cursors. psycopg answers a ``ROLLBACK``
    it runs itself (and a ``DROP`` or ``ALTER``) with ``DEALLOCATE ALL`` once it has prepared
    a statement of its own (a read it ran five times, such as a polled ``get``), and that
    takes every statement :class:`Pipe` prepared on the session with it: the next
    transaction that used one failed with "prepared statement does not exist"."""
    result = conn.pgconn.exec_(b"ROLLBACK")
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise error_of(result)


class Pipe:
    """The statements of one round trip of a transaction, sent in libpq's pipeline mode on
    ``conn`` with one sync: each prepared from its second use on the session (with the
    same parameter types), at most :data:`MAX_PREPARED` of them a session."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._session = _SESSIONS.setdefault(conn, _Session())
        self._syncs = 0  # syncs sent whose answer is not read yet

    def run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Row]:
        """Run ``statements`` in one round trip; the rows of the last one (none for a
        statement that returns none). The first failure is raised once all answers are in:
        the statements after it did not run. Parameters psycopg cannot adapt are refused
        before anything is sent."""
        pg = self.conn.pgconn
        adapt = Transformer.from_context(self.conn)
        sends = []
        for sql, params in statements:
            values = adapt.dump_sequence(params, [PyFormat.AUTO] * len(params)) if params else []
            types = tuple(adapt.types or ()) if params else ()
            formats = list(adapt.formats or ()) if params else []
            sends.append((statement(sql, params), values, types, formats))
        session = self._session
        steps: list[tuple[Any, bytes] | None] = []  # a prepare's (key, name), or a query
        pending: dict[Any, bytes] = {}  # prepared in this run
        pg.enter_pipeline_mode()
        try:
            for text, values, types, formats in sends:
                key = (text, types)
                name = session.prepared.get(key) or pending.get(key)
                if name is None and key in session.seen and len(session.prepared) < MAX_PREPARED:
                    session.names += 1
                    name = pending[key] = b"outlast_p%d" % session.names
                    pg.send_prepare(name, text, types)
                    steps.append((key, name))
                if name is None:
                    session.seen.add(key)
                    if len(session.seen) > 4 * MAX_PREPARED:
                        session.seen.clear()
                    pg.send_query_params(text, values, types, formats, pq.Format.BINARY)
                else:
                    pg.send_query_prepared(name, values, formats, pq.Format.BINARY)
                steps.append(None)
            pg.pipeline_sync()
            self._syncs += 1
            result, failed = self._read(pg, steps)
            pg.exit_pipeline_mode()
        except BaseException:
            self._recover(pg)
            raise
        if failed is not None:
            error = error_of(failed)
            if isinstance(error, psycopg.errors.InvalidSqlStatementName):
                # the session lost what it had prepared (a DEALLOCATE ALL not ours, a
                # pooler between): prepare again from the next run on
                session.prepared.clear()
                session.seen.clear()
            raise error
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        adapt.set_pgresult(result)
        return adapt.load_rows(0, result.ntuples, tuple)

    def _read(self, pg: pq.abc.PGconn, steps: list[tuple[Any, bytes] | None]) -> tuple[Any, Any]:
        """Every answer up to the sync: the last statement's result, and the first failure."""
        self._flush(pg)
        last = None
        failed = None
        for step in steps:
            result = self._next(pg)
            if result is None or self._next(pg) is not None:  # each answer, then a None
                raise psycopg.InternalError("a direct statement gave no result, or two")
            status = result.status
            if status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
                if step is not None:
                    self._session.prepared[step[0]] = step[1]
                else:
                    last = result
            elif status != pq.ExecStatus.PIPELINE_ABORTED and failed is None:
                failed = result
        result = self._next(pg)
        if result is None or result.status != pq.ExecStatus.PIPELINE_SYNC:
            raise psycopg.InternalError("a direct pipeline's sync did not come back")
        self._syncs -= 1
        return last, failed

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
