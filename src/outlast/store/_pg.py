"""PostgreSQL plumbing for :mod:`outlast.store.postgresql`: the URL, the schema migrations,
a small fork-safe connection pool, and the ``LISTEN`` listener.

Connections are autocommit (a transaction is an explicit ``BEGIN … COMMIT``, pipelined), with
client-side TCP keepalives so that a vanished server is noticed in about ten seconds instead
of the kernel's fifteen minutes. Why not ``psycopg_pool``: it connects in background threads,
so a wrong URL or a server that is down surfaces only as a timeout after many seconds, while a
CLI call wants the server's own message at once; and its ``connection()`` adds a round trip per
use. Here a connection is made in the calling thread and reused; nothing runs in the background.

Fork: a child must never speak on its parent's sockets (it would corrupt the parent's sessions)
nor keep them open (the parent's worker locks would outlive the parent). After a fork the child
closes its copies of every socket, without a word to the server, and starts afresh.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import select
import socket
import threading
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo as pg_conninfo

from outlast.errors import InvalidInput, StoreError
from outlast.store import _pgwire, common
from outlast.store._pgwire import error_of
from outlast.store.common import log

Conn = psycopg.Connection[tuple[Any, ...]]

DEFAULT_SCHEMA = "outlast"
MAX_IDLE = 4  # idle connections kept for reuse
MAX_LISTENERS_IDLE = 2  # idle LISTEN connections kept for the next listen()
MAX_CONNECTIONS = 16  # statements in flight at once, per store
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")
_MIGRATION_LOCK = 0x6F75746C  # "outl": first key of the two-int migration lock
CLIENT_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
#: Settings of a lock connection's session, where claims run. No JIT: a claim's custom
#: plan (the first five runs of its prepared statement in a session) is costed above
#: ``jit_above_cost`` once the store holds ~100,000 jobs, and compiling it cost 20-35 ms a
#: run, for a statement that runs in well under one (BENCHMARKS.md, issue #18). Generic
#: plans: the planner costs a custom plan of a claim (its queue, priority and range known)
#: far below the generic one, so it planned every claim afresh, 0.3-0.8 ms of a claim that
#: runs in 0.1; every plan a claim's statements can take reads its indexes in order, for
#: any queue and priority (tests/store/test_claim_plans.py checks the generic plans).
LOCK_SESSION = {"jit": "off", "plan_cache_mode": "force_generic_plan"}


def translated(what: str) -> contextlib.AbstractContextManager[None]:
    """Turn psycopg and OS failures into :class:`StoreError` at the boundary."""
    return common.translated("postgresql store", what, (psycopg.Error,))


#: Connections the server said FATAL to while they were idle (terminated, shut down, timed
#: out): the end of the stream follows, but may not have arrived yet.
_DOOMED: weakref.WeakSet[Conn] = weakref.WeakSet()


def _on_notice(conn: weakref.ref[Conn], diag: psycopg.errors.Diagnostic) -> None:
    if diag.severity_nonlocalized in ("FATAL", "PANIC") and (live := conn()) is not None:
        _DOOMED.add(live)


def socket_ok(conn: Conn) -> bool:
    """False once the server closed the connection, said it would, or the network failed.

    No round trip: it reads what the server sent while nobody was reading. An idle session
    gets nothing but the odd parameter report, or its end: ``FATAL`` (handed to the notice
    handler when libpq parses it) followed by the end of the stream.
    """
    pgconn = conn.pgconn
    try:
        while not conn.closed and pgconn.status == psycopg.pq.ConnStatus.OK:
            if conn in _DOOMED:
                return False
            if not select.select([pgconn.socket], [], [], 0)[0]:
                return True
            pgconn.consume_input()
            pgconn.is_busy()  # parses it: notices, and so a FATAL, reach the handler
    except (psycopg.Error, OSError, ValueError):
        pass
    return False


def socket_of(conn: Conn | None) -> int | None:
    if conn is None or conn.closed:
        return None
    try:
        return conn.pgconn.socket
    except psycopg.Error:
        return None


# ----------------------------------------------------------------------- libpq directly
class Direct:
    """A few fixed statements on one autocommit connection, sent through libpq itself
    (psycopg's documented ``psycopg.pq`` wrapper) rather than psycopg's cursors: each is
    prepared once per connection, its parameters go as text, its answer is read by
    :meth:`wait`. That costs ~32 µs of CPU a statement where ``Connection.execute`` costs ~54
    and a pipelined one ~70 (psycopg's adapters, cursor and pipeline are Python): a job
    process runs two such statements per job (its journal, BENCHMARKS.md issue #18).

    The connection must be used by nothing else while a statement is out (a journal's own
    connection). Failures are psycopg's errors (the server's by its SQLSTATE), so the
    callers' :func:`translated` applies. A send or a wait cut off by an exception (a signal
    handler's) leaves libpq's state whole: the next :meth:`wait` goes on where it stopped.
    """

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._prepared: set[bytes] = set()
        self._out = False
        self._ended = False  # the server said FATAL: the session is over
        conn.add_notice_handler(self._noticed)

    def _noticed(self, diag: psycopg.errors.Diagnostic) -> None:
        # an error while nothing is out comes as a notice: the server ending the session
        if diag.severity_nonlocalized in ("FATAL", "PANIC"):
            self._ended = True

    @property
    def pending(self) -> bool:
        """Whether a statement was sent and its answer not yet read."""
        return self._out

    def alive(self) -> bool:
        """Whether the session is still up, as far as what the server sent says: one it
        ended (a restart, an idle timeout, an administrator) sent its FATAL, read here
        (one ``select`` when nothing came)."""
        pg = self.conn.pgconn
        try:
            while not self._out and select.select([pg.socket], [], [], 0)[0]:
                pg.consume_input()  # the end raises, once the socket is shut
                pg.is_busy()  # parses what came: an error while idle goes to _noticed
                if self._ended or pg.status != psycopg.pq.ConnStatus.OK:
                    break
        except (psycopg.OperationalError, OSError):
            self._ended = True
        return not self._ended and pg.status == psycopg.pq.ConnStatus.OK

    def send(self, sql: str, params: Sequence[str]) -> None:
        """Send ``sql`` (``$1``… placeholders; prepared on its first use, under a name made
        from its text, so the same text prepared before on the session is the same
        statement) with ``params``, after the answer to what was sent before."""
        self.wait()
        pg = self.conn.pgconn
        text = sql.encode()
        name = b"outlast_%08x" % zlib.crc32(text)
        if name not in self._prepared:
            pg.send_prepare(name, text)
            self._out = True
            with contextlib.suppress(psycopg.errors.DuplicatePreparedStatement):
                self.wait()
            self._prepared.add(name)
        pg.send_query_prepared(name, [p.encode() for p in params])
        self._out = True
        self._flush()

    def run(self, sql: str, params: Sequence[str]) -> None:
        """:meth:`send`, then :meth:`wait`."""
        self.send(sql, params)
        self.wait()

    def _flush(self) -> None:
        pg = self.conn.pgconn
        while pg.flush():
            select.select([], [pg.socket], [])

    def wait(self) -> None:
        """Read the answer to the statement sent, if one is out; the server's error raised."""
        if not self._out:
            return
        pg = self.conn.pgconn
        self._flush()  # what a send cut off left
        pg.consume_input()
        while pg.is_busy():
            select.select([pg.socket], [], [])
            pg.consume_input()
        failed = None
        while (result := pg.get_result()) is not None:
            if failed is None and result.status not in _OK:
                failed = result
        self._out = False
        if failed is not None:
            if failed.error_field(psycopg.pq.DiagnosticField.SEVERITY_NONLOCALIZED) in (
                b"FATAL",
                b"PANIC",
            ):
                self._ended = True
            raise error_of(failed)


_OK = (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK)


# ---------------------------------------------------------------------------------- fork
class _Forkable(Protocol):
    def _forget_after_fork(self) -> None: ...


#: Connections a forked child inherited: their sockets are closed in the child; they are kept
#: referenced so that no finaliser ever runs on them there.
_ORPHANS: list[object] = []
_FORKABLE: weakref.WeakSet[Any] = weakref.WeakSet()


def on_fork(owner: _Forkable) -> None:
    """Have ``owner._forget_after_fork()`` called in every forked child."""
    _FORKABLE.add(owner)


def orphan(conn: Conn | None) -> None:
    """In a forked child: let go of the parent's connection without telling the server."""
    if conn is not None:
        with contextlib.suppress(psycopg.Error, OSError, ValueError):
            os.close(conn.pgconn.socket)
        _ORPHANS.append(conn)


def _after_fork_in_child() -> None:
    for owner in list(_FORKABLE):
        owner._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ------------------------------------------------------------------------------ the URL
def parse_url(url: str) -> tuple[str, str, str]:
    """``(schema, libpq URL without it, host:port/db for messages)``; refuses bad input."""
    try:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError as exc:
        raise InvalidInput(f"not a postgresql URL: {exc}") from None
    schemas = [v for k, v in query if k == "schema"]
    schema = schemas[-1] if schemas else DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise InvalidInput(
            f"schema {schema!r}: use at most 48 lower-case letters, digits and '_', "
            "starting with a letter or '_'"
        )
    rest = [(k, v) for k, v in query if k != "schema"]
    given = {k for k, _ in rest}
    rest += [(k, v) for k, v in CLIENT_KEEPALIVES.items() if k not in given]
    if "application_name" not in given:
        rest.append(("application_name", "outlast"))
    stripped = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    try:
        params = pg_conninfo.conninfo_to_dict(stripped)
    except psycopg.Error as exc:
        raise InvalidInput(f"not a usable postgresql URL: {exc}") from None
    where = f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
    where += f"/{params.get('dbname') or params.get('user') or ''}?schema={schema}"
    return schema, stripped, where


def _int4(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


Migration = Callable[[Conn], None]


def exists(conn: Conn, schema: str) -> bool:
    """Whether ``schema`` holds a store (its version table)."""
    row = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".schema_version',)).fetchone()
    return row is not None and row[0] is not None


def migrate(conn: Conn, schema: str, migrations: Sequence[Sequence[str | Migration]]) -> None:
    """Bring the schema to the latest version, one migration per transaction, serialised by
    a transaction-level advisory lock (so concurrent openers wait, then find it done). A
    migration is a list of statements and Python steps (a step gets the connection)."""
    s, latest = f'"{schema}"', len(migrations)
    try:
        row = conn.execute(f"SELECT max(version) FROM {s}.schema_version").fetchone()
        version = int(row[0] or 0) if row else 0
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        version = 0
    while version < latest:
        with conn.transaction():
            lock = (_int4(_MIGRATION_LOCK), _int4(zlib.crc32(schema.encode())))
            conn.execute("SELECT pg_advisory_xact_lock(%s::int4, %s::int4)", lock)
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute(f"SELECT max(version) FROM {s}.schema_version").fetchone()
            version = int(row[0] or 0) if row else 0
            if version < latest:
                for step in migrations[version]:
                    if callable(step):
                        step(conn)
                    else:
                        conn.execute(step)
                conn.execute(
                    f"INSERT INTO {s}.schema_version (version) VALUES (%s)", (version + 1,)
                )
                version += 1
    if version > latest:
        raise StoreError(
            f"postgresql store: schema {schema} is at version {version}, newer than this "
            f"outlast knows ({latest}); upgrade outlast"
        )


# -------------------------------------------------------------------------- connections
class Connections:
    """A few reusable autocommit connections to one server. Thread-safe."""

    def __init__(self, conninfo: str, where: str) -> None:
        self.conninfo, self.where = conninfo, where
        self._pid = os.getpid()
        self._idle: list[Conn] = []
        self._idle_listeners: list[Conn] = []
        self._mutex = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._tls = threading.local()
        on_fork(self)

    def connect(self, **extra: str) -> Conn:
        """A new connection of its own (``extra``: libpq parameters over the URL's)."""
        with translated(f"cannot connect to {self.where}"):
            conn = psycopg.connect(
                pg_conninfo.make_conninfo(self.conninfo, **extra), autocommit=True
            )
        conn.add_notice_handler(functools.partial(_on_notice, weakref.ref(conn)))
        return conn

    def _take(self, idle: list[Conn], **extra: str) -> Conn:
        if self._pid != os.getpid():
            self._forget_after_fork()
        with self._mutex:
            while idle:
                conn = idle.pop()
                if socket_ok(conn):
                    return conn
                conn.close()
        return self.connect(**extra)

    def _give(self, idle: list[Conn], keep: int, conn: Conn) -> None:
        usable = (
            socket_ok(conn) and conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )
        with self._mutex:
            if usable and len(idle) < keep and self._pid == os.getpid():
                idle.append(conn)
                return
        conn.close()

    @contextlib.contextmanager
    def session(self, what: str) -> Iterator[Conn]:
        """A connection for one statement or transaction; rolled back on error, failures
        translated. Nested use in one thread shares the connection (and its transaction), so
        a transaction never waits for a second connection."""
        current: Conn | None = getattr(self._tls, "conn", None)
        if current is not None:
            yield current
            return
        if not self._slots.acquire(timeout=60):
            raise StoreError(f"postgresql store: {what}: all {MAX_CONNECTIONS} connections busy")
        try:
            conn = self._take(self._idle)
            try:
                with self._as_session(conn, what):
                    yield conn
            finally:
                self._give(self._idle, MAX_IDLE, conn)
        finally:
            self._slots.release()

    @contextlib.contextmanager
    def borrowed(self, conn: Conn, what: str) -> Iterator[Conn]:
        """``conn``, a connection of the caller's own (the lock connection), as this
        thread's session for one transaction: nested :meth:`session` calls share it, a
        failure is translated and rolled back, and the connection stays the caller's."""
        if getattr(self._tls, "conn", None) is not None:
            raise StoreError(f"postgresql store: {what}: a transaction inside a transaction")
        with self._as_session(conn, what):
            yield conn

    @contextlib.contextmanager
    def _as_session(self, conn: Conn, what: str) -> Iterator[None]:
        """``conn`` as this thread's session: failures translated, a transaction left open
        by one rolled back."""
        self._tls.conn = conn
        try:
            with translated(what):
                yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    _pgwire.rollback(conn)
            raise
        finally:
            self._tls.conn = None

    def take(self) -> Conn:
        """A connection for the caller to keep (an idle one if there is one)."""
        return self._take(self._idle)

    def take_listener(self) -> Conn:
        return self._take(self._idle_listeners, application_name="outlast-listen")

    def give_listener(self, conn: Conn) -> None:
        """Take back a listener's connection: unsubscribed and drained, it serves the next."""
        try:
            conn.execute("UNLISTEN *")
            for _ in conn.notifies(timeout=0):
                pass
        except psycopg.Error:
            conn.close()
            return
        self._give(self._idle_listeners, MAX_LISTENERS_IDLE, conn)

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the parent's connections and thread state (a mutex may have
        been held by a thread that is not here)."""
        for conn in [*self._idle, *self._idle_listeners]:
            orphan(conn)
        self._idle, self._idle_listeners = [], []
        self._mutex = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._tls = threading.local()
        self._pid = os.getpid()

    def close(self) -> None:
        with self._mutex:
            conns = self._idle + self._idle_listeners
            self._idle, self._idle_listeners = [], []
        for conn in conns:
            with contextlib.suppress(psycopg.Error):
                conn.close()


# ------------------------------------------------------------------------ lock connection
_POOLER_HINT = (
    "worker locks are session advisory locks: connect workers to PostgreSQL directly or "
    "through a pooler in session mode (PgBouncer's transaction pooling breaks them)"
)


#: ``application_name`` of a lock connection: ``outlast-locks host:pid`` of its process, so
#: a prober on the same host can tell a holder whose process is dead from a live one.
LOCK_APP = "outlast-locks"


def lock_app_name() -> str:
    """This process's lock-connection name (PostgreSQL keeps 63 bytes: a longer one is cut,
    and :func:`dead_local_holder` then ignores it)."""
    return f"{LOCK_APP} {common.worker_name()}"


def dead_local_holder(app_name: str | None) -> bool:
    """True when ``app_name`` names a lock connection of a process on this host that no
    longer exists: its backend still shows the lock only because it has not yet seen its
    client go (a killed client's backend notices on its next read, which a loaded machine
    can delay). Anything else (another host, a cut name, a live pid) is False."""
    if not app_name or len(app_name.encode()) > 63:
        return False
    prefix, _, worker = app_name.partition(" ")
    host, _, pid = worker.rpartition(":")
    if prefix != LOCK_APP or host != os.uname().nodename or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, someone else's
        return False
    return False


def open_lock_connection(conns: Connections, probe: int, ids: tuple[int, int]) -> tuple[Conn, int]:
    """A new lock connection and its backend pid: server-side keepalives, and checked to own
    its session (``probe`` is a lock key nobody else uses, ``ids`` its pg_locks ids)."""
    options = " ".join(f"-c {k}={v}" for k, v in {**SERVER_KEEPALIVES, **LOCK_SESSION}.items())
    base = pg_conninfo.conninfo_to_dict(conns.conninfo).get("options") or ""
    try:
        conn = conns.connect(application_name=lock_app_name(), options=f"{base} {options}".strip())
    except StoreError as exc:
        if "startup parameter" not in str(exc):
            raise
        raise StoreError(f"{exc}; {_POOLER_HINT}") from exc.__cause__
    try:
        with translated("open the lock connection"):
            return conn, _check_session(conn, probe, ids, conns.where)
    except BaseException:
        conn.close()
        raise


def _check_session(conn: Conn, probe: int, ids: tuple[int, int], where: str) -> int:
    """Refuse a session whose advisory locks are not its own; warn about a proxy between us
    and the server, or server-side keepalives that did not take."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s::int8), pg_backend_pid(),"
        " current_setting('tcp_keepalives_idle'), inet_client_port()",
        (probe,),
    ).fetchone()
    assert row is not None
    seen = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
        " AND classid = %s::int8::oid AND objid = %s::int8::oid AND objsubid = 1 AND granted",
        (row[1], *ids),
    ).fetchone()
    conn.execute("SELECT pg_advisory_unlock(%s::int8)", (probe,))
    if not row[0] or not seen or seen[0] != 1:
        raise StoreError(
            f"postgresql store at {where}: a session advisory lock is not visible on its own "
            f"session; {_POOLER_HINT}"
        )
    if row[3] is not None:  # TCP
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as ours:
            port = ours.getsockname()[1]
        if port != row[3]:
            log.warning(
                "postgresql store at %s: the lock connection goes through a proxy or pooler "
                "(the server sees client port %s, this end is %s); %s",
                where,
                row[3],
                port,
                _POOLER_HINT,
            )
        elif row[2] != SERVER_KEEPALIVES["tcp_keepalives_idle"]:
            log.warning(
                "postgresql store at %s: the server did not apply tcp_keepalives_idle=10 to the "
                "lock connection (it says %r): a vanished worker host keeps its jobs' locks "
                "until the server notices by its own settings",
                where,
                row[2],
            )
    return int(row[1])
