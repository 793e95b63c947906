"""What an idle pool costs: SQL statements per minute and CPU, on SQLite and PostgreSQL.

A pool (``-c 1``, default poll settings) runs in this process on an empty store; after a
settling second every statement it (and its maintainer thread) sends is counted for
``--seconds``: SQLite's own trace callback sees each statement, and on PostgreSQL every
``Cursor.execute`` of psycopg is counted. Run with the figures of two trees side by side::

    PYTHONPATH=/path/to/other/src python bench/idle_bench.py

It uses only what every version has (``Pool(store).run()``, ``pool.stop()``), so it measures
before and after a change alike. Two pools run at once (``--pools 2``) to show that only one
of them, the store's maintainer, sends anything.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import tempfile
import threading
import time
from typing import Any

COUNT = [0]


def _count_sqlite() -> None:
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = real(*args, **kwargs)
        conn.set_trace_callback(lambda _sql: COUNT.__setitem__(0, COUNT[0] + 1))
        return conn

    sqlite3.connect = connect  # type: ignore[assignment]


def _count_psycopg() -> None:
    import psycopg

    real = psycopg.Cursor.execute  # Connection.execute goes through it too

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNT[0] += 1
        return real(self, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]


def measure(url: str, seconds: float, pools: int) -> tuple[float, float]:
    """Statements per minute and CPU seconds per minute of ``pools`` idle pools."""
    from outlast.run.pool import Pool
    from outlast.store import open_store

    store = open_store(url)
    runners = []
    for _ in range(pools):
        pool = Pool(store, concurrency=1)
        thread = threading.Thread(target=pool.run, daemon=True)
        thread.start()
        runners.append((pool, thread))
    time.sleep(3.0)  # start-up: job processes, first claims, the first (thorough) sweep
    before, cpu = COUNT[0], resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    used = resource.getrusage(resource.RUSAGE_SELF)
    statements = COUNT[0] - before
    for pool, thread in runners:
        pool.stop()
        thread.join(30)
    store.close()
    cpu_s = (used.ru_utime - cpu.ru_utime) + (used.ru_stime - cpu.ru_stime)
    return statements * 60 / seconds, cpu_s * 60 / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--pools", type=int, default=1)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    args = parser.parse_args()
    os.environ.pop("WORKER_POLL_MIN", None)
    os.environ.pop("WORKER_POLL_MAX", None)
    if args.store == "sqlite":
        _count_sqlite()
        url = f"sqlite://{tempfile.mkdtemp(prefix='outlast-idle-')}/s.db"
    else:
        _count_psycopg()
        url = f"{args.pg}{'&' if '?' in args.pg else '?'}schema=idle_{os.getpid()}"
    per_minute, cpu = measure(url, args.seconds, args.pools)
    print(
        f"{args.store}: {args.pools} idle pool(s): {per_minute:.0f} statements/min, "
        f"{cpu:.2f} CPU s/min (this process: pools, their maintainers, not job processes)"
    )
    if args.store == "postgresql":
        import psycopg

        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "idle_{os.getpid()}" CASCADE')


if __name__ == "__main__":
    main()
