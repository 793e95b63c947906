"""PostgreSQL's worker locks and maintenance lock: session advisory locks the server frees
when their connection ends.

A worker lock is a session advisory lock on a 64-bit key, the BLAKE2b hash of (schema, job
id), taken on the process's *lock connection*: one long-lived connection that is never
pooled, so the lock lives exactly as long as that connection. The server frees it when the
connection ends: exit, crash, SIGKILL, ``pg_terminate_backend``, or a dead host found by
keepalives. Each job row keeps its key (``lock_key``), so "live jobs whose lock is free" is
one query joining ``pg_locks``. A claim runs on the lock connection itself: the statement
that reads its rows (``FOR UPDATE SKIP LOCKED``) tries their locks (:data:`TRY_LOCK_SQL`), a
round trip less than taking them afterwards. Session locks outlive a rolled-back transaction,
so a claim that fails lets go of the locks it took (:meth:`AdvisoryLocks._claiming`). Two ids
with the same key (about 2**-64 per pair) share a lock: the second job is skipped by claims
and looks alive while the first one runs. It is delayed, never doubled.

The maintenance lock is an advisory lock on its own connection, waited for (not polled) by
every pool and server of the store: when its holder dies, the next one gets it at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outlast.errors import StoreError, WorkerLockHeld
from outlast.store import _pg, _pgwire
from outlast.store._pg import Conn
from outlast.store.common import log

LOCK_RETRY_FOR = 0.2  # seconds an acquirer rides out a lock being handed over
EXITING_FOR = 0.05  # seconds a prober rides out a holder whose backend is exiting
DYING_FOR = 3.0  # ... and one whose process on this host is gone, its backend not yet told


def lock_key(schema: str, job_id: str) -> int:
    """The job's advisory lock key: 64 bits of BLAKE2b over (schema, id), signed."""
    digest = hashlib.blake2b(f"{schema}/{job_id}".encode(), digest_size=8, person=b"outlast")
    return int.from_bytes(digest.digest(), "big", signed=True)


def lock_pair(key: int) -> tuple[int, int]:
    """The two-key (``int4, int4``) form of ``key``: a lock of its own (``objsubid`` 2 in
    ``pg_locks``, under the same ids), which a job process holds shared while it runs the
    job, so the job stays alive until that process is dead too (claims never take it)."""
    low = key & 0xFFFFFFFF
    return key >> 32, low - (1 << 32) if low >= 1 << 31 else low


def lock_ids(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` shows a one-key advisory lock."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


#: The condition "some session holds the advisory lock of ``{alias}.lock_key``", in SQL.
HELD_SQL = (
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND l.classid = (({alias}.lock_key >> 32) & 4294967295)::oid"
    " AND l.objid = ({alias}.lock_key & 4294967295)::oid AND l.objsubid IN (1, 2) AND l.granted)"
)


#: A claimed row's worker lock, tried in the claim's own statement on the lock connection
#: (``c`` is the claimed rows, the parameter the keys this process holds already: a session
#: lock is re-entrant, so those are not taken twice). NULL for a row without a key.
TRY_LOCK_SQL = (
    "CASE WHEN c.lock_key = ANY(%s::int8[]) THEN false ELSE pg_try_advisory_lock(c.lock_key) END"
)

#: Let go of the given worker locks (a claim's rows it took but does not start).
UNLOCK_SQL = "SELECT pg_advisory_unlock(k) FROM unnest(%s::int8[]) AS k"

#: Let go of every worker lock this session holds but the given ones (a failed claim's).
_STRAYS_SQL = (
    "SELECT count(pg_advisory_unlock(s.k)) FROM (SELECT (l.classid::int8 << 32) | l.objid::int8"
    " AS k FROM pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()"
    " AND l.objsubid = 1 AND l.granted) s WHERE s.k <> ALL(%s::int8[])"
)


@dataclass(frozen=True)
class LockHandle:
    """A worker lock taken on one lock connection (``generation``) of this process."""

    generation: int
    key: int


@dataclass
class _Locks:
    """The lock connection and the keys this process holds on it."""

    conn: Conn | None = None
    generation: int = 0
    backend: int = 0
    held: set[int] = field(default_factory=set)


class AdvisoryLocks:
    """The worker-lock verbs of the PostgreSQL store (a mixin: the store gives ``schema``,
    ``_db``, ``_where`` and ``_session``)."""

    schema: str
    _db: _pg.Connections
    _where: str

    def _init_locks(self) -> None:
        self._locks = _Locks()
        self._lock_mutex = threading.Lock()
        self._pid = os.getpid()

    def _forget_locks_after_fork(self) -> None:
        """In a forked child: let go of the parent's lock connection, so that the parent's
        worker locks end with the parent."""
        _pg.orphan(self._locks.conn)
        self._locks = _Locks(generation=self._locks.generation + 1)
        self._lock_mutex = threading.Lock()
        self._pid = os.getpid()

    def _close_locks(self) -> None:
        with self._lock_mutex:
            conn = self._locks.conn
            self._locks = _Locks(generation=self._locks.generation + 1)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _lock_conn(self) -> Conn:
        """This process's lock connection (call with ``_lock_mutex`` held)."""
        locks = self._locks
        if locks.conn is not None and _pg.socket_ok(locks.conn):
            return locks.conn
        if locks.conn is not None:
            with contextlib.suppress(psycopg.Error):
                locks.conn.close()
        probe = lock_key(self.schema, f"\0probe/{os.getpid()}/{time.time()}")
        conn, backend = _pg.open_lock_connection(self._db, probe, lock_ids(probe))
        self._locks = _Locks(conn, locks.generation + 1, backend, set())
        return conn

    @contextlib.contextmanager
    def _claiming(self) -> Iterator[Conn]:
        """The lock connection, for a claim that tries its rows' worker locks in its own
        statement (one round trip less than taking them after the rows are read). Held
        under the lock mutex until the claim ends; the claim reports the keys it keeps with
        :meth:`_claimed_locks`. A claim that fails has taken locks it may not know of (a
        statement cut off half way, an error after the rows came back: session locks outlive
        a rolled-back transaction), so every worker lock of the session that this process
        does not hold is let go then; if even that fails the connection is closed, which
        frees them all (the running jobs' holders see their locks gone, and stop)."""
        if self._pid != os.getpid():
            self._forget_locks_after_fork()
        with self._lock_mutex:
            conn = self._lock_conn()
            try:
                yield conn
            except BaseException:
                self._release_strays(conn)
                raise

    def _release_strays(self, conn: Conn) -> None:
        """(With ``_lock_mutex`` held, after a failed claim.)"""
        if conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK:
            return  # the server let go of them with the session
        try:
            if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                _pgwire.rollback(conn)
            conn.execute(_STRAYS_SQL, (sorted(self._locks.held),))
        except psycopg.Error as exc:
            log.warning("could not let go of a failed claim's worker locks: %s", exc)
            conn.close()  # frees them all; _lock_alive tells the holders of the others

    def _check_backend(self, conn: Conn, backend: int) -> None:
        """(With ``_lock_mutex`` held.) Refuse a lock connection that changed server
        sessions: its locks would not be ours."""
        if backend != self._locks.backend:
            conn.close()  # frees whatever it took, wherever that was
            raise StoreError(
                f"postgresql store at {self._where}: the lock connection changed server "
                "sessions (a transaction pooler?); worker locks need a session of their own"
            )

    def _held_keys(self) -> list[int]:
        """(With ``_lock_mutex`` held.) The worker locks this process holds."""
        return list(self._locks.held)

    def _claimed_locks(self, keys: dict[str, int]) -> dict[str, LockHandle]:
        """(With ``_lock_mutex`` held, once a claim committed.) The handles of the locks it
        keeps, by job id."""
        self._locks.held.update(keys.values())
        generation = self._locks.generation
        return {job_id: LockHandle(generation, key) for job_id, key in keys.items()}

    def _try_locks(self, job_ids: Sequence[str]) -> dict[str, LockHandle]:
        """Take the free worker locks among ``job_ids`` on the lock connection."""
        if self._pid != os.getpid():
            self._forget_locks_after_fork()
        keys: dict[int, str] = {}
        with self._lock_mutex:
            for job_id in job_ids:
                key = lock_key(self.schema, job_id)
                if key not in keys and key not in self._locks.held:
                    keys[key] = job_id  # one attempt per key: a session lock is re-entrant
            if not keys:
                return {}
            conn = self._lock_conn()
            with _pg.translated("take worker locks"):
                row = conn.execute(
                    "SELECT array_agg(k) FILTER (WHERE pg_try_advisory_lock(k)), pg_backend_pid()"
                    " FROM unnest(%s::int8[]) AS k",
                    (list(keys),),
                ).fetchone()
            assert row is not None
            got: list[int] = row[0] or []
            self._check_backend(conn, row[1])
            self._locks.held.update(got)
            generation = self._locks.generation
        return {keys[k]: LockHandle(generation, k) for k in got}

    def _lock_acquire(self, job_id: str) -> Any:
        deadline = time.monotonic() + LOCK_RETRY_FOR
        while True:
            handle = self._try_locks([job_id]).get(job_id)
            if handle is not None:
                return handle
            if time.monotonic() >= deadline:
                raise WorkerLockHeld(f"job {job_id} already has a live worker")
            time.sleep(0.01)

    def _lock_release(self, job_id: str, handle: Any) -> None:
        """Drop a lock; a lock of a connection that is gone is already free."""
        assert isinstance(handle, LockHandle)
        with self._lock_mutex:
            locks = self._locks
            if handle.generation != locks.generation or locks.conn is None:
                return
            locks.held.discard(handle.key)
            try:
                locks.conn.execute("SELECT pg_advisory_unlock(%s::int8)", (handle.key,))
            except psycopg.Error as exc:
                log.warning("lost the lock connection while releasing %s: %s", job_id, exc)
                locks.conn.close()  # its other locks go too; _lock_alive tells their holders

    def _lock_release_many(self, items: list[tuple[str, Any]]) -> None:
        """Drop several locks in one statement (a pool's finished batch)."""
        with self._lock_mutex:
            locks = self._locks
            keys = [
                h.key
                for _, h in items
                if isinstance(h, LockHandle) and h.generation == locks.generation
            ]
            if locks.conn is None or not keys:
                return
            locks.held.difference_update(keys)
            try:
                locks.conn.execute(
                    "SELECT pg_advisory_unlock(k) FROM unnest(%s::int8[]) AS k", (keys,)
                )
            except psycopg.Error as exc:
                log.warning("lost the lock connection while releasing locks: %s", exc)
                locks.conn.close()

    def _lock_alive(self, job_id: str, handle: Any) -> bool:
        """True while this process still holds the lock behind ``handle``.

        No round trip: it checks that the lock connection has not been closed by the server
        (``pg_terminate_backend``, a restart) or the network (keepalives), so a worker may call
        it often. A worker whose lock is gone must stop the job: the server has already let
        another worker claim it, and the attempt token refuses this one's writes.
        """
        if not isinstance(handle, LockHandle):
            return False
        with self._lock_mutex:
            locks = self._locks
            if handle.generation != locks.generation or locks.conn is None:
                return False
            if self._pid != os.getpid():
                return False
            if not _pg.socket_ok(locks.conn):
                locks.conn.close()  # so lock_fileno() stops being readable; locks are gone
                return False
            return handle.key in locks.held

    def check_locks(self) -> None:
        """Read what the lock connection was sent; close it if the server or the network
        dropped it (its locks are gone), so :meth:`lock_fileno` stops being readable."""
        with self._lock_mutex:
            conn = self._locks.conn
            if conn is not None and not _pg.socket_ok(conn):
                conn.close()

    def lock_fileno(self) -> int | None:
        """The lock connection's socket, readable when the server or the network drops it
        (or says something): a worker may ``select()`` on it, then check :meth:`_lock_alive`
        of its tasks, which consumes what was said. None while there is no lock connection."""
        return _pg.socket_of(self._locks.conn)

    def _lock_held(self, job_id: str) -> bool:
        """True while any session holds the job's lock (``pg_locks``).

        A holder whose client just died can show for a moment while its backend exits
        (idle, no longer reading from its client): such a lock is looked at again briefly.
        A holder whose lock connection names a process of this host that is gone (see
        :func:`~outlast.store._pg.dead_local_holder`) is waited for longer, up to
        ``DYING_FOR`` seconds: its backend frees the lock once it sees the client gone.
        """
        classid, objid = lock_ids(lock_key(self.schema, job_id))
        query = (
            "SELECT coalesce(a.state = 'idle' AND a.wait_event IS NULL, false),"
            " a.application_name FROM pg_locks l"
            " LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.classid = %s::int8::oid AND l.objid = %s::int8::oid"
            " AND l.objsubid IN (1, 2) AND l.granted"
        )
        started = time.monotonic()
        with self._db.session(f"probe the worker lock of {job_id}") as conn:
            while True:
                rows = conn.execute(query, (classid, objid)).fetchall()
                if not rows:
                    return False
                exiting = all(dying for dying, _ in rows)
                if not exiting and not all(
                    dying or _pg.dead_local_holder(name) for dying, name in rows
                ):
                    return True
                elapsed = time.monotonic() - started
                if elapsed >= (DYING_FOR if not exiting else EXITING_FOR):
                    return True
                time.sleep(0.002 if elapsed < EXITING_FOR else 0.01)
                conn.execute("SELECT pg_stat_clear_snapshot()")  # a fresh pg_stat_activity


#: The names whose advisory lock keys (:func:`lock_key`) are the store's maintenance lock
#: and its timer lock: no job id starts with a NUL.
MAINTENANCE_LOCK = "\0maintenance"
TIMER_LOCK = "\0timer"


class PgMaintenance:
    """The maintenance lock of a PostgreSQL store (or another lock of one process per
    store: the timer's, a worker's registry entry): ``pg_advisory_lock`` on a connection of
    its own, waited for by the server (no polling); :meth:`interrupt` cancels the wait."""

    RETRY = 1.0  # seconds between tries to connect while the server is unreachable

    def __init__(self, db: _pg.Connections, key: int, name: str = "outlast-maintainer") -> None:
        self._db, self._key, self._name = db, key, name
        self._conn: Conn | None = None
        self._held = False
        self._mutex = threading.Lock()
        self._stop = threading.Event()

    def _connection(self) -> Conn | None:
        """The lock's own connection (made if need be), or None once interrupted."""
        while not self._stop.is_set():
            conn = self._conn
            if conn is not None and _pg.socket_ok(conn):
                return conn
            try:
                conn = self._db.connect(application_name=self._name)
            except StoreError as exc:
                log.warning("maintenance lock: %s; retrying", exc)
                self._stop.wait(self.RETRY)
                continue
            with self._mutex:
                if self._stop.is_set():
                    conn.close()
                    return None
                self._conn = conn
            return conn
        return None

    def _lock(self, function: str) -> bool:
        conn = self._connection()
        if conn is None:
            return False
        try:
            row = conn.execute(f"SELECT {function}(%s::int8)", (self._key,)).fetchone()
        except psycopg.Error as exc:
            with self._mutex:
                self._conn = None
            conn.close()
            if not isinstance(exc, psycopg.errors.QueryCanceled):
                log.warning("maintenance lock: %s; retrying", exc)
                self._stop.wait(self.RETRY)
            return False
        self._held = row is None or row[0] is not False  # pg_advisory_lock returns void
        return self._held

    def try_acquire(self) -> bool:
        return self._held or self._lock("pg_try_advisory_lock")

    def acquire(self) -> bool:
        while not self._stop.is_set():
            if self._held or self._lock("pg_advisory_lock"):
                return True
        return False

    def held(self) -> bool:
        conn = self._conn
        self._held = self._held and conn is not None and _pg.socket_ok(conn)
        return self._held

    def interrupt(self) -> None:
        with self._mutex:
            self._stop.set()
            conn = self._conn
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=5.0)

    def release(self) -> None:
        with self._mutex:
            conn, self._conn = self._conn, None
            self._held = False
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
