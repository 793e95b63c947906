"""PostgreSQL's guarded transitions: a batch of outcomes in one round trip.

A transition reads the job's row (``SELECT … FOR UPDATE``), applies the pure rule, and
writes: two round trips on PostgreSQL, the first of which a pool's outcomes need not wait
for, since the pool wrote (or read) each of those rows last itself, when it claimed them.
Here the rule is applied to the state the store object remembers (:meth:`StateCache.guess`),
and the write carries its guard: each row is updated only if it still holds exactly the
document and ``seq`` the state was made from (``UPDATE … WHERE id = … AND seq = … AND doc
= …``, re-checked by the server on the locked row). The events and the notifications are
written for the rows the update took, in the same statement, in its own transaction: one
round trip in all. A row the guard refused (the job's own report changed it, a cancel, a
delete) is left as it was, and its item goes the ordinary way: read, rule, write.

So nothing is written from a stale state: the guard is the whole read's check, made by the
server under the row's lock, and a transition is still one transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from outlast import codec, machine
from outlast.machine import Change
from outlast.model import JobState, utcnow
from outlast.store.base import Applied, Transition
from outlast.store.sql import Dialect, StateCache, slim_row

#: The condition that leads a statement which updates the jobs named in a JSON parameter
#: to their rows through the primary key: their ids again, as an array. The planner counts
#: 100 rows for ``jsonb_array_elements``; under ~10,000 jobs it then read the whole table
#: and hashed every row (its document too) for each batch: 0.6 ms for one outcome among
#: 1,200 jobs, 0.05 ms with the ids (BENCHMARKS.md, issue #18).
BY_IDS = " AND j.id = ANY(%s::text[])"


def guarded_sql(d: Dialect) -> str:
    """The batch's one statement. Parameters: the rows (:func:`slim_row`'s values, then the
    old document and ``seq``), the rows' job ids (an array, :data:`BY_IDS`), the events
    ``[job id, seq, doc]``, the notifications ``[channel, job id]`` (JSON arrays, see
    :func:`outlast.store.postgresql.rows_json`). Returns a row per notification sent, so
    the ids it names are the jobs written (each has one on its own channel at least)."""
    ts = "timestamptz"
    return (
        "WITH r AS (SELECT x->>0 AS status, x->>1 AS worker,"
        f" (x->>2)::{ts} AS run_after, (x->>3)::{ts} AS finished_at,"
        f" (x->>4)::{ts} AS expires_at, (x->>5)::{ts} AS started_at,"
        " decode(x->>6, 'base64') AS doc, (x->>7)::integer AS seq, x->>8 AS id,"
        " decode(x->>9, 'base64') AS old_doc, (x->>10)::integer AS old_seq"
        " FROM jsonb_array_elements(%s::jsonb) AS x),"
        f" u AS (UPDATE {d.jobs} AS j SET status = r.status, worker = r.worker,"
        " run_after = r.run_after, finished_at = r.finished_at, expires_at = r.expires_at,"
        " started_at = r.started_at, doc = r.doc, seq = r.seq"
        f" FROM r WHERE j.id = r.id AND j.seq = r.old_seq AND j.doc = r.old_doc{BY_IDS}"
        " RETURNING j.id),"
        f" e AS (INSERT INTO {d.events} (job_id, seq, doc)"
        " SELECT x->>0, (x->>1)::integer, decode(x->>2, 'base64')"
        " FROM jsonb_array_elements(%s::jsonb) AS x WHERE x->>0 IN (SELECT id FROM u))"
        " SELECT x->>1, pg_notify(x->>0, x->>1) FROM jsonb_array_elements(%s::jsonb) AS x"
        " WHERE x->>1 IN (SELECT id FROM u)"
    )


class Guess:
    """One guarded item: the job as remembered (its document and ``seq``), the change made
    from it, and what that writes."""

    __slots__ = ("change", "doc", "events", "job_id", "old", "old_doc", "seq")

    def __init__(
        self, job_id: str, old: JobState, old_doc: bytes, seq: int, change: Change
    ) -> None:
        self.job_id, self.old, self.old_doc, self.seq = job_id, old, old_doc, seq
        self.change = change
        self.doc = codec.encode(change.state)
        self.events = machine.number(job_id, seq, change.events, utcnow())


def guesses(cache: StateCache, items: Sequence[tuple[str, Transition]]) -> list[Guess]:
    """The items a guarded write can take: each job once, remembered with its ``seq``, its
    change one of status on the columns an outcome writes (the others go the ordinary
    way)."""
    counts = Counter(job_id for job_id, _ in items)
    taken: list[Guess] = []
    for job_id, fn in items:
        hit = cache.guess(job_id) if counts[job_id] == 1 else None
        change = None if hit is None else fn(hit[1])
        if hit is not None and change is not None and _slim(hit[1], change.state):
            taken.append(Guess(job_id, hit[1], hit[0], hit[2], change))
    return taken


def _slim(old: JobState, new: JobState) -> bool:
    """A change of status that leaves what an outcome does not write as it was."""
    return (
        old.status != new.status
        and (old.queue, old.kind, old.created_at) == (new.queue, new.kind, new.created_at)
        and old.labels == new.labels
    )


def parameters(
    d: Dialect, taken: Sequence[Guess], channels: Callable[[Guess], list[str]]
) -> tuple[list[Any], list[Any], list[Any]]:
    """The statement's three row lists; ``channels(guess)`` names the channels to wake."""
    rows: list[Any] = []
    events: list[Any] = []
    notes: list[Any] = []
    for g in taken:
        new = slim_row(d, g.change.state, g.doc, g.seq + len(g.events))
        rows.append([*new, g.old_doc, g.seq])
        events += [[e.job_id, e.seq, codec.encode_event(e)] for e in g.events]
        notes += [[channel, g.job_id] for channel in channels(g)]
    return rows, events, notes


def results(taken: Sequence[Guess], written: set[str], cache: StateCache) -> dict[str, Applied]:
    """What the guarded write came to, for the jobs it wrote (remembered as written)."""
    out: dict[str, Applied] = {}
    for g in taken:
        if g.job_id in written:
            cache.remember(g.change.state, g.doc, g.seq + len(g.events))
            out[g.job_id] = Applied(g.change.state, list(g.events))
    return out
