"""What an agent waits for: how soon ``outlast wait`` returns (exit 4) after a job pauses
for a person, and how soon the MCP ``wait`` tool does.

A pool runs ``bench.ask``, which notes the wall-clock time and raises ``outlast.Pause``; a
``outlast wait ID`` started before the job ran (so it is already waiting) exits 4, and the
benchmark notes the time it exited. The figure is exit time minus the job's note: it holds
the pause's write to the store, the waiter's wake-up, its read and its exit. Repeated
``--runs`` times (20 by default) on each store; medians, p90 and max.

Target (#17): a paused job's ``wait`` returns within 50 ms of the pause, median.

    python bench/agents_bench.py [--runs 20] [--pg postgresql://127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402, F401  (registers bench.ask for create_job)
from _common import percentile  # noqa: E402

from outlast.model import Status, utcnow  # noqa: E402
from outlast.run.api import create_job  # noqa: E402
from outlast.store import open_store  # noqa: E402

OUTLAST = os.path.join(os.path.dirname(sys.executable), "outlast")


def _env(url: str) -> dict[str, str]:
    return dict(
        os.environ,
        OUTLAST_STORE=url,
        PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
        WORKER_POLL_MAX="0.5",
    )


def one_store(url: str, runs: int) -> list[float]:
    """Milliseconds from each pause to its waiter's exit."""
    store = open_store(url, create=True)
    folder = tempfile.mkdtemp(prefix="outlast-agents-")
    pool = subprocess.Popen(
        [sys.executable, "-m", "outlast", "worker", "--import", "bench_jobs", "-c", "2"],
        env=_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    gaps = []
    try:
        for i in range(runs + 1):  # the first one warms the pool up
            mark = os.path.join(folder, f"mark-{i}")
            due = utcnow() + timedelta(seconds=0.5)  # the waiter is waiting by then
            job = create_job(store, "bench.ask", [mark], {}, run_after=due)
            waiter = subprocess.Popen(
                [OUTLAST, "wait", job.id, "--timeout", "60"],
                env=_env(url),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            code = waiter.wait()  # a blocking waitpid: wait(timeout) polls every 50 ms
            exited = time.time()
            assert code == 4, f"wait exited {code}, not 4 (paused)"
            assert store.get(job.id).status == Status.PAUSED
            with open(mark) as note:
                paused = float(note.read())
            if i:
                gaps.append((exited - paused) * 1000)
    finally:
        pool.terminate()
        pool.wait(30)
        store.close()
    return gaps


def one_store_mcp(url: str, runs: int) -> list[float]:
    """Milliseconds from each pause to the MCP ``wait`` tool's answer reaching its client
    (the SDK's own, over stdio to ``outlast mcp``)."""
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    store = open_store(url, create=True)
    folder = tempfile.mkdtemp(prefix="outlast-agents-")
    pool = subprocess.Popen(
        [sys.executable, "-m", "outlast", "worker", "--import", "bench_jobs", "-c", "2"],
        env=_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = StdioServerParameters(command=OUTLAST, args=["mcp"], env=_env(url))

    async def session() -> list[float]:
        gaps = []
        async with Client(server) as client:
            for i in range(runs + 1):
                mark = os.path.join(folder, f"mark-{i}")
                due = utcnow() + timedelta(seconds=0.3)
                job = create_job(store, "bench.ask", [mark], {}, run_after=due)
                done = await client.call_tool("wait", {"job_id": job.id, "timeout": 60})
                answered = time.time()
                assert done.structured_content, done.content
                assert done.structured_content["reason"] == "paused", done.structured_content
                with open(mark) as note:
                    paused = float(note.read())
                if i:
                    gaps.append((answered - paused) * 1000)
        return gaps

    try:
        return asyncio.run(session())
    finally:
        pool.terminate()
        pool.wait(30)
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pg", metavar="URL", help="also on this PostgreSQL server")
    args = parser.parse_args()
    urls = [("sqlite", f"sqlite://{tempfile.mkdtemp(prefix='outlast-agents-')}/s.db")]
    if args.pg:
        sep = "&" if "?" in args.pg else "?"
        urls.append(("postgresql", f"{args.pg}{sep}schema=agents_{os.getpid()}"))
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| store | waiter | runs | pause → returned, p50 | p90 | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind, url in urls:
        for waiter, measure in (("outlast wait (exit 4)", one_store), ("MCP wait", one_store_mcp)):
            gaps = measure(url, args.runs)
            print(
                f"| {kind} | {waiter} | {len(gaps)} | {statistics.median(gaps):.1f} ms |"
                f" {percentile(gaps, 90):.1f} ms | {max(gaps):.1f} ms |"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
