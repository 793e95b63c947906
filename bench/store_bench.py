"""Store throughput: create, report, get and claim+succeed, with 1,000 and 100,000 jobs present.

Prints ops/s per adapter and size, medians of several runs, and the ratio between the sizes
(100k ÷ 1k; 1.0 means no slowdown). Also the create→claim→succeed cycle rate from one process.

    python bench/store_bench.py [--adapters sqlite,files] [--runs 5] [--pg postgresql://…]
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import median_rate, populate, table, temp_store

from outlast.model import Kind

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
        print()
    print(f"# medians of {args.runs} runs; cores={os.cpu_count()}")


if __name__ == "__main__":
    main()
