"""The SQLite adapter: the zero-setup default, one machine by nature.

What is SQLite's own here (the statements and the verbs are :mod:`outlast.store.sql`'s):

- WAL mode, one transaction per transition, ``BEGIN IMMEDIATE`` for every read-modify-write,
  so two writers serialise on SQLite's own lock, retried from 50 µs up (SQLite's busy handler
  would sleep whole milliseconds). ``synchronous=NORMAL``: a committed transition survives any
  process crash; only a power loss can take back the last moments.
- Connections per thread: one to read (it waits out a rare WAL-recovery lock) and one to
  write; ``close()`` closes every thread's.
- A claim first looks for a due job without the write lock, so idle pools never contend.
- A process reuses the state it last wrote or read for a job whose stored bytes are exactly
  those (states are immutable; the pool reads back right after it writes).
- Worker locks are flock files in ``<db>.d/locks``; waiters are woken by pulse files in
  ``<db>.d/pulse`` (see :mod:`outlast.store.notify`), written after the commit.

Indexes: ``jobs_due (queue, priority DESC, COALESCE(run_after, created_at), id)`` of the
claimable jobs a pool runs that have no concurrency key, for claims (and ``jobs_due_keyed``
of those with a key, ``jobs_due_bykey`` of those again key by key, ``jobs_due_commands`` of
the claimable command jobs), ``jobs_created`` and ``jobs_status_created`` for listings,
``jobs_name`` for the name search, ``jobs_live`` (the jobs a worker holds) for the
maintainer, ``labels_kv`` (``key, value, created_at, job_id``) for label filters,
``jobs_finished`` and ``jobs_expires`` for retention, ``schedules_next`` for the schedules
due. ``PRAGMA user_version`` is the schema version.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sqlite3
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from outlast import paths
from outlast.model import TERMINAL, JobState, Kind
from outlast.store import _counts, _local
from outlast.store.common import disk_full, make_private_dir, translated
from outlast.store.journal import Journal
from outlast.store.sql import (
    LIVE,
    Dialect,
    Row,
    SqlStore,
    StateCache,
    Write,
    due_indexes,
    fill_name_keys,
    flow_columns,
    keyed_indexes,
    labels_by_time,
    name_index,
    parked_index,
    search_columns,
    tables,
    time_tables,
    timed_indexes,
    worker_table,
)

BUSY_TIMEOUT = 60.0  # seconds a writer waits for SQLite's write lock before giving up
#: Commits of this process between two checkpoints on its checkpoint thread (see _Checkpointer).
CHECKPOINT_EVERY = 100
#: WAL pages after which a writer checkpoints in its own commit (SQLite's default is 1,000):
#: the safety net when the checkpoint thread falls behind, and what ends a WAL that the thread
#: copied while writers went on (the writer's checkpoint then has little left to copy, and the
#: next write starts the WAL over).
WAL_AUTOCHECKPOINT = 4000
#: Rows written by one statement over many rows that count as one commit toward
#: :data:`CHECKPOINT_EVERY`: a transition writes a handful of WAL pages (its row, its index
#: entries, its event), about what ten new rows of a bulk insert write. Without this weight a
#: ``submit_many`` (1,000 rows a commit) never woke the checkpoint thread, and its writer
#: copied 16 MB of WAL in its own commit twice per 20,000 jobs (~5 µs a job; BENCHMARKS.md,
#: issue #18, the session of 2026-12-04).
ROWS_PER_COMMIT = 10

_FINISHED = frozenset(str(s) for s in TERMINAL)

DIALECT = Dialect(
    name="sqlite",
    param="?",
    jobs="jobs",
    events="events",
    labels="labels",
    schedules="schedules",
    limits="limits",
    text="TEXT",
    blob="BLOB",
    integer="INTEGER",
    time_type="TEXT",
    without_rowid=" WITHOUT ROWID",
)

#: A Python step of a migration: it gets the migration's transaction.
Step = Callable[["_Tx"], None]
_DOC = "json_extract(CAST(doc AS TEXT), '$.{}')"


def _fill_name_keys(tx: _Tx) -> None:
    fill_name_keys(DIALECT, _DOC.format("name"), tx.read, tx.write_many)


def _add_label_times(tx: _Tx) -> None:
    """``labels.created_at`` (:func:`~outlast.store.sql.labels_by_time`), unless a run of
    the migrations before added it (SQLite has no ``ADD COLUMN IF NOT EXISTS``)."""
    if not any(row[1] == "created_at" for row in tx.read("PRAGMA table_info(labels)")):
        tx.write(f"ALTER TABLE labels ADD COLUMN created_at {DIALECT.time_type}")


#: Each schema version's statements (and Python steps); a store is brought to the last one
#: when opened.
MIGRATIONS: tuple[tuple[str | Step, ...], ...] = (
    (
        *tables(DIALECT),
        "CREATE INDEX IF NOT EXISTS jobs_claim ON jobs (status, queue, created_at, id)",
        "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at, id)",
        "CREATE INDEX IF NOT EXISTS jobs_status_created ON jobs (status, created_at, id)",
        "CREATE INDEX IF NOT EXISTS labels_kv ON labels (key, value)",
    ),
    (f"CREATE INDEX IF NOT EXISTS jobs_live ON jobs (worker) WHERE {LIVE}",),
    tuple(time_tables(DIALECT, _DOC.format("finished_at"))),
    (*flow_columns(DIALECT), "DROP INDEX IF EXISTS jobs_claim"),
    tuple(worker_table(DIALECT)),
    (
        *search_columns(DIALECT, _DOC.format("started_at")),
        _fill_name_keys,
        name_index(DIALECT),
        # the timeline reads finished jobs from the index alone (written once, as they end)
        "DROP INDEX IF EXISTS jobs_finished",
        "CREATE INDEX jobs_finished ON jobs (finished_at, status, created_at, started_at)"
        " WHERE finished_at IS NOT NULL",
    ),
    # jobs counted by queue, status and kind as they change (Store.stats); the jobs that
    # finished in a window counted by kind and outcome from the index alone
    (
        *_counts.sqlite_statements(),
        "DROP INDEX IF EXISTS jobs_finished",
        "CREATE INDEX jobs_finished ON jobs (finished_at, status, created_at, started_at, kind)"
        " WHERE finished_at IS NOT NULL",
    ),
    # the claimable jobs split by who starts them: a pool's claim read past every command
    # job of its queue that waits (for a group's slot, for its time) to find its own kinds
    tuple(due_indexes(DIALECT, "jobs_due")),
    # the jobs parked for a slot of their key, per key in claim order: a group's hand-off
    # read every pending job and sorted a key's (8 ms with 10,000 parked)
    (parked_index(DIALECT),),
    # a pool's jobs of a concurrency key apart from the others, and again key by key: a
    # claim walked every job of a full key in its queue (107 ms with 100,000 waiting)
    tuple(keyed_indexes(DIALECT, "jobs_due")),
    # the command and spawned jobs that wait for their time with no process, in time order,
    # for the store's timer (outlast.run.timer)
    tuple(timed_indexes(DIALECT)),
    # a listing of a label read every job with the label and sorted them (137 ms a page
    # with 50,000): labels_kv now holds each job's created_at, in the listing's order
    (_add_label_times, *labels_by_time(DIALECT, "labels_kv")),
)
SCHEMA_VERSION = len(MIGRATIONS)


def _translated(what: str, path: Path | None = None) -> contextlib.AbstractContextManager[None]:
    return translated("sqlite store", what, (sqlite3.Error,), lambda exc: _hint(exc, path))


def _hint(exc: BaseException, path: Path | None) -> str | None:
    """What to do about SQLite's least telling errors."""
    text = str(exc)
    if path is not None and (
        "disk I/O error" in text or "disk is full" in text or getattr(exc, "errno", 0) == 28
    ):
        if disk_full(path.parent):
            return f"no space left on the disk holding {path}: free some, then try again"
        if "disk I/O error" in text:
            return (
                f"if {path.name}-wal or {path.name}-shm was removed or replaced while the "
                "store was in use, stop every process using it and open it again; else "
                "check the disk"
            )
    return None


class _Tx:
    """A transaction on a writing connection: statements run at once; wake-ups are pulsed
    after the commit."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.wakes: dict[str, bool] = {}
        self.interrupts: list[str] = []
        self.pools = False
        self.rows = 0  # written by statements over many rows: how much WAL the commit writes

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(sql, params).fetchall()

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, params)

    def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)
        self.rows += len(rows)

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        marks = ", ".join("?" * len(columns))
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
        self.conn.executemany(sql, rows)
        self.rows += len(rows)

    def wake(self, job_id: str, claimable: bool, interrupt: bool = False) -> None:
        self.wakes[job_id] = self.wakes.get(job_id, False) or claimable
        if interrupt:
            self.interrupts.append(job_id)

    def wake_pools(self, job_id: str) -> None:
        self.pools = True

    def relax(self) -> None:
        pass  # synchronous=NORMAL already: a WAL commit is durable against process crashes


#: Held by a checkpoint thread while it is inside SQLite, and by a thread that forks (see
#: ``os.register_at_fork`` below): a child forked while a checkpoint ran would inherit SQLite's
#: global mutexes held by a thread it does not have, and hang at its first connection.
_FORK_GUARD = threading.Lock()


def _after_fork_in_child() -> None:
    global _FORK_GUARD
    _FORK_GUARD = threading.Lock()


os.register_at_fork(
    before=lambda: _FORK_GUARD.acquire(),
    after_in_parent=lambda: _FORK_GUARD.release(),
    after_in_child=_after_fork_in_child,
)


class _Checkpointer:
    """Copies the WAL into the database file on a thread of its own, so that the process that
    writes does not (BENCHMARKS.md, issue #18: SQLite's automatic checkpoint, run in the
    committing thread, was ~30% of a one-at-a-time ``submit``).

    Every :data:`CHECKPOINT_EVERY` commits of this process (a commit of many rows weighs more,
    see :data:`ROWS_PER_COMMIT`) it wakes a daemon thread, started then (a short-lived
    process, e.g. one CLI call, starts it only for a bulk insert), that runs ``PRAGMA
    wal_checkpoint(PASSIVE)`` on a connection of its own: a passive checkpoint waits for no
    reader or writer and takes no lock a writer needs, and SQLite lets one checkpoint run at
    a time (a writer's own, :data:`WAL_AUTOCHECKPOINT`, is skipped meanwhile, and vice versa).
    Durability is unchanged: a commit is in the WAL before the checkpoint copies it. After a
    fork the child starts its own thread when it needs one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.commits = 0  # since the last wake-up; a lost count between threads is harmless
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None  # the one running, in process _pid
        self._pid = os.getpid()
        self._starting = threading.Lock()

    def committed(self, weight: int = 1) -> None:
        """Count a commit (``weight``: as many commits as the WAL it wrote, see
        :data:`ROWS_PER_COMMIT`); every :data:`CHECKPOINT_EVERY`, wake the thread."""
        self.commits += weight
        if self.commits < CHECKPOINT_EVERY:
            return
        self.commits = 0
        if self._pid != os.getpid():  # forked: the parent's thread and lock are not ours
            self._starting, self._thread, self._pid = threading.Lock(), None, os.getpid()
        if self._thread is None:
            with self._starting:  # one thread, however many threads commit
                if self._thread is None:
                    self._wake = threading.Event()
                    self._thread = threading.Thread(
                        target=self._run, args=(self._wake,), name="outlast-checkpoint", daemon=True
                    )
                    self._thread.start()
        self._wake.set()

    def _run(self, wake: threading.Event) -> None:
        conn = None
        try:
            while True:
                wake.wait()
                wake.clear()
                if self._thread is not threading.current_thread():
                    return  # closed
                # busy: another checkpoint runs (a writer's, another process's): next time;
                # failing to connect: the writers' own checkpoints go on
                with _FORK_GUARD, contextlib.suppress(sqlite3.Error):
                    if conn is None:
                        conn = sqlite3.connect(  # a fork waits at most this busy wait
                            self.path, timeout=0.1, isolation_level=None, check_same_thread=False
                        )
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            if conn is not None:
                with _FORK_GUARD:
                    conn.close()

    def close(self) -> None:
        """Stop the thread (the store's next commits start another if it is used again)."""
        thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            self._wake.set()
            thread.join(5.0)


def _drop(conns: list[sqlite3.Connection], lock: threading.Lock, conn: sqlite3.Connection) -> None:
    with lock:
        if conn in conns:
            conns.remove(conn)
    conn.close()


class SQLiteStore(_local.LocalStore, SqlStore):
    dialect = DIALECT

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).absolute()
        self.url = f"sqlite://{self.path}"
        make_private_dir(self.path.parent, warn=False)  # the user's folder, not ours
        self.parts = _local.LocalParts(Path(paths.sqlite_side_dir(str(self.path))))
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []  # every thread's, for close()
        self._conns_lock = threading.Lock()
        self._states = StateCache()
        self._checkpoints = _Checkpointer(self.path)
        with _translated("open", self.path):
            if not self.path.exists():
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self._migrate()

    def _migrate(self) -> None:
        """Bring the schema to the last version, statement by statement inside our own write
        transaction (``executescript`` would commit it and run the rest without any wait for
        the write lock)."""
        conn = self._writer()
        if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        with self._tx("create the schema") as tx:
            version = tx.read("PRAGMA user_version")[0][0]
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    if callable(statement):
                        statement(tx)
                    else:
                        tx.write(statement)
            if version < SCHEMA_VERSION:
                tx.write(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------ connections
    def _connect(self, busy_ms: int) -> sqlite3.Connection:
        # the set-up waits for a lock (a new connection may find the WAL being recovered or
        # removed by another's close: "database is locked" reached an HTTP client once);
        # then the connection's own busy wait
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA busy_timeout={busy_ms}")
        with self._conns_lock:
            self._conns.append(conn)
        # a server's worker threads come and go: close their connections with them
        weakref.finalize(threading.current_thread(), _drop, self._conns, self._conns_lock, conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This thread's reading connection (waits up to 60 s on a rare WAL-recovery lock)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            self._local.writer = None
            conn = self._local.conn = self._connect(60000)
            self._local.pid = os.getpid()
        return conn

    def _writer(self) -> sqlite3.Connection:
        """This thread's writing connection: no busy handler, see :meth:`_begin`; it leaves
        the WAL's checkpoints to the checkpoint thread up to :data:`WAL_AUTOCHECKPOINT`."""
        self._conn()
        conn: sqlite3.Connection | None = getattr(self._local, "writer", None)
        if conn is None:
            conn = self._local.writer = self._connect(0)
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
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
    def _tx(self, what: str) -> Iterator[_Tx]:
        conn = self._writer()
        tx = _Tx(conn)
        with _translated(what, self.path):
            self._begin(conn)
            try:
                yield tx
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        self._checkpoints.committed(1 + tx.rows // ROWS_PER_COMMIT)
        if tx.wakes or tx.pools:
            self.parts.pulse_many(tx.wakes, tx.interrupts, pools=tx.pools)

    def _query(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with _translated(what, self.path):
            return self._conn().execute(sql, params).fetchall()

    def _job_counts(self) -> list[Row]:
        return self._query("count jobs", _counts.SQLITE_READ)

    def _count(self, tx: Any, changes: Counter[tuple[str, str, str]]) -> None:
        """The finished jobs only (see :mod:`outlast.store._counts`)."""
        rows = [(*key, n) for key, n in changes.items() if n and key[1] in _FINISHED]
        if rows:
            tx.write_many(_counts.SQLITE_ADD, rows)

    def close(self) -> None:
        """Close every connection of this store (all threads'), and its pulse files."""
        self._checkpoints.close()
        with self._conns_lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            conn.close()
        self._local = threading.local()
        self.parts.close()

    def change_watch(self) -> _local.StatWatch:
        """Every commit writes the database's WAL file (and a checkpoint the database file):
        their sizes and times say when to look again, without a query."""
        return _local.StatWatch([self.path, Path(f"{self.path}-wal")])

    def _forget(self, job_id: str) -> None:
        super()._forget(job_id)
        self.parts.forget(job_id)

    # ------------------------------------------------------------------ claims
    def _claim(
        self,
        worker: str,
        limit: int,
        queues: list[str] | None,
        kinds: list[Kind] | None,
        now: datetime,
        journal: Journal,
    ) -> list[tuple[JobState, Any]]:
        # nothing due: no write lock taken (idle pools stay cheap)
        if not self._due_rows(functools.partial(self._query, "claim"), queues, kinds, now, 1):
            return []
        with self._tx("claim") as tx:
            rows = self._due_rows(tx.read, queues, kinds, now, limit * 2)
            starts: list[Write] = self._starts(tx, rows, worker, now, limit)
            if starts:
                journal.claimed([(new.id, new.attempts) for _, new, _, _ in starts])
                self._write(tx, starts)
                for _, new, _, _ in starts:
                    tx.wake(new.id, False)
        # no per-job lock: the claimer's liveness lock covers the job
        return [(new, None) for _, new, _, _ in starts]
