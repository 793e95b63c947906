"""Huey's side of ``bench/peers/run.py`` (run with ``bench/.peers/huey``): ``SqliteHuey`` on a
fresh file in ``PEERS_DIR``.

Settings: Huey's documented defaults. ``SqliteHuey(filename=…)`` (WAL, SQLite's default
``synchronous`` = FULL, 8 MB cache), results kept (the task returns a value), no retries;
``huey_consumer huey_jobs.huey -w C -k process`` per worker: C worker processes (the docs'
choice for CPU-bound work; the default is threads), polling every 0.1 s backing off by 1.15x
up to 10 s while idle (the defaults), logging each task at INFO (the default) to a file.
Status polls with ``Result.get(blocking=False)``; ``done_count`` is ``huey.result_count()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any

from _drive import popen, stamp
from huey import SqliteHuey

VERSION = f"Huey {version('huey')}"
SETTINGS = (
    "defaults: SqliteHuey (WAL, synchronous=FULL), `huey_consumer -w C -k process` "
    "per worker (poll 0.1 s, backoff 1.15x to 10 s), INFO log per task"
)
DURABILITY = (
    "queued jobs durable (SQLite WAL, synchronous=FULL); a task is deleted from the queue "
    "when a worker takes it: a worker killed mid-task loses it (no acknowledgement)"
)

huey = SqliteHuey("peers", filename=os.path.join(os.environ.get("PEERS_DIR", "."), "huey.db"))


@huey.task()
def noop(i: int) -> int:
    started = time.time()
    stamp(i, started)
    return i


def setup() -> None:
    pass  # SqliteHuey made its tables when the module was imported


def enqueue(i: int) -> Any:
    return noop(i)


def start_workers(
    count: int, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    consumer = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
    argv = [consumer, "huey_jobs.huey", "-w", str(concurrency), "-k", "process"]
    return [popen(argv, env, f"huey-{n}") for n in range(count)]


def done_count() -> int:
    return int(huey.result_count())


def is_done(result: Any) -> bool:
    return result.get(blocking=False) is not None


def teardown() -> None:
    huey.storage.close()
