"""What a page of the job list costs with many jobs in the store: ``Store.list`` of 50 jobs
(what the dashboard and ``outlast ls`` read), with no filter, one status, a label, a page
deep down (the ``before`` cursor), an id prefix and a name, median of ``--reads`` each, in
milliseconds; and a whole listing (no limit) of the newest ``--whole`` jobs' store.

The store is filled as ``metrics_bench.fill`` fills it (most jobs finished, some pending,
running, failed), plus ``--labeled`` jobs with a label. Run it on two trees to compare them
(``PYTHONPATH=other/src``): each run fills its own store with the same seed. BENCHMARKS.md
(issue #18, the session of 2026-12-07, late) has what it measured of a listing that merged
one read per status, to drop the index of every job by ``created_at``.

    .venv/bin/python bench/list_bench.py [--jobs 100000] [--pg URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # bench/ and the project (tests.pg.support)

from _common import temp_store  # noqa: E402
from metrics_bench import fill  # noqa: E402

from outlast.store import Store  # noqa: E402

PAGE = 50


def median_ms(call: Callable[[], object], reads: int) -> float:
    times = []
    for _ in range(reads):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(store: Store, reads: int) -> dict[str, float]:
    newest = store.list(limit=PAGE * 40)
    deep = newest[-1].id
    prefix = newest[0].id[:4]
    cases: dict[str, Callable[[], object]] = {
        "every status": lambda: store.list(limit=PAGE),
        "pending": lambda: store.list(status="pending", limit=PAGE),
        "failed": lambda: store.list(status="failed", limit=PAGE),
        "a label": lambda: store.list(label={"team": "billing"}, limit=PAGE),
        "page 40 (before)": lambda: store.list(limit=PAGE, before=deep),
        "id prefix": lambda: store.list(id_prefix=prefix, limit=PAGE),
        "name": lambda: store.list(name="resize", limit=PAGE),
    }
    return {name: median_ms(call, reads) for name, call in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--labeled", type=int, default=2_000)
    parser.add_argument("--reads", type=int, default=15)
    parser.add_argument("--pg", metavar="URL", help="PostgreSQL too (a schema of its own)")
    args = parser.parse_args()
    kinds = ["sqlite", *(["postgresql"] if args.pg else [])]
    for kind in kinds:
        store = temp_store(kind, args.pg)
        try:
            fill(store, args.jobs)
            for _ in range(args.labeled):
                store.create(name="billing.charge", labels={"team": "billing"})
            got = measure(store, args.reads)
            t0 = time.perf_counter()
            whole = len(store.list(limit=None))
            got["whole list"] = (time.perf_counter() - t0) * 1000
            print(f"{kind}, {args.jobs:,} jobs (+{args.labeled:,} labeled), ms:")
            for name, ms in got.items():
                print(f"  {name:18} {ms:9.2f}")
            print(f"  (the whole list held {whole:,} jobs)")
        finally:
            store.close()
            if kind == "postgresql":
                from tests.pg.support import drop_schema

                drop_schema(store.url)


if __name__ == "__main__":
    main()
