"""A queue of commands in a pueue-style group, before/after, paired: what it costs to hold and
to drain. How the parked group commands were measured (BENCHMARKS.md).

    python bench/groups_bench.py BEFORE_SRC AFTER_SRC [--store sqlite|postgresql]
        [--jobs 200] [--slots 1] [--reps 3] [--command "true"] [--shared]

A source is a folder holding the ``outlast`` package (``git worktree add /tmp/before REV``,
then ``/tmp/before/src``); each run is a fresh process with it first on ``PYTHONPATH``, on a
fresh store. One run: ``--slots`` set for the group, ``--jobs`` commands queued in it one
``outlast.run_command`` call at a time (a user's loop of ``outlast run --group``, without the
CLI's start-up), then waited for. Printed per side, medians over ``--reps``:

- ``submit ms``: the median ``run_command`` call;
- ``drain jobs/s``: jobs over the time from the first call to the last job's end;
- ``hand-off ms``: with one slot, the median gap between a job's end and the next one's start
  (the jobs' own times in the store);
- ``supervisors``: the most supervisor processes of the store alive at once (sampled every
  20 ms), and ``MB``: the most resident memory they held at once.

``--shared``: the group is shared with function jobs (``limit_key="g"``) run by one pool
(``outlast worker -c 1``). ``--jobs`` times: a function job of the group that takes 0.2 s is
queued, then, once it runs, a command of the group, which waits parked for the slot; the
figure is the median gap between the function job's end and the command's start
(``pool hand-off ms``), and the run's time.
"""

from __future__ import annotations

import argparse
import os
import statistics

from _common import alternate, run_in_tree

RUN = r"""
import json, os, statistics, sys, threading, time
import psutil
import outlast
from outlast.run import reap

url, jobs, slots, command = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
store = outlast.open_store(url)
if hasattr(outlast, "set_slots"):
    outlast.set_slots("g", slots, store)
else:
    store.set_slots("g", slots)
most = [0, 0.0]
stop = threading.Event()

def sample():
    while not stop.wait(0.02):
        n, rss = 0, 0
        for proc in psutil.process_iter(["cmdline"]):
            line = " ".join(proc.info["cmdline"] or [])
            if "outlast.run.supervisor" in line and url in line:
                try:
                    rss += proc.memory_info().rss
                    n += 1
                except psutil.Error:
                    pass
        most[0], most[1] = max(most[0], n), max(most[1], rss / 2**20)

threading.Thread(target=sample, daemon=True).start()
calls, ids = [], []
t0 = time.time()
for _ in range(jobs):
    a = time.perf_counter()
    ids.append(outlast.run_command(["sh", "-c", command], group="g", store=store).id)
    calls.append(time.perf_counter() - a)
states = [reap.wait_for(store, i, timeout=600) for i in ids]
stop.set()
time.sleep(0.05)
assert all(s.status == "succeeded" for s in states), [s.status for s in states]
end = max(s.finished_at for s in states).timestamp()
order = sorted(states, key=lambda s: s.started_at)
gaps = [
    (b.started_at - a.finished_at).total_seconds() * 1000 for a, b in zip(order, order[1:])
]
print(json.dumps({
    "submit_ms": statistics.median(calls) * 1000,
    "drain": jobs / (end - t0),
    "handoff_ms": statistics.median(gaps) if slots == 1 else None,
    "supervisors": most[0],
    "mb": most[1],
}))
"""


SHARED = r"""
import json, os, statistics, subprocess, sys, tempfile, time
import outlast
from outlast.run import reap

url, jobs = sys.argv[1], int(sys.argv[2])
store = outlast.use_store(url)
outlast.set_slots("g", 1, store)
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "shared_jobs.py"), "w") as f:
    f.write(
        "import time, outlast\n"
        "@outlast.job(name='shared.hold', limit_key='g')\n"
        "def hold() -> None:\n"
        "    time.sleep(0.2)\n"
    )
sys.path.insert(0, folder)
import shared_jobs
env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["PYTHONPATH"], folder]))
argv = [sys.executable, "-m", "outlast", "--store", url, "worker", "-c", "1",
        "--import", "shared_jobs"]
pool = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
gaps = []
t0 = time.monotonic()
try:
    for _ in range(jobs):
        held = shared_jobs.hold.submit()
        while store.get(held.id).status != "running":
            time.sleep(0.005)
        command = outlast.run_command(["true"], group="g", store=store)
        done = reap.wait_for(store, command.id, timeout=120)
        assert done.status == "succeeded", done.status
        gaps.append((done.started_at - store.get(held.id).finished_at).total_seconds() * 1000)
finally:
    pool.terminate()
    pool.wait(30)
print(json.dumps({"handoff_ms": statistics.median(gaps), "seconds": time.monotonic() - t0}))
"""


def run_once(src: str, args: argparse.Namespace) -> dict[str, float]:
    if args.shared:
        return run_in_tree(src, SHARED, args.store, args.pg, str(args.jobs))
    return run_in_tree(src, RUN, args.store, args.pg, str(args.jobs), str(args.slots), args.command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--command", default="true")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--shared", action="store_true", help="the group shared with a pool's function jobs"
    )
    args = parser.parse_args()
    runs = alternate(args.reps, lambda side: run_once(getattr(args, side), args))
    load = os.getloadavg()[0]
    if args.shared:
        print(f"\n{args.store}, {args.jobs} hand-offs from a pool's job, load {load:.1f}")
        for side, found in runs.items():
            handoff = statistics.median(r["handoff_ms"] for r in found)
            seconds = statistics.median(r["seconds"] for r in found)
            print(f"{side:8} pool hand-off ms {handoff:10.1f}   run s {seconds:6.1f}")
        return
    print(
        f"\n{args.store}, {args.jobs} x {args.command!r} in a group of {args.slots},"
        f" {args.reps} reps, load {load:.1f}"
    )
    print(
        f"{'':8} {'submit ms':>10} {'drain jobs/s':>13} {'hand-off ms':>12} "
        f"{'supervisors':>12} {'MB':>8}"
    )
    for side, found in runs.items():

        def med(key: str, found: list[dict[str, float]] = found) -> float:
            values = [r[key] for r in found if r[key] is not None]
            return statistics.median(values) if values else float("nan")

        print(
            f"{side:8} {med('submit_ms'):10.2f} {med('drain'):13.1f} {med('handoff_ms'):12.1f}"
            f" {med('supervisors'):12.0f} {med('mb'):8.0f}"
        )


if __name__ == "__main__":
    main()
