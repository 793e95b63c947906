"""Celery's side of ``bench/peers/run.py`` (run with ``bench/.peers/celery``): the local Redis
as broker (database 13) and result backend (database 14), both flushed first.

Settings: Celery's documented defaults. ``noop.delay(i)``; ``celery -A celery_jobs worker -c
C`` per worker: the prefork pool of C processes, prefetch multiplier 4, acknowledgement on
receipt (``task_acks_late`` off), results stored in Redis (needed to see a job done), log
level WARNING (the default), no retries. Status polls with ``AsyncResult.state``;
``done_count`` is the result database's size (``DBSIZE``: one key per finished task).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any

from _drive import popen, stamp
from celery import Celery

BROKER = "redis://127.0.0.1:6379/13"
BACKEND = "redis://127.0.0.1:6379/14"
VERSION = f"Celery {version('celery')}"
SETTINGS = (
    "defaults: `celery worker -c C` (prefork), prefetch x4, acks on receipt, "
    "Redis broker + Redis results"
)
DURABILITY = (
    "not durable: Redis here has no persistence, a restart loses every job; acks on receipt, "
    "so a worker killed mid-task loses it (acks_late would redeliver it after the 1 h "
    "visibility timeout)"
)

app = Celery("peers", broker=BROKER, backend=BACKEND)
app.conf.broker_connection_retry_on_startup = True  # silences a start-up deprecation warning


@app.task(name="peers.noop")
def noop(i: int) -> int:
    started = time.time()
    stamp(i, started)
    return i


def setup() -> None:
    from redis import Redis

    for url in (BROKER, BACKEND):
        client = Redis.from_url(url)
        client.flushdb()
        client.close()


def enqueue(i: int) -> Any:
    return noop.delay(i)


def start_workers(
    count: int, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    cli = os.path.join(os.path.dirname(sys.executable), "celery")
    argv = [cli, "-A", "celery_jobs", "worker", "-c", str(concurrency)]
    return [popen([*argv, "-n", f"peers{n}@%h"], env, f"celery-{n}") for n in range(count)]


def done_count() -> int:
    return int(app.backend.client.dbsize())


def is_done(result: Any) -> bool:
    return bool(result.state == "SUCCESS")


def teardown() -> None:
    app.close()
