"""How soon a dead worker is seen: from its SIGKILL to ``Store.wait()`` returning the job's
true state, and to the store's maintainer (an idle pool) reconciling it with nobody asking;
and how soon another pool takes the maintenance over when the maintainer itself is killed.

Each figure is the median (and max) over ``--runs`` kills, on SQLite (``--store`` for another
URL). The worker is a separate process that holds the job's worker lock and started it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from outlast.model import Status
from outlast.store import Store, open_store

HOLDER = """
import sys, time
from outlast.store import open_store
store = open_store(sys.argv[1])
task = store.open(sys.argv[2])
task.hold_worker_lock()
assert task.start()
print("ready", flush=True)
time.sleep(600)
"""


def dead_worker(store: Store, url: str) -> tuple[str, subprocess.Popen[str]]:
    job = store.create(kind="function", name="bench.held", queue="nobody", max_attempts=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, job.id], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    return job.id, holder


def until_failed(store: Store, job_id: str, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while store.get(job_id).status != Status.FAILED:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"job {job_id} not reconciled in {timeout}s")
        time.sleep(0.005)
    return time.monotonic() - start


def wait_after_kill(store: Store, url: str) -> float:
    job_id, holder = dead_worker(store, url)
    done: list[float] = []

    def waiter() -> None:
        state = store.wait(job_id, timeout=30)
        assert state.status == Status.FAILED, state
        done.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)
    killed = time.monotonic()
    holder.kill()
    holder.wait()
    thread.join(30)
    return done[0] - killed


def pool(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "outlast", "worker", "-c", "1"],
        env=dict(os.environ, OUTLAST_STORE=url),
        stderr=subprocess.DEVNULL,
    )


def maintainer_after_kill(store: Store, url: str) -> float:
    job_id, holder = dead_worker(store, url)
    holder.kill()
    holder.wait()
    return until_failed(store, job_id)


def maintenance_file(url: str) -> str | None:
    """The maintenance lock's file of a local store (None for PostgreSQL)."""
    scheme, _, path = url.partition("://")
    if scheme == "sqlite":
        return f"{path}.d/locks/@maintenance.lock"
    if scheme == "files":
        return f"{path}/.outlast/locks/@maintenance.lock"
    return None


def maintainer_pid(lock: str) -> int | None:
    """Who holds the maintenance lock (from /proc/locks)."""
    inode = os.stat(lock).st_ino
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) == inode:
                return int(fields[4])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--store", help="store URL (default: SQLite in a temporary folder)")
    args = parser.parse_args()
    url = args.store or f"sqlite://{tempfile.mkdtemp(prefix='outlast-rbench-')}/s.db"
    store = open_store(url)
    waits = [wait_after_kill(store, url) for _ in range(args.runs)]
    pools = [pool(url), pool(url)]
    time.sleep(2.0)
    swept = [maintainer_after_kill(store, url) for _ in range(args.runs)]
    takeovers = []
    lock = maintenance_file(url)
    for _ in range(min(args.runs, 5)):  # kill the maintainer; the other pool must take over
        holder = maintainer_pid(lock) if lock else None
        victim = next((p for p in pools if p.pid == holder), pools[0])
        job_id, worker = dead_worker(store, url)
        victim.kill()
        worker.kill()
        victim.wait()
        worker.wait()
        takeovers.append(until_failed(store, job_id))
        pools.remove(victim)
        pools.append(pool(url))
        time.sleep(1.5)  # the new pool is up, waiting for the lock
    for p in pools:
        p.terminate()
        p.wait()
    store.close()
    for name, values in (
        ("SIGKILL -> Store.wait() returns failed", waits),
        ("SIGKILL -> reconciled by the maintainer", swept),
        ("SIGKILL of it and of the maintainer -> reconciled", takeovers),
    ):
        print(
            f"{name:58} median {statistics.median(values) * 1000:7.0f} ms"
            f"   max {max(values) * 1000:6.0f} ms   ({len(values)} kills)"
        )


if __name__ == "__main__":
    main()
