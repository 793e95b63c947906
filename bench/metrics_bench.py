"""What a ``GET /metrics`` scrape (``Store.stats()`` and its rendering) costs at 100,000 jobs:
a store filled with jobs of every status over a few queues (the last hour's finished jobs
among them), then the scrape timed, median of ``--runs``.

    .venv/bin/python bench/metrics_bench.py [--jobs 100000] [--runs 7] [--store postgresql://…]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worker_bench import fresh_url  # noqa: E402

from outlast import machine  # noqa: E402
from outlast.http import metrics  # noqa: E402
from outlast.model import Call, ErrorInfo, Kind, Status, utcnow  # noqa: E402
from outlast.store import Store, open_store  # noqa: E402

QUEUES = ["default", "mail", "images", "reports"]


def fill(store: Store, jobs: int) -> None:
    """``jobs`` jobs, 1,000 per transaction: most finished (some in the last hour), some
    pending, running, failed."""
    rng = random.Random(7)
    now = utcnow()
    batch = []
    for i in range(jobs):
        created = now - timedelta(seconds=rng.uniform(0, 7 * 86400))
        state = machine.new_job(
            kind=Kind.FUNCTION,
            name="bench.fill",
            queue=rng.choice(QUEUES),
            call=Call("bench", [i], {}),
            max_attempts=3,
            now=created,
        )
        roll = rng.random()
        if roll < 0.8 or roll >= 0.95:
            finished = created + timedelta(seconds=rng.uniform(0.01, 5))
            if roll < 0.02:  # in the last hour
                finished = now - timedelta(seconds=rng.uniform(0, 3500))
            ok = roll < 0.8
            state = state.evolve(
                status=Status.SUCCEEDED if ok else Status.FAILED,
                attempts=1,
                started_at=created,
                finished_at=finished,
                updated_at=finished,
                error=None if ok else ErrorInfo("error", "boom"),
            )
        elif roll < 0.9:
            pass  # pending
        else:
            state = state.evolve(
                status=Status.RUNNING, attempts=1, started_at=created, worker="h:1"
            )
        batch.append(state)
        if len(batch) == 1000:
            store._insert_many(batch)
            batch = []
    if batch:
        store._insert_many(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--store")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        url = fresh_url(opts.store, "metrics") if opts.store else f"sqlite://{tmp}/s.db"
        store = open_store(url)
        t0 = time.perf_counter()
        fill(store, opts.jobs)
        print(f"filled {opts.jobs:,} jobs in {time.perf_counter() - t0:.1f} s")
        stats_times, render_times = [], []
        for _ in range(opts.runs):
            t0 = time.perf_counter()
            stats = store.stats()
            t1 = time.perf_counter()
            body = metrics.render(stats)
            t2 = time.perf_counter()
            stats_times.append(t1 - t0)
            render_times.append(t2 - t1)
        p50, low = statistics.median(stats_times) * 1000, min(stats_times) * 1000
        rendering = statistics.median(render_times) * 1000
        print(
            f"scrape at {opts.jobs:,} jobs ({len(stats.recent):,} finished in the last hour):"
            f" Store.stats() p50 {p50:.1f} ms (min {low:.1f}), rendering {rendering:.1f} ms,"
            f" {len(body):,} bytes; load {os.getloadavg()[0]:.1f}"
        )
        store.close()


if __name__ == "__main__":
    main()
