"""Time: how close to its time a delayed job starts, and what schedules cost.

1. Delay precision: a job delayed ~0.5 s (a random fraction added, so nothing lines up with
   a poll) to an idle pool (``outlast worker -c 2``), one after another; lateness = the
   claim's ``started_at`` minus the due time, p50/p95 over ``--samples``. Idle, and under
   load (two processes burning both cores). Also a delayed command job (``run_command(…,
   delay=)``: its supervisor waits for its time). Target: p50 <= 50 ms.
2. Cost of schedules: 1,000 schedules every minute, all due at once: the maintainer's CPU
   per fire (``fire_schedules()``, in this process), and what the maintainer pays per sweep
   to know the next fire time.
3. Claims not slowed: a burst pool drains ``--jobs`` no-op jobs while 1,000 schedules fire
   during the drain, paired with the same drain without schedules, alternating; the ratio of
   the drain rates (1.0 = not slowed).

    python bench/time_bench.py [--samples 20] [--jobs 3000] [--runs 3] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402
from _common import percentile  # noqa: E402
from worker_bench import worker  # noqa: E402

from outlast import cron  # noqa: E402
from outlast.model import Kind  # noqa: E402
from outlast.run.api import create_job, run_command  # noqa: E402
from outlast.store import Store, open_store  # noqa: E402

PG = "postgresql://postgres@127.0.0.1:5432/test"


def fresh(kind: str, tag: str) -> str:
    if kind == "postgresql":
        return f"{PG}?schema=tbench_{tag}_{os.getpid()}"
    if kind == "files":
        return f"files://{tempfile.mkdtemp(prefix='outlast-tbench-')}/jobs"
    return f"sqlite://{tempfile.mkdtemp(prefix='outlast-tbench-')}/s.db"


def drop(url: str) -> None:
    if url.startswith("postgresql"):
        import psycopg

        schema = url.rpartition("schema=")[2]
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def lateness(store: Store, samples: int, command: bool = False) -> list[float]:
    late = []
    for i in range(samples):
        due = datetime.now(UTC) + timedelta(seconds=0.5 + random.random() * 0.1)
        if command:
            task = run_command(["true"], at=due, store=store)
        else:
            task = create_job(store, bench_jobs.noop, [i], run_after=due)
        state = store.wait(task.id, timeout=30)
        assert state.status == "succeeded" and state.started_at is not None, state
        late.append((state.started_at - due).total_seconds())
    return late


def precision(kind: str, samples: int) -> None:
    url = fresh(kind, "delay")
    store = open_store(url)
    pool = worker(url)
    try:
        time.sleep(1.5)
        lateness(store, 3)  # warm-up
        rows = [("idle", lateness(store, samples))]
        burners = [multiprocessing.Process(target=burn, args=(600,)) for _ in range(2)]
        for b in burners:
            b.start()
        try:
            time.sleep(0.5)
            rows.append(("2 cores burning", lateness(store, samples)))
        finally:
            for b in burners:
                b.kill()
                b.join()
        if kind == "sqlite":
            rows.append(("command, idle", lateness(store, samples, command=True)))
    finally:
        pool.terminate()
        pool.wait()
        store.close()
        drop(url)
    for name, values in rows:
        print(
            f"  delay precision {kind:10} {name:16} p50 {percentile(values, 50) * 1000:6.1f} ms"
            f"   p95 {percentile(values, 95) * 1000:6.1f} ms   (target p50 <= 50 ms)"
        )


def add_schedules(store: Store, n: int, due: datetime) -> None:
    template = cron.template(Kind.FUNCTION, "bench.noop", queue="scheduled")
    for i in range(n):
        schedule = cron.new_schedule(
            f"s{i:04}", template, every=60, now=due - timedelta(seconds=60)
        )
        store.add_schedule(schedule)


def fire_cost(kind: str, runs: int, n: int = 1000) -> None:
    cpu, wall, peek = [], [], []
    for r in range(runs):
        url = fresh(kind, f"fire{r}")
        store = open_store(url)
        try:
            due = datetime.now(UTC) + timedelta(seconds=3)
            add_schedules(store, n, due)
            time.sleep(2.1)  # the steady state: no schedule written in the last 2 s
            store.next_fire()
            t0 = time.perf_counter()
            for _ in range(20):
                store.next_fire()
            peek.append((time.perf_counter() - t0) / 20)
            time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 0.05)
            c0, w0 = time.process_time(), time.perf_counter()
            made = store.fire_schedules()
            cpu.append((time.process_time() - c0) / n)
            wall.append(time.perf_counter() - w0)
            assert len(made) == n, len(made)
        finally:
            store.close()
            drop(url)
    print(
        f"  fire {n:,} due schedules    {kind:10}"
        f" CPU {statistics.median(cpu) * 1000:5.2f} ms per fire"
        f"   all in {statistics.median(wall):5.2f} s   next-fire look-up per sweep"
        f" {statistics.median(peek) * 1e6:6.0f} µs"
    )


def drain(kind: str, jobs: int, schedules: int) -> float:
    url = fresh(kind, f"drain{schedules}")
    store = open_store(url)
    try:
        ids = [create_job(store, bench_jobs.noop, [i]).id for i in range(jobs)]
        if schedules:
            add_schedules(store, schedules, datetime.now(UTC) + timedelta(seconds=0.9))
        proc = worker(url, "--burst")
        proc.wait()
        states = [store.get(i) for i in ids]
        assert all(s.status == "succeeded" for s in states)
        if schedules:
            fired = len(store.list(status="pending", limit=None))
            assert fired == schedules, f"{fired} of {schedules} fired during the drain"
        first = min(s.started_at for s in states if s.started_at)
        last = max(s.finished_at for s in states if s.finished_at)
        return jobs / (last - first).total_seconds()
    finally:
        store.close()
        drop(url)


def claims_not_slowed(kind: str, jobs: int, runs: int) -> None:
    plain, busy = [], []
    for _ in range(runs):
        plain.append(drain(kind, jobs, 0))
        busy.append(drain(kind, jobs, 1000))
    ratios = [b / p for b, p in zip(busy, plain, strict=True)]
    print(
        f"  drain {jobs:,} no-op jobs   {kind:10} alone {statistics.median(plain):6,.0f} jobs/s"
        f"   with 1,000 schedules firing {statistics.median(busy):6,.0f} jobs/s"
        f"   ratio {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    kinds = args.stores.split(",")
    print(f"# cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
    for kind in kinds:
        precision(kind, args.samples)
    for kind in kinds:
        fire_cost(kind, args.runs)
    for kind in kinds:
        claims_not_slowed(kind, args.jobs, args.runs)
    print(f"# load after={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
