"""The async pool against arq and SAQ: I/O-bound jobs (``asyncio.sleep``), side by side.

1. throughput: ``--jobs`` jobs sleeping ``--sleep`` seconds are enqueued one call at a time,
   then one worker with ``--concurrency`` drains them (outlast: ``outlast worker --async -c C
   --burst``, its start-up included; arq: a burst worker with ``max_jobs=C``; SAQ: a worker
   with ``concurrency=C``). Reported: jobs/s over the drain, and over enqueue + drain.
2. latency: ``--latency`` no-op jobs, one after another, to an idle worker: from before the
   enqueue call to the job seen finished by polling its status every 1 ms (p50).

The runs alternate (outlast, arq, SAQ; then the other way round), ``--runs`` times; the table
gives medians with min-max and each peer's ratio to outlast. outlast's jobs are durable (every
transition is a SQLite or PostgreSQL commit); arq's and SAQ's live in Redis without
persistence. The peers run from their own virtual environment, ``bench/.peers/async``
(made here with pinned versions: arq 0.28.0, SAQ 0.26.4), on the local Redis (database 15);
without Redis or the packages they are skipped, with a note.

    .venv/bin/python bench/async_bench.py [--jobs 10000] [--concurrency 200] [--sleep 0.05]
        [--runs 3] [--latency 200] [--store postgresql://…]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402,F401  (registers bench.asleep)
from worker_bench import fresh_url  # noqa: E402

from outlast.model import Status  # noqa: E402
from outlast.run.api import create_job  # noqa: E402
from outlast.store import open_store  # noqa: E402

PEERS = os.path.join(HERE, ".peers", "async")
PINNED = ["arq==0.28.0", "saq==0.26.4", "typing_extensions"]


def peer_python() -> str | None:
    """The peers' interpreter (their environment made on first use), or None."""
    python = os.path.join(PEERS, "bin", "python")
    if not os.path.exists(python):
        try:
            subprocess.run([sys.executable, "-m", "venv", PEERS], check=True)
            subprocess.run(
                [python, "-m", "pip", "install", "-q", *PINNED],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except (subprocess.CalledProcessError, OSError) as exc:
            print(f"peers skipped: cannot install {PINNED}: {exc}")
            return None
    probe = subprocess.run(
        [python, "-c", "import redis; redis.Redis.from_url('redis://127.0.0.1:6379/15').ping()"],
        capture_output=True,
    )
    if probe.returncode != 0:
        print("peers skipped: no Redis at 127.0.0.1:6379")
        return None
    return python


def run_peer(python: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [python, os.path.join(HERE, "peers_async.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def env_for(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTLAST_", "WORKER_"))}
    env.update(OUTLAST_STORE=url, PYTHONPATH=HERE)
    return env


def outlast_throughput(
    base: str | None, jobs: int, concurrency: int, sleep: float, run: int = 0
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        url = fresh_url(base, f"athr{run}") if base else f"sqlite://{tmp}/s.db"
        store = open_store(url)
        started = time.perf_counter()
        for _ in range(jobs):
            create_job(store, "bench.asleep", [sleep])
        enqueued = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "outlast",
                "worker",
                "--async",
                "-c",
                str(concurrency),
                "--burst",
                "--import",
                "bench_jobs",
            ],
            env=env_for(url),
            check=True,
            stderr=subprocess.DEVNULL,
        )
        drained = time.perf_counter()
        done = sum(1 for s in store.list(limit=None) if s.status == Status.SUCCEEDED)
        store.close()
    return {"enqueue_s": enqueued - started, "drain_s": drained - enqueued, "done": done}


def outlast_latency(base: str | None, count: int, run: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        url = fresh_url(base, f"alat{run}") if base else f"sqlite://{tmp}/s.db"
        store = open_store(url)
        worker = subprocess.Popen(
            [sys.executable, "-m", "outlast", "worker", "--async", "--import", "bench_jobs"],
            env=env_for(url),
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(1.0)
            seen = []
            for _ in range(count):
                t0 = time.perf_counter()
                job_id = create_job(store, "bench.asleep", [0]).id
                while store.get(job_id).status != Status.SUCCEEDED:
                    time.sleep(0.001)
                seen.append(time.perf_counter() - t0)
        finally:
            worker.terminate()
            worker.wait()
            store.close()
    return {"p50_ms": statistics.median(seen) * 1000}


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} ({low}-{high})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--store", help="a PostgreSQL URL for outlast (default: SQLite)")
    opts = parser.parse_args()
    python = peer_python()
    systems = ["outlast"] + (["arq", "saq"] if python else [])
    results: dict[str, list[dict]] = {name: [] for name in systems}
    for run in range(opts.runs):
        order = systems if run % 2 == 0 else list(reversed(systems))
        for name in order:
            if name == "outlast":
                thr = outlast_throughput(opts.store, opts.jobs, opts.concurrency, opts.sleep, run)
                lat = outlast_latency(opts.store, opts.latency, run)
            else:
                assert python is not None
                args = [str(opts.jobs), str(opts.concurrency), str(opts.sleep)]
                thr = run_peer(python, name, "throughput", *args)
                lat = run_peer(python, name, "latency", str(opts.latency))
            thr.update(lat)
            results[name].append(thr)
            print(
                f"run {run + 1} {name:8} drain {opts.jobs / thr['drain_s']:8,.0f} jobs/s"
                f"  enqueue+drain {opts.jobs / (thr['enqueue_s'] + thr['drain_s']):8,.0f} jobs/s"
                f"  latency p50 {thr['p50_ms']:7.1f} ms  done {thr['done']}",
                flush=True,
            )
    load = os.getloadavg()
    floor = opts.jobs / (opts.concurrency / opts.sleep)
    print(
        f"\n{opts.jobs:,} jobs of asyncio.sleep({opts.sleep}), concurrency {opts.concurrency}"
        f" (the sleeps alone take {floor:.2f} s), {opts.runs} runs, load {load[0]:.1f}"
    )
    print("| system | drain jobs/s | enqueue + drain jobs/s | latency p50 ms | drain ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    ours = statistics.median(opts.jobs / r["drain_s"] for r in results["outlast"])
    for name, runs in results.items():
        drain = [opts.jobs / r["drain_s"] for r in runs]
        total = [opts.jobs / (r["enqueue_s"] + r["drain_s"]) for r in runs]
        p50 = [r["p50_ms"] for r in runs]
        ratio = "" if name == "outlast" else f"{ours / statistics.median(drain):.2f}x"
        print(f"| {name} | {spread(drain)} | {spread(total)} | {spread(p50, '{:.1f}')} | {ratio} |")


if __name__ == "__main__":
    main()
