"""What the jobs table's indexes cost a new job (issue #18, item 4: the floor under ``submit``).

SQLite: the schema outlast makes (read from a fresh store, so it follows the code), copied
into fresh files that lack one index each (and one with the table alone). Into each, rows of
a real pending function job (its row read back from that store, a new id and time each), one
``BEGIN IMMEDIATE`` / ``INSERT`` / ``COMMIT`` per row as ``submit`` does, on one connection a
file (WAL, ``synchronous=NORMAL``, as outlast's): ``--jobs`` rows a variant in each of
``--reps`` reps, the variants taking turns of ``CHUNK`` rows so that the machine's drift lands
on all of them alike (run in one piece each, the figures spread ±15 µs). Each figure is the
median over the turns, in µs a row, with the difference from the full schema. Each rep also
times ``submit`` itself (one call per job, into the real store): the Python around the SQL.

PostgreSQL (``--pg URL``): ``COPY`` of 1,000 such rows (binary, as ``submit_many`` writes them)
into the real table, into a copy with its indexes, and into a copy without any, then
``COMMIT``: what the server's index work is of a batch.

    python bench/index_cost.py [--jobs 3000] [--reps 5] [--pg postgresql://…/test]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from typing import Any

from _common import temp_store

import outlast

#: Rows a variant inserts before the next variant's turn.
CHUNK = 100


@outlast.job(name="index_cost.noop", attempts=1)
def noop(i: int) -> int:
    return i


def sqlite_schema(folder: str) -> tuple[list[str], list[str], tuple[Any, ...], Any]:
    """The jobs table's statements (the table first), its columns, one pending job's row,
    and the store (for timing ``submit``)."""
    store = outlast.use_store(f"sqlite://{folder}/outlast.db")
    noop.submit(0)
    conn = sqlite3.connect(f"{folder}/outlast.db")
    sql = [
        row[0]
        for row in conn.execute(
            "SELECT sql FROM sqlite_master WHERE tbl_name = 'jobs' AND sql IS NOT NULL "
            "ORDER BY type DESC"  # 'table' before 'index'
        )
    ]
    cursor = conn.execute("SELECT * FROM jobs LIMIT 1")
    columns = [c[0] for c in cursor.description]
    row = cursor.fetchone()
    conn.close()
    return sql, columns, row, store


def index_name(statement: str) -> str:
    return statement.split(" ON ")[0].split()[-1]


def sqlite_variant(folder: str, name: str, statements: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{folder}/{name}.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statement in statements:
        conn.execute(statement)
    return conn


def sqlite_inserts(
    conn: sqlite3.Connection, columns: list[str], row: tuple[Any, ...], jobs: int
) -> tuple[float, float, float]:
    """µs a row: BEGIN IMMEDIATE, INSERT, COMMIT."""
    sql = f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    at_id, at_created = columns.index("id"), columns.index("created_at")
    values = list(row)
    begin = insert = commit = 0.0
    for _ in range(jobs):
        values[at_id] = uuid.uuid4().hex
        values[at_created] = outlast.model.format_time(outlast.model.utcnow())
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        t1 = time.perf_counter()
        conn.execute(sql, values)
        t2 = time.perf_counter()
        conn.execute("COMMIT")
        t3 = time.perf_counter()
        begin, insert, commit = begin + t1 - t0, insert + t2 - t1, commit + t3 - t2
    return begin / jobs * 1e6, insert / jobs * 1e6, commit / jobs * 1e6


def submits(jobs: int) -> float:
    """µs a ``submit`` call into the real store."""
    t0 = time.perf_counter()
    for i in range(jobs):
        noop.submit(i)
    return (time.perf_counter() - t0) / jobs * 1e6


def run_sqlite(jobs: int, reps: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        statements, columns, row, _store = sqlite_schema(folder)
        table, indexes = statements[0], statements[1:]
        variants: dict[str, list[str]] = {"every index": statements, "the table alone": [table]}
        for index in indexes:
            variants[f"without {index_name(index)}"] = [s for s in statements if s != index]
        conns = {
            name: sqlite_variant(folder, f"v{n}", chosen)
            for n, (name, chosen) in enumerate(variants.items())
        }
        figures: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        calls: list[float] = []
        for _ in range(reps):
            # fine-grained alternation: the machine's drift lands on every variant alike
            for _ in range(max(1, jobs // CHUNK)):
                for name, conn in conns.items():
                    figures[name].append(sqlite_inserts(conn, columns, row, CHUNK))
            calls.append(submits(jobs))
        for conn in conns.values():
            conn.close()
        full = statistics.median(sum(f) for f in figures["every index"])
        print(
            f"SQLite, {jobs} rows a variant a rep, {reps} reps, in rounds of {CHUNK} rows "
            "(median over the rounds, µs a row):"
        )
        print(f"{'variant':34} {'begin':>6} {'insert':>7} {'commit':>7} {'total':>7} {'vs all':>7}")
        for name, runs in figures.items():
            b, i, c = (statistics.median(r[k] for r in runs) for k in range(3))
            total = statistics.median(sum(r) for r in runs)
            print(f"{name:34} {b:6.1f} {i:7.1f} {c:7.1f} {total:7.1f} {total - full:+7.1f}")
        call = statistics.median(calls)
        print(
            f"submit() one call: {call:.1f} µs ({1e6 / call:,.0f}/s); the SQL floor above is "
            f"{full / call:.0%} of it"
        )


def run_pg(url: str, reps: int) -> None:
    import psycopg

    from outlast.store import postgresql as pg

    store = outlast.use_store(temp_store("postgresql", url))  # a schema of its own
    schema = store.schema  # type: ignore[attr-defined]
    captured: list[tuple[str, tuple[str, ...], list[Any]]] = []
    insert_rows = pg._Tx.insert_rows

    def capture(self: Any, table: str, columns: Any, rows: Any) -> None:
        if not captured:
            captured.append((table, tuple(columns), list(rows)))
        insert_rows(self, table, columns, rows)

    pg._Tx.insert_rows = capture  # type: ignore[method-assign]
    try:
        outlast.submit_many(noop, [(i,) for i in range(1000)])
    finally:
        pg._Tx.insert_rows = insert_rows  # type: ignore[method-assign]
    table, columns, rows = captured[0]
    at_id = columns.index("id")
    conn = psycopg.connect(url)
    try:
        conn.execute(f'CREATE TABLE "{schema}".bare (LIKE {table} INCLUDING DEFAULTS)')
        conn.execute(
            f'CREATE TABLE "{schema}".indexed (LIKE {table} INCLUDING DEFAULTS INCLUDING INDEXES)'
        )
        conn.commit()
        types = [pg.COPY_TYPES[c] for c in columns]
        targets = {
            "no index": f'"{schema}".bare',
            "the jobs indexes (a copy)": f'"{schema}".indexed',
            "the jobs table itself": table,
        }
        got: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for _ in range(reps):
            for name, target in targets.items():
                batch = [
                    tuple(uuid.uuid4().hex if j == at_id else v for j, v in enumerate(r))
                    for r in rows
                ]
                t0 = time.perf_counter()
                sql = f"COPY {target} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
                with conn.cursor().copy(sql) as copy:
                    copy.set_types(types)
                    for r in batch:
                        copy.write_row(r)
                t1 = time.perf_counter()
                conn.commit()
                got[name].append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
        print(f"PostgreSQL, COPY of {len(rows)} rows, {reps} reps (median ms a batch):")
        for name, runs in got.items():
            copy_ms = statistics.median(r[0] for r in runs)
            commit_ms = statistics.median(r[1] for r in runs)
            print(f"{name:30} copy {copy_ms:6.1f}  commit {commit_ms:5.1f}")
    finally:
        conn.rollback()
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        conn.commit()
        conn.close()
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pg", default=None, help="also measure PostgreSQL's COPY (a URL)")
    args = parser.parse_args()
    print("load at the start", os.getloadavg())
    run_sqlite(args.jobs, args.reps)
    if args.pg:
        run_pg(args.pg, args.reps)
    print("load at the end", os.getloadavg())


if __name__ == "__main__":
    main()
