"""The CLI's fast path: median wall time of `outlast status ID` against `python -c pass`.

Target: the ratio is at most 3 (a status call is what scripts and agents run in a loop).
Also: how long `outlast run -- true` takes to return with the job id (target 300 ms).

    python bench/cli_bench.py [--runs 31]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from outlast.store import open_store


def wall(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=31)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="outlast-cli-bench-")
    url = f"sqlite://{root}/s.db"
    store = open_store(url)
    task = store.create(command=["true"])
    store.close()
    env = dict(os.environ, OUTLAST_STORE=url)
    outlast = shutil.which("outlast", path=os.path.dirname(sys.executable)) or "outlast"
    base = wall([sys.executable, "-c", "pass"], args.runs, env)
    fast = wall([outlast, "status", task.id], args.runs, env)
    fast_json = wall([outlast, "status", task.id, "--json"], args.runs, env)
    full = wall([outlast, "ls", "--limit", "5"], args.runs, env)
    run = wall([outlast, "run", "--", "true"], args.runs, env)
    print(f"python -c pass           {base * 1000:7.1f} ms")
    print(
        f"outlast status ID        {fast * 1000:7.1f} ms   ratio {fast / base:.2f}  (target <= 3)"
    )
    print(f"outlast status ID --json {fast_json * 1000:7.1f} ms   ratio {fast_json / base:.2f}")
    print(f"outlast ls (full CLI)    {full * 1000:7.1f} ms   ratio {full / base:.2f}")
    print(f"outlast run -- true      {run * 1000:7.1f} ms   (returns with the id; target 300 ms)")
    print(f"# medians of {args.runs} runs")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
