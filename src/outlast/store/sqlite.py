"""The SQLite adapter: the zero-setup default, one machine by nature.

WAL mode, one transaction per transition, ``BEGIN IMMEDIATE`` for every read-modify-write so
two writers serialise on SQLite's own lock. The job document is stored whole as JSON beside the
columns that are queried (status, queue, kind, times), which carry the indexes: ``get`` is a
primary-key lookup and ``claim`` walks the ``(status, queue, created_at)`` index, so neither
slows with the number of jobs. ``synchronous=NORMAL``: a committed transition survives any
process crash; only a power loss can take back the last moments.

Worker locks are flock files in ``<db>.d/locks``; waiters are woken by pulse files in
``<db>.d/pulse`` (see :mod:`outlast.store.notify`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from outlast import codec, machine, paths
from outlast.errors import CorruptJob, JobActive, JobNotFound, StoreError
from outlast.model import JobState, Kind, ProgressEvent, Status, format_time, utcnow
from outlast.store import _local, notify
from outlast.store.base import Transition

SCHEMA_VERSION = 1
DOC_CACHE = 4096  # parsed documents kept per store object, reused only if byte-identical
BUSY_TIMEOUT = 60.0  # seconds a writer waits for SQLite's write lock before giving up

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    queue TEXT NOT NULL,
    worker TEXT,
    run_after TEXT,
    created_at TEXT NOT NULL,
    seq INTEGER NOT NULL DEFAULT 0,
    doc BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (status, queue, created_at, id);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at, id);
CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created_at, id);
CREATE TABLE IF NOT EXISTS labels (
    job_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS labels_kv ON labels (key, value);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    doc BLOB NOT NULL,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
PRAGMA user_version = 1;
"""


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn sqlite3 and OS failures into :class:`StoreError` at the boundary."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreError(f"sqlite store: {what}: {exc}") from exc
    except OSError as exc:
        raise StoreError(f"sqlite store: {what}: {exc}") from exc


class SQLiteStore(_local.LocalStore):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self.url = f"sqlite://{self.path}"
        _local.make_private_dir(self.path.parent)
        self.parts = _local.LocalParts(Path(paths.sqlite_side_dir(str(self.path))))
        self._local = threading.local()
        self._docs: dict[str, tuple[bytes, JobState]] = {}
        self._docs_lock = threading.Lock()
        with _translated("open"):
            if not self.path.exists():
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            conn = self._writer()
            if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                # statement by statement inside our own write transaction: executescript
                # would commit it and run the rest without any wait for the write lock
                with self._write("create the schema") as tx:
                    if tx.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                tx.execute(statement)

    # ------------------------------------------------------------------ connections
    def _connect(self, busy_ms: int) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's reading connection (waits up to 60 s on a rare WAL-recovery lock)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            self._local.writer = None
            conn = self._local.conn = self._connect(60000)
            self._local.pid = os.getpid()
            # a server's worker threads come and go: close their connections with them
            weakref.finalize(threading.current_thread(), conn.close)
        return conn

    def _writer(self) -> sqlite3.Connection:
        """This thread's writing connection: no busy handler, see :meth:`_begin`."""
        self._conn()
        conn: sqlite3.Connection | None = getattr(self._local, "writer", None)
        if conn is None:
            conn = self._local.writer = self._connect(0)
            weakref.finalize(threading.current_thread(), conn.close)
        return conn

    @staticmethod
    def _begin(conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE``, retried with short sleeps while another writer holds the lock.

        SQLite's own busy handler sleeps 1, 2, 5, 10… milliseconds between tries, which turns
        every brief contention between a pool and its job processes into milliseconds of
        idle time; retrying from 50 microseconds up keeps the lock busy instead.
        """
        delay, deadline = 0.00005, time.monotonic() + BUSY_TIMEOUT
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.005)

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._writer()
        with _translated(what):
            self._begin(conn)
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        for name in ("conn", "writer"):
            conn = getattr(self._local, name, None)
            if conn is not None:
                conn.close()
                setattr(self._local, name, None)
        self.parts.close()

    # ------------------------------------------------------------------ rows
    @staticmethod
    def _row(state: JobState) -> tuple[Any, ...]:
        return (
            str(state.status),
            str(state.kind),
            state.queue,
            state.worker,
            format_time(state.run_after),
            format_time(state.created_at),
            codec.encode(state),
        )

    def _decode(self, job_id: str, raw: bytes) -> JobState:
        """Parse a stored document, or reuse the state this process last wrote or read for the
        job if the stored bytes are exactly that (states are immutable, so sharing is safe;
        a transition is read back right after it is written, e.g. claim then succeed)."""
        hit = self._docs.get(job_id)
        if hit is not None and hit[0] == raw:
            return hit[1]
        state = codec.decode(job_id, raw)
        self._remember(state, raw)
        return state

    def _remember(self, state: JobState, doc: bytes) -> None:
        with self._docs_lock:
            self._docs[state.id] = (doc, state)
            if len(self._docs) > DOC_CACHE:
                self._docs.pop(next(iter(self._docs)))

    def _insert(self, state: JobState) -> None:
        row = self._row(state)
        with self._write("create") as conn:
            conn.execute(
                "INSERT INTO jobs (status, kind, queue, worker, run_after, created_at, doc, id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, state.id),
            )
            if state.labels:
                conn.executemany(
                    "INSERT INTO labels (job_id, key, value) VALUES (?, ?, ?)",
                    [(state.id, k, v) for k, v in state.labels.items()],
                )
        self._remember(state, row[-1])

    def _read_with(self, conn: sqlite3.Connection, job_id: str) -> tuple[JobState, int]:
        row = conn.execute("SELECT doc, seq FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return self._decode(job_id, row[0]), row[1]

    def _read(self, job_id: str) -> JobState:
        with _translated(f"read {job_id}"):
            return self._read_with(self._conn(), job_id)[0]

    def _read_many(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, tuple[Any, int]]:
        """``id -> (stored document, seq)`` of those of ``ids`` that exist, in few queries."""
        found: dict[str, tuple[Any, int]] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            sql = f"SELECT id, doc, seq FROM jobs WHERE id IN ({','.join('?' * len(chunk))})"
            for job_id, doc, seq in conn.execute(sql, chunk):
                found[job_id] = (doc, seq)
        return found

    def _update(
        self, conn: sqlite3.Connection, old: JobState, new: JobState, seq: int, events: list[Any]
    ) -> list[ProgressEvent]:
        return self._update_many(conn, [(old, new, seq, events)])[0]

    def _update_many(
        self, conn: sqlite3.Connection, changes: list[tuple[JobState, JobState, int, list[Any]]]
    ) -> list[list[ProgressEvent]]:
        """Write several transitions (old state, new state, stored seq, new events) with one
        statement for all their events and one for all their rows; returns the stored events."""
        now = utcnow()
        stored_all: list[list[ProgressEvent]] = []
        event_rows: list[tuple[str, int, bytes]] = []
        job_rows: list[tuple[Any, ...]] = []
        full: list[tuple[Any, ...]] = []
        for old, new, seq, events in changes:
            stored: list[ProgressEvent] = []
            for event in events:
                seq += 1
                stored.append(
                    ProgressEvent(new.id, seq, now, event.step, event.status, event.message)
                )
            event_rows += [(e.job_id, e.seq, codec.encode_event(e)) for e in stored]
            doc = codec.encode(new)
            if (new.queue, new.kind, new.created_at) == (old.queue, old.kind, old.created_at):
                # the columns that never change are left out: their indexes stay untouched
                job_rows.append(
                    (str(new.status), new.worker, format_time(new.run_after), doc, seq, new.id)
                )
            else:
                full.append((*self._row(new), seq, new.id))
            self._remember(new, doc)  # checked against the stored bytes when read back
            if new.labels != old.labels:
                conn.execute("DELETE FROM labels WHERE job_id = ?", (new.id,))
                conn.executemany(
                    "INSERT INTO labels (job_id, key, value) VALUES (?, ?, ?)",
                    [(new.id, k, v) for k, v in new.labels.items()],
                )
            stored_all.append(stored)
        if event_rows:
            conn.executemany("INSERT INTO events (job_id, seq, doc) VALUES (?, ?, ?)", event_rows)
        if job_rows:
            conn.executemany(
                "UPDATE jobs SET status = ?, worker = ?, run_after = ?, doc = ?, seq = ?"
                " WHERE id = ?",
                job_rows,
            )
        if full:
            conn.executemany(
                "UPDATE jobs SET status = ?, kind = ?, queue = ?, worker = ?, run_after = ?,"
                " created_at = ?, doc = ?, seq = ? WHERE id = ?",
                full,
            )
        return stored_all

    def _modify(self, job_id: str, fn: Transition) -> tuple[JobState, list[ProgressEvent]]:
        with self._write(f"update {job_id}") as conn:
            state, seq = self._read_with(conn, job_id)
            change = fn(state)
            if change is None:
                return state, []
            events = self._update(conn, state, change.state, seq, list(change.events))
        self.parts.pulse(job_id, change.claimable)
        return change.state, events

    def _modify_many(
        self, items: list[tuple[str, Transition]]
    ) -> list[tuple[JobState, list[ProgressEvent]]]:
        """All in one transaction, with one read of all the rows and one write of all the
        changes (more when a job comes back in ``items``: its earlier changes are written and
        read back first); a job that cannot be read is skipped (logged), not fatal."""
        results: list[tuple[JobState, list[ProgressEvent]]] = []
        pulses: list[tuple[str, bool]] = []
        with self._write("update many") as conn:
            rows = self._read_many(conn, [job_id for job_id, _ in items])
            changes: list[tuple[JobState, JobState, int, list[Any]]] = []
            places: list[int] = []  # where each change's result sits in ``results``
            pending: set[str] = set()  # jobs with a change not written yet
            for job_id, fn in items:
                if job_id in pending:  # the same job again: write what is pending first,
                    self._write_changes(conn, changes, places, results)
                    rows.update(self._read_many(conn, list(pending)))  # and read it back
                    changes, places, pending = [], [], set()
                try:
                    if job_id not in rows:
                        raise JobNotFound(f"no job {job_id}")
                    doc, seq = rows[job_id]
                    state = self._decode(job_id, doc)
                except (JobNotFound, CorruptJob) as exc:
                    _local.log.warning("not updating job %s: %s", job_id, exc)
                    continue
                change = fn(state)
                if change is None:
                    results.append((state, []))
                    continue
                changes.append((state, change.state, seq, list(change.events)))
                pending.add(job_id)
                places.append(len(results))
                results.append((change.state, []))
                pulses.append((job_id, change.claimable))
            self._write_changes(conn, changes, places, results)
        self._pulse_many(pulses)
        return results

    def _write_changes(
        self,
        conn: sqlite3.Connection,
        changes: list[tuple[JobState, JobState, int, list[Any]]],
        places: list[int],
        results: list[tuple[JobState, list[ProgressEvent]]],
    ) -> None:
        if changes:
            for place, events in zip(places, self._update_many(conn, changes), strict=True):
                results[place] = (results[place][0], events)

    def _pulse_many(self, pulses: list[tuple[str, bool]]) -> None:
        """Wake the waiters of several jobs: each channel once."""
        channels = {notify.job_channel(job_id) for job_id, _ in pulses}
        if any(claimable for _, claimable in pulses):
            channels.add(notify.QUEUE)
        if channels:
            self.parts.pulses.pulse(sorted(channels))

    def _select(
        self, status: Status | None, labels: dict[str, str], limit: int | None, before: str | None
    ) -> list[JobState]:
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(str(status))
        for key, value in labels.items():
            where.append("id IN (SELECT job_id FROM labels WHERE key = ? AND value = ?)")
            args += [key, value]
        with _translated("list"):
            conn = self._conn()
            if before is not None:
                row = conn.execute("SELECT created_at FROM jobs WHERE id = ?", (before,)).fetchone()
                if row is None:
                    raise JobNotFound(f"no job {before} (the 'before' cursor)")
                where.append("(created_at, id) < (?, ?)")
                args += [row[0], before]
            sql = "SELECT id, doc FROM jobs"
            if where:
                sql += " WHERE " + " AND ".join(where)
            sql += " ORDER BY created_at DESC, id DESC"
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            rows = conn.execute(sql, args).fetchall()
        return _local.decode_listing(rows)

    def _held_by(self, worker: str) -> list[JobState]:
        sql = "SELECT id, doc FROM jobs WHERE worker = ? AND status IN ('running', 'pending')"
        with _translated("list"):
            return _local.decode_listing(self._conn().execute(sql, (worker,)).fetchall())

    def _remove(self, job_id: str, force: bool) -> None:
        with self._write(f"delete {job_id}") as conn:
            row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(f"no job {job_id}")
            if not force and row[0] not in {s.value for s in Status if s.terminal}:
                raise JobActive(f"job {job_id} is {row[0]}; cancel it first or force the delete")
            for table, column in (("jobs", "id"), ("events", "job_id"), ("labels", "job_id")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
        self.parts.forget(job_id)
        self.parts.pulse(job_id, False)

    def _claim(
        self,
        worker: str,
        limit: int,
        queues: list[str] | None,
        kinds: list[Kind] | None,
        now: datetime,
    ) -> list[tuple[JobState, Any]]:
        where = ["status = 'pending'", "worker IS NULL", "(run_after IS NULL OR run_after <= ?)"]
        args: list[Any] = [format_time(now)]
        if queues:
            where.append(f"queue IN ({','.join('?' * len(queues))})")
            args += queues
        if kinds:
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += [str(k) for k in kinds]
        due = f"FROM jobs WHERE {' AND '.join(where)} ORDER BY created_at, id LIMIT ?"
        with _translated("claim"):  # nothing due: no write lock taken (idle pools stay cheap)
            if self._conn().execute(f"SELECT id {due}", (*args, 1)).fetchone() is None:
                return []
        sql = f"SELECT id, doc, seq {due}"
        changes: list[tuple[JobState, JobState, int, list[Any]]] = []
        with self._write("claim") as conn:
            for job_id, doc, seq in conn.execute(sql, (*args, limit * 2)).fetchall():
                if len(changes) >= limit:
                    break
                try:
                    state = self._decode(job_id, doc)
                    change = machine.start(state, worker, now)
                except CorruptJob as exc:
                    _local.log.warning("not claiming a corrupt job: %s", exc)
                    change = None
                if change is not None:
                    changes.append((state, change.state, seq, list(change.events)))
            if changes:
                self._update_many(conn, changes)
        self._pulse_many([(new.id, False) for _, new, _, _ in changes])
        # no per-job lock: the claimer's liveness lock covers the job
        return [(new, None) for _, new, _, _ in changes]

    def _events(self, job_id: str, after: int, limit: int | None) -> list[ProgressEvent]:
        sql = "SELECT doc FROM events WHERE job_id = ? AND seq > ? ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with _translated(f"events of {job_id}"):
            rows = self._conn().execute(sql, (job_id, after)).fetchall()
        try:
            return [ProgressEvent.from_dict(json.loads(doc)) for (doc,) in rows]
        except (ValueError, CorruptJob) as exc:
            raise CorruptJob(f"job {job_id} has a corrupt event: {exc}") from exc
