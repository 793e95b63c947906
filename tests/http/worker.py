"""A worker process of the HTTP tests: opens the store by URL, runs one job and reports.

``python -m tests.http.worker STORE_URL JOB_ID [--events N] [--interval S] [--step NAME]
[--die]`` holds the job's worker lock, starts it, reports N events (step ``work``, message
``{"i": i}``), then succeeds — or, with ``--die``, exits without a word, as a crashed
worker would. It stops early once the job was finished by someone else (a cancel).
"""

from __future__ import annotations

import argparse
import os
import time

from outlast.store import open_store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store_url")
    parser.add_argument("job_id")
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--step", default="work")
    parser.add_argument("--interval", type=float, default=0.0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before starting")
    parser.add_argument("--die", action="store_true")
    args = parser.parse_args()
    store = open_store(args.store_url)
    task = store.open(args.job_id)
    task.hold_worker_lock()
    time.sleep(args.delay)
    if not task.start():
        raise SystemExit(f"job {args.job_id} was not pending")
    for i in range(args.events):
        progress = 100.0 * (i + 1) / args.events
        if task.report(args.step, "progress", {"i": i}, progress=progress) is None:
            return  # canceled: the store ignores us now
        if args.interval:
            time.sleep(args.interval)
    if args.die:
        os._exit(3)
    task.succeed({"events": args.events})


if __name__ == "__main__":
    main()
