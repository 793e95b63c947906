"""The PostgreSQL adapter: workers on many machines sharing one database.

URL: ``postgresql://[user@]host[:port]/dbname[?schema=NAME&…]``. ``schema`` (default
``outlast``; lower-case letters, digits and ``_``) is the PostgreSQL schema that holds the
store, so one database can hold several stores and test runs never collide; every other
parameter is libpq's (``sslmode``, ``connect_timeout``…). Prefer ``PGPASSWORD`` or
``~/.pgpass`` to a password in the URL: the URL is handed to job processes.

**Tables.** ``jobs`` keeps the queried columns beside the document (``JobState.to_dict()`` as
UTF-8 JSON in a ``bytea``: byte for byte what the other adapters store; in SQL read it with
``convert_from(doc, 'UTF8')::jsonb``); ``events`` has the key ``(job_id, seq)``; ``labels``.
Versioned migrations run on open, each in one transaction under ``pg_advisory_xact_lock``, so
any number of processes may open a fresh database at once.

**Writes.** A transition is one transaction: ``SELECT … FOR UPDATE`` of the job's row, the new
document, its events (``seq`` continuing from ``jobs.seq``) and ``pg_notify`` (delivered on
commit), in two round trips (pipeline mode). Claims take due pending jobs oldest first with
``FOR UPDATE SKIP LOCKED``. Channels: ``<schema>_j0``…``_j15`` (a hash shard of the job id) and
``<schema>_queue`` (a job became claimable); the payload is the job id, so a listener wakes only
for its own jobs.

**Worker locks.** A session advisory lock on a 64-bit key, the BLAKE2b hash of (schema, job id),
taken on the process's *lock connection*: one long-lived connection that is never pooled, so the
lock lives exactly as long as that connection. The server frees it when the connection ends:
exit, crash, SIGKILL, ``pg_terminate_backend``, or a dead host found by keepalives. ``_lock_held``
reads ``pg_locks``. Two ids with the same key (about 2**-64 per pair) share a lock: the second
job is skipped by claims and looks alive while the first one runs. It is delayed, never doubled.

**Keepalives, the trade-off.** The lock connection's server side uses ``tcp_keepalives_idle=10``,
``_interval=5``, ``_count=3`` and ``tcp_user_timeout=30000``: the server drops a vanished host's
connection, and with it its locks, within about 25-30 s. The client side is stricter (5 s, 2 s,
3 probes, ``tcp_user_timeout=10000``): a worker cut off from the server finds out (see
``_lock_alive``) in about 11 s, before anyone else can claim its jobs, and stops them. Shorter
settings fail over sooner but turn network blips into lost attempts; longer ones leave a dead
host's jobs waiting longer. Over a Unix socket keepalives do not apply (nothing to vanish).

**Poolers.** PgBouncer in transaction (or statement) pooling mode hands each transaction to
any server connection, which breaks session advisory locks (a lock would outlive its worker on a
server connection that serves others) and ``LISTEN``. The lock connection refuses to work when
its lock is not visible in ``pg_locks`` on its own backend or its backend changes, and says so
when the startup options it needs are rejected (PgBouncer's default); when the server sees
another client port than ours (a proxy or pooler in between) it warns. Session pooling is fine.

**Durability.** A transition that changes the status (create, claim, outcome, cancel…) waits
for its commit to be flushed; one that keeps it (a progress report, a label, a pid, a
checkpoint) commits with ``synchronous_commit = off``: a server crash may take back its last
fraction of a second, never a status change. ``options=-csynchronous_commit%3Doff`` in the URL
trades that for every transaction (several times the throughput on slow disks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from outlast import codec, machine, paths
from outlast.errors import CorruptJob, JobActive, JobNotFound, StoreError, WorkerLockHeld
from outlast.machine import NewEvent
from outlast.model import JobState, Kind, ProgressEvent, Status, utcnow
from outlast.store import _local, _pg
from outlast.store._pg import Conn, PgListener, translated
from outlast.store.base import Capabilities, Store, Transition

SHARDS = 16
LOCK_RETRY_FOR = 0.2  # seconds an acquirer rides out a lock being handed over
_TERMINAL = [str(s) for s in Status if s.terminal]


def lock_key(schema: str, job_id: str) -> int:
    """The job's advisory lock key: 64 bits of BLAKE2b over (schema, id), signed."""
    digest = hashlib.blake2b(f"{schema}/{job_id}".encode(), digest_size=8, person=b"outlast")
    return int.from_bytes(digest.digest(), "big", signed=True)


def _lock_ids(key: int) -> tuple[int, int]:
    """``(classid, objid)`` under which ``pg_locks`` shows a one-key advisory lock."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


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


class _Script:
    """Statements sent in one round trip (pipeline mode): a transaction is two of them,
    ``BEGIN`` and the reads, then the writes and ``COMMIT``."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def add(self, statement: str, *params: Any) -> _Script:
        self.statements.append((statement, params))
        return self

    def run(self, conn: Conn) -> list[tuple[Any, ...]]:
        """Run and clear the script; returns the rows of its last statement."""
        with conn.pipeline():
            cursors = [conn.execute(sql, params or None) for sql, params in self.statements]
        self.statements = []
        last = cursors[-1]
        return last.fetchall() if last.description is not None else []


class PostgresStore(Store):
    capabilities = Capabilities(pushes_notifications=True, spans_hosts=True, local_logs=False)

    def __init__(self, url: str) -> None:
        self.url = url
        self.schema, conninfo, self._where = _pg.parse_url(url)
        s = f'"{self.schema}"'
        self._jobs, self._events_t, self._labels = f"{s}.jobs", f"{s}.events", f"{s}.labels"
        self._queue_channel = f"{self.schema}_queue"
        self._insert_event = f"INSERT INTO {self._events_t} (job_id, seq, doc) VALUES (%s, %s, %s)"
        self._update_job = (
            f"UPDATE {self._jobs} SET status = %s, kind = %s, queue = %s, worker = %s,"
            " run_after = %s, created_at = %s, doc = %s, seq = %s WHERE id = %s"
        )
        self._db = _pg.Connections(conninfo, self._where)
        self._session = self._db.session
        self._tls = threading.local()
        self._locks = _Locks()
        self._lock_mutex = threading.Lock()
        self._pid = os.getpid()
        _pg.on_fork(self)
        try:
            with self._session("open") as conn:
                _pg.migrate(conn, self.schema)
        except BaseException:
            self.close()
            raise

    def _forget_after_fork(self) -> None:
        """In a forked child: let go of the parent's lock connection, so that the parent's
        worker locks end with the parent."""
        _pg.orphan(self._locks.conn)
        self._locks = _Locks(generation=self._locks.generation + 1)
        self._lock_mutex = threading.Lock()
        self._tls = threading.local()
        self._pid = os.getpid()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Close the store's connections, the lock connection included: on PostgreSQL the
        worker locks of this process live on it and end with it."""
        self._db.close()
        with self._lock_mutex:
            conn = self._locks.conn
            self._locks = _Locks(generation=self._locks.generation + 1)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    # ------------------------------------------------------------------ rows
    def _channel(self, job_id: str) -> str:
        return f"{self.schema}_j{zlib.crc32(job_id.encode()) % SHARDS}"

    @staticmethod
    def _notify(script: _Script, pairs: Sequence[tuple[str, str]]) -> _Script:
        """Add ``pg_notify(channel, job_id)`` for each pair (delivered on commit)."""
        if pairs:
            script.add(
                "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS t(c, p)",
                [c for c, _ in pairs],
                [p for _, p in pairs],
            )
        return script

    def _wake(self, job_id: str, claimable: bool) -> list[tuple[str, str]]:
        pairs = [(self._channel(job_id), job_id)]
        if claimable:
            pairs.append((self._queue_channel, job_id))
        return pairs

    @staticmethod
    def _columns(state: JobState) -> tuple[Any, ...]:
        return (
            str(state.status),
            str(state.kind),
            state.queue,
            state.worker,
            state.run_after,
            state.created_at,
            codec.encode(state),
        )

    def _insert(self, state: JobState) -> None:
        script = _Script().add("BEGIN")
        script.add(
            f"INSERT INTO {self._jobs} (status, kind, queue, worker, run_after, created_at,"
            " doc, id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            *self._columns(state),
            state.id,
        )
        self._put_labels(script, state)
        self._notify(script, self._wake(state.id, True)).add("COMMIT")
        with self._session(f"create {state.id}") as conn:
            script.run(conn)
        self._tls.inserted = state.id  # see _pulse

    def _put_labels(self, script: _Script, state: JobState) -> None:
        if state.labels:
            script.add(
                f"INSERT INTO {self._labels} (job_id, key, value)"
                " SELECT %s, k, v FROM unnest(%s::text[], %s::text[]) AS t(k, v)",
                state.id,
                list(state.labels),
                list(state.labels.values()),
            )

    def _read(self, job_id: str) -> JobState:
        with self._session(f"read {job_id}") as conn:
            row = conn.execute(f"SELECT doc FROM {self._jobs} WHERE id = %s", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return codec.decode(job_id, row[0])

    def _write(
        self,
        script: _Script,
        items: Sequence[tuple[JobState, JobState, int, Sequence[NewEvent]]],
        wakes: Sequence[tuple[str, str]],
    ) -> list[list[ProgressEvent]]:
        """Add the writes of ``(old, new, seq, new_events)`` items and their notifications to
        ``script``; returns each item's stored events. When no item changes a status, the
        commit does not wait for the WAL flush (see "Durability" above)."""
        now = utcnow()
        stored: list[list[ProgressEvent]] = []
        first: dict[str, JobState] = {}
        last: dict[str, tuple[JobState, int]] = {}  # a job written twice: its last state
        for old, new, seq, events in items:
            stored.append(
                [
                    ProgressEvent(new.id, seq + i, now, e.step, e.status, e.message)
                    for i, e in enumerate(events, 1)
                ]
            )
            first.setdefault(new.id, old)
            last[new.id] = (new, seq + len(events))
        for event in (e for mine in stored for e in mine):
            script.add(self._insert_event, event.job_id, event.seq, codec.encode_event(event))
        for new, seq in last.values():
            script.add(self._update_job, *self._columns(new), seq, new.id)
        self._notify(script, wakes)
        if all(old.status == new.status for old, new, _, _ in items):
            script.add("SET LOCAL synchronous_commit = off")
        for job_id, (new, _) in last.items():
            if new.labels != first[job_id].labels:
                script.add(f"DELETE FROM {self._labels} WHERE job_id = %s", job_id)
                self._put_labels(script, new)
        return stored

    def _modify(self, job_id: str, fn: Transition) -> tuple[JobState, list[ProgressEvent]]:
        return self._apply([(job_id, fn)], f"update {job_id}", strict=True)[0]

    def _modify_many(
        self, items: list[tuple[str, Transition]]
    ) -> list[tuple[JobState, list[ProgressEvent]]]:
        """All in one transaction: a job that cannot be read is skipped (logged), not fatal."""
        return self._apply(items, "update many", strict=False)

    def _apply(
        self, items: list[tuple[str, Transition]], what: str, strict: bool
    ) -> list[tuple[JobState, list[ProgressEvent]]]:
        """Lock the rows (in id order: two batches never deadlock), apply the transitions in
        order, write and notify, commit. A transition that keeps the status (a progress report,
        a label, a pid, a checkpoint) commits without waiting for the WAL flush: a crash of
        the server may take back its last moments, never a status change."""
        ids = sorted({job_id for job_id, _ in items})
        results: list[tuple[JobState, int | None]] = []  # the state, and its index in writes
        stored: list[list[ProgressEvent]] = []
        writes: list[tuple[JobState, JobState, int, Sequence[NewEvent]]] = []
        wakes: list[tuple[str, str]] = []
        script = _Script().add("BEGIN")
        script.add(
            f"SELECT id, doc, seq FROM {self._jobs} WHERE id = ANY(%s::text[])"
            " ORDER BY id FOR UPDATE",
            ids,
        )
        with self._session(what) as conn:
            rows = script.run(conn)
            found = {r[0]: (r[1], r[2]) for r in rows}
            current: dict[str, tuple[JobState, int]] = {}
            for job_id, fn in items:
                try:
                    if job_id not in current:
                        if job_id not in found:
                            raise JobNotFound(f"no job {job_id}")
                        doc, seq = found[job_id]
                        current[job_id] = (codec.decode(job_id, doc), seq)
                except (JobNotFound, CorruptJob) as exc:
                    if strict:
                        raise
                    _local.log.warning("not updating job %s: %s", job_id, exc)
                    continue
                state, seq = current[job_id]
                change = fn(state)
                if change is None:
                    results.append((state, None))
                    continue
                results.append((change.state, len(writes)))
                writes.append((state, change.state, seq, change.events))
                current[job_id] = (change.state, seq + len(change.events))
                wakes += self._wake(job_id, change.claimable)
            if writes:
                stored = self._write(script, writes, sorted(set(wakes)))
            script.add("COMMIT").run(conn)
        return [(state, [] if i is None else stored[i]) for state, i in results]

    def _select(
        self, status: Status | None, labels: dict[str, str], limit: int | None, before: str | None
    ) -> list[JobState]:
        where, args = ["TRUE"], []
        if status is not None:
            where.append("status = %s")
            args.append(str(status))
        for key, value in labels.items():
            where.append(f"id IN (SELECT job_id FROM {self._labels} WHERE key = %s AND value = %s)")
            args += [key, value]
        with self._session("list") as conn:
            if before is not None:
                row = conn.execute(
                    f"SELECT created_at FROM {self._jobs} WHERE id = %s", (before,)
                ).fetchone()
                if row is None:
                    raise JobNotFound(f"no job {before} (the 'before' cursor)")
                where.append("(created_at, id) < (%s, %s)")
                args += [row[0], before]
            query = f"SELECT id, doc FROM {self._jobs} WHERE {' AND '.join(where)}"
            query += " ORDER BY created_at DESC, id DESC"
            if limit is not None:
                query += f" LIMIT {int(limit)}"
            rows = conn.execute(query, args).fetchall()
        return _local.decode_listing(rows)

    def _remove(self, job_id: str, force: bool) -> None:
        script = _Script().add("BEGIN")
        script.add(f"SELECT status FROM {self._jobs} WHERE id = %s FOR UPDATE", job_id)
        with self._session(f"delete {job_id}") as conn:
            rows = script.run(conn)
            if not rows:
                raise JobNotFound(f"no job {job_id}")
            if not force and rows[0][0] not in _TERMINAL:
                status = rows[0][0]
                raise JobActive(f"job {job_id} is {status}; cancel it first or force the delete")
            for table, column in ((self._jobs, "id"), (self._events_t, "job_id")):
                script.add(f"DELETE FROM {table} WHERE {column} = %s", job_id)
            script.add(f"DELETE FROM {self._labels} WHERE job_id = %s", job_id)
            self._notify(script, self._wake(job_id, False)).add("COMMIT").run(conn)
        for name in (f"{job_id}.log", f"{job_id}.log.1"):  # and its rotated part
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._log_dir() / name)

    def _claim(
        self,
        worker: str,
        limit: int,
        queues: list[str] | None,
        kinds: list[Kind] | None,
        now: datetime,
    ) -> list[tuple[JobState, Any]]:
        where = ["status = 'pending'", "worker IS NULL", "(run_after IS NULL OR run_after <= %s)"]
        args: list[Any] = [now]
        if queues:
            where.append("queue = ANY(%s::text[])")
            args.append(list(queues))
        if kinds:
            where.append("kind = ANY(%s::text[])")
            args.append([str(k) for k in kinds])
        query = (
            f"SELECT id, doc, seq FROM {self._jobs} WHERE {' AND '.join(where)}"
            " AND id <> ALL(%s::text[]) ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        seen: list[str] = []
        taken: dict[str, LockHandle] = {}
        claimed: list[tuple[JobState, Any]] = []
        script = _Script().add("BEGIN")
        try:
            with self._session("claim") as conn:
                for _ in range(3):  # more rounds only when rows were skipped
                    want = limit - len(claimed)
                    rows = script.add(query, *args, seen, want).run(conn)
                    seen += [r[0] for r in rows]
                    starts = self._startable(rows, worker, now)
                    taken.update(self._try_locks([s[0].id for s in starts]))
                    starts = [s for s in starts if s[0].id in taken]
                    if starts:
                        wakes = [(self._channel(s.id), s.id) for s, _, _ in starts]
                        items = [(s, c.state, q, c.events) for s, q, c in starts]
                        self._write(script, items, wakes)
                    claimed += [(c.state, taken[s.id]) for s, _, c in starts]
                    if len(rows) < want or len(claimed) >= limit:
                        break
                script.add("COMMIT").run(conn)
        except BaseException:
            for job_id, handle in taken.items():
                self._lock_release(job_id, handle)
            raise
        return claimed

    @staticmethod
    def _startable(
        rows: Iterable[tuple[Any, ...]], worker: str, now: datetime
    ) -> list[tuple[JobState, int, machine.Change]]:
        starts = []
        for job_id, doc, seq in rows:
            try:
                state = codec.decode(job_id, doc)
            except CorruptJob as exc:
                _local.log.warning("not claiming a corrupt job: %s", exc)
                continue
            change = machine.start(state, worker, now)
            if change is not None:
                starts.append((state, seq, change))
        return starts

    def _events(self, job_id: str, after: int, limit: int | None) -> list[ProgressEvent]:
        query = f"SELECT doc FROM {self._events_t} WHERE job_id = %s AND seq > %s ORDER BY seq"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        with self._session(f"events of {job_id}") as conn:
            rows = conn.execute(query, (job_id, after)).fetchall()
        try:
            return [ProgressEvent.from_dict(json.loads(doc)) for (doc,) in rows]
        except (ValueError, CorruptJob) as exc:
            raise CorruptJob(f"job {job_id} has a corrupt event: {exc}") from exc

    def _pulse(self, job_id: str, claimable: bool = False) -> None:
        if getattr(self._tls, "inserted", None) == job_id:
            self._tls.inserted = None  # _insert already notified, in its own transaction
            return
        with self._session(f"notify {job_id}") as conn:
            self._notify(_Script(), self._wake(job_id, claimable)).run(conn)

    # ------------------------------------------------------------------ worker locks
    def _lock_conn(self) -> Conn:
        """This process's lock connection (call with ``_lock_mutex`` held)."""
        locks = self._locks
        if locks.conn is not None and _pg.socket_ok(locks.conn):
            return locks.conn
        if locks.conn is not None:
            with contextlib.suppress(psycopg.Error):
                locks.conn.close()
        probe = lock_key(self.schema, f"\0probe/{os.getpid()}/{time.time()}")
        conn, backend = _pg.open_lock_connection(self._db, probe, _lock_ids(probe))
        self._locks = _Locks(conn, locks.generation + 1, backend, set())
        return conn

    def _try_locks(self, job_ids: Sequence[str]) -> dict[str, LockHandle]:
        """Take the free worker locks among ``job_ids`` on the lock connection."""
        if self._pid != os.getpid():
            self._forget_after_fork()
        keys: dict[int, str] = {}
        with self._lock_mutex:
            for job_id in job_ids:
                key = lock_key(self.schema, job_id)
                if key not in keys and key not in self._locks.held:
                    keys[key] = job_id  # one attempt per key: a session lock is re-entrant
            if not keys:
                return {}
            conn = self._lock_conn()
            with translated("take worker locks"):
                row = conn.execute(
                    "SELECT array_agg(k) FILTER (WHERE pg_try_advisory_lock(k)), pg_backend_pid()"
                    " FROM unnest(%s::int8[]) AS k",
                    (list(keys),),
                ).fetchone()
            assert row is not None
            got: list[int] = row[0] or []
            if row[1] != self._locks.backend:
                conn.close()  # frees whatever it took, wherever that was
                raise StoreError(
                    f"postgresql store at {self._where}: the lock connection changed server "
                    "sessions (a transaction pooler?); worker locks need a session of their own"
                )
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
                _local.log.warning("lost the lock connection while releasing %s: %s", job_id, exc)
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
                _local.log.warning("lost the lock connection while releasing locks: %s", exc)
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
        """
        classid, objid = _lock_ids(lock_key(self.schema, job_id))
        query = (
            "SELECT coalesce(a.state = 'idle' AND a.wait_event IS NULL, false) FROM pg_locks l"
            " LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.classid = %s::int8::oid AND l.objid = %s::int8::oid AND l.objsubid = 1"
            " AND l.granted"
        )
        with self._session(f"probe the worker lock of {job_id}") as conn:
            for _ in range(25):
                row = conn.execute(query, (classid, objid)).fetchone()
                if row is None:
                    return False
                if not row[0]:
                    return True
                time.sleep(0.002)
                conn.execute("SELECT pg_stat_clear_snapshot()")  # a fresh pg_stat_activity
        return True

    # ------------------------------------------------------------------ notification, logs
    def listen(self, job_ids: list[str] | None = None, queue: bool = False) -> PgListener:
        if job_ids is None:
            channels = {f"{self.schema}_j{i}" for i in range(SHARDS)} | {self._queue_channel}
        else:
            channels = {self._channel(j) for j in job_ids}
            if queue:
                channels.add(self._queue_channel)
        jobs = None if job_ids is None else set(job_ids)
        return PgListener(self._db, sorted(channels), jobs, self._queue_channel)

    def _log_dir(self) -> Path:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self._where)
        return Path(paths.state_dir()) / "postgresql" / name / "logs"

    def log_path(self, job_id: str) -> Path:
        """The job's log on this machine (logs are per machine: the worker's host has it)."""
        folder = self._log_dir()
        for level in (folder.parent.parent, folder.parent, folder):  # all private, not just logs
            _local.make_private_dir(level)
        return folder / f"{job_id}.log"
