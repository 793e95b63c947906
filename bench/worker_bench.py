"""Pool throughput and latency, the workload compared side by side with Huey, RQ, Celery and
Procrastinate:

1. throughput: 10,000 no-op jobs, submitted first, then drained by `outlast worker --burst
   --concurrency 2` (jobs/s from the first job's start to the last one's end, and wall time
   including the worker's start-up);
2. latency with an idle worker (`--concurrency 2`): submit → the job starts, and the job
   finishes → `wait` returns, p50 and p95 over 200 jobs submitted one after another.

Targets (SQLite): >= 2,000 jobs/s; both p50 latencies <= 10 ms.

    python bench/worker_bench.py [--jobs 10000] [--runs 3] [--store URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402
from _common import percentile  # noqa: E402

from outlast.run.api import create_job  # noqa: E402
from outlast.store import Store, open_store  # noqa: E402


def fresh_url(base: str | None, tag: str) -> str:
    if base:
        sep = "&" if "?" in base else "?"
        return (
            f"{base}{sep}schema=wbench_{tag}_{os.getpid()}" if base.startswith("postgres") else base
        )
    return f"sqlite://{tempfile.mkdtemp(prefix='outlast-wbench-')}/s.db"


def worker(url: str, *extra: str, concurrency: int = 2) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        OUTLAST_STORE=url,
        PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outlast",
            "worker",
            "-c",
            str(concurrency),
            "--import",
            "bench_jobs",
            *extra,
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )


def stamp(value: datetime | None) -> float:
    assert value is not None
    return value.timestamp()


def throughput(url: str, jobs: int, workers: int, concurrency: int) -> tuple[float, float, float]:
    store = open_store(url)
    t0 = time.perf_counter()
    ids = [create_job(store, bench_jobs.noop, [i], {}).id for i in range(jobs)]
    submit_rate = jobs / (time.perf_counter() - t0)
    t1 = time.perf_counter()
    procs = [worker(url, "--burst", concurrency=concurrency) for _ in range(workers)]
    for proc in procs:
        proc.wait()
    wall = time.perf_counter() - t1
    states = [store.get(i) for i in ids]
    assert all(s.status == "succeeded" for s in states), "not every job succeeded"
    first = min(stamp(s.started_at) for s in states)
    last = max(stamp(s.finished_at) for s in states)
    store.close()
    return submit_rate, jobs / (last - first), jobs / wall


def latency(store: Store, count: int) -> tuple[list[float], list[float]]:
    to_start, to_wait = [], []
    for i in range(count):
        task = create_job(store, bench_jobs.noop, [i], {})
        state = store.wait(task.id, timeout=30)
        returned = time.time()
        assert state.status == "succeeded", state.status
        to_start.append(stamp(state.started_at) - stamp(state.created_at))
        to_wait.append(returned - stamp(state.finished_at))
    return to_start, to_wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--store", help="a store URL (default: a fresh SQLite file per run)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes draining")
    parser.add_argument("--concurrency", type=int, default=2, help="-c of each worker")
    args = parser.parse_args()

    results = [
        throughput(fresh_url(args.store, f"t{r}"), args.jobs, args.workers, args.concurrency)
        for r in range(args.runs)
    ]
    submit, drain, wall = (statistics.median(col) for col in zip(*results, strict=True))
    print(f"submit                {submit:8,.0f} jobs/s")
    target = "1,000 on PostgreSQL" if (args.store or "").startswith("postgres") else "2,000"
    print(
        f"drain ({args.workers} worker(s) -c {args.concurrency}) {drain:8,.0f} jobs/s"
        f"   (target >= {target})"
    )
    print(f"drain incl. start-up  {wall:8,.0f} jobs/s")

    url = fresh_url(args.store, "lat")
    store = open_store(url)
    proc = worker(url)
    try:
        time.sleep(1.0)  # let the idle worker start and back off
        latency(store, 10)  # warm-up
        to_start, to_wait = latency(store, args.latency_jobs)
    finally:
        proc.terminate()
        proc.wait()
    for name, values in (("submit → start", to_start), ("finish → wait returns", to_wait)):
        print(
            f"{name:22} p50 {percentile(values, 50) * 1000:6.1f} ms   "
            f"p95 {percentile(values, 95) * 1000:6.1f} ms   (target p50 <= 10 ms)"
        )
    print(
        f"# throughput: medians of {args.runs} runs of {args.jobs:,} jobs; latency: "
        f"{args.latency_jobs} jobs; cores={os.cpu_count()}"
    )


if __name__ == "__main__":
    main()
