"""What a ``GET /metrics`` scrape (``Store.stats()`` and its rendering) and the dashboard's
chart (``Store.timeline()``, ``GET /stats/timeline``) cost at 100,000 jobs: a store filled
with jobs of every status over a few queues (``--recent``: the fraction of them that
finished in the last hour), then each timed, median of ``--runs``. The timeline is timed
cold (a new store object: every step read) and warm (the same object again: settled steps
are kept, only the last minutes are read).

    .venv/bin/python bench/metrics_bench.py [--jobs 100000] [--runs 7] [--recent 0.02]
        [--store postgresql://…]
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
#: The jobs' names: a search for "resize" finds about a quarter of them, "invoice" one in
#: a thousand (``billing.Invoice_Reminder``), "nosuchname" none.
NAMES = ["images.resize", "mail.send_digest", "reports.monthly", "bench.fill"]
RARE = "billing.Invoice_Reminder"


def fill(store: Store, jobs: int, recent: float = 0.02) -> None:
    """``jobs`` jobs, 1,000 per transaction: most finished (a fraction ``recent`` of all
    jobs in the last hour), some pending, running, failed."""
    rng = random.Random(7)
    now = utcnow()
    batch = []
    for i in range(jobs):
        created = now - timedelta(seconds=rng.uniform(0, 7 * 86400))
        roll = rng.random()
        if roll < recent:  # finished in the last hour: created shortly before
            created = now - timedelta(seconds=rng.uniform(5, 3600))
        state = machine.new_job(
            kind=Kind.FUNCTION,
            name=RARE if rng.random() < 0.001 else rng.choice(NAMES),
            queue=rng.choice(QUEUES),
            call=Call("bench", [i], {}),
            max_attempts=3,
            now=created,
        )
        if roll < recent or roll < 0.8 or roll >= 0.95:
            waited = rng.expovariate(1 / 0.05)
            started = created + timedelta(seconds=waited)
            finished = started + timedelta(seconds=rng.uniform(0.01, 5))
            if roll < recent:
                finished = min(finished, now)
            ok = roll < max(0.8, recent * 0.9)
            state = state.evolve(
                status=Status.SUCCEEDED if ok else Status.FAILED,
                attempts=1,
                started_at=started,
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
    parser.add_argument("--recent", type=float, default=0.02)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        url = fresh_url(opts.store, "metrics") if opts.store else f"sqlite://{tmp}/s.db"
        store = open_store(url)
        t0 = time.perf_counter()
        fill(store, opts.jobs, opts.recent)
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
        timeline(url, store, opts.runs)
        if url.startswith("postgresql"):
            drop_schema(store)
        store.close()


def timeline(url: str, store: Store, runs: int) -> None:
    cold, warm = [], []
    for _ in range(runs):
        with open_store(url) as fresh:
            t0 = time.perf_counter()
            line = fresh.timeline()
            cold.append(time.perf_counter() - t0)
    store.timeline()
    for _ in range(runs):
        t0 = time.perf_counter()
        store.timeline()
        warm.append(time.perf_counter() - t0)
    finished = sum(sum(s.finished) for s in line.steps)
    print(
        f"timeline of the last hour ({finished:,} finished in it): cold p50"
        f" {statistics.median(cold) * 1000:.1f} ms (min {min(cold) * 1000:.1f}), warm p50"
        f" {statistics.median(warm) * 1000:.1f} ms (min {min(warm) * 1000:.1f});"
        f" load {os.getloadavg()[0]:.1f}"
    )


def drop_schema(store: Store) -> None:
    """The benchmark's PostgreSQL schema goes with it."""
    schema = store.schema  # type: ignore[attr-defined]
    with store._session("drop the benchmark's schema") as conn:  # type: ignore[attr-defined]
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
