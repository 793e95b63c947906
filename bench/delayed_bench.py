"""Delayed commands, before/after, paired: what they hold while they wait, and how close to
their time they start. How the parked delayed jobs were measured (BENCHMARKS.md).

    python bench/delayed_bench.py BEFORE_SRC AFTER_SRC [--store sqlite|postgresql]
        [--jobs 100] [--delay 8] [--reps 3]

A source is a folder holding the ``outlast`` package (``git worktree add /tmp/before REV``,
then ``/tmp/before/src``); each run is a fresh process with it first on ``PYTHONPATH``, on a
fresh store. One run: ``--jobs`` commands (``true``) delayed by ``--delay`` seconds, one
``outlast.run_command`` call at a time, all due at the same moment, then waited for. Printed
per side, medians over ``--reps``:

- ``submit ms``: the median ``run_command`` call;
- ``procs`` and ``MB``: the store's supervisors and timer alive, and their resident memory,
  half-way through the wait (sampled once: nothing starts or ends then);
- ``late ms``: each job's start after its time (its ``started_at`` against the ``run_after``
  it was given), the median and the most. After the change the timer starts the workers of
  a crowd of one time 0.2 s apart, ahead of it (``outlast.run.timer.START_COST``).
"""

from __future__ import annotations

import argparse
import os
import statistics

from _common import alternate, run_in_tree

RUN = r"""
import json, os, statistics, sys, time
from datetime import timedelta
import psutil
import outlast
from outlast.model import utcnow
from outlast.run import reap

url, jobs, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
store = outlast.open_store(url)
due = utcnow() + timedelta(seconds=delay)
calls, ids = [], []
for _ in range(jobs):
    a = time.perf_counter()
    ids.append(outlast.run_command(["true"], at=due, store=store).id)
    calls.append(time.perf_counter() - a)
time.sleep(max(0.0, ((due - utcnow()).total_seconds()) / 2))
procs, rss = 0, 0
for proc in psutil.process_iter(["cmdline"]):
    line = " ".join(proc.info["cmdline"] or [])
    ours = proc.pid != os.getpid() and url in line.split()
    if ours and ("outlast.run.supervisor" in line or "outlast.run.timer" in line):
        try:
            rss += proc.memory_info().rss
            procs += 1
        except psutil.Error:
            pass
states = [reap.wait_for(store, i, timeout=600) for i in ids]
assert all(s.status == "succeeded" for s in states), [s.status for s in states]
late = [(s.started_at - due).total_seconds() * 1000 for s in states]
print(json.dumps({
    "submit_ms": statistics.median(calls) * 1000,
    "procs": procs,
    "mb": rss / 2**20,
    "late_p50": statistics.median(late),
    "late_max": max(late),
    "early": sum(1 for x in late if x < 0),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--delay", type=float, default=8.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    jobs, delay = str(args.jobs), str(args.delay)
    runs = alternate(
        args.reps,
        lambda side: run_in_tree(getattr(args, side), RUN, args.store, args.pg, jobs, delay),
    )
    load = os.getloadavg()[0]
    print(
        f"\n{args.store}, {args.jobs} x 'true' delayed {args.delay:g} s, {args.reps} reps,"
        f" load {load:.1f}"
    )
    print(
        f"{'':8} {'submit ms':>10} {'procs':>6} {'MB':>7} {'late p50 ms':>12}"
        f" {'late max ms':>12} {'early':>6}"
    )
    for side, found in runs.items():

        def med(key: str, found: list[dict[str, float]] = found) -> float:
            return statistics.median(r[key] for r in found)

        print(
            f"{side:8} {med('submit_ms'):10.2f} {med('procs'):6.0f} {med('mb'):7.0f}"
            f" {med('late_p50'):12.1f} {med('late_max'):12.1f} {med('early'):6.0f}"
        )


if __name__ == "__main__":
    main()
