"""Procrastinate's side of ``bench/peers/run.py`` (run with ``bench/.peers/procrastinate``): the
fresh database ``PEERS_PG``, its schema applied first (not timed).

Settings: Procrastinate's documented defaults. ``App(connector=PsycopgConnector(…))``, opened
synchronously for ``defer`` (its sync API, as a web app uses it); ``procrastinate --app
procrastinate_jobs.app worker --concurrency C`` per worker, with LISTEN/NOTIFY (the default)
and the 5 s fallback poll, finished jobs kept (``delete_jobs`` never, the default), no
retries. Status polls with ``app.job_manager.get_job_status(id)``; ``done_count`` counts
``status = 'succeeded'`` rows of ``procrastinate_jobs`` with one query.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import version
from typing import Any

import psycopg
from _drive import popen, stamp
from procrastinate import App, PsycopgConnector
from procrastinate.jobs import Status

VERSION = f"Procrastinate {version('procrastinate')}"
SETTINGS = (
    "defaults: `procrastinate worker --concurrency C` per worker, LISTEN/NOTIFY + 5 s poll, "
    "sync `defer` through the app's psycopg pool, INFO log per job"
)
DURABILITY = (
    "durable: every job change is a PostgreSQL commit (synchronous_commit=on); a worker killed "
    "mid-job leaves it 'doing' until stalled-job recovery (the user's call: "
    "get_stalled_jobs + retry; heartbeat 30 s)"
)

app = App(connector=PsycopgConnector(conninfo=os.environ.get("PEERS_PG", "")))


@app.task(name="peers.noop")
def noop(i: int) -> int:
    started = time.time()
    stamp(i, started)
    return i


_count: Any = None


def setup() -> None:
    global _count
    app.open()
    app.schema_manager.apply_schema()
    _count = psycopg.connect(os.environ["PEERS_PG"], autocommit=True)


def enqueue(i: int) -> int:
    return noop.defer(i=i)


def start_workers(
    count: int, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    cli = os.path.join(os.path.dirname(sys.executable), "procrastinate")
    argv = [cli, "--app", "procrastinate_jobs.app", "worker", "--concurrency", str(concurrency)]
    return [popen(argv, env, f"procrastinate-{n}") for n in range(count)]


def done_count() -> int:
    sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    return int(_count.execute(sql).fetchone()[0])


def is_done(job_id: int) -> bool:
    return bool(app.job_manager.get_job_status(job_id) == Status.SUCCEEDED)


def teardown() -> None:
    if _count is not None:
        _count.close()
    app.close()
