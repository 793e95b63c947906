"""outlast's side of ``bench/peers/run.py`` (run with ``.venv``): ``PEERS_STORE=sqlite`` (a
fresh SQLite file in ``PEERS_DIR``) or ``postgresql`` (the fresh database ``PEERS_PG``,
schema ``outlast``).

Settings: outlast's defaults. ``@outlast.job(attempts=1)`` (no retries, as the peers'
defaults), ``noop.submit(i)`` one call per job, ``outlast worker -c C --import outlast_jobs``
per worker (the CLI a user runs), status polls with ``store.get(id)``; ``done_count`` counts
``status = 'succeeded'`` rows of the jobs table with one query on a connection of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from _drive import popen, stamp

import outlast
from outlast.store import Store

KIND = os.environ.get("PEERS_STORE", "sqlite")
VERSION = f"outlast {outlast.__version__}"
SETTINGS = "defaults: attempts=1, `outlast worker -c C` per worker; " + (
    "SQLite WAL, synchronous=NORMAL"
    if KIND == "sqlite"
    else "PostgreSQL, status changes committed with synchronous_commit=on"
)
DURABILITY = (
    "durable: every transition is a commit (SQLite WAL synchronous=NORMAL: survives any "
    "process crash, a power loss may take back the last moments); a dead worker is detected "
    "exactly (flock) and its job retried or failed"
    if KIND == "sqlite"
    else "durable: every status change is a flushed PostgreSQL commit; a dead worker is "
    "detected exactly (its advisory lock) and its job retried or failed"
)


@outlast.job(name="peers.noop", attempts=1)
def noop(i: int) -> int:
    started = time.time()
    stamp(i, started)
    return i


def url() -> str:
    if KIND == "postgresql":
        return os.environ["PEERS_PG"]
    return f"sqlite://{os.environ['PEERS_DIR']}/outlast.db"


_store: Store | None = None
_count: Any = None


def setup() -> None:
    global _store, _count
    _store = outlast.use_store(url())
    if KIND == "postgresql":
        import psycopg

        _count = psycopg.connect(os.environ["PEERS_PG"], autocommit=True)
    else:
        import sqlite3

        _count = sqlite3.connect(f"file:{os.environ['PEERS_DIR']}/outlast.db?mode=ro", uri=True)


def enqueue(i: int) -> str:
    return noop.submit(i).id


def start_workers(
    count: int, concurrency: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    env = dict(env, OUTLAST_STORE=url())
    argv = [sys.executable, "-m", "outlast", "worker", "-c", str(concurrency)]
    argv += ["--import", "outlast_jobs"]
    return [popen(argv, env, f"outlast-{n}") for n in range(count)]


def done_count() -> int:
    table = "outlast.jobs" if KIND == "postgresql" else "jobs"
    row = _count.execute(f"SELECT count(*) FROM {table} WHERE status = 'succeeded'").fetchone()
    return int(row[0])


def is_done(job_id: str) -> bool:
    assert _store is not None
    return bool(_store.get(job_id).status == outlast.Status.SUCCEEDED)


def teardown() -> None:
    if _count is not None:
        _count.close()
    if _store is not None:
        _store.close()
