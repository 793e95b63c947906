"""The PostgreSQL adapter: workers on many machines sharing one database.

URL: ``postgresql://[user@]host[:port]/dbname[?schema=NAME&…]``. ``schema`` (default
``outlast``; lower-case letters, digits and ``_``) is the PostgreSQL schema that holds the
store, so one database can hold several stores and test runs never collide; every other
parameter is libpq's (``sslmode``, ``connect_timeout``…). Prefer ``PGPASSWORD`` or
``~/.pgpass`` to a password in the URL: the URL is handed to job processes.

What is PostgreSQL's own here (the tables, statements and verbs are :mod:`outlast.store.sql`'s;
in SQL read a document with ``convert_from(doc, 'UTF8')::jsonb``):

**Writes.** A transition is one transaction: ``SELECT … FOR UPDATE`` of the job's row, the new
document, its events (``seq`` continuing from ``jobs.seq``) and ``pg_notify`` (delivered on
commit), in two round trips (pipeline mode). Claims take due pending jobs oldest first with
``FOR UPDATE SKIP LOCKED``. Channels: ``<schema>_j0``…``_j15`` (a hash shard of the job id),
``<schema>_queue`` (a job became claimable) and ``<schema>_interrupt`` (a running job was
canceled or deleted: the one job change pools listen to); the payload is the job id, so a
listener wakes only for its own jobs. Versioned migrations run on open, each in one
transaction under ``pg_advisory_xact_lock``, so any number of processes may open a fresh
database at once.

**Worker locks** are session advisory locks on a dedicated connection (see
:mod:`outlast.store._pglocks`).

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

import binascii
import contextlib
import os
import re
import threading
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import psycopg

from outlast import codec, machine, paths
from outlast.errors import InvalidInput, OutlastError, StoreError
from outlast.ids import check_id
from outlast.machine import Outcome
from outlast.model import TERMINAL, JobState, Kind
from outlast.store import _counts, _pg, _pglog, _pgwire
from outlast.store import _pgguard as guard
from outlast.store._pg import Conn
from outlast.store._pglisten import PgListener
from outlast.store._pglocks import (
    HELD_SQL,
    MAINTENANCE_LOCK,
    TIMER_LOCK,
    TRY_LOCK_SQL,
    UNLOCK_SQL,
    AdvisoryLocks,
    PgMaintenance,
    lock_key,
    lock_pair,
)
from outlast.store.base import Applied, Capabilities, ChangeWatch, MaintenanceLock, Transition
from outlast.store.common import decode_listing, log, make_private_dir
from outlast.store.joblog import TAIL_BYTES, LogCursor, LogSink, check_range
from outlast.store.journal import Fate, Journal, Key, line_fate, record_line
from outlast.store.sql import (
    CLAIM_ORDER,
    CLAIMABLE,
    DUE,
    DUE_PARTS,
    DUE_RANGE,
    DUE_TIMES,
    EVENT_INSERT,
    KEYED,
    LABEL_COLUMNS,
    LABEL_INSERT,
    LIVE,
    LIVE_STATUSES,
    ROOM,
    SKEW,
    SLIM_UPDATE,
    Dialect,
    Row,
    SqlStore,
    StateCache,
    Write,
    due_indexes,
    due_parts,
    fill_name_keys,
    flow_columns,
    keyed_indexes,
    label_rows,
    labels_by_time,
    name_index,
    parked_index,
    priority_probe,
    search_columns,
    tables,
    time_tables,
    timed_indexes,
    window,
    worker_table,
)
from outlast.store.sql import (
    insert_sql as _insert,
)
from outlast.store.sql import (
    unique_insert_sql as _unique_insert,
)

SHARDS = 16
#: The first key of the two-key advisory locks of concurrency keys (its own namespace).
_LIMIT_LOCKS = 0x4C494D  # "LIM"
#: The reads one claim makes at most: one per priority it goes down to (the due jobs of its
#: highest ran short), and again when rows it read were taken by another claimer. A claim
#: that stops there returns what it took; the pool's next claim reads on.
_CLAIM_ROUNDS = 8


def dialect(schema: str) -> Dialect:
    s = f'"{schema}"'
    return Dialect(
        name="postgresql",
        param="%s",
        jobs=f"{s}.jobs",
        events=f"{s}.events",
        labels=f"{s}.labels",
        schedules=f"{s}.schedules",
        limits=f"{s}.limits",
        workers=f"{s}.workers",
        text="text",
        blob="bytea",
        integer="integer",
        time_type="timestamptz",
        for_update=" FOR UPDATE",
    )


class Bulk(NamedTuple):
    """A statement's one-statement form (:func:`bulk_statements`): its SQL, and which
    column of a row is the job's id when the statement also takes the rows' ids."""

    sql: str
    id_column: int | None = None

    def params(self, rows: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
        if self.id_column is None:
            return (rows_json(rows),)
        return rows_json(rows), [row[self.id_column] for row in rows]


def bulk_statements(d: Dialect) -> dict[str, Bulk]:
    """The one-statement form of the SQL core's statements that a transaction runs once per
    job (a claim's starts, a batch of outcomes): the rows as one JSON array of arrays
    (:func:`rows_json`), read with ``jsonb_array_elements``. A pool's batch of 16 jobs is
    then 2 statements instead of 32, which spares the pool the client's cost of each
    statement and the server its planning and execution; and one JSON parameter, not an
    array per column, which spares it psycopg's dumping of each array element in Python
    (5x the client's CPU of a batch's update, BENCHMARKS.md issue #18).

    An update of jobs also takes their ids as an array (``_pgguard.BY_IDS``): the planner counts
    100 rows for ``jsonb_array_elements``, and under ~10,000 jobs it then read the whole
    table and hashed it for every batch, where the ids let it use the primary key."""
    ts = "timestamptz"
    slim = (
        f"UPDATE {d.jobs} AS j SET status = r->>0, worker = r->>1,"
        f" run_after = (r->>2)::{ts}, finished_at = (r->>3)::{ts},"
        f" expires_at = (r->>4)::{ts}, started_at = (r->>5)::{ts},"
        " doc = decode(r->>6, 'base64'), seq = (r->>7)::integer"
        f" FROM jsonb_array_elements(%s::jsonb) AS r WHERE j.id = r->>8{guard.BY_IDS}"
    )
    events = (
        f"INSERT INTO {d.events} (job_id, seq, doc)"
        " SELECT r->>0, (r->>1)::integer, decode(r->>2, 'base64')"
        " FROM jsonb_array_elements(%s::jsonb) AS r"
    )
    return {d.sql(SLIM_UPDATE): Bulk(slim, 8), d.sql(EVENT_INSERT): Bulk(events)}


def fusable_writes(schema: str, d: Dialect, bulk: dict[str, Bulk]) -> dict[str, str]:
    """The writes a transaction's commit may join into one statement (see ``_Script.fuse``),
    each with the table it writes: a transition's (the job's row, its events) and a claim's
    journal records. None reads a table another writes."""
    slim, events = d.sql(SLIM_UPDATE), d.sql(EVENT_INSERT)
    return {
        slim: "jobs",
        bulk[slim].sql: "jobs",
        events: "events",
        bulk[events].sql: "events",
        _journal_upsert(schema): "journal",
    }


#: The type of every column a binary ``COPY`` writes (:meth:`_Tx.insert_rows`: the jobs and
#: labels tables), as the migrations make it; a test compares it with the catalog.
_TEXT = ("id", "status", "kind", "queue", "worker", "retry_of", "unique_key", "limit_key")
COPY_TYPES = {
    **dict.fromkeys((*_TEXT, "name_key", "job_id", "key", "value"), "text"),
    **dict.fromkeys(
        ("run_after", "created_at", "started_at", "finished_at", "expires_at"), "timestamptz"
    ),
    **dict.fromkeys(("priority", "limit_slots", "seq"), "int4"),
    "lock_key": "int8",
    "doc": "bytea",
}

#: A document's field in SQL.
_DOC = "convert_from(doc, 'UTF8')::jsonb->>'{}'"


def migrations(schema: str) -> list[list[str | _pg.Migration]]:
    """Each schema version's statements (and Python steps), in order."""
    d = dialect(schema)

    def backfill_lock_keys(conn: Conn) -> None:
        ids = [r[0] for r in conn.execute(f"SELECT id FROM {d.jobs} WHERE lock_key IS NULL")]
        with conn.cursor() as cur:
            cur.executemany(
                f"UPDATE {d.jobs} SET lock_key = %s WHERE id = %s",
                [(lock_key(schema, job_id), job_id) for job_id in ids],
            )

    def fill_names(conn: Conn) -> None:
        def write_many(sql: str, rows: Sequence[Sequence[Any]]) -> None:
            with conn.cursor() as cur:
                cur.executemany(sql, rows)

        fill_name_keys(
            d, _DOC.format("name"), lambda q, p: conn.execute(q, p).fetchall(), write_many
        )

    return [
        [
            *tables(d),
            f"CREATE INDEX jobs_claimable ON {d.jobs} (created_at, id)"
            " WHERE status = 'pending' AND worker IS NULL",
            f"CREATE INDEX jobs_created ON {d.jobs} (created_at, id)",
            f"CREATE INDEX jobs_status_created ON {d.jobs} (status, created_at, id)",
            f"CREATE INDEX labels_kv ON {d.labels} (key, value)",
        ],
        [
            f"ALTER TABLE {d.jobs} ADD COLUMN IF NOT EXISTS lock_key bigint",
            backfill_lock_keys,
            f"CREATE INDEX IF NOT EXISTS jobs_live ON {d.jobs} (worker) WHERE {LIVE}",
        ],
        # the latest attempt journal record of each job (outlast.store.journal)
        [f'CREATE TABLE IF NOT EXISTS "{schema}".journal (id text PRIMARY KEY, line text)'],
        # schedules, and retention (outlast.cron; Store.prune)
        list(time_tables(d, f"({_DOC.format('finished_at')})::timestamptz")),
        # priorities: the claim's order and its index (outlast.store.sql.CLAIM_ORDER)
        [*flow_columns(d), f'DROP INDEX IF EXISTS "{schema}".jobs_claimable'],
        # every job's log, in the database (outlast.store._pglog); the workers' registry
        [*_pglog.table_statements(schema), *worker_table(d)],
        # the job list's name search and the timeline (outlast.store.query, .timeline)
        [
            *search_columns(d, f"({_DOC.format('started_at')})::timestamptz"),
            fill_names,
            name_index(d),
            f'CREATE INDEX IF NOT EXISTS jobs_id_bytes ON {d.jobs} (id COLLATE "C")',
        ],
        # jobs counted by queue, status and kind as they change (Store.stats)
        [*_counts.pg_statements(schema)],
        # the claims of pools of several queues, or of all, in the claim's order: through
        # jobs_due (queue first) the planner sorted every claimable job of those queues for
        # each claim, 11 ms with 5,000 waiting and 510 ms with 100,000 (BENCHMARKS.md,
        # issue #18). A claim leaves the index without writing it (the running row's version
        # is not in it), so only a new job pays for it: SQLite, which would pay at both,
        # reads jobs_due queue by queue instead (sql.SqlStore._due_query)
        [f"CREATE INDEX IF NOT EXISTS jobs_due_all ON {d.jobs} ({CLAIM_ORDER}) WHERE {CLAIMABLE}"],
        # the claimable jobs split by who starts them (sql.DUE_PARTS): a pool's claim read
        # past every command job of its queues that waits (for a group's slot, for its
        # time) to find its own kinds
        [
            *due_indexes(d, f'"{schema}".jobs_due'),
            f'DROP INDEX IF EXISTS "{schema}".jobs_due_all',
            *_all_indexes(d),
        ],
        # the jobs parked for a slot of their key, per key in claim order (sql.PARKED)
        [parked_index(d)],
        # a pool's jobs of a concurrency key apart from the others, and again key by key: a
        # claim walked every job of a full key in its queues (180 ms with 100,000 waiting)
        [
            *keyed_indexes(d, f'"{schema}".jobs_due'),
            f'DROP INDEX IF EXISTS "{schema}".jobs_due_all',
            *_all_indexes(d),
        ],
        # the command and spawned jobs that wait for their time with no process, in time
        # order, for the store's timer (outlast.run.timer; sql.TIMED)
        [*timed_indexes(d)],
        # a listing of a label read every job with the label and sorted them: labels_kv
        # now holds each job's created_at, in the listing's order (outlast.store._sqllist)
        [
            f"ALTER TABLE {d.labels} ADD COLUMN IF NOT EXISTS created_at timestamptz",
            *labels_by_time(d, f'"{schema}".labels_kv'),
        ],
    ]


def _all_indexes(d: Dialect) -> list[str]:
    """The indexes of :data:`~outlast.store.sql.DUE_PARTS` in claim order across queues."""
    return [
        f"CREATE INDEX IF NOT EXISTS {index.replace('jobs_due', 'jobs_due_all')}"
        f" ON {d.jobs} ({CLAIM_ORDER}) WHERE {CLAIMABLE} AND {holds}"
        for index, holds in DUE_PARTS
    ]


def _greatest(values: list[str]) -> str:
    return values[0] if len(values) == 1 else f"GREATEST({', '.join(values)})"


#: Wakes the listeners of channels: a JSON array (:func:`rows_json`) of [channel, payload].
_NOTIFY = "SELECT pg_notify(r->>0, r->>1) FROM jsonb_array_elements(%s::jsonb) AS r"


def rows_json(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as one JSON array of arrays, for ``jsonb_array_elements``: times in ISO 8601
    with their offset (read back with ``::timestamptz``, to the microsecond), bytes in
    base64 (``decode(…, 'base64')``: the exact bytes, whatever the database's encoding)."""
    return orjson.dumps(rows, default=_base64).decode()


def _base64(value: object) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return binascii.b2a_base64(value, newline=False).decode()
    raise TypeError(f"{type(value).__name__} is not a column value")


class _Script:
    """Statements sent in one round trip (pipeline mode)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def add(self, statement: str, *params: Any) -> _Script:
        self.statements.append((statement, params))
        return self

    def fuse(self, writes: dict[str, str], last: str) -> None:
        """Join each run of statements of ``writes`` (each statement's SQL, and the table it
        writes) that write different tables, and the statement ``last`` if it follows them,
        into one statement: the writes as data-modifying ``WITH`` queries, ``last`` (else
        ``SELECT 1``) as its main query. The client's cost is per statement (~150 us of
        psycopg here, BENCHMARKS.md issue #18); a claim's writes are then one, not four.

        Safe for the statements it is given only: each writes a table none of the others in
        its run reads or writes (they share one snapshot, and every one runs to completion
        whether read or not), and none has a ``WITH`` or ``RETURNING`` of its own."""
        fused: list[tuple[str, tuple[Any, ...]]] = []
        run: list[tuple[str, tuple[Any, ...]]] = []
        tables: set[str] = set()

        def close(main: tuple[str, tuple[Any, ...]] | None) -> None:
            if run and (len(run) > 1 or main is not None):
                parts = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(run))
                sql, params = main or ("SELECT 1", ())
                joined = tuple(p for _, each in run for p in each) + params
                fused.append((f"WITH {parts} {sql}", joined))
            else:
                fused.extend(run)
                if main is not None:
                    fused.append(main)
            run.clear()
            tables.clear()

        for statement in self.statements:
            if statement[0] == last:
                close(statement)
                continue
            table = writes.get(statement[0])
            if table is None or table in tables:
                close(None)
            if table is None:
                fused.append(statement)
            else:
                run.append(statement)
                tables.add(table)
        close(None)
        self.statements = fused

    def run(self, conn: Conn, pipe: _pgwire.Pipe | None = None) -> list[Row]:
        """Run and clear the script; returns the rows of its last statement (through
        ``pipe``, libpq directly, when given)."""
        if pipe is not None:
            statements, self.statements = self.statements, []
            return pipe.run(statements)
        with conn.pipeline():
            cursors = [conn.execute(sql, params or None) for sql, params in self.statements]
        self.statements = []
        last = cursors[-1]
        return last.fetchall() if last.description is not None else []


class _Tx:
    """A transaction as (usually) two round trips: ``BEGIN`` with the reads, then the writes,
    the notifications and ``COMMIT``."""

    def __init__(self, conn: Conn, bulk: dict[str, Bulk], pipe: _pgwire.Pipe | None = None) -> None:
        self.conn = conn
        self.pipe = pipe  # the claim's: its statements through libpq directly
        self.bulk = bulk  # bulk_statements()
        self.script = _Script().add("BEGIN")
        self.wakes: dict[str, bool] = {}
        self.interrupts: list[str] = []
        self.new_job: str | None = None  # a new job's id: the pools' channel is woken
        self.relaxed = False

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self.script.add(sql, *params).run(self.conn, self.pipe)

    def write(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.script.add(sql, *params)

    def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        bulk = self.bulk.get(sql) if len(rows) > 1 else None
        if bulk is not None:  # the rows as one JSON parameter
            self.script.add(bulk.sql, *bulk.params(rows))
            return
        for row in rows:
            self.script.add(sql, *row)

    def insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """``COPY``, after what the script holds so far (``BEGIN``, earlier writes): a
        copy cannot be pipelined, so this costs a round trip more than a write, and saves a
        statement per row. Binary (each column's type from :data:`COPY_TYPES`): a document
        goes as its bytes, not as hex text that the server decodes (~8% of a
        ``submit_many``, BENCHMARKS.md, issue #18)."""
        if self.script.statements:
            self.script.run(self.conn)
        sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
        with self.conn.cursor().copy(sql) as copy:
            copy.set_types([COPY_TYPES[column] for column in columns])
            for row in rows:
                copy.write_row(row)

    def wake(self, job_id: str, claimable: bool, interrupt: bool = False) -> None:
        self.wakes[job_id] = self.wakes.get(job_id, False) or claimable
        if interrupt:
            self.interrupts.append(job_id)

    def wake_pools(self, job_id: str) -> None:
        self.new_job = self.new_job or job_id

    def relax(self) -> None:
        self.relaxed = True


class PostgresStore(AdvisoryLocks, SqlStore):
    capabilities = Capabilities(pushes_notifications=True, spans_hosts=True, local_logs=False)

    def __init__(self, url: str, create: bool = True) -> None:
        """``create=False``: a schema that holds no store is an error, not created."""
        self.url = url
        self.schema, conninfo, self._where = _pg.parse_url(url)
        self.dialect = dialect(self.schema)
        self._bulk = bulk_statements(self.dialect)
        self._guarded_sql = guard.guarded_sql(self.dialect)
        self._in_rule = threading.local()  # a guess's transition runs (see _guesses)
        self._fusable = fusable_writes(self.schema, self.dialect, self._bulk)
        self._states = StateCache()
        self._queue_channel = f"{self.schema}_queue"
        self._interrupt_channel = f"{self.schema}_interrupt"
        self._db = _pg.Connections(conninfo, self._where)
        self._registry_locks: dict[str, PgMaintenance] = {}
        self._session = self._db.session
        self._init_locks()
        _pg.on_fork(self)
        try:
            with self._session("open") as conn:
                if not create and not _pg.exists(conn, self.schema):
                    raise InvalidInput(
                        f"no postgresql store in schema {self.schema} at {self._where} "
                        "(nothing was created); check --store or $OUTLAST_STORE"
                    )
                _pg.migrate(conn, self.schema, migrations(self.schema))
        except BaseException:
            self.close()
            raise

    def _forget_after_fork(self) -> None:
        self._forget_locks_after_fork()

    def __del__(self) -> None:
        try:  # noqa: SIM105 - not contextlib: at interpreter exit, globals may be None
            self.close()
        except Exception:  # nothing to tell, nobody to tell it to
            pass

    def close(self) -> None:
        """Close the store's connections, the lock connection included: on PostgreSQL the
        worker locks of this process live on it and end with it."""
        self._db.close()
        self._close_locks()
        for lock in self._registry_locks.values():
            lock.release()
        self._registry_locks.clear()

    # ------------------------------------------------------------------ the engine's part
    def _channel(self, job_id: str) -> str:
        return f"{self.schema}_j{zlib.crc32(job_id.encode()) % SHARDS}"

    def listen_key(self, job_id: str) -> str:
        return self._channel(job_id)

    def _new_job_channels(self, job_id: str) -> list[str]:
        """Where a new job is announced: the queue's channel (pools wake, and the listeners
        of every job). Nobody can wait on the job's own channel before it exists."""
        return [self._queue_channel]

    @contextlib.contextmanager
    def _idle_session(self, what: str) -> Iterator[Conn]:
        """A session with no transaction open: a write that commits must not run inside a
        caller's transaction (its COMMIT would end theirs early)."""
        if getattr(self._in_rule, "on", False):
            raise StoreError(f"postgresql store: {what}: a write inside a transition")
        with self._session(what) as conn:
            if conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                raise StoreError(f"postgresql store: {what}: a transaction inside a transaction")
            yield conn

    @contextlib.contextmanager
    def _tx(self, what: str) -> Iterator[_Tx]:
        with self._idle_session(what) as conn:
            tx = _Tx(conn, self._bulk, _pgwire.Pipe(conn))
            yield tx
            self._commit(tx)

    def _commit(self, tx: _Tx) -> None:
        """The end of ``tx``'s transaction: its notifications, then ``COMMIT``, in the
        round trip of its writes."""
        pairs = []
        for job_id, claimable in sorted(tx.wakes.items()):
            pairs.append((self._channel(job_id), job_id))
            if claimable:
                pairs.append((self._queue_channel, job_id))
        pairs += [(self._interrupt_channel, job_id) for job_id in tx.interrupts]
        if tx.new_job is not None and not any(c == self._queue_channel for c, _ in pairs):
            pairs.append((self._queue_channel, tx.new_job))
        if pairs:
            tx.script.add(_NOTIFY, rows_json(pairs))
        if tx.relaxed:
            tx.script.add("SET LOCAL synchronous_commit = off")
        tx.script.add("COMMIT").fuse(self._fusable, _NOTIFY)
        tx.script.run(tx.conn, tx.pipe)

    def _query(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._session(what) as conn:
            return conn.execute(sql, params or None).fetchall()

    def _job_counts(self) -> list[Row]:
        with self._session("count jobs") as conn:
            conn.execute(_counts.pg_fold(self.schema))
            return conn.execute(_counts.pg_read(self.schema)).fetchall()

    def prune(
        self, now: datetime | None = None, keep: float | None = None, limit: int = 500
    ) -> list[str]:
        """:meth:`Store.prune`, and the job counts' changes folded (the maintainer prunes
        once a minute: the changes a stats read sums stay few even when nobody reads)."""
        removed = super().prune(now, keep, limit)
        with self._session("fold the job counts") as conn:
            conn.execute(_counts.pg_fold(self.schema))
        return removed

    def _extra_columns(self, state: JobState) -> dict[str, Any]:
        return {**super()._extra_columns(state), "lock_key": lock_key(self.schema, state.id)}

    def _forget(self, job_id: str) -> None:
        super()._forget(job_id)
        for name in (f"{job_id}.log", f"{job_id}.log.1", f"{job_id}.worker.log"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._log_dir() / name)

    # ------------------------------------------------------------------ transitions
    def _apply_many(
        self, items: list[tuple[str, Transition]], strict: bool = False
    ) -> list[Applied]:
        """The items whose rows this store object remembers (a pool's outcomes: it claimed
        those jobs) as one guarded statement, one round trip (see :mod:`._pgguard`); the
        others, and those whose row the guard found changed, the ordinary way after."""
        taken = [] if strict else self._guesses(items)
        if not taken:
            return super()._apply_many(items, strict)
        done = self._guarded(taken)
        rest = [(job_id, fn) for job_id, fn in items if job_id not in done]
        later: defaultdict[str, deque[Applied]] = defaultdict(deque)
        for applied in super()._apply_many(rest) if rest else []:
            later[applied.state.id].append(applied)
        out = []
        for job_id, _ in items:  # in order, as the ordinary way returns them
            if job_id in done:
                out.append(done[job_id])
            elif later[job_id]:
                out.append(later[job_id].popleft())
        return out

    def _apply_one(self, job_id: str, fn: Transition) -> Applied:
        """A change of status of a job this store object remembers (a worker's outcome: it
        started the job) as one guarded statement; else, or if the row changed, the SQL
        core's shortest path (two round trips)."""
        taken = self._guesses([(job_id, fn)])
        done = self._guarded(taken) if taken else {}
        return done[job_id] if job_id in done else super()._apply_one(job_id, fn)

    def _guesses(self, items: list[tuple[str, Transition]]) -> list[guard.Guess]:
        """:func:`._pgguard.guesses` of ``items``; their transitions run outside a
        transaction here, so a write of this store inside one is refused as it is inside a
        transaction (transitions are pure: a transition that writes is an error, never a
        write made twice)."""
        before = getattr(self._in_rule, "on", False)
        self._in_rule.on = True
        try:
            return guard.guesses(self._states, items)
        finally:
            self._in_rule.on = before

    def _guarded(self, taken: list[guard.Guess]) -> dict[str, Applied]:
        """Write ``taken`` as one guarded statement; what it came to, for the jobs it wrote."""
        rows, events, notes = guard.parameters(self.dialect, taken, self._guess_channels)
        ids = [g.job_id for g in taken]
        params = (rows_json(rows), ids, rows_json(events), rows_json(notes))
        with self._idle_session(f"update {len(taken)} jobs") as conn:
            written = {row[0] for row in _pgwire.Pipe(conn).run([(self._guarded_sql, params)])}
        return guard.results(taken, written, self._states)

    def _guess_channels(self, g: guard.Guess) -> list[str]:
        channels = [self._channel(g.job_id)]
        if machine.wakes_pools(g.old, g.change):
            channels.append(self._queue_channel)
        if g.change.interrupts:
            channels.append(self._interrupt_channel)
        return channels

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
        """Due jobs in the claim's order (priority, due time, id), skipping rows others
        have locked; each one's worker lock is taken before it is started (a job whose lock
        is held is left as it is).

        The claim runs on the lock connection, so its first statement both reads the rows
        and tries their locks (a round trip less on the way from ``submit`` to a job's
        start, BENCHMARKS.md issue #18); the locks of rows it then does not start are let go
        in its write round trip, and a failed claim lets go of all it took (see
        :meth:`_claiming`)."""
        if getattr(self._in_rule, "on", False):
            raise StoreError("postgresql store: claim: a write inside a transition")
        query, parts = self._claim_query(queues, kinds)
        probes = [x for args, _ in parts for x in args]  # the priorities': each part's
        seen: list[str] = []
        kept: dict[str, int] = {}  # job id -> lock key, of the jobs claimed
        claimed: list[JobState] = []
        level: int | None = None  # the priority read: None, the highest
        with self._claiming() as conn, self._db.borrowed(conn, "claim"):
            tx = _Tx(conn, self._bulk, _pgwire.Pipe(conn))
            held = self._held_keys()
            for _ in range(_CLAIM_ROUNDS):
                want = limit - len(claimed)
                reads = [
                    x
                    for args, part in parts
                    for x in (*args, now + SKEW, now, seen)
                    + ((window(want), want) if part == KEYED else (want,))
                ]
                got = tx.read(query, (level, *probes, *probes, *reads, held))
                lower = got[0][6] if got else None  # the next priority down
                rows = [r[:6] for r in got if r[0] is not None]
                if got and got[0][8] is not None and got[0][8] >= window(want):
                    keyed = sum(1 for r in got if r[7] == KEYED)
                    if keyed < want:  # the window was all full keys: the keys one by one
                        rows = self._claim_by_key(tx, got, queues, kinds, now, want, held, seen)
                seen += [r[0] for r in rows]
                locked, loose = self._locked_rows(tx, rows, kept)
                starts: list[Write] = self._starts(tx, [r[:3] for r in locked], worker, now, want)
                started = {old.id for old, _, _, _ in starts}
                loose += [r[3] for r in locked if r[0] not in started]
                if loose:  # taken, not started: let go in the write round trip
                    tx.write(UNLOCK_SQL, (loose,))
                kept.update((r[0], r[3]) for r in locked if r[0] in started)
                if starts:  # journaled in the claim's own transaction
                    keys = [(new.id, new.attempts) for _, new, _, _ in starts]
                    if isinstance(journal, _PgJournal):  # in its write round trip
                        tx.write(*self._journal_claims_sql(journal.records(keys)))
                    else:
                        journal.claimed(keys)
                    self._write(tx, starts)
                    for _, new, _, _ in starts:
                        tx.wake(new.id, False)
                claimed += [new for _, new, _, _ in starts]
                if len(claimed) >= limit:
                    break
                if len(rows) < want:  # the priority's due jobs are all read: the next down
                    if lower is None:
                        break
                    level = lower
                # else rows were skipped (locked, or their key full): the priority again
            self._commit(tx)
            handles = self._claimed_locks(kept)
        return [(state, handles[state.id]) for state in claimed]

    def _claim_query(
        self, queues: list[str] | None, kinds: list[Kind] | None
    ) -> tuple[str, list[tuple[list[Any], int]]]:
        """The read of a claim's round: the due jobs of one priority (the highest of its
        queues and kinds, or a given one), earliest due first, skipping rows others have
        locked, each one's worker lock tried; and the next priority down. Each part of
        :data:`~outlast.store.sql.DUE_PARTS` the claim reads is its own range (a pool's
        claim reads two: its kinds without a concurrency key, and with one, whose range is
        walked for a window of :func:`~outlast.store.sql.window` jobs before their room is
        checked); and the parameters of each part's condition, with the part. Rows ``(id,
        doc, seq, lock key, lock taken, backend, next priority down, part, keyed jobs
        walked, priority, due)``."""
        parts: list[str] = []
        params: list[tuple[list[Any], int]] = []
        numbers = []
        for part, picked in due_parts(kinds):
            where, args = self._claimable(queues, [Kind(k) for k in picked] or None)
            parts.append(f"{where} AND {DUE_PARTS[part][1]}")
            params.append((args, part))
            numbers.append(part)
        highest = [f"({priority_probe('{jobs}', where)})" for where in parts]
        lower = [f"({priority_probe('{jobs}', where, 's.p')})" for where in parts]
        names = ["c"] if len(parts) == 1 else [f"c{i}" for i in range(len(parts))]
        reads = []
        walked = "NULL::int8"
        for i, where in enumerate(parts):
            level = f"{where} AND priority = (SELECT p FROM t)"
            if numbers[i] == KEYED:  # a window of the range in claim order, then the room
                reads.append(
                    f"w AS (SELECT id FROM {{jobs}} WHERE {level} AND {DUE_TIMES}"
                    f" AND id <> ALL(?::text[]) ORDER BY {DUE}, id LIMIT ?),"
                    f" {names[i]} AS (SELECT id, doc, seq, lock_key, {DUE} AS due, {KEYED} AS part"
                    f" FROM {{jobs}} j WHERE id IN (SELECT id FROM w) AND {ROOM}"
                    f" ORDER BY {DUE}, id LIMIT ? FOR UPDATE OF j SKIP LOCKED)"
                )
                walked = "(SELECT count(*) FROM w)"
                continue
            reads.append(
                f"{names[i]} AS (SELECT id, doc, seq, lock_key, {DUE} AS due,"
                f" {numbers[i]} AS part FROM {{jobs}} j WHERE {level} AND {DUE_RANGE}"
                f" AND id <> ALL(?::text[]) ORDER BY {DUE}, id LIMIT ? FOR UPDATE OF j SKIP LOCKED)"
            )
        if len(parts) > 1:  # a pool's claim (both parts of its kinds), or of every kind
            reads.append(f"c AS ({' UNION ALL '.join(f'SELECT * FROM {n}' for n in names)})")
        # s and t materialized: inlined, each "next priority down" probed the highest again
        query = self.dialect.sql(
            f"WITH s AS MATERIALIZED (SELECT COALESCE(?::int, {_greatest(highest)}) AS p),"
            f" t AS MATERIALIZED (SELECT p, {_greatest(lower)} AS lower FROM s),"
            f" {', '.join(reads)}"
            f" SELECT c.id, c.doc, c.seq, c.lock_key, {TRY_LOCK_SQL}, pg_backend_pid(), t.lower,"
            f" c.part, {walked}, t.p, c.due FROM t LEFT JOIN c ON true ORDER BY c.due, c.id"
        )
        return query, params

    def _claim_by_key(
        self,
        tx: _Tx,
        got: list[Row],
        queues: list[str] | None,
        kinds: list[Kind] | None,
        now: datetime,
        want: int,
        held: list[int],
        seen: list[str],
    ) -> list[Row]:
        """A claim round's rows ``(id, doc, seq, key, took, backend)`` when the window of its
        keyed jobs was all jobs of full keys: the round's other rows, and the first due
        jobs of each key with room, read key by key (:meth:`SqlStore._key_heads`), each
        row locked and its worker lock tried as the round's own are (but those an earlier
        round read: a key counted full again when it started them); in claim order."""
        level = got[0][9]
        main = [r for r in got if r[0] is not None]
        ordered = [(r[10], r[0], r[:6]) for r in main]  # (due, id, row): the claim's order
        taken = {r[0] for r in main} | set(seen)
        due: dict[str, Any] = {}
        for queue in queues or self._claimable_queues(kinds):
            for _, picked in [p for p in due_parts(kinds) if p[0] == KEYED]:
                for r in self._key_heads(tx.read, queue, picked, level, now, want, []):
                    if r[0] not in taken:
                        due[r[0]] = r[4]
        if due:
            locked = tx.read(
                self.dialect.sql(
                    f"SELECT c.id, c.doc, c.seq, c.lock_key, {TRY_LOCK_SQL}, pg_backend_pid()"
                    f" FROM {{jobs}} c WHERE c.id = ANY(?::text[]) AND {CLAIMABLE}"
                    " FOR UPDATE OF c SKIP LOCKED"
                ),
                (held, list(due)),
            )
            ordered += [(due[r[0]], r[0], r) for r in locked]
        ordered.sort(key=lambda x: (x[0], x[1]))
        return [row for _, _, row in ordered]

    def _locked_rows(
        self, tx: _Tx, rows: list[Row], kept: dict[str, int]
    ) -> tuple[list[Row], list[int]]:
        """The claim's rows ``(id, doc, seq, key, took, backend)`` whose lock it took, as
        ``(id, doc, seq, key)``, and the keys it took once more. A row without a key
        (written by a version before keys) has its lock tried now. A second row of a key
        taken already (two ids, one 64-bit key) is left as it is: its hold of the
        re-entrant lock is one to let go."""
        if rows:
            self._check_backend(tx.conn, rows[0][5])
        keyless = [r[0] for r in rows if r[3] is None]
        late: dict[str, tuple[int, bool]] = {}
        if keyless:
            keys = {job_id: lock_key(self.schema, job_id) for job_id in keyless}
            held = set(self._held_keys())
            wanted = [k for k in keys.values() if k not in held]
            got = {
                r[0]
                for r in tx.read(
                    "SELECT k FROM unnest(%s::int8[]) AS k WHERE pg_try_advisory_lock(k)",
                    (wanted,),
                )
            }
            late = {job_id: (key, key in got) for job_id, key in keys.items()}
        taken = set(kept.values())
        locked: list[Row] = []
        again: list[int] = []
        for job_id, doc, seq, key, took, _ in rows:
            if key is None:
                key, took = late[job_id]
            if not took:
                continue
            if key in taken:
                again.append(key)
                continue
            taken.add(key)
            locked.append((job_id, doc, seq, key))
        return locked, again

    def _slots(self, tx: Any, keys: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
        """Each key locked for the transaction first (one after the other, in order), so
        two claimers of one key count one after the other: what the first started is
        committed, and counted, when the second counts."""
        for key in keys:
            tx.read("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LIMIT_LOCKS, key))
        return super()._slots(tx, keys)

    # ------------------------------------------------------------------ attempt journal
    def journal(self, worker: str, label: str) -> Journal:
        return _PgJournal(self)

    def _fate(self, state: JobState) -> Fate:
        sql = f'SELECT line FROM "{self.schema}".journal WHERE id = %s'
        rows = self._query("read the job's attempt journal", sql, (state.id,))
        return line_fate(rows[0][0] if rows else None, (state.id, state.attempts))

    def _journal_claims(self, records: list[tuple[Key, str]]) -> None:
        """Upsert claim records in one statement, inside the claim's transaction (whose
        session this is): if it fails, so does the claim."""
        if not records:
            return
        with self._session("journal claims") as conn:
            conn.execute(*self._journal_claims_sql(records))

    def _journal_claims_sql(self, records: list[tuple[Key, str]]) -> tuple[str, list[Any]]:
        return _journal_upsert(self.schema), [rows_json([(k[0], line) for k, line in records])]

    def _sweep_journal(self) -> None:
        """Forget the records of finished (or deleted) jobs: only those, since a pending job
        may be claimed, and its record rewritten, while the sweep runs."""
        terminal = ", ".join(f"'{s}'" for s in TERMINAL)
        held = f"SELECT 1 FROM {self.dialect.jobs} WHERE id = j.id AND status NOT IN ({terminal})"
        sql = f'DELETE FROM "{self.schema}".journal j WHERE NOT EXISTS ({held})'
        try:
            with self._session("sweep the attempt journal") as conn:
                conn.execute(sql)
        except OutlastError as exc:
            log.warning("%s", exc)

    # ------------------------------------------------------------------ maintenance
    def maintenance_lock(self) -> MaintenanceLock:
        return PgMaintenance(self._db, lock_key(self.schema, MAINTENANCE_LOCK))

    def timer_lock(self) -> MaintenanceLock:
        return PgMaintenance(self._db, lock_key(self.schema, TIMER_LOCK), "outlast-timer")

    def timer_running(self) -> bool:
        return self._lock_held(TIMER_LOCK)

    def abandoned_jobs(self, thorough: bool = False) -> list[JobState]:
        """One query: the live jobs whose advisory lock nobody holds (``reconcile`` looks at
        each once more, riding out a holder whose backend is still exiting)."""
        held = HELD_SQL.format(alias="j")
        sql = self.dialect.sql(f"SELECT j.id, j.doc FROM {{jobs}} j WHERE {LIVE} AND NOT {held}")
        abandoned = decode_listing(self._query("find abandoned jobs", sql))
        if thorough:  # what earlier sweeps reconciled no longer needs its journal
            self._sweep_journal()
        return abandoned

    # ------------------------------------------------------------------ notification, logs
    def listen(
        self, job_ids: list[str] | None = None, queue: bool = False, interrupts: bool = False
    ) -> PgListener:
        if job_ids is None:
            channels = {f"{self.schema}_j{i}" for i in range(SHARDS)} | {self._queue_channel}
        else:
            channels = {self._channel(j) for j in job_ids}
            if queue:
                channels.add(self._queue_channel)
        if interrupts:
            channels.add(self._interrupt_channel)
        jobs = None if job_ids is None else set(job_ids)
        return PgListener(
            self._db, sorted(channels), jobs, self._queue_channel, self._interrupt_channel
        )

    def _insert(self, state: JobState) -> JobState | None:
        """One job without a unique key (a ``submit``) as one statement, its own transaction:
        the row, its labels and its notifications (delivered at the commit) without a
        ``BEGIN`` and ``COMMIT`` of their own. A unique key takes the SQL core's way."""
        if state.unique_key is not None:
            return super()._insert(state)
        d = self.dialect
        doc = codec.encode(state)
        names, row = self._new_row(state, doc)
        params: list[Any] = list(row)
        sql = f"WITH j AS ({_insert(d, names)} RETURNING id)"
        if state.labels:
            sql += (
                f", l AS (INSERT INTO {d.labels} ({', '.join(LABEL_COLUMNS)})"
                " SELECT j.id, k, v, %s::timestamptz"
                " FROM j, unnest(%s::text[], %s::text[]) AS t(k, v))"
            )
            params += [d.time(state.created_at), list(state.labels), list(state.labels.values())]
        sql += " SELECT pg_notify(c, j.id) FROM j, unnest(%s::text[]) AS t(c)"
        params.append(self._new_job_channels(state.id))
        with self._idle_session(f"create {state.id}") as conn:
            _pgwire.Pipe(conn).run([(sql, params)])
        self._remember(state, doc, 0)  # a new row: no events yet
        return None

    def _insert_on(self, connection: Any, state: JobState) -> JobState | None:
        """The insert, its labels and its wake-ups as statements of the caller's
        transaction (``pg_notify`` is delivered when it commits, so pools wake for a job
        that exists). Nothing is committed here."""
        if not isinstance(connection, psycopg.Connection):
            raise InvalidInput(
                "connection= takes an open psycopg (3) Connection to the store's database, "
                f"not {type(connection).__name__}"
            )
        d = self.dialect
        names, values = self._new_row(state, codec.encode(state))
        with _pg.translated(f"create {state.id} in your transaction"):
            if state.unique_key is not None:
                sql = _unique_insert(d, names)
                if connection.execute(sql, values).fetchone() is None:
                    row = connection.execute(
                        d.sql(
                            "SELECT id, doc FROM {jobs} WHERE unique_key = ?"
                            f" AND status IN {LIVE_STATUSES}"
                        ),
                        (state.unique_key,),
                    ).fetchone()
                    if row is None:
                        raise StoreError(
                            "the live job that held the unique key just ended; try again"
                        )
                    return codec.decode(row[0], row[1])
            else:
                connection.execute(_insert(d, names), values)
            if state.labels:
                with connection.cursor() as cur:
                    cur.executemany(d.sql(LABEL_INSERT), label_rows(d, state))
            connection.execute(
                "SELECT pg_notify(c, %s) FROM unnest(%s::text[]) AS t(c)",
                (state.id, self._new_job_channels(state.id)),
            )
        return None

    def change_watch(self) -> ChangeWatch:
        """Woken by the notifications of a job becoming claimable (a new job, a retry) and
        of a schedule changing (``<schema>_schedules``, sent in the schedule's transaction)."""
        channels = sorted({self._queue_channel, f"{self.schema}_schedules"})
        return _PgWatch(PgListener(self._db, channels, None, self._queue_channel))

    def _schedules_changed(self, tx: Any, name: str) -> None:
        tx.write("SELECT pg_notify(%s, %s)", (f"{self.schema}_schedules", name))

    def _log_dir(self) -> Path:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self._where)
        return Path(paths.state_dir()) / "postgresql" / name / "logs"

    def _hold_registry(self, name: str) -> None:
        """A session advisory lock of this worker's, on a connection of its own, held until
        the process ends (PostgreSQL frees it when the connection goes)."""
        if name not in self._registry_locks:
            lock = PgMaintenance(self._db, lock_key(self.schema, f"\0worker:{name}"))
            lock.try_acquire()
            self._registry_locks[name] = lock

    def _registry_alive_many(self, names: list[str]) -> dict[str, bool]:
        if len(names) < 2:
            return {name: self._registry_alive(name) for name in names}
        rows = self._query(
            "check the workers",
            "SELECT l.classid::int8, l.objid::int8 FROM pg_locks l WHERE l.locktype = 'advisory'"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.objsubid IN (1, 2) AND l.granted",
        )
        held = {(int(c), int(o)) for c, o in rows}
        found = {}
        for name in names:
            key = lock_key(self.schema, f"\0worker:{name}")
            found[name] = ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF) in held
        return found

    def _registry_alive(self, name: str) -> bool:
        key = lock_key(self.schema, f"\0worker:{name}")
        rows = self._query(
            "check a worker",
            "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory'"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.classid = %s::oid AND l.objid = %s::oid AND l.objsubid IN (1, 2)"
            " AND l.granted)",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
        return bool(rows and rows[0][0])

    def log_writer(self, job_id: str) -> LogSink:
        """A writer of the job's log in the database (readable from any host)."""
        return _pglog.PgLogWriter(self._db, self.schema, job_id)

    def log_cursor(self, job_id: str) -> LogCursor:
        return _pglog.PgLogCursor(self._db, self.schema, job_id)

    def log_tail(self, job_id: str, lines: int) -> str | None:
        return _pglog.tail(self._db, self.schema, job_id, lines, TAIL_BYTES)

    def log_read(self, job_id: str, offset: int = 0, limit: int = 65536) -> tuple[bytes, int]:
        check_range(offset, limit)
        return _pglog.read_range(self._db, self.schema, check_id(job_id), offset, limit)

    def worker_output_path(self, job_id: str) -> Path:
        """What a detached worker on this machine prints itself (its job's output goes to
        the database: :meth:`log_writer`)."""
        return self.log_path(job_id).with_suffix(".worker.log")

    def log_path(self, job_id: str) -> Path:
        """A file of the job's on this machine (the log itself is in the database)."""
        folder = self._log_dir()
        for level in (folder.parent.parent, folder.parent, folder):  # all private, not just logs
            make_private_dir(level)
        return folder / f"{job_id}.log"


class _PgWatch(ChangeWatch):
    """A :class:`ChangeWatch` over a listener: changed at first, and whenever a notification
    came (or the connection was lost) since the last look."""

    def __init__(self, listener: PgListener) -> None:
        self.listener = listener
        self._first = True

    def changed(self) -> bool:
        first, self._first = self._first, False
        return self.listener.drain_any() or first

    def close(self) -> None:
        self.listener.close()


class _PgJournal(Journal):
    """The attempt journal on PostgreSQL: the latest record of each job in the ``journal``
    table (see :mod:`outlast.store.journal`). Claims are journaled in the claim's own
    transaction; starts and outcomes on a connection this journal keeps, which also holds a
    shared advisory lock on the job from its start record to its outcome (the two-key form of
    its key: :func:`outlast.store._pglocks.lock_pair`). So a job whose pool is killed looks
    abandoned only once the process that ran it is gone too, its journal complete."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._table = f'"{store.schema}".journal'
        self._conn: Conn | None = None
        self._held: tuple[int, int] | None = None
        self._failing = False
        #: The connection's statements; one may be out, not yet answered
        #: (:meth:`send_returned`): :meth:`settle` reads its answer.
        self._direct: _pg.Direct | None = None
        #: The last statement sent and its parameters (sent again if its session died).
        self._sent: tuple[str, list[str]] | None = None

    def claimed(self, keys: Sequence[Key], started: bool = False) -> None:
        self.store._journal_claims(self.records(keys, started))

    @staticmethod
    def records(keys: Sequence[Key], started: bool = False) -> list[tuple[Key, str]]:
        """The claim (or start) records of ``keys``, as the journal table keeps them."""
        kind = "s" if started else "c"
        return [(k, record_line(kind, k)) for k in keys]

    def started(self, key: Key) -> bool:
        if self._held is not None:  # an attempt that never said how it ended
            self._run("let go of a job", _UNLOCK_SHARED, self._held)
            self._held = None
        pair = lock_pair(lock_key(self.store.schema, key[0]))
        sql = (
            "WITH l AS (SELECT pg_advisory_lock_shared($1::int4, $2::int4))"
            f" INSERT INTO {self._table} SELECT $3::text, $4::text FROM l{_UPSERT}"
        )
        if not self._run("journal a start", sql, (*pair, key[0], record_line("s", key))):
            return False
        self._held = pair
        return True

    def returned(self, key: Key, outcome: Outcome) -> None:
        self.send_returned(key, outcome)
        self.settle()

    def send_returned(self, key: Key, outcome: Outcome) -> None:
        """The outcome's record (and the job's shared lock let go with it, in the same
        statement) sent, not waited for: the job's process hands the outcome to its pool
        meanwhile and waits in :meth:`settle`, a round trip less before the pool has it.
        The job stays alive until the statement has run (its shared lock), so whoever
        reconciles it after the pool's death reads the record."""
        held, self._held = self._held, None
        if outcome.verb != "gone":
            insert = f"INSERT INTO {self._table} VALUES ($1::text, $2::text){_UPSERT}"
            line = record_line("o", key, outcome)
            if held is None:
                self._run("journal an outcome", insert, (key[0], line), wait=False)
            else:  # the lock goes once the outcome is in
                sql = (
                    f"WITH w AS ({insert} RETURNING 1)"
                    " SELECT pg_advisory_unlock_shared($3::int4, $4::int4) FROM w"
                )
                self._run("journal an outcome", sql, (key[0], line, *held), wait=False)
        elif held is not None:
            self._run("let go of a job", _UNLOCK_SHARED, held)

    def settle(self) -> None:
        if self._direct is not None and self._direct.pending:
            self._guarded("journal an outcome", lambda: self._answer(again=True))

    def close(self) -> None:
        """Wait for what was sent, then close the connection (its settings are this
        journal's, ``synchronous_commit`` off: it is not given back to be reused), which
        lets go of a shared lock still held."""
        self.settle()
        conn, self._conn, self._direct, self._held = self._conn, None, None, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _run(self, what: str, sql: str, params: Sequence[str | int], wait: bool = True) -> bool:
        """One statement on the journal's connection (after what was sent before is
        answered); ``wait=False``: sent, its answer read in :meth:`settle`."""
        self.settle()

        def run() -> None:
            # a session the server ended while it was idle (a restart, an idle timeout, an
            # administrator) is replaced before the statement, not failed with it
            if self._direct is None or not self._direct.alive():
                self._connect()
            self._send(sql, [str(p) for p in params])
            if wait:
                self._answer(again=True)

        return self._guarded(what, run)

    def _send(self, sql: str, params: list[str]) -> None:
        assert self._direct is not None
        self._sent = (sql, params)
        self._direct.send(sql, params)

    def _answer(self, again: bool) -> None:
        """Read the answer to the statement sent. A session that died under it (the
        server's FATAL, which may come only once a statement is out) gets the statement
        again, once, on a new session: these are upserts of this job's own record and its
        own shared lock, which went with the dead session either way."""
        assert self._direct is not None
        try:
            self._direct.wait()
        except psycopg.OperationalError:
            if not (again and not self._direct.alive() and self._sent is not None):
                raise
            self._connect()
            self._send(*self._sent)
            self._answer(again=False)

    def _connect(self) -> None:
        """A new session for the journal (the one it had, if any, closed)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = self._direct = None
        self._conn = self.store._db.take()
        # a record is not worth waiting for the disk (a flush, ~0.15 ms, on every job's
        # start): a server crash may take back the last moments' records. A start taken back
        # leaves the claim's record (flushed with the claim), so that attempt is given back
        # uncounted though it ran; an outcome taken back makes the job run again. Both are
        # at-least-once; RELIABILITY.md has the figures and what was tried instead.
        self._conn.execute("SET synchronous_commit = off")
        self._direct = _pg.Direct(self._conn)

    def _guarded(self, what: str, fn: Callable[[], object]) -> bool:
        """Run ``fn``; a failure is logged (once until the next success) and the
        connection, with its lock, dropped."""
        try:
            with _pg.translated(what):
                fn()
        except OutlastError as exc:
            if not self._failing:
                log.warning("cannot %s: %s", what, exc)
            self._failing = True
            if self._conn is not None:
                self._conn.close()
            self._conn, self._direct, self._held = None, None, None
            return False
        self._failing = False
        return True


_UPSERT = " ON CONFLICT (id) DO UPDATE SET line = excluded.line"
_UNLOCK_SHARED = "SELECT pg_advisory_unlock_shared($1::int4, $2::int4)"


def _journal_upsert(schema: str) -> str:
    """Journal records ([id, line] rows, :func:`rows_json`) written over those of the same
    jobs."""
    rows = "SELECT r->>0, r->>1 FROM jsonb_array_elements(%s::jsonb) AS r"
    return f'INSERT INTO "{schema}".journal {rows}{_UPSERT}'
