"""The job listing of the SQL stores (``Store.list``): newest first, filtered, paged by a
cursor, each page one cheap read however many jobs the store holds.

**Name search.** A substring cannot use an index, and a search that matches nothing would
read every row. But a store holds few distinct names (function names, commands), so the
search first reads them from the ``jobs_name`` index (``name_key, created_at, id``) in one
seek each (a recursive query: a loose index scan, at most :data:`MAX_NAMES`), keeps those
that hold the search in Python (the one rule of :mod:`outlast.store.query`), and then reads
each matching name's newest jobs from the same index, merged: a page costs a few index
seeks whether the search matches half the jobs or none. A store with more distinct names
than that, or a search matching more than :data:`MAX_BRANCHES` of them, falls back to
walking the jobs newest first with the substring as a filter (which stops after a page when
matches are common; at worst it reads every row).

**Labels.** Each row of ``labels`` holds its job's ``created_at``, and ``labels_kv`` is
``(key, value, created_at, job_id)``: a listing with a label walks that label's jobs newest
first and stops after a page, the other filters (more labels, a status) checked on each
job. Before, the engine read every job with the label and sorted them (137 ms a page with
50,000 of them). A label row written by an older outlast still running against a migrated
store has no ``created_at``: its job can be missing from the label's pages (a ``before``
cursor never passes a row without a time; a first page lists it first on PostgreSQL, last
on SQLite). Every process on a store should run the same version.

**Id prefix.** The ids with the prefix are first read in order through an index of ids
(:meth:`~outlast.store.sql.SqlStore._ids_starting`), up to :data:`MAX_PREFIXED`: when there
are no more, the page is read by those ids; else the prefix is a filter on the walk of the
newest jobs, which many then pass. Either way a page costs little, and no plan depends on
the engine's statistics.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any

from outlast.errors import JobNotFound
from outlast.model import JobState
from outlast.store.common import decode_listing
from outlast.store.query import Filter

if TYPE_CHECKING:
    from outlast.store.sql import SqlStore

#: Distinct names read for a name search; a store with more searches by a scan.
MAX_NAMES = 500
#: Matching names read one by one (merged); more are searched by a scan.
MAX_BRANCHES = 40
#: Jobs of an id prefix read by id; more are found by a walk of the newest jobs.
MAX_PREFIXED = 1000
_ORDER = " ORDER BY created_at DESC, id DESC"
#: A listing of a label: its rows of ``labels`` (``l``) hold their job's ``created_at``.
_LABEL_KEY = "l.created_at, l.job_id"
_LABEL_ORDER = " ORDER BY l.created_at DESC, l.job_id DESC"


def select(
    store: SqlStore, query: Filter, limit: int | None, before: str | None
) -> builtins.list[JobState]:
    """``Store.list`` on a SQL store (see the module)."""
    d = store.dialect
    names = None
    # (an id prefix reads its few jobs by id, or many of them newest first: the name is
    # then a filter too)
    if query.name is not None and limit is not None and query.id_prefix is None:
        names = names_holding(store, query.name)
        if names == []:
            return []
    by_label = bool(query.labels) and not names  # else the names' reads drive the walk
    where, params = _conditions(store, query, before, by_label)
    order = _ORDER if limit is None else f"{_ORDER} LIMIT {int(limit)}"
    if query.name is not None and names is None:  # too many names: the substring a filter
        where.append(d.contains("name_key"))
        params.append(query.name)
    if names:
        # one ordered read per matching name, merged (each reads jobs_name in order)
        branch = "SELECT id, doc, created_at FROM {jobs} WHERE " + " AND ".join(
            ["name_key = ?", *where]
        )
        sql = " UNION ALL ".join(
            f"SELECT * FROM ({branch}{order}) AS b{i}" for i in range(len(names))
        )
        args = [arg for name in names for arg in (name, *params)]
        rows = store._query("list", d.sql(sql + order), args)
        return decode_listing((job_id, doc) for job_id, doc, _ in rows)
    if by_label:  # the jobs of the first label newest first (labels_kv); the rest filters
        key, value = next(iter(query.labels.items()))
        sql = (
            "SELECT j.id, j.doc FROM {labels} AS l CROSS JOIN {jobs} AS j"
            " WHERE l.key = ? AND l.value = ? AND j.id = l.job_id"
        )
        sql += "".join(f" AND {condition}" for condition in where)
        sql += _LABEL_ORDER if limit is None else f"{_LABEL_ORDER} LIMIT {int(limit)}"
        return decode_listing(store._query("list", d.sql(sql), [key, value, *params]))
    sql = "SELECT id, doc FROM {jobs}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return decode_listing(store._query("list", d.sql(sql + order), params))


def _conditions(
    store: SqlStore, query: Filter, before: str | None, by_label: bool = False
) -> tuple[list[str], list[Any]]:
    """The conditions of every filter but the name, and their parameters; ``by_label``: but
    the first label's, which drives the walk (``l``, its rows of ``labels``)."""
    where: list[str] = []
    params: list[Any] = []
    if query.status is not None:
        where.append("status = ?")
        params.append(str(query.status))
    for key, value in list(query.labels.items())[1 if by_label else 0 :]:
        where.append("id IN (SELECT job_id FROM {labels} WHERE key = ? AND value = ?)")
        params += [key, value]
    if query.id_prefix is not None:
        prefix = query.id_prefix
        ids = store._ids_starting(prefix, MAX_PREFIXED + 1)
        if len(ids) <= MAX_PREFIXED:  # these ones (none: a condition nothing meets)
            sql, args = store.dialect.one_of("id", ids or [""])
        else:  # most jobs, maybe: the walk of the newest finds a page soon
            sql, args = f"substr(id, 1, {len(prefix)}) = ?", [prefix]
        where.append(sql)
        params += args
    if before is not None:
        sql = store.dialect.sql("SELECT created_at FROM {jobs} WHERE id = ?")
        rows = store._query("list", sql, (before,))
        if not rows:
            raise JobNotFound(f"no job {before} (the 'before' cursor)")
        where.append(f"({_LABEL_KEY if by_label else 'created_at, id'}) < (?, ?)")
        params += [rows[0][0], before]
    return where, params


def names_holding(store: SqlStore, term: str) -> builtins.list[str] | None:
    """The distinct (casefolded) names that hold ``term``; None when the store has more than
    :data:`MAX_NAMES` names or more than :data:`MAX_BRANCHES` of them match."""
    sql = store.dialect.sql(
        "WITH RECURSIVE n(k) AS (SELECT min(name_key) FROM {jobs}"
        " UNION ALL SELECT (SELECT min(name_key) FROM {jobs} WHERE name_key > n.k)"
        " FROM n WHERE n.k IS NOT NULL)"
        f" SELECT k FROM n WHERE k IS NOT NULL LIMIT {MAX_NAMES + 1}"
    )
    names = [row[0] for row in store._query("list names", sql)]
    if len(names) > MAX_NAMES:
        return None
    found = [name for name in names if term in name]
    return found if len(found) <= MAX_BRANCHES else None
