"""Store throughput: create, report, get and claim+succeed, with 1,000 and 100,000 jobs present.

Prints ops/s per adapter and size, medians of several runs, and the ratio between the sizes
(100k ÷ 1k; 1.0 means no slowdown). Also the create→claim→succeed cycle rate from one process,
and beside it the ceiling of this disk: the same three write transactions done by ``sqlite3``
alone (the adapter's schema, pragmas and statements, a document of the same size, no outlast
code at all), so that the cycle figure can be read against what SQLite itself can do here.

    python bench/store_bench.py [--adapters sqlite,files] [--runs 5] [--pg postgresql://…]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from _common import median_rate, populate, table, temp_store

from outlast.model import Kind
from outlast.store.sqlite import MIGRATIONS

SIZES = (1_000, 100_000)


def measure(kind: str, size: int, runs: int, pg: str | None) -> dict[str, float]:
    store = temp_store(kind, pg)
    populate(store, size)
    ids = [s.id for s in store.list(limit=2000)]
    small = kind == "files" and size > 10_000  # the files adapter scans: keep the run short
    n = 20 if small else 300

    def create() -> int:
        for _ in range(n):
            store.create(kind=Kind.FUNCTION, name="bench.noop")
        return n

    job = store.create(kind=Kind.FUNCTION, name="bench.report")
    [worker] = store.claim(kinds=[Kind.FUNCTION], limit=1)

    def report() -> int:
        for i in range(n):
            worker.report("step", "progress", {"i": i}, progress=i % 100)
        return n

    def get() -> int:
        for _ in range(n * 4):
            store.get(random.choice(ids))
        return n * 4

    def cycle() -> int:
        for _ in range(n):
            store.create(kind=Kind.FUNCTION, name="bench.noop")
            for task in store.claim(kinds=[Kind.FUNCTION], limit=1):
                task.succeed(None)
                task.release_worker_lock()
        return n

    del job
    result = {
        "create": median_rate(create, runs),
        "report": median_rate(report, runs),
        "get": median_rate(get, runs),
        "create→claim→succeed": median_rate(cycle, runs),
    }
    store.close()
    return result


def bare_sqlite_cycles(runs: int, n: int = 1000) -> float:
    """create→claim→succeed as three ``BEGIN IMMEDIATE`` transactions of ``sqlite3`` alone:
    the insert of a job, then twice a read, an event insert and a row update (cycles/s)."""
    path = os.path.join(tempfile.mkdtemp(prefix="outlast-bare-"), "bare.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    for statements in MIGRATIONS:  # the adapter's own schema, every version of it
        for statement in statements:
            conn.execute(statement)
    doc, event = b"x" * 540, b"y" * 150  # the sizes of a no-op job's document and event
    counter = iter(range(10**9))

    def cycles() -> int:
        for _ in range(n):
            job = f"job{next(counter):012d}"
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO jobs (id, status, kind, queue, worker, run_after, created_at, doc)"
                " VALUES (?, 'pending', 'function', 'default', NULL, NULL, ?, ?)",
                (job, job, doc),
            )
            conn.execute("COMMIT")
            for seq, status in ((1, "running"), (2, "succeeded")):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("SELECT doc, seq FROM jobs WHERE id = ?", (job,)).fetchone()
                conn.execute("INSERT INTO events VALUES (?, ?, ?)", (job, seq, event))
                conn.execute(
                    "UPDATE jobs SET status = ?, worker = 'w', run_after = NULL, doc = ?, seq = ?"
                    " WHERE id = ?",
                    (status, doc, seq, job),
                )
                conn.execute("COMMIT")
        return n

    cycles()  # warm up
    rate = median_rate(cycles, runs)
    conn.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", default="sqlite,files")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pg", help="PostgreSQL URL (adds the postgresql adapter)")
    args = parser.parse_args()
    adapters = args.adapters.split(",") + (["postgresql"] if args.pg else [])
    rows = [["adapter", "operation", "ops/s @1k", "ops/s @100k", "100k÷1k"]]
    for kind in adapters:
        results = {size: measure(kind, size, args.runs, args.pg) for size in SIZES}
        for op in results[SIZES[0]]:
            low, high = results[SIZES[0]][op], results[SIZES[1]][op]
            rows.append([kind, op, f"{low:,.0f}", f"{high:,.0f}", f"{high / low:.2f}"])
        print(table(rows[:1] + [r for r in rows[1:] if r[0] == kind]), flush=True)
        if kind == "sqlite":
            bare = bare_sqlite_cycles(args.runs)
            cycle = results[SIZES[0]]["create→claim→succeed"]
            print(
                f"sqlite3 alone, the same 3 transactions per cycle: {bare:,.0f} cycles/s "
                f"(the adapter reaches {cycle / bare:.0%} of it; target 5,000)"
            )
        print()
    print(f"# medians of {args.runs} runs; cores={os.cpu_count()}")


if __name__ == "__main__":
    main()
