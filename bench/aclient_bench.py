"""The async client's cost against the blocking API it is built on, in one process:

1. ``await outlast.asubmit(job, …)`` against ``outlast.submit(job, …)``, one call at a time
   (the store's insert moved to the loop's executor: what that hop costs);
2. a job's end seen by ``await task.await_done()`` against ``task.wait()`` (the store's
   notification watched by the event loop, against a blocking listener), p50 over jobs run
   one after another by an idle ``outlast worker --async``.

    .venv/bin/python bench/aclient_bench.py [--calls 500] [--jobs 100] [--runs 3]
        [--store postgresql://…]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402
from worker_bench import fresh_url  # noqa: E402

import outlast  # noqa: E402
from outlast.run import api  # noqa: E402
from outlast.store import open_store  # noqa: E402


def submits(calls: int) -> tuple[float, float]:
    """Seconds per call: submit, then asubmit."""
    t0 = time.perf_counter()
    for _ in range(calls):
        outlast.submit(bench_jobs.asleep, 0)
    sync = (time.perf_counter() - t0) / calls

    async def main() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            await outlast.asubmit(bench_jobs.asleep, 0)
        return (time.perf_counter() - t0) / calls

    return sync, asyncio.run(main())


def seen(jobs: int) -> tuple[float, float]:
    """p50 seconds from a job's end to its waiter seeing it: wait(), then await_done()."""
    blocking = []
    for _ in range(jobs):
        task = outlast.submit(bench_jobs.asleep, 0)
        state = task.wait(timeout=30)
        blocking.append(time.time() - state.finished_at.timestamp())  # type: ignore[union-attr]

    async def main() -> list[float]:
        out = []
        for _ in range(jobs):
            task = await outlast.asubmit(bench_jobs.asleep, 0)
            state = await task.await_done(timeout=30)
            out.append(time.time() - state.finished_at.timestamp())  # type: ignore[union-attr]
        return out

    return statistics.median(blocking), statistics.median(asyncio.run(main()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store")
    opts = parser.parse_args()
    rows = []
    for run in range(opts.runs):
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o700)
            url = fresh_url(opts.store, f"acl{run}") if opts.store else f"sqlite://{tmp}/s.db"
            store = open_store(url)
            api.use_store(store)
            env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLAST_")}
            env.update(OUTLAST_STORE=url, PYTHONPATH=HERE)
            worker = subprocess.Popen(
                [sys.executable, "-m", "outlast", "worker", "--async", "--import", "bench_jobs"],
                env=env,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(1.0)
                sync, aio = submits(opts.calls)
                blocking, awaited = seen(opts.jobs)
            finally:
                worker.terminate()
                worker.wait()
                store.close()
        rows.append((sync, aio, blocking, awaited))
        print(
            f"run {run + 1}: submit {sync * 1e3:.3f} ms, asubmit {aio * 1e3:.3f} ms;"
            f" end seen by wait() {blocking * 1e3:.2f} ms, by await_done() {awaited * 1e3:.2f} ms",
            flush=True,
        )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(
        f"\nmedians of {opts.runs} runs, load {os.getloadavg()[0]:.1f}:"
        f" submit {med[0] * 1e3:.3f} ms, asubmit {med[1] * 1e3:.3f} ms"
        f" (ratio {med[1] / med[0]:.2f});"
        f" end seen: wait() {med[2] * 1e3:.2f} ms, await_done() {med[3] * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
