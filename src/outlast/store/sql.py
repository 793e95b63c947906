"""The SQL core shared by the SQLite and PostgreSQL adapters: one schema, one set of
statements, and the store verbs written once over a small transaction interface.

Each adapter says only what is different about its engine: how it connects, how a
transaction begins and commits (``BEGIN IMMEDIATE`` and a retry loop; pipelined round trips
with ``FOR UPDATE``), how waiters are woken (pulse files after the commit; ``pg_notify``
inside it), how a claim skips locked rows, and where worker locks live.

**Tables.** ``jobs`` keeps the columns that are queried (status, kind, queue, worker, times,
the last event's ``seq``) beside ``doc``, the job document (``JobState.to_dict()`` as compact
UTF-8 JSON, byte for byte what every adapter stores); ``events`` has the key ``(job_id, seq)``;
``labels`` one row per label (with its job's ``created_at``, so a label is listed in order), for
filtering.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from outlast import codec, machine
from outlast.errors import CorruptJob, JobActive, JobNotFound, ScheduleNotFound, StoreError
from outlast.ids import DEDICATED, check_id
from outlast.machine import NewEvent
from outlast.model import (
    TERMINAL,
    JobState,
    Kind,
    ProgressEvent,
    Schedule,
    Status,
    format_time,
    utcnow,
)
from outlast.store import _sqllist as listing
from outlast.store import stats as stats_module
from outlast.store.base import (
    REMOVE,
    Applied,
    ScheduleChange,
    Store,
    Transition,
    expires_at,
    fire_one,
    live,
)
from outlast.store.common import decode_listing, log
from outlast.store.query import Filter, fold
from outlast.store.stats import Stats, add_schedules

Row = tuple[Any, ...]
#: ``(state before, state after, seq before, new events)`` of one job in one transaction.
Write = tuple[JobState, JobState, int, Sequence[NewEvent]]
_TERMINAL = tuple(str(s) for s in TERMINAL)
_CHUNK = 500  # ids per ``IN (…)``
#: Schedules fired per transaction.
FIRE_BATCH = 100


class _HolderGone(Exception):
    """The live job that held a unique key ended between the insert and its read."""


class Dialect:
    """How one SQL engine spells what the statements need (one per store: hashed by
    identity, cheap for the statement caches; a plain class: imported on every CLI call)."""

    __slots__ = (
        "_last_time",
        "blob",
        "events",
        "for_update",
        "integer",
        "jobs",
        "labels",
        "limits",
        "name",
        "param",
        "schedules",
        "text",
        "time_type",
        "without_rowid",
        "workers",
    )  # fmt: skip

    def __init__(
        self,
        *,
        name: str,
        param: str,
        jobs: str,
        events: str,
        labels: str,
        schedules: str,
        limits: str,
        text: str,
        blob: str,
        integer: str,
        time_type: str,
        for_update: str = "",
        without_rowid: str = "",
        workers: str = "workers",
    ) -> None:
        #: ``sqlite`` or ``postgresql``; the placeholder, ``?`` or ``%s``.
        self.name, self.param = name, param
        #: Table names (PostgreSQL qualifies them with the store's schema).
        self.jobs, self.events, self.labels = jobs, events, labels
        self.schedules, self.limits, self.workers = schedules, limits, workers
        #: Column types: text, binary, whole number, time.
        self.text, self.blob, self.integer, self.time_type = text, blob, integer, time_type
        #: Appended to a read-modify-write's select (``FOR UPDATE``; SQLite locks the file).
        self.for_update = for_update
        #: A table definition's suffix for the key-only tables (SQLite: ``WITHOUT ROWID``).
        self.without_rowid = without_rowid
        #: The time :meth:`time` wrote last, and its text (a batch of jobs shares one).
        self._last_time: tuple[datetime | None, Any] = (None, None)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - dialects live as long as the program
    def sql(self, statement: str) -> str:
        """``statement`` written with ``?`` placeholders and ``{jobs}``-style table names, in
        this dialect."""
        out = statement.format(
            jobs=self.jobs,
            events=self.events,
            labels=self.labels,
            schedules=self.schedules,
            limits=self.limits,
            workers=self.workers,
        )
        return out if self.param == "?" else out.replace("?", self.param)

    def time(self, value: datetime | None) -> Any:
        """A time as a parameter: SQLite keeps ISO 8601 text (which sorts as time does)."""
        if value is None:
            return None
        if self.name == "sqlite":
            last = self._last_time  # one tuple: read whole, as another thread may set it
            if last[0] is value:  # the same object (kept alive by the tuple): the same text
                return last[1]
            text = format_time(value)
            self._last_time = (value, text)
            return text
        return value

    def contains(self, column: str) -> str:
        """``column`` holds the parameter as a substring (no wildcards to escape)."""
        return f"instr({column}, ?) > 0" if self.name == "sqlite" else f"strpos({column}, ?) > 0"

    def bytewise(self, column: str) -> str:
        """``column`` compared byte by byte (SQLite's own order; on PostgreSQL the "C"
        collation, which ``jobs_id_bytes`` keeps whatever the database's own is)."""
        return column if self.name == "sqlite" else f'{column} COLLATE "C"'

    def using(self, index: str) -> str:
        """Said after a table: the read goes through ``index`` (SQLite's planner, without
        statistics, may take a wider one; PostgreSQL's has them)."""
        return f" INDEXED BY {index}" if self.name == "sqlite" else ""

    def seconds(self, column: str) -> str:
        """A time column as seconds since the epoch (SQLite: to the millisecond, what its
        date functions read of a fraction)."""
        if self.name == "sqlite":
            return f"((julianday({column}) - 2440587.5) * 86400.0)"
        return f"date_part('epoch', {column})"

    def between(self, start: str, end: str) -> str:
        """Seconds from time ``start`` to time ``end``, to the microsecond. (SQLite keeps
        :func:`~outlast.model.format_time`'s text, ``2026-11-29T18:11:10.123456+00:00``,
        always UTC: whole seconds apart, rounded, plus the fractions' difference.)"""
        if self.name == "sqlite":
            whole = f"round((julianday(substr({end}, 1, 19)) - julianday(substr({start}, 1, 19)))"
            fraction = f"CAST(substr({end}, 20, 7) AS REAL) - CAST(substr({start}, 20, 7) AS REAL)"
            return f"({whole} * 86400.0) + {fraction})"
        return f"date_part('epoch', {end} - {start})"

    def one_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values``: the SQL and its parameters (one value: an
        equality, which an index can also read in order)."""
        if len(values) == 1:
            return f"{column} = ?", [values[0]]
        if self.name == "sqlite":
            return f"{column} IN ({','.join('?' * len(values))})", list(values)
        return f"{column} = ANY(?::text[])", [list(values)]


def tables(d: Dialect) -> list[str]:
    """The three tables of the first schema version, in the dialect's types (the indexes
    are each engine's own; later columns and tables come with :func:`time_tables`)."""
    return [
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{jobs}} (id {d.text} PRIMARY KEY,"
            f" status {d.text} NOT NULL, kind {d.text} NOT NULL, queue {d.text} NOT NULL,"
            f" worker {d.text},"
            f" run_after {d.time_type}, created_at {d.time_type} NOT NULL,"
            f" seq {d.integer} NOT NULL DEFAULT 0, doc {d.blob} NOT NULL)"
        ),
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{labels}} (job_id {d.text} NOT NULL,"
            f" key {d.text} NOT NULL, value {d.text} NOT NULL, PRIMARY KEY (job_id, key))"
            f"{d.without_rowid}"
        ),
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{events}} (job_id {d.text} NOT NULL,"
            f" seq {d.integer} NOT NULL, doc {d.blob} NOT NULL, PRIMARY KEY (job_id, seq))"
            f"{d.without_rowid}"
        ),
    ]


def flow_columns(d: Dialect) -> list[str]:
    """What flow control added: ``jobs.priority`` and the ``jobs_due`` index that claims
    read in :data:`CLAIM_ORDER`; ``jobs.retry_of`` (indexed: a job's retries); and
    ``jobs.unique_key`` with ``jobs_unique``, unique among live jobs; ``jobs.limit_key``,
    ``jobs.limit_slots`` and the ``limits`` table (a key's slots, ``outlast group set``)."""
    return [
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN priority {d.integer} NOT NULL DEFAULT 0"),
        d.sql(
            f"CREATE INDEX IF NOT EXISTS jobs_due ON {{jobs}} (queue, {CLAIM_ORDER})"
            f" WHERE {CLAIMABLE}"
        ),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN retry_of {d.text}"),
        d.sql(
            "CREATE INDEX IF NOT EXISTS jobs_retry_of ON {jobs} (retry_of)"
            " WHERE retry_of IS NOT NULL"
        ),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN unique_key {d.text}"),
        d.sql(
            f"CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique ON {{jobs}} (unique_key)"
            f" WHERE unique_key IS NOT NULL AND status IN {LIVE_STATUSES}"
        ),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN limit_key {d.text}"),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN limit_slots {d.integer}"),
        d.sql(
            "CREATE INDEX IF NOT EXISTS jobs_holding ON {jobs} (limit_key)"
            " WHERE status = 'running' AND limit_key IS NOT NULL"
        ),
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{limits}} (key {d.text} PRIMARY KEY,"
            f" slots {d.integer} NOT NULL)"
        ),
    ]


def time_tables(d: Dialect, finished_at: str) -> list[str]:
    """What schedules and retention added (schema version 3 on SQLite, 4 on PostgreSQL):
    ``jobs.finished_at`` and ``jobs.expires_at`` (a job's own ``keep`` after it finished),
    and the ``schedules`` table (``doc`` is ``Schedule.to_dict()``). ``finished_at``: the
    engine's expression of a document's ``finished_at``, to fill the new column."""
    terminal = ", ".join(f"'{s}'" for s in _TERMINAL)
    return [
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN finished_at {d.time_type}"),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN expires_at {d.time_type}"),
        d.sql(f"UPDATE {{jobs}} SET finished_at = {finished_at} WHERE status IN ({terminal})"),
        d.sql(
            "CREATE INDEX IF NOT EXISTS jobs_finished ON {jobs} (finished_at)"
            " WHERE finished_at IS NOT NULL"
        ),
        d.sql(
            "CREATE INDEX IF NOT EXISTS jobs_expires ON {jobs} (expires_at)"
            " WHERE expires_at IS NOT NULL"
        ),
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{schedules}} (id {d.text} PRIMARY KEY,"
            f" paused {d.integer} NOT NULL DEFAULT 0, next_at {d.time_type},"
            f" doc {d.blob} NOT NULL)"
        ),
        d.sql(
            "CREATE INDEX IF NOT EXISTS schedules_next ON {schedules} (next_at) WHERE paused = 0"
        ),
    ]


def search_columns(d: Dialect, started_at: str) -> list[str]:
    """What the job list's search and the timeline added: ``jobs.name_key``, the job's name
    casefolded (:func:`outlast.store.query.fold`; filled by :func:`fill_name_keys`, which
    needs Python's casefold), and ``jobs.started_at`` (its last start), so neither reads a
    document. ``started_at``: the engine's expression of a document's ``started_at``."""
    return [
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN name_key {d.text}"),
        d.sql(f"ALTER TABLE {{jobs}} ADD COLUMN started_at {d.time_type}"),
        d.sql(f"UPDATE {{jobs}} SET started_at = {started_at}"),
    ]


#: The columns of a label's row: its job's ``created_at`` too, so that a listing of a label
#: reads its jobs newest first from ``labels_kv`` (:mod:`outlast.store._sqllist`).
LABEL_COLUMNS = ("job_id", "key", "value", "created_at")
#: One label's row (:func:`label_rows`), in the dialect's ``?`` placeholders.
LABEL_INSERT = f"INSERT INTO {{labels}} ({', '.join(LABEL_COLUMNS)}) VALUES (?, ?, ?, ?)"


def label_rows(d: Dialect, state: JobState) -> list[tuple[Any, ...]]:
    """The rows of ``state``'s labels (:data:`LABEL_COLUMNS`)."""
    created = d.time(state.created_at)
    return [(state.id, key, value, created) for key, value in state.labels.items()]


def labels_by_time(d: Dialect, old_index: str) -> list[str]:
    """What made a listing of a label read a page, not every job with the label: the job's
    ``created_at`` on each label row (the column ``labels.created_at``, added by the engine's
    own step, which may run again), and ``labels_kv`` in the listing's order (it replaces
    ``old_index``, of key and value only)."""
    return [
        d.sql(
            "UPDATE {labels} SET created_at ="
            " (SELECT created_at FROM {jobs} WHERE {jobs}.id = {labels}.job_id)"
        ),
        f"DROP INDEX IF EXISTS {old_index}",
        d.sql("CREATE INDEX IF NOT EXISTS labels_kv ON {labels} (key, value, created_at, job_id)"),
    ]


def name_index(d: Dialect) -> str:
    """The index of the name search (:mod:`outlast.store._sqllist`): the distinct names in
    a few seeks, and each name's jobs newest first."""
    return d.sql("CREATE INDEX IF NOT EXISTS jobs_name ON {jobs} (name_key, created_at, id)")


def fill_name_keys(d: Dialect, name: str, read: Any, write_many: Any) -> None:
    """Fill ``jobs.name_key`` of the jobs stored before it existed, 5,000 at a time.
    ``name``: the engine's expression of a document's ``name``; ``read(sql, params)``,
    ``write_many(sql, rows)``: the migration's transaction."""
    after = ""
    while True:
        sql = f"SELECT id, {name} FROM {{jobs}} WHERE id > ? ORDER BY id LIMIT 5000"
        rows = read(d.sql(sql), (after,))
        if not rows:
            return
        write_many(
            d.sql("UPDATE {jobs} SET name_key = ? WHERE id = ?"),
            [(fold(n) if isinstance(n, str) else None, job_id) for job_id, n in rows],
        )
        after = rows[-1][0]


def worker_table(d: Dialect) -> list[str]:
    """The registry of live workers (``Store.register_worker``): one row per process."""
    return [
        d.sql(
            f"CREATE TABLE IF NOT EXISTS {{workers}} (name {d.text} PRIMARY KEY,"
            f" doc {d.blob} NOT NULL)"
        )
    ]


#: A transition's event (``tx.write_many`` of many: one statement on PostgreSQL).
EVENT_INSERT = "INSERT INTO {events} (job_id, seq, doc) VALUES (?, ?, ?)"
#: The columns of ``jobs`` a change can touch without touching the never-changing ones (and
#: their indexes): kind, queue and created_at are set once. Every pool's claim and outcome
#: writes these, by ``tx.write_many`` (PostgreSQL: one statement for many jobs).
SLIM_UPDATE = (
    "UPDATE {jobs} SET status = ?, worker = ?, run_after = ?, finished_at = ?, expires_at = ?,"
    " started_at = ?, doc = ?, seq = ? WHERE id = ?"
)
_FULL = (
    "UPDATE {jobs} SET status = ?, kind = ?, queue = ?, worker = ?, run_after = ?,"
    " created_at = ?, finished_at = ?, expires_at = ?, priority = ?, retry_of = ?,"
    " unique_key = ?, limit_key = ?, limit_slots = ?, started_at = ?, doc = ?, seq = ?"
    " WHERE id = ?"
)


def due_indexes(d: Dialect, drop: str) -> list[str]:
    """The indexes of :data:`DUE_PARTS`, in place of the ``jobs_due`` that held every
    claimable job (``drop``: its name as ``DROP INDEX`` takes it)."""
    return [
        f"DROP INDEX IF EXISTS {drop}",
        *(
            d.sql(
                f"CREATE INDEX IF NOT EXISTS {index} ON {{jobs}} (queue, {CLAIM_ORDER})"
                f" WHERE {CLAIMABLE} AND {holds}"
            )
            for index, holds in DUE_PARTS
        ),
    ]


def slim_row(d: Dialect, new: JobState, doc: bytes, seq: int) -> tuple[Any, ...]:
    """The parameters of :data:`SLIM_UPDATE` writing ``new`` (its document ``doc``, the
    row's ``seq`` after its events), in that statement's order, the id last."""
    return (
        str(new.status),
        new.worker,
        d.time(new.run_after),
        d.time(new.finished_at),
        d.time(expires_at(new)),
        d.time(new.started_at),
        doc,
        seq,
        new.id,
    )


#: A job of a concurrency key may start while fewer than the key's slots (the ``limits``
#: table's, else the job's own ``limit``, else 1) of its jobs run (``j`` is the job's row).
ROOM = (
    "(j.limit_key IS NULL OR (SELECT count(*) FROM {jobs} r WHERE r.limit_key = j.limit_key"
    " AND r.status = 'running') < COALESCE((SELECT l.slots FROM {limits} l"
    " WHERE l.key = j.limit_key), j.limit_slots, 1))"
)
#: When a pending job is due.
DUE = "COALESCE(run_after, created_at)"
#: How far past its clock a claim reads a priority's jobs in ``jobs_due`` (each is then
#: checked exactly): a job without ``run_after`` is due from its ``created_at``, written by
#: the clock of the host that made it, so a host whose clock runs ahead of the claimer's by
#: more than this has its jobs wait for the difference.
SKEW = timedelta(seconds=10)
#: The order claims take due jobs in (and the ``jobs_due`` index of both engines).
CLAIM_ORDER = f"priority DESC, {DUE}, id"
#: Jobs a worker may hold: running, or pending and bound to the worker that will retry them
#: (a running job always names its worker). Both engines index exactly these (``jobs_live``).
LIVE = "worker IS NOT NULL AND status IN ('running', 'pending')"
#: The statuses of a live job (one that holds its unique key).
LIVE_STATUSES = "('pending', 'running', 'paused')"
#: Jobs a claim may take (with ``run_after`` passed).
CLAIMABLE = "status = 'pending' AND worker IS NULL"
#: Jobs that a worker of their own runs, not a pool: commands and spawned jobs.
_OWN_WORKER = f"(kind = 'command' OR queue = '{DEDICATED}')"
#: The jobs that wait for a slot of their concurrency key with no worker (parked command and
#: spawned jobs; a delayed one's worker holds it while it waits for its time): the rows of
#: ``jobs_parked``, in claim order per key, so :meth:`Store.parked` reads a key's first ones
#: and :meth:`Store.parked_keys` the keys, an index step each, however many wait.
PARKED = f"{CLAIMABLE} AND limit_key IS NOT NULL AND {_OWN_WORKER}"


def parked_index(d: Dialect) -> str:
    return d.sql(
        f"CREATE INDEX IF NOT EXISTS jobs_parked ON {{jobs}} (limit_key, {CLAIM_ORDER})"
        f" WHERE {PARKED}"
    )


#: The command and spawned jobs with a time of their own that no worker is bound to: the
#: rows of ``jobs_timed``, in time order, which the store's timer pages through
#: (:meth:`Store.timed`), an index step a job, however many wait for their time.
TIMED = f"{CLAIMABLE} AND run_after IS NOT NULL AND {_OWN_WORKER}"


#: The command and spawned jobs of no key and no time of their own that no worker is bound
#: to: the rows of ``jobs_unclaimed``, each there from its creation until its worker takes
#: it (a moment), so that the maintainer's look for jobs nobody took (:meth:`Store.unclaimed`)
#: reads those and the due rows of ``jobs_timed``, not every job waiting for its time.
UNCLAIMED = f"{CLAIMABLE} AND run_after IS NULL AND limit_key IS NULL AND {_OWN_WORKER}"


def timed_indexes(d: Dialect) -> list[str]:
    return [
        d.sql(f"CREATE INDEX IF NOT EXISTS jobs_timed ON {{jobs}} (run_after, id) WHERE {TIMED}"),
        d.sql(f"CREATE INDEX IF NOT EXISTS jobs_unclaimed ON {{jobs}} (id) WHERE {UNCLAIMED}"),
    ]


#: The columns of a new job's row, in the order of :meth:`SqlStore._columns`, its document
#: and its id (each engine's :meth:`SqlStore._extra_columns` follow).
JOB_COLUMNS = (
    "status",
    "kind",
    "queue",
    "worker",
    "run_after",
    "created_at",
    "finished_at",
    "expires_at",
    "priority",
    "retry_of",
    "unique_key",
    "limit_key",
    "limit_slots",
    "doc",
    "id",
)


#: The claimable jobs, each in one of three partial indexes of one shape (the queue, then
#: :data:`CLAIM_ORDER`): ``jobs_due`` holds those a pool runs (functions and pipelines) of no
#: concurrency key, ``jobs_due_keyed`` those of a key, and ``jobs_due_commands`` the command
#: jobs, whose supervisors start them (a command of a full group waits there, and a delayed
#: one), so that a pool's claim never walks past those. The keyed jobs are apart so that
#: the jobs of a full key, which a claim passes over, hold up no other job: a claim walks a
#: bounded window of them in claim order and, when that window is all full keys, reads the
#: keys one by one (:data:`BY_KEY`, :meth:`SqlStore._by_key`). ``(index, the condition that
#: puts a job in it)``.
DUE_PARTS = (
    ("jobs_due", "kind <> 'command' AND limit_key IS NULL"),
    ("jobs_due_keyed", "kind <> 'command' AND limit_key IS NOT NULL"),
    ("jobs_due_commands", "kind = 'command'"),
)
#: The part of :data:`DUE_PARTS` that holds a pool's jobs of a concurrency key.
KEYED = 1
#: The same jobs as ``jobs_due_keyed``, key by key: ``(queue, limit_key, CLAIM_ORDER)``.
BY_KEY = "jobs_due_bykey"
_POOL_KINDS = tuple(sorted(str(k) for k in Kind if k != Kind.COMMAND))


def window(want: int) -> int:
    """How many keyed jobs of one priority a claim of ``want`` walks in claim order before
    it reads the keys one by one instead (each job of a full key it passes costs ~1 us on
    SQLite, ~2 us on PostgreSQL; a key by key read costs a few index steps per key)."""
    return 2 * want + 32


def due_parts(kinds: Sequence[Kind] | None) -> list[tuple[int, tuple[str, ...]]]:
    """The parts of :data:`DUE_PARTS` a read of ``kinds`` (none: every kind) reads, each
    with the kinds it still has to pick (none: every kind the part holds)."""
    return list(_due_parts(tuple(kinds or ())))


@functools.lru_cache(maxsize=64)
def _due_parts(kinds: tuple[Kind, ...]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    names = {str(k) for k in kinds} or {str(k) for k in Kind}
    parts: list[tuple[int, tuple[str, ...]]] = []
    pools = tuple(sorted(names - {str(Kind.COMMAND)}))
    if pools:
        picked = () if pools == _POOL_KINDS else pools
        parts += [(0, picked), (KEYED, picked)]
    if str(Kind.COMMAND) in names:
        parts.append((2, ()))
    return tuple(parts)


def by_key_index(d: Dialect) -> str:
    return d.sql(
        f"CREATE INDEX IF NOT EXISTS {BY_KEY} ON {{jobs}} (queue, limit_key, {CLAIM_ORDER})"
        f" WHERE {CLAIMABLE} AND {DUE_PARTS[KEYED][1]}"
    )


def keyed_indexes(d: Dialect, drop: str) -> list[str]:
    """``jobs_due`` without the keyed jobs, ``jobs_due_keyed`` and ``jobs_due_bykey`` with
    them (``drop``: the old ``jobs_due`` as ``DROP INDEX`` takes it)."""
    return [*due_indexes(d, drop), by_key_index(d)]


#: The due jobs of a priority's range (parameters: its end, the claim's clock plus
#: :data:`SKEW`, then the clock): each checked exactly, and for room (``j`` is the job's row).
DUE_TIMES = f"{DUE} <= ? AND (run_after IS NULL OR run_after <= ?)"
DUE_RANGE = f"{DUE_TIMES} AND {ROOM}"


def due_range(part: int) -> str:
    """:data:`DUE_RANGE` of a part of :data:`DUE_PARTS` in SQLite's reads: without the room
    of a key in the part of the jobs of no key. (PostgreSQL's claim keeps it: without it,
    its planner took the index across queues for a claim of one.)"""
    return DUE_TIMES if part == 0 else DUE_RANGE


def priority_probe(source: str, where: str, below: str = "") -> str:
    """The highest priority among the rows of ``source`` (``{jobs}``, with its index) where
    ``where`` holds, or the highest one under ``below``."""
    under = f" AND priority < {below}" if below else ""
    return f"SELECT priority FROM {source} WHERE {where}{under} ORDER BY priority DESC LIMIT 1"


def due_where(d: Dialect, part: int, kinds: int) -> str:
    """The claimable jobs of one queue in ``part`` (parameters: the queue, then ``kinds``
    kinds; none, every kind of the part)."""
    where = f"{CLAIMABLE} AND {DUE_PARTS[part][1]} AND queue = ?"
    if kinds:
        where += " AND " + d.one_of("kind", ["?"] * kinds)[0]
    return where


@functools.lru_cache(maxsize=256)
def due_texts(d: Dialect, part: int, kinds: int) -> tuple[str, str, str, str]:
    """A claim's reads of one queue (:meth:`SqlStore._due_rows`) in ``part``, each a range of
    its index (:func:`due_where` says the first parameters): ``SELECT id, doc, seq,
    priority, due`` of the due jobs of the queue's highest priority, then of a given one
    (each earliest due first; parameters then: [those again, for the highest | the
    priority], the range's end, which is the claim's clock plus :data:`SKEW`, the clock, the
    limit); the queue's highest priority, and the next one below a given one (then: the
    priority)."""
    where = due_where(d, part, kinds)
    using = d.using(DUE_PARTS[part][0])
    top = priority_probe(f"{{jobs}}{using}", where)

    def read(level: str) -> str:
        if part == KEYED:  # a window of the range in claim order, then each job's room
            # (no ORDER BY outside: SQLite reads the window as a co-routine, in its order,
            # and stops at the limit; a sort would read and check the whole window first)
            return (
                f"SELECT id, doc, seq, priority, due FROM (SELECT id, doc, seq, priority,"
                f" {DUE} AS due, limit_key, limit_slots FROM {{jobs}}{using} WHERE {where}"
                f" AND priority = {level} AND {DUE_TIMES} ORDER BY {DUE}, id LIMIT ?) j"
                f" WHERE {ROOM} LIMIT ?"
            )
        return (
            f"SELECT id, doc, seq, priority, {DUE} FROM {{jobs}} j{using} WHERE {where}"
            f" AND priority = {level} AND {due_range(part)} ORDER BY {DUE}, id LIMIT ?"
        )

    return read(f"({top})"), read("?"), top, priority_probe(f"{{jobs}}{using}", where, "?")


@functools.lru_cache(maxsize=64)
def keyed_texts(d: Dialect, kinds: int, ranged: bool = True) -> tuple[str, str, str]:
    """The reads of :meth:`SqlStore._by_key` for one queue's keyed jobs of one priority
    (:func:`due_where` says the first parameters, given three times in the first read):
    whether a claim's window (:func:`window`) was all there was (``SELECT count(*)``;
    then: the priority, the range's two ends, the window); the first due job of each key
    with room, earliest first (``id, doc, seq, priority, due, limit_key, free slots,
    run_after``; then: the priority, [the range's ends,] the limit); and a key's due jobs
    after its first (then: the key, the priority, [the range's ends,] the limit). Without
    ``ranged``, every job of the priority, due or not (for :meth:`SqlStore._next_due`)."""
    where = due_where(d, KEYED, kinds)
    using = d.using(DUE_PARTS[KEYED][0])
    by_key = d.using(BY_KEY)
    times = f" AND {DUE_TIMES}" if ranged else ""
    walked = (
        f"SELECT count(*) FROM (SELECT 1 FROM {{jobs}}{using} WHERE {where} AND priority = ?"
        f" AND {DUE_TIMES} ORDER BY {DUE}, id LIMIT ?) w"
    )
    # each step in the index's order, not min(): with no statistics yet, PostgreSQL read
    # every row of the queue's keyed jobs for min() (a new store's first claims)
    step = f"SELECT limit_key FROM {{jobs}}{by_key} WHERE {where}"
    free = (
        "COALESCE((SELECT l.slots FROM {limits} l WHERE l.key = j.limit_key), j.limit_slots,"
        " 1) - (SELECT count(*) FROM {jobs} r WHERE r.limit_key = j.limit_key"
        " AND r.status = 'running')"
    )
    heads = (
        f"WITH RECURSIVE p(v) AS (SELECT ({step} ORDER BY limit_key LIMIT 1) UNION ALL SELECT"
        f" ({step} AND limit_key > p.v ORDER BY limit_key LIMIT 1) FROM p WHERE p.v IS NOT NULL)"
        f" SELECT j.id, j.doc, j.seq, j.priority, {DUE}, j.limit_key, {free}, j.run_after"
        f" FROM {{jobs}} j WHERE j.id IN (SELECT (SELECT id FROM {{jobs}}{by_key}"
        f" WHERE {where} AND limit_key = p.v AND priority = ?"
        f"{times} ORDER BY {DUE}, id LIMIT 1) FROM p WHERE p.v IS NOT NULL) AND {ROOM}"
        f" ORDER BY {DUE}, j.id LIMIT ?"
    )
    more = (
        f"SELECT id, doc, seq, priority, {DUE} FROM {{jobs}}{by_key} WHERE {where}"
        f" AND limit_key = ? AND priority = ?{times} ORDER BY {DUE}, id LIMIT ? OFFSET 1"
    )
    return d.sql(walked), d.sql(heads), d.sql(more)


@functools.lru_cache(maxsize=64)
def due_query_text(d: Dialect, shapes: tuple[tuple[int, int], ...]) -> str:
    """The text of :meth:`SqlStore._due_query`: the first range of each read, whose
    ``(part, kinds)`` are ``shapes``."""
    texts = [due_texts(d, part, kinds)[0] for part, kinds in shapes]
    if len(texts) == 1:
        return d.sql(texts[0])
    # and a row of each read's highest priority (NULL: it holds no job), so that a read that
    # ran short goes down from there, and an empty one not at all, with no read more
    marks = [
        f"SELECT NULL, NULL, NULL, ({due_texts(d, part, kinds)[2]}), NULL, {i}"
        for i, (part, kinds) in enumerate(shapes)
    ]
    reads = [f"SELECT *, {i} FROM ({t})" for i, t in enumerate(texts)]
    return d.sql(" UNION ALL ".join(reads + marks))


@functools.lru_cache(maxsize=64)
def insert_sql(d: Dialect, extra: tuple[str, ...], fired: bool = False) -> str:
    """The insert of a job's row; ``fired``: a schedule's job, made at most once (its id is
    the key of its fire time), so a second insert does nothing."""
    names = ", ".join([*JOB_COLUMNS, *extra])
    marks = ", ".join("?" * (15 + len(extra)))
    sql = f"INSERT INTO {{jobs}} ({names}) VALUES ({marks})"
    return d.sql(sql + (" ON CONFLICT (id) DO NOTHING" if fired else ""))


def unique_insert_sql(d: Dialect, extra: tuple[str, ...]) -> str:
    """The insert of a job with a unique key: nothing (no row back) while a live job holds
    the key (the ``jobs_unique`` partial index)."""
    return insert_sql(d, extra) + " ON CONFLICT DO NOTHING RETURNING id"


if TYPE_CHECKING:  # an interface for annotations only (a Protocol costs import time)
    from typing import Protocol

    class Tx(Protocol):
        """One transaction of an engine. ``write`` may be deferred until the next ``read`` or
        the commit (PostgreSQL pipelines them into one round trip); ``read`` returns rows."""

        def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...
        def write(self, sql: str, params: Sequence[Any] = ()) -> None: ...
        def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...
        def insert_rows(
            self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
        ) -> None:
            """Insert ``rows`` into ``table`` (its name in SQL) as fast as the engine can
            (SQLite: one prepared statement over them; PostgreSQL: ``COPY``)."""

        def wake(self, job_id: str, claimable: bool, interrupt: bool = False) -> None:
            """Wake the job's waiters (if ``claimable``, idle pools too; if ``interrupt``, the
            pools: a running job was canceled or deleted) once committed."""

        def wake_pools(self, job_id: str) -> None:
            """A new job ``job_id`` is claimable: wake idle pools (and the listeners of every
            job, who hear the pools' channel) once committed. Nobody can wait on a job that
            did not exist, so its own channel is not woken."""

        def relax(self) -> None:
            """This transaction changes no status: its commit need not wait to be durable."""


#: Parsed documents kept per store object, reused only if byte-identical.
STATE_CACHE = 4096


class StateCache:
    """The states a store object last wrote or read, each with its document's bytes: a read
    whose stored bytes are exactly those reuses the state instead of parsing and checking
    the document again (~50 us here). States are immutable, so sharing one is safe; a
    transition is read back right after it is written (a pool's claim, then the outcome),
    and a job polled while it does not change is read again and again. The oldest entry
    goes past :data:`STATE_CACHE`. Thread-safe.

    With each state it keeps the row's ``seq`` when it was known (written, or read with
    the document): :meth:`guess` hands both to a write that is checked against the row
    itself (PostgreSQL's guarded outcomes), never trusted alone."""

    def __init__(self) -> None:
        # an OrderedDict: its oldest entry goes in constant time (a dict's first key is
        # found by scanning past the slots of the keys removed before it: ~6 us a call here)
        self._docs: OrderedDict[str, tuple[bytes, JobState, int | None]] = OrderedDict()
        self._lock = threading.Lock()

    def decode(self, job_id: str, raw: Any, seq: int | None = None) -> JobState:
        hit = self._docs.get(job_id)
        if hit is not None and hit[0] == raw:
            if seq is not None and hit[2] != seq:
                self.remember(hit[1], hit[0], seq)
            return hit[1]
        state = codec.decode(job_id, raw)
        self.remember(state, bytes(raw) if isinstance(raw, memoryview) else raw, seq)
        return state

    def remember(self, state: JobState, doc: bytes, seq: int | None = None) -> None:
        with self._lock:
            self._docs[state.id] = (doc, state, seq)
            if len(self._docs) > STATE_CACHE:
                self._docs.popitem(last=False)

    def guess(self, job_id: str) -> tuple[bytes, JobState, int] | None:
        """The document, state and ``seq`` this store object last wrote or read for the
        job, if its ``seq`` is known: what the row probably holds now."""
        hit = self._docs.get(job_id)
        if hit is None or hit[2] is None:
            return None
        return hit[0], hit[1], hit[2]

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._docs.pop(job_id, None)


class SqlStore(Store):
    """The store verbs over SQL, for an engine that provides :meth:`_tx` and :meth:`_query`."""

    dialect: Dialect

    # ------------------------------------------------------------------ the engine's part
    @contextlib.contextmanager
    def _tx(self, what: str) -> Iterator[Tx]:  # pragma: no cover - abstract
        """A read-modify-write transaction; failures are translated into StoreError."""
        raise NotImplementedError
        yield

    def _query(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One read outside a transaction."""
        raise NotImplementedError

    #: The states this store object last wrote or read, by job (engines make it: a
    #: :class:`StateCache` each).
    _states: StateCache

    def _decode(self, job_id: str, raw: Any, seq: int | None = None) -> JobState:
        """A stored document as a state: the one this process last wrote or read for the job
        if the stored bytes are exactly that (:class:`StateCache`); ``seq``: the row's."""
        return self._states.decode(job_id, raw, seq)

    def _remember(self, state: JobState, doc: bytes, seq: int | None = None) -> None:
        """Note the document just written for ``state`` (see ``_decode``), with the row's
        ``seq`` when known."""
        self._states.remember(state, doc, seq)

    def _extra_columns(self, state: JobState) -> dict[str, Any]:
        """Columns of a new job's row beyond :meth:`_columns`: what the search and the
        timeline read (engines add their own: PostgreSQL, its lock key)."""
        return {"name_key": fold(state.name), "started_at": self.dialect.time(state.started_at)}

    def _forget(self, job_id: str) -> None:
        """Remove what a deleted job left outside the database (its log and lock files);
        engines add theirs to this."""
        self._states.forget(job_id)

    # ------------------------------------------------------------------ rows
    def _new_row(self, state: JobState, doc: bytes) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """A new job's row: the names of its :meth:`_extra_columns`, and every value in the
        order of ``JOB_COLUMNS``, the document, the id, then those extra columns."""
        extra = self._extra_columns(state)
        return tuple(extra), (*self._columns(state), doc, state.id, *extra.values())

    def _columns(self, state: JobState) -> tuple[Any, ...]:
        """The queried columns of a job's row: status, kind, queue, worker, run_after,
        created_at, finished_at, expires_at, priority, retry_of, unique_key, limit_key,
        limit_slots."""
        d = self.dialect
        return (
            str(state.status),
            str(state.kind),
            state.queue,
            state.worker,
            d.time(state.run_after),
            d.time(state.created_at),
            d.time(state.finished_at),
            d.time(expires_at(state)),
            state.priority,
            state.retry_of,
            state.unique_key,
            state.limit_key,
            state.limit,
        )

    def _insert(self, state: JobState) -> JobState | None:
        [holder] = self._insert_many([state])
        return holder

    def _insert_many(self, states: Sequence[JobState]) -> builtins.list[JobState | None]:
        """Insert new jobs in one transaction; for each, None, or the live job that holds
        its unique key (then it is not inserted)."""
        if len(states) > 1 and all(s.unique_key is None for s in states):
            return self._insert_plain(states)
        for _ in range(5):  # a holder that ended between the insert and its read: again
            out: list[JobState | None] = []
            try:
                docs = [codec.encode(state) for state in states]  # once each
                with self._tx(f"create {states[0].id}" if len(states) == 1 else "create") as tx:
                    for state, doc in zip(states, docs, strict=True):
                        out.append(self._insert_one(tx, state, doc))
            except _HolderGone:
                continue  # rolled back: try the whole batch again
            for state, doc, holder in zip(states, docs, out, strict=True):
                if holder is None:
                    self._remember(state, doc, 0)  # a new row: no events yet
            return out
        raise StoreError("could not insert a job with a unique key: its holder kept changing")

    def _insert_plain(self, states: Sequence[JobState]) -> builtins.list[JobState | None]:
        """Many jobs without unique keys (nothing can refuse them): their rows, then their
        labels, as one statement each over many rows, in one transaction; each document
        encoded once."""
        docs = [codec.encode(state) for state in states]
        rows: list[tuple[Any, ...]] = []
        names: tuple[str, ...] = ()
        for state, doc in zip(states, docs, strict=True):
            names, row = self._new_row(state, doc)  # the same columns for every job
            rows.append(row)
        d = self.dialect
        labels = [row for s in states if s.labels for row in label_rows(d, s)]
        with self._tx(f"create {len(states)} jobs") as tx:
            tx.insert_rows(d.sql("{jobs}"), (*JOB_COLUMNS, *names), rows)
            self._count(tx, Counter(_key(s) for s in states))
            if labels:
                tx.insert_rows(d.sql("{labels}"), LABEL_COLUMNS, labels)
            tx.wake_pools(states[0].id)
        for state, doc in zip(states, docs, strict=True):
            self._remember(state, doc, 0)  # a new row: no events yet
        return [None] * len(states)

    def _insert_one(self, tx: Tx, state: JobState, doc: bytes) -> JobState | None:
        d = self.dialect
        names, values = self._new_row(state, doc)
        if state.unique_key is None:
            tx.write(insert_sql(d, names), values)
        elif not tx.read(unique_insert_sql(d, names), values):
            sql = f"SELECT id, doc FROM {{jobs}} WHERE unique_key = ? AND status IN {LIVE_STATUSES}"
            found = tx.read(d.sql(sql), (state.unique_key,))
            if not found:
                raise _HolderGone
            return self._decode(found[0][0], found[0][1])
        self._count(tx, Counter([_key(state)]))
        self._put_labels(tx, state)
        tx.wake_pools(state.id)
        return None

    def _retries_of(self, job_id: str) -> builtins.list[str]:
        sql = self.dialect.sql("SELECT id FROM {jobs} WHERE retry_of = ? ORDER BY created_at")
        return [row[0] for row in self._query(f"retries of {job_id}", sql, (job_id,))]

    def _put_labels(self, tx: Tx, state: JobState, fired: bool = False) -> None:
        if state.labels:
            sql = LABEL_INSERT
            if fired:  # made at most once: see insert_sql
                sql += " ON CONFLICT (job_id, key) DO NOTHING"
            tx.write_many(self.dialect.sql(sql), label_rows(self.dialect, state))

    def _read(self, job_id: str) -> JobState:
        sql = self.dialect.sql("SELECT doc FROM {jobs} WHERE id = ?")
        rows = self._query(f"read {job_id}", sql, (job_id,))
        if not rows:
            raise JobNotFound(f"no job {job_id}")
        return self._decode(job_id, rows[0][0])

    def _stats(self, now: datetime, window: float) -> Stats:
        """Reads whose cost does not grow with the jobs the store keeps: the counts the
        engine keeps by queue, status and kind (:mod:`outlast.store._counts`); the oldest due
        job per queue that waits (the indexes of :data:`DUE_PARTS` alone); the jobs finished
        in the window by kind and outcome, and the times of the most recent ``RECENT_MAX`` of them
        (``jobs_finished``, no document read)."""
        d = self.dialect
        stats = Stats(at=now, window=window)
        for queue, status, kind, count in self._job_counts():
            stats.jobs[(queue, status, kind)] += int(count)
        for index, holds in DUE_PARTS:  # as the live jobs' counts: what the backlog is
            sql = d.sql(
                f"SELECT queue, min({DUE}) FROM {{jobs}}{d.using(index)}"
                f" WHERE {CLAIMABLE} AND {holds} AND {DUE} <= ? GROUP BY queue"
            )
            for queue, oldest in self._query("stats", sql, (d.time(now),)):
                oldest_at = _as_time(oldest)
                if oldest_at is not None:
                    since = max(0.0, (now - oldest_at).total_seconds())
                    stats.oldest_due[queue] = max(stats.oldest_due.get(queue, 0.0), since)
        since = d.time(now - timedelta(seconds=window))
        sql = d.sql(
            "SELECT kind, status, count(*) FROM {jobs} WHERE finished_at >= ? GROUP BY kind, status"
        )
        for kind, status, count in self._query("stats", sql, (since,)):
            stats.finished[(kind, status)] += int(count)
        started = "COALESCE(started_at, finished_at)"
        sql = d.sql(
            f"SELECT kind, status, {d.between('created_at', started)},"
            f" {d.between(started, 'finished_at')} FROM {{jobs}} WHERE finished_at >= ?"
            f" ORDER BY finished_at DESC LIMIT {stats_module.RECENT_MAX}"
        )
        for kind, status, waited, ran in self._query("stats", sql, (since,)):
            stats.recent.append((kind, status, max(0.0, float(waited)), max(0.0, float(ran))))
        add_schedules(stats, self.schedules(), now)
        return stats

    def _running_by_worker(self) -> dict[str, int]:
        sql = "SELECT worker, count(*) FROM {jobs} WHERE status = 'running' GROUP BY worker"
        rows = self._query("count running jobs", self.dialect.sql(sql))
        return {worker: int(n) for worker, n in rows if worker}

    def _job_counts(self) -> list[Row]:
        """``(queue, status, kind, jobs)`` of every key with jobs, as the engine counts them."""
        raise NotImplementedError

    def _count(self, tx: Tx, changes: Counter[tuple[str, str, str]]) -> None:
        """Count, in ``tx``, jobs that came (+1), went (-1) or moved between keys, by
        (queue, status, kind). An engine whose triggers count them (PostgreSQL) does
        nothing; SQLite, where a trigger on ``jobs`` costs ~20 µs per row written, counts
        the finished ones here (:mod:`outlast.store._counts`)."""

    def _finished_since(self, since: datetime, until: datetime) -> list[Row]:
        """One read of three numbers per job through ``jobs_finished`` (no document; a
        range bounded on both sides: a planner without statistics reads it through the
        index too)."""
        d = self.dialect
        waited = d.between("created_at", "COALESCE(started_at, finished_at)")
        sql = d.sql(
            f"SELECT {d.seconds('finished_at')}, status, {waited} FROM {{jobs}}"
            " WHERE finished_at >= ? AND finished_at < ?"  # only finished jobs have one
        )
        return self._query("timeline", sql, (d.time(since), d.time(until)))

    def get_many(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        found: dict[str, JobState] = {}
        unique = sorted({check_id(job_id) for job_id in job_ids})
        for start in range(0, len(unique), _CHUNK):
            where, params = self.dialect.one_of("id", unique[start : start + _CHUNK])
            sql = self.dialect.sql(f"SELECT id, doc FROM {{jobs}} WHERE {where}")
            for job_id, doc in self._query("read jobs", sql, params):
                found[job_id] = self._decode(job_id, doc)
        return found

    def _rows(self, tx: Tx, ids: Sequence[str]) -> dict[str, tuple[Any, int]]:
        """``id -> (stored document, seq)`` of those of ``ids`` that exist, locked for the
        transaction (rows in id order, so two transactions never deadlock)."""
        found: dict[str, tuple[Any, int]] = {}
        unique = sorted(set(ids))
        d = self.dialect
        for start in range(0, len(unique), _CHUNK):
            where, params = d.one_of("id", unique[start : start + _CHUNK])
            sql = f"SELECT id, doc, seq FROM {{jobs}} WHERE {where} ORDER BY id{d.for_update}"
            sql = d.sql(sql)
            for job_id, doc, seq in tx.read(sql, params):
                found[job_id] = (doc, seq)
        return found

    def _write(self, tx: Tx, writes: Sequence[Write]) -> list[list[ProgressEvent]]:
        """Add the writes of several transitions to ``tx``: all their events in one statement,
        the last state of each job in another, their labels; returns each one's events.
        When no write changes a status, the commit need not wait to be durable."""
        now = utcnow()
        d = self.dialect
        stored: list[list[ProgressEvent]] = []
        first: dict[str, JobState] = {}
        last: dict[str, tuple[JobState, int]] = {}
        for old, new, seq, events in writes:
            stored.append(machine.number(new.id, seq, events, now) if events else [])
            first.setdefault(new.id, old)
            last[new.id] = (new, seq + len(events))
        event_rows = [(e.job_id, e.seq, codec.encode_event(e)) for mine in stored for e in mine]
        if event_rows:
            tx.write_many(d.sql(EVENT_INSERT), event_rows)
        slim, full = [], []
        for job_id, (new, seq) in last.items():
            old = first[job_id]
            doc = codec.encode(new)
            self._remember(new, doc, seq)  # checked against the stored bytes when read back
            if (new.queue, new.kind, new.created_at) == (old.queue, old.kind, old.created_at):
                slim.append(slim_row(d, new, doc, seq))
            else:
                full.append((*self._columns(new), d.time(new.started_at), doc, seq, job_id))
            if new.labels != old.labels:
                tx.write(d.sql("DELETE FROM {labels} WHERE job_id = ?"), (job_id,))
                self._put_labels(tx, new)
        if slim:
            tx.write_many(d.sql(SLIM_UPDATE), slim)
        if full:
            tx.write_many(d.sql(_FULL), full)
        moved: Counter[tuple[str, str, str]] = Counter()
        for job_id, (new, _) in last.items():
            old = first[job_id]
            if (old.queue, old.status, old.kind) != (new.queue, new.status, new.kind):
                moved[(old.queue, str(old.status), str(old.kind))] -= 1
                moved[(new.queue, str(new.status), str(new.kind))] += 1
        if moved:
            self._count(tx, moved)
        if all(old.status == new.status for old, new, _, _ in writes):
            tx.relax()
        return stored

    def _apply_one(self, job_id: str, fn: Transition) -> Applied:
        """:meth:`_apply_many` of one job, on the shortest path (a progress report, an
        outcome: this is the transition workers make most)."""
        d = self.dialect
        with self._tx(f"update {job_id}") as tx:
            rows = tx.read(
                d.sql(f"SELECT doc, seq FROM {{jobs}} WHERE id = ?{d.for_update}"), (job_id,)
            )
            if not rows:
                raise JobNotFound(f"no job {job_id}")
            state = self._decode(job_id, rows[0][0], rows[0][1])
            change = fn(state)
            if change is None:
                return Applied(state, [])
            [stored] = self._write(tx, [(state, change.state, rows[0][1], change.events)])
            tx.wake(job_id, machine.wakes_pools(state, change), change.interrupts)
        return Applied(change.state, stored)

    def _apply_many(
        self, items: builtins.list[tuple[str, Transition]], strict: bool = False
    ) -> builtins.list[Applied]:
        """Lock the rows, apply the transitions in order (a job that comes back sees its
        earlier change), write and wake, commit."""
        if not items:
            return []
        results: list[tuple[JobState, int | None]] = []  # the state, and its index in writes
        writes: list[Write] = []
        what = f"update {items[0][0]}" if len(items) == 1 else "update many"
        with self._tx(what) as tx:
            found = self._rows(tx, [job_id for job_id, _ in items])
            current: dict[str, tuple[JobState, int]] = {}
            for job_id, fn in items:
                try:
                    if job_id not in current:
                        if job_id not in found:
                            raise JobNotFound(f"no job {job_id}")
                        doc, seq = found[job_id]
                        current[job_id] = (self._decode(job_id, doc, seq), seq)
                except (JobNotFound, CorruptJob) as exc:
                    if strict:
                        raise
                    log.warning("not updating job %s: %s", job_id, exc)
                    continue
                state, seq = current[job_id]
                change = fn(state)
                if change is None:
                    results.append((state, None))
                    continue
                results.append((change.state, len(writes)))
                writes.append((state, change.state, seq, change.events))
                current[job_id] = (change.state, seq + len(change.events))
                tx.wake(job_id, machine.wakes_pools(state, change), change.interrupts)
            stored = self._write(tx, writes) if writes else []
        return [Applied(state, [] if i is None else stored[i]) for state, i in results]

    # ------------------------------------------------------------------ reads
    def _select(
        self, query: Filter, limit: int | None, before: str | None
    ) -> builtins.list[JobState]:
        return listing.select(self, query, limit, before)

    def _ids_starting(self, prefix: str, limit: int) -> builtins.list[str]:
        """Up to ``limit`` ids that start with ``prefix``: the ids from ``prefix`` on in
        bytewise order, read in order through an index and cut where the prefix ends (an
        open range with a limit: every planner reads it in order and stops soon)."""
        column = self.dialect.bytewise("id")
        sql = self.dialect.sql(
            f"SELECT id FROM {{jobs}} WHERE {column} >= ? ORDER BY {column} LIMIT {int(limit)}"
        )
        ids = [row[0] for row in self._query("list", sql, (prefix,))]
        return list(itertools.takewhile(lambda job_id: job_id.startswith(prefix), ids))

    def _events(self, job_id: str, after: int, limit: int | None) -> builtins.list[ProgressEvent]:
        sql = "SELECT doc FROM {events} WHERE job_id = ? AND seq > ? ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = self._query(f"events of {job_id}", self.dialect.sql(sql), (job_id, after))
        return [codec.decode_event(job_id, doc) for (doc,) in rows]

    def _live_jobs(self) -> builtins.list[JobState]:
        sql = self.dialect.sql(f"SELECT id, doc FROM {{jobs}} WHERE {LIVE}")
        return decode_listing(self._query("list live jobs", sql))

    def _held_by(self, worker: str) -> builtins.list[JobState]:
        sql = self.dialect.sql(f"SELECT id, doc FROM {{jobs}} WHERE worker = ? AND {LIVE}")
        return decode_listing(self._query("list", sql, (worker,)))

    def _claimable(
        self, queues: builtins.list[str] | None, kinds: builtins.list[Kind] | None
    ) -> tuple[str, list[Any]]:
        """The condition of the jobs a claim of ``queues`` and ``kinds`` may take, apart from
        being due."""
        where, params = [CLAIMABLE], []
        for column, values in (("queue", queues), ("kind", [str(k) for k in kinds or []])):
            if values:
                sql, args = self.dialect.one_of(column, values)
                where.append(sql)
                params += args
        return " AND ".join(where), params

    def _due_query(
        self,
        queues: builtins.list[str],
        kinds: builtins.list[Kind] | None,
        now: datetime,
        limit: int,
    ) -> tuple[str, list[Any]]:
        """The first read of a claim of ``queues`` and ``kinds``: the first ``limit`` due jobs
        of the highest priority of each queue in each part it reads (:func:`due_parts`), rows
        ``(id, doc, seq, priority, due)`` and, with several reads, the read's place in
        :meth:`_due_reads`."""
        params: list[Any] = []
        shapes = []
        reads = self._due_reads(queues, kinds)
        times = self._range(now)
        for queue, part, picked in reads:
            params += [queue, *picked, queue, *picked, *self._ends(part, times, limit)]
            shapes.append((part, len(picked)))
        if len(reads) > 1:  # each read's highest priority (due_query_text)
            params += [x for queue, _, picked in reads for x in (queue, *picked)]
        return due_query_text(self.dialect, tuple(shapes)), params

    def _range(self, now: datetime) -> list[Any]:
        """The two ends of a claim's range of due jobs: its clock plus :data:`SKEW`, its
        clock."""
        return [self.dialect.time(now + SKEW), self.dialect.time(now)]

    @staticmethod
    def _ends(part: int, times: list[Any], limit: int) -> list[Any]:
        """The last parameters of a read of :func:`due_texts`: the range's two ends
        (:meth:`_range`), [the window of the keyed part,] the limit."""
        if part == KEYED:
            return [*times, window(limit), limit]
        return [*times, limit]

    @staticmethod
    def _due_reads(
        queues: builtins.list[str], kinds: builtins.list[Kind] | None
    ) -> builtins.list[tuple[str, int, tuple[str, ...]]]:
        """``(queue, part, kinds picked)`` of each read of a claim."""
        parts = due_parts(kinds)
        return [(queue, part, picked) for queue in queues for part, picked in parts]

    def _due_rows(
        self,
        read: Callable[[str, Sequence[Any]], builtins.list[Row]],
        queues: builtins.list[str] | None,
        kinds: builtins.list[Kind] | None,
        now: datetime,
        limit: int,
    ) -> builtins.list[Row]:
        """``(id, doc, seq)`` of at most ``limit`` due claimable jobs in :data:`CLAIM_ORDER`
        (higher priority first, then the earliest due), read with ``read``.

        ``jobs_due`` holds them queue by queue, priority by priority, in the order they fall
        due; a claim reads the due range of each priority it needs, from the highest down,
        and stops at the first job not yet due. A read in the index's order that filtered
        each job walked every job of the queue waiting behind the last due one: with
        100,000 delayed jobs, 56 ms per claim on SQLite and 246 ms on PostgreSQL, each
        time the due jobs ran short (and a claim of several queues sorted them all, 134 ms
        with 100,000 waiting: BENCHMARKS.md, issue #18). A pool's claim reads no command
        job (:data:`DUE_PARTS`).
        """
        if not queues:  # every queue (an empty list too, as a filter of none)
            queues = self._claimable_queues(kinds)
            if not queues:
                return []
        reads = self._due_reads(queues, kinds)
        found = read(*self._due_query(queues, kinds, now, limit))
        if len(reads) == 1:  # a pool's claim of one queue
            if len(found) < limit:  # the highest priority ran short: the ones below
                found = self._due_below(read, reads[0], now, limit, found)
            return [r[:3] for r in found]
        by_read: dict[int, builtins.list[Row]] = {}
        highest: dict[int, Any] = {}
        for row in found:
            if row[0] is None:  # a read's highest priority
                highest[row[5]] = row[3]
            else:
                by_read.setdefault(row[5], []).append(row)
        rows: builtins.list[Row] = []
        for i, one in enumerate(reads):
            got = by_read.get(i, [])
            if len(got) < limit and highest.get(i) is not None:
                got = self._due_below(read, one, now, limit, got, highest[i])
            rows += got
        rows.sort(key=lambda r: (-r[3], r[4], r[0]))
        return [r[:3] for r in rows[:limit]]

    def _due_below(
        self,
        read: Callable[[str, Sequence[Any]], builtins.list[Row]],
        one: tuple[str, int, tuple[str, ...]],
        now: datetime,
        limit: int,
        got: builtins.list[Row],
        highest: int | None = None,
    ) -> builtins.list[Row]:
        """``got`` (all of the due jobs of the highest priority of one read, or none) and the
        due jobs of the priorities below it, a range each, until ``limit`` (``highest``: the
        read's highest priority, when known)."""
        d = self.dialect
        queue, part, picked = one
        _, at, top, below = (d.sql(text) for text in due_texts(d, part, len(picked)))
        args = [queue, *picked]
        got = list(got)
        if got:
            level = got[0][3]
        elif highest is not None:
            level = highest
        else:  # the highest priority's range was read, and empty
            levels = read(top, args)
            if not levels:
                return got
            level = levels[0][0]
        if part == KEYED and len(got) < limit:
            got = self._by_key(read, one, level, now, limit, got)
        times = self._range(now)
        while len(got) < limit:
            levels = read(below, [*args, level])
            if not levels:
                break
            level = levels[0][0]
            want = limit - len(got)
            found = read(at, [*args, level, *self._ends(part, times, want)])
            if part == KEYED and len(found) < want:
                found = self._by_key(read, one, level, now, want, found)
            got += found
        return got

    def _by_key(
        self,
        read: Callable[[str, Sequence[Any]], builtins.list[Row]],
        one: tuple[str, int, tuple[str, ...]],
        level: int,
        now: datetime,
        want: int,
        found: builtins.list[Row],
    ) -> builtins.list[Row]:
        """The due keyed jobs of one priority of one read, ``found`` (what its window gave)
        and, if its window of claim order was all there was to walk (:func:`window`), the
        first due jobs of each key with room, read key by key: at most ``want``, in claim
        order. The window bounds what the jobs of a full key cost a claim that passes
        them over: a claim with 100,000 of them walked them all, 107 ms on SQLite and
        180 ms on PostgreSQL (BENCHMARKS.md, issue #18); key by key, a claim costs a few
        index steps per key of the queue."""
        queue, _, picked = one
        d = self.dialect
        walked = keyed_texts(d, len(picked))[0]
        size = window(want)
        [(count,)] = read(walked, [queue, *picked, level, *self._range(now), size])
        if int(count) < size:  # the window held every due job of the priority
            return found
        return self._key_heads(read, queue, picked, level, now, want, found)

    def _key_heads(
        self,
        read: Callable[[str, Sequence[Any]], builtins.list[Row]],
        queue: str,
        picked: tuple[str, ...],
        level: int,
        now: datetime,
        want: int,
        found: builtins.list[Row],
    ) -> builtins.list[Row]:
        """``found`` and the first due jobs of ``queue``'s keys of ``picked`` kinds at
        priority ``level``, read key by key (as many of a key as it has free slots), rows
        ``(id, doc, seq, priority, due)``: the first ``want`` of them in claim order."""
        d = self.dialect
        _, heads, more = keyed_texts(d, len(picked))
        args = [queue, *picked]
        ends = self._range(now)
        rows: dict[str, Row] = {r[0]: r[:5] for r in found}
        for head in read(heads, [*args, *args, *args, level, *ends, want]):
            rows.setdefault(head[0], head[:5])
            free = min(int(head[6]), want) - 1
            if free > 0:  # the key's next due jobs, as far as its slots go
                for row in read(more, [*args, head[5], level, *ends, free]):
                    rows.setdefault(row[0], row)
        return sorted(rows.values(), key=lambda r: (r[4], r[0]))[:want]

    def _loose_scan(self, column: str, first: str, where: str, index: str) -> str:
        """A recursive query ``p(v)`` of the distinct values of ``column`` among the rows of
        ``index`` where ``where`` holds, one index step each (and a last NULL): ``first``
        ``"min"`` walks them up, ``"max"`` down."""
        beyond = ">" if first == "min" else "<"
        step = f"SELECT {first}({column}) FROM {{jobs}}{self.dialect.using(index)}"
        return (
            f"WITH RECURSIVE p(v) AS (SELECT ({step} WHERE {where}) UNION ALL"
            f" SELECT ({step} WHERE {where} AND {column} {beyond} p.v)"
            " FROM p WHERE p.v IS NOT NULL)"
        )

    def _claimable_queues(self, kinds: builtins.list[Kind] | None = None) -> builtins.list[str]:
        """The queues that hold a claimable job of ``kinds``: one index step per queue (in
        each part of :data:`DUE_PARTS` it reads)."""
        queues: set[str] = set()
        for part, _ in due_parts(kinds):
            index, holds = DUE_PARTS[part]
            scan = self._loose_scan("queue", "min", f"{CLAIMABLE} AND {holds}", index)
            sql = self.dialect.sql(f"{scan} SELECT v FROM p WHERE v IS NOT NULL")
            queues.update(row[0] for row in self._query("claimable queues", sql, ()))
        return sorted(queues)

    def _next_due(
        self, queues: builtins.list[str] | None, kinds: builtins.list[Kind] | None
    ) -> datetime | None:
        """The earliest due of each queue and priority is the first row of ``jobs_due``
        there that has room: one read of the index for each, not a sort of the queue's
        claimable jobs (67 ms on SQLite, 297 ms on PostgreSQL with 100,000 delayed jobs
        waiting, after every claim that took all there was; BENCHMARKS.md, issue #18). The
        keyed jobs' (``jobs_due_keyed``) in a window of each priority, and key by key where
        that window is all jobs of full keys (:meth:`_by_key`)."""
        if not queues:  # every queue (an empty list too, as a filter of none)
            queues = self._claimable_queues(kinds)
        d = self.dialect
        reads = self._due_reads(queues, kinds)
        firsts: list[tuple[Any, Any]] = []
        for due, run_after, level, n in self._next_due_rows(reads):
            if level is None:
                firsts.append((due, run_after))
                continue
            queue, _, picked = reads[n]
            heads = keyed_texts(d, len(picked), ranged=False)[1]
            args = [queue, *picked]
            for head in self._query("next due", heads, [*args, *args, *args, level, 1]):
                firsts.append((head[4], head[7]))
        best: tuple[datetime, datetime | None] | None = None  # (due, run_after), earliest
        for due, run_after in firsts:
            at = _as_time(due)
            if at is not None and (best is None or at < best[0]):
                best = (at, _as_time(run_after))
        if best is None:
            return None
        if best[1] is None:  # due already, unless made by a clock far ahead (see SKEW)
            return max(utcnow(), best[0] - SKEW)
        return best[1]

    def _next_due_rows(
        self, reads: builtins.list[tuple[str, int, tuple[str, ...]]]
    ) -> builtins.list[Row]:
        """``(due, run_after, priority, read)`` of each read of :meth:`_next_due`: its first
        job with room, or (keyed jobs) a priority whose window held none and was full."""
        d = self.dialect
        texts: list[tuple[str, list[Any]]] = []
        for i, (queue, part, picked) in enumerate(reads):
            index = DUE_PARTS[part][0]
            scan = self._loose_scan("priority", "max", due_where(d, part, 0), index)
            where = due_where(d, part, len(picked))
            if part != KEYED:
                room = f" AND {ROOM}" if part else ""  # none to check for jobs of no key
                text = (
                    f"{scan}, f(id) AS (SELECT (SELECT id FROM {{jobs}} j{d.using(index)}"
                    f" WHERE {where} AND priority = p.v{room}"
                    f" ORDER BY {CLAIM_ORDER} LIMIT 1) FROM p WHERE p.v IS NOT NULL)"
                    f" SELECT {DUE} AS due, run_after, CAST(NULL AS INTEGER) AS level, {i} AS n"
                    " FROM {jobs} JOIN f USING (id) ORDER BY 1 LIMIT 1"
                )
                texts.append((text, [queue, queue, queue, *picked]))
                continue
            size = window(1)
            walk = f"{{jobs}}{d.using(index)} WHERE {where} AND priority = p.v"
            text = (
                f"{scan}, f(id, v, n) AS (SELECT (SELECT id FROM {{jobs}} j WHERE j.id IN"
                f" (SELECT id FROM {walk} ORDER BY {DUE}, id LIMIT {size}) AND {ROOM}"
                f" ORDER BY {DUE}, id LIMIT 1), p.v, (SELECT count(*) FROM (SELECT 1 FROM"
                f" {walk} LIMIT {size}) w) FROM p WHERE p.v IS NOT NULL)"
                f" SELECT {DUE}, run_after, CAST(NULL AS INTEGER), {i} FROM {{jobs}} JOIN f"
                f" USING (id) UNION ALL SELECT NULL, NULL, v, {i} FROM f"
                f" WHERE id IS NULL AND n = {size}"
            )
            texts.append((text, [queue, queue, queue, *picked, queue, *picked]))
        if d.name == "postgresql" and len(texts) > 1:  # the reads in one round trip
            sql = " UNION ALL ".join(f"SELECT * FROM ({t}) n{i}" for i, (t, _) in enumerate(texts))
            return self._query("next due", d.sql(sql), [x for _, p in texts for x in p])
        # SQLite: one statement each (it prepared such a union afresh on every run, 0.2 ms)
        return [row for t, p in texts for row in self._query("next due", d.sql(t), p)]

    def _starts(
        self,
        tx: Tx,
        rows: Sequence[Row],
        worker: str,
        now: datetime,
        limit: int | None = None,
    ) -> list[Write]:
        """The claims of due rows ``(id, doc, seq)``, at most ``limit``: each job started as
        ``worker``'s attempt (a corrupt one is skipped with a warning); a job of a
        concurrency key only while the key has a free slot (counted in ``tx``)."""
        starts: list[Write] = []
        states = []
        for job_id, doc, seq in rows:
            try:
                states.append((self._decode(job_id, doc, seq), seq))
            except CorruptJob as exc:
                log.warning("not claiming a corrupt job: %s", exc)
        keys = sorted({s.limit_key for s, _ in states if s.limit_key is not None})
        slots, used = self._slots(tx, keys) if keys else ({}, {})
        for state, seq in states:
            if limit is not None and len(starts) >= limit:
                break
            key = state.limit_key
            if key is not None:
                if used.get(key, 0) >= slots.get(key, state.limit or 1):
                    continue  # the key's slots are taken
                used[key] = used.get(key, 0) + 1
            change = machine.start(state, worker, now)
            if change is not None:
                starts.append((state, change.state, seq, change.events))
        return starts

    def _slots(self, tx: Tx, keys: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
        """The slots set for concurrency ``keys`` (``outlast group set``) and how many jobs of
        each run now, read in ``tx`` (PostgreSQL locks each key for the transaction first, so
        two claimers of one key count one after the other)."""
        d = self.dialect
        where, params = d.one_of("limit_key", list(keys))
        sql = (
            f"SELECT limit_key, count(*) FROM {{jobs}} WHERE status = 'running' AND {where}"
            " GROUP BY limit_key"
        )
        used = {key: int(count) for key, count in tx.read(d.sql(sql), params)}
        where, params = d.one_of("key", list(keys))
        sql = f"SELECT key, slots FROM {{limits}} WHERE {where}"
        slots = {key: int(n) for key, n in tx.read(d.sql(sql), params)}
        return slots, used

    # ------------------------------------------------------------------ removal
    def _remove(self, job_id: str, force: bool) -> None:
        d = self.dialect
        with self._tx(f"delete {job_id}") as tx:
            sql = d.sql(f"SELECT status, queue, kind FROM {{jobs}} WHERE id = ?{d.for_update}")
            rows = tx.read(sql, (job_id,))
            if not rows:
                raise JobNotFound(f"no job {job_id}")
            status, queue, kind = rows[0]
            if not force and status not in _TERMINAL:
                why = "cancel it first or force the delete"
                raise JobActive(f"job {job_id} is {status}; {why}")
            for table, column in (("{jobs}", "id"), ("{events}", "job_id"), ("{labels}", "job_id")):
                tx.write(d.sql(f"DELETE FROM {table} WHERE {column} = ?"), (job_id,))
            self._count(tx, Counter({(queue, status, kind): -1}))
            tx.wake(job_id, False, interrupt=status == "running")
        self._forget(job_id)

    # ------------------------------------------------------------------ schedules
    def _write_schedule(self, name: str, change: ScheduleChange) -> Schedule | None:
        d = self.dialect
        with self._tx(f"schedule {name}") as tx:
            sql = d.sql(f"SELECT doc FROM {{schedules}} WHERE id = ?{d.for_update}")
            rows = tx.read(sql, (name,))
            old = codec.decode_schedule(name, rows[0][0]) if rows else None
            new = change(old)
            if new is None:
                return old
            self._schedules_changed(tx, name)
            if new is REMOVE:
                tx.write(d.sql("DELETE FROM {schedules} WHERE id = ?"), (name,))
                return None
            assert isinstance(new, Schedule)
            values = (int(new.paused), d.time(new.next_at), codec.encode_schedule(new), name)
            if rows:
                sql = "UPDATE {schedules} SET paused = ?, next_at = ?, doc = ? WHERE id = ?"
            else:
                sql = "INSERT INTO {schedules} (paused, next_at, doc, id) VALUES (?, ?, ?, ?)"
            tx.write(d.sql(sql), values)
        return new

    def _read_schedule(self, name: str) -> Schedule:
        rows = self._query(
            f"read schedule {name}",
            self.dialect.sql("SELECT doc FROM {schedules} WHERE id = ?"),
            (name,),
        )
        if not rows:
            raise ScheduleNotFound(f"no schedule {name}")
        return codec.decode_schedule(name, rows[0][0])

    def _put_worker(self, name: str, doc: bytes) -> None:
        d = self.dialect
        with self._tx(f"register {name}") as tx:
            tx.write(d.sql("DELETE FROM {workers} WHERE name = ?"), (name,))
            tx.write(d.sql("INSERT INTO {workers} (name, doc) VALUES (?, ?)"), (name, doc))

    def _drop_worker(self, name: str) -> None:
        with self._tx(f"unregister {name}") as tx:
            tx.write(self.dialect.sql("DELETE FROM {workers} WHERE name = ?"), (name,))

    def _worker_docs(self) -> builtins.list[tuple[str, bytes]]:
        rows = self._query("list workers", self.dialect.sql("SELECT name, doc FROM {workers}"))
        return [(name, bytes(doc)) for name, doc in rows]

    def _list_schedules(self) -> builtins.list[Schedule]:
        rows = self._query("list schedules", self.dialect.sql("SELECT id, doc FROM {schedules}"))
        out = []
        for name, doc in rows:
            try:
                out.append(codec.decode_schedule(name, doc))
            except CorruptJob as exc:
                log.warning("skipping a corrupt schedule: %s", exc)
        return out

    def _fire(self, now: datetime, manual: str | None) -> builtins.list[JobState]:
        """The due schedules in batches of :data:`FIRE_BATCH`, one transaction each (a fired
        schedule moves past ``now``, so the next batch holds the next ones; a corrupt one
        stays behind, skipped once)."""
        made: list[JobState] = []
        seen: set[str] = set()
        while True:
            jobs, fired = self._fire_batch(now, manual, seen)
            made += jobs
            if manual is not None or not fired:
                return made
            seen.update(fired)

    def _fire_batch(
        self, now: datetime, manual: str | None, seen: set[str]
    ) -> tuple[builtins.list[JobState], builtins.list[str]]:
        d = self.dialect
        made: list[JobState] = []
        fired: list[str] = []
        with self._tx("fire schedules") as tx:
            if manual is None:
                skip = " FOR UPDATE SKIP LOCKED" if d.name == "postgresql" else ""
                sql = (
                    "SELECT id, doc FROM {schedules} WHERE paused = 0 AND next_at <= ?"
                    f" ORDER BY next_at, id LIMIT {FIRE_BATCH}{skip}"
                )
                rows = tx.read(d.sql(sql), (d.time(now),))
            else:
                sql = f"SELECT id, doc FROM {{schedules}} WHERE id = ?{d.for_update}"
                rows = tx.read(d.sql(sql), (manual,))
            for name, doc in rows:
                if name in seen:
                    continue
                fired.append(name)
                try:
                    schedule = codec.decode_schedule(name, doc)
                except CorruptJob as exc:
                    log.warning("not firing a corrupt schedule: %s", exc)
                    continue
                last_live = False
                if not schedule.overlap and schedule.last_job and manual is None:
                    sql = d.sql("SELECT status FROM {jobs} WHERE id = ?")
                    found = tx.read(sql, (schedule.last_job,))
                    last_live = live(found[0][0] if found else None)
                new, jobs = fire_one(schedule, now, manual is not None, last_live)
                for job in jobs:
                    extra = self._extra_columns(job)
                    if tx.read(
                        insert_sql(d, tuple(extra), fired=True) + " RETURNING id",
                        (*self._columns(job), codec.encode(job), job.id, *extra.values()),
                    ):  # made now (not by another firer before)
                        self._count(tx, Counter([_key(job)]))
                    self._put_labels(tx, job, fired=True)
                    tx.wake(job.id, True)
                sql = "UPDATE {schedules} SET paused = ?, next_at = ?, doc = ? WHERE id = ?"
                values = (int(new.paused), d.time(new.next_at), codec.encode_schedule(new), name)
                tx.write(d.sql(sql), values)
                made += jobs
            if fired:
                self._schedules_changed(tx, fired[0])
        return made, fired

    def _next_fire(self) -> datetime | None:
        sql = self.dialect.sql("SELECT min(next_at) FROM {schedules} WHERE paused = 0")
        rows = self._query("next fire time", sql)
        return _as_time(rows[0][0]) if rows else None

    # ------------------------------------------------------------------ retention, strays
    def _expired(
        self, now: datetime, cutoff: datetime | None, limit: int
    ) -> builtins.list[JobState]:
        d = self.dialect
        terminal = ", ".join(f"'{s}'" for s in _TERMINAL)
        where, params = "expires_at <= ?", [d.time(now)]
        if cutoff is not None:
            where = f"({where} OR (expires_at IS NULL AND finished_at <= ?))"
            params.append(d.time(cutoff))
        sql = (
            f"SELECT id, doc FROM {{jobs}} WHERE status IN ({terminal}) AND {where}"
            f" ORDER BY finished_at LIMIT {int(limit)}"
        )
        return decode_listing(self._query("find expired jobs", d.sql(sql), params))

    def _unclaimed(self, now: datetime) -> builtins.list[JobState]:
        d = self.dialect
        sql = (
            f"SELECT id, doc FROM {{jobs}}{d.using('jobs_unclaimed')} WHERE {UNCLAIMED}"
            f" UNION ALL SELECT id, doc FROM {{jobs}}{d.using('jobs_timed')} WHERE {TIMED}"
            " AND limit_key IS NULL AND run_after <= ?"
        )
        rows = self._query("find unclaimed jobs", d.sql(sql), (d.time(now),))
        return decode_listing(rows)

    def _timed(self, after: tuple[datetime, str] | None, limit: int) -> builtins.list[JobState]:
        d = self.dialect
        where, params = TIMED, list[Any]()
        if after is not None:
            where += " AND (run_after, id) > (?, ?)"
            params = [d.time(after[0]), after[1]]
        sql = (
            f"SELECT id, doc FROM {{jobs}}{d.using('jobs_timed')} WHERE {where}"
            f" ORDER BY run_after, id LIMIT {int(limit)}"
        )
        rows = self._query("find the jobs waiting for their time", d.sql(sql), params)
        return decode_listing(rows)

    def _key_usage(self, key: str) -> tuple[int | None, int]:
        d = self.dialect
        sql = "SELECT count(*) FROM {jobs} WHERE status = 'running' AND limit_key = ?"
        [(running,)] = self._query("count a key's running jobs", d.sql(sql), (key,))
        rows = self._query(
            "a key's slots", d.sql("SELECT slots FROM {limits} WHERE key = ?"), (key,)
        )
        return (int(rows[0][0]) if rows else None), int(running)

    def _parked(self, key: str, now: datetime, limit: int) -> builtins.list[JobState]:
        d = self.dialect
        sql = (
            f"SELECT id, doc FROM {{jobs}}{d.using('jobs_parked')} WHERE {PARKED}"
            f" AND limit_key = ? AND (run_after IS NULL OR run_after <= ?)"
            f" ORDER BY {CLAIM_ORDER} LIMIT {int(limit)}"
        )
        rows = self._query("find a key's parked jobs", d.sql(sql), (key, d.time(now)))
        return decode_listing(rows)

    def _waiting_by_key(self) -> dict[str, int]:
        sql = self.dialect.sql(
            f"SELECT limit_key, count(*) FROM {{jobs}}{self.dialect.using('jobs_parked')}"
            f" WHERE {PARKED} GROUP BY limit_key"
        )
        return {key: int(n) for key, n in self._query("count the parked jobs", sql, ())}

    def _parked_keys(self) -> builtins.list[str]:
        scan = self._loose_scan("limit_key", "min", PARKED, "jobs_parked")
        sql = self.dialect.sql(f"{scan} SELECT v FROM p WHERE v IS NOT NULL")
        return [key for (key,) in self._query("find parked keys", sql, ())]

    def _schedules_changed(self, tx: Tx, name: str) -> None:
        """Tell the maintainer's change watch (PostgreSQL notifies; the local stores' watch
        sees the file change)."""

    # ------------------------------------------------------------------ concurrency keys
    def _set_slots(self, key: str, slots: int | None) -> None:
        d = self.dialect
        with self._tx(f"slots of {key}") as tx:
            tx.write(d.sql("DELETE FROM {limits} WHERE key = ?"), (key,))
            if slots is not None:
                tx.write(d.sql("INSERT INTO {limits} (key, slots) VALUES (?, ?)"), (key, slots))
            tx.wake(f"{key}.slots", True)  # a slot may be free now: wake pools

    def _slot_usage(self) -> dict[str, tuple[int | None, int]]:
        d = self.dialect
        sql = (
            "SELECT limit_key, count(*) FROM {jobs} WHERE status = 'running'"
            " AND limit_key IS NOT NULL GROUP BY limit_key"
        )
        running = {k: int(n) for k, n in self._query("slot usage", d.sql(sql))}
        slots = {
            k: int(n) for k, n in self._query("slots", d.sql("SELECT key, slots FROM {limits}"))
        }
        return {k: (slots.get(k), running.get(k, 0)) for k in sorted({*running, *slots})}

    def _start_one(self, job_id: str, worker: str, now: datetime) -> Applied:
        d = self.dialect
        with self._tx(f"start {job_id}") as tx:
            sql = d.sql(f"SELECT doc, seq FROM {{jobs}} WHERE id = ?{d.for_update}")
            rows = tx.read(sql, (job_id,))
            if not rows:
                raise JobNotFound(f"no job {job_id}")
            state = self._decode(job_id, rows[0][0])
            if state.limit_key is not None and state.status == Status.PENDING:
                slots, used = self._slots(tx, [state.limit_key])
                if used.get(state.limit_key, 0) >= slots.get(state.limit_key, state.limit or 1):
                    return Applied(state, [])  # no free slot
            change = machine.start(state, worker, now)
            if change is None:
                return Applied(state, [])
            [stored] = self._write(tx, [(state, change.state, rows[0][1], change.events)])
            tx.wake(job_id, False)
        return Applied(change.state, stored)


def _key(state: JobState) -> tuple[str, str, str]:
    """A job's key in the counts: (queue, status, kind)."""
    return (state.queue, str(state.status), str(state.kind))


def _as_time(value: Any) -> datetime | None:
    """A time column's value (SQLite keeps ISO text)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)
