"""A group's queue under SIGKILL: parked jobs lose nothing when supervisors die.

    python bench/groups_kills.py STORE_URL [--jobs 60] [--slots 2] [--every 0.3]
        [--maintainer | --no-maintainer]

``--jobs`` commands (each marks its start and end in a file and sleeps 0.1 s; 5 attempts)
are queued in a group of ``--slots``. Every ``--every`` seconds, seven times in ten, a random
live supervisor of the store is SIGKILLed: the one running a job, or one on its way to take
the next. With ``--maintainer`` (the default) an ``outlast scheduler`` maintains the store;
without, each look at a job between the kills reconciles it, as ``outlast status`` would
(``outlast.run.reap.reconcile``). Printed as one JSON line: the jobs by final status (all must
succeed), the kills, the attempts, and the most jobs that ran at once by their marks (never
more than ``--slots``). Exit 1 if a promise broke.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter

import psutil

import outlast
from outlast.run import reap


def _supervisors(url: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "outlast.run.supervisor" in line and url in line:
            found.append(proc)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--every", type=float, default=0.3)
    parser.add_argument("--maintainer", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp()
    os.chmod(tmp, 0o700)
    os.environ.setdefault("XDG_STATE_HOME", f"{tmp}/state")
    os.environ["OUTLAST_RETRY_DELAY"] = "0.05"
    marks = f"{tmp}/marks"
    store = outlast.open_store(args.url)
    outlast.set_slots("g", args.slots, store)
    scheduler = None
    if args.maintainer:
        scheduler = subprocess.Popen(
            [sys.executable, "-m", "outlast", "scheduler", "--store", args.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    script = f'echo "+ $OUTLAST_JOB_ID" >> {marks}; sleep 0.1; echo "- $OUTLAST_JOB_ID" >> {marks}'
    ids = [
        outlast.run_command(["sh", "-c", script], group="g", store=store, attempts=5).id
        for _ in range(args.jobs)
    ]

    def look(job_id: str) -> bool:  # without a maintainer, as `outlast status` would
        state = store.get(job_id)
        return (state if args.maintainer else reap.reconcile(store, state)).terminal

    kills, started = 0, time.monotonic()
    while time.monotonic() < started + 600 and not all(look(i) for i in ids):
        time.sleep(args.every)
        victims = _supervisors(args.url)
        if victims and random.random() < 0.7:
            try:
                random.choice(victims).kill()
                kills += 1
            except psutil.Error:
                pass
    states = [reap.wait_for(store, i, timeout=120) for i in ids]
    if scheduler is not None:
        scheduler.terminate()
        scheduler.wait(10)
    running: set[str] = set()
    most = 0
    with open(marks) as lines:
        for line in lines:
            sign, job = line.split()
            (running.add if sign == "+" else running.discard)(job)
            most = max(most, len(running))
    statuses = Counter(str(s.status) for s in states)
    print(
        json.dumps(
            {
                "jobs": args.jobs,
                "kills": kills,
                "statuses": statuses,
                "attempts": sum(s.attempts for s in states),
                "most_at_once": most,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
    return 0 if statuses == {"succeeded": args.jobs} and most <= args.slots else 1


if __name__ == "__main__":
    sys.exit(main())
