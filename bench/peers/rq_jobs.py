"""RQ's side of ``bench/peers/run.py`` (run with ``bench/.peers/rq``): the local Redis,
database 12 (flushed first).

Settings: RQ's documented defaults. ``Queue("peers").enqueue(noop, i)``; C processes of
``rq worker -u URL peers`` per worker (an RQ worker runs one job at a time, in a work horse it
forks per job: its production mode; ``SimpleWorker`` is for tests), results kept 500 s (the
default), logging each job at INFO (the default) to a file, no retries. Status polls with
``job.get_status()``; ``done_count`` is the finished registry's size (``ZCARD``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any

from _drive import popen, stamp
from redis import Redis
from rq import Queue
from rq.job import JobStatus

URL = "redis://127.0.0.1:6379/12"
VERSION = f"RQ {version('rq')}"
SETTINGS = "defaults: C x `rq worker` (a forked work horse per job), INFO log per job"
DURABILITY = (
    "not durable: Redis here has no persistence (no RDB, no AOF), a restart loses every job; "
    "with AOF a job whose worker dies is moved to the failed registry (abandoned)"
)

redis = Redis.from_url(URL)
queue = Queue("peers", connection=redis)


def noop(i: int) -> int:
    started = time.time()
    stamp(i, started)
    return i


def setup() -> None:
    redis.flushdb()


def enqueue(i: int) -> Any:
    return queue.enqueue(noop, i)  # as "rq_jobs.noop": _drive imports this module by name


def start_workers(
    count: int, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    cli = os.path.join(os.path.dirname(sys.executable), "rq")
    argv = [cli, "worker", "-u", URL, "peers"]
    return [popen(argv, env, f"rq-{n}") for n in range(count * concurrency)]


def done_count() -> int:
    return int(queue.finished_job_registry.get_job_count(cleanup=False))


def is_done(job: Any) -> bool:
    return bool(job.get_status(refresh=True) == JobStatus.FINISHED)


def teardown() -> None:
    redis.close()
