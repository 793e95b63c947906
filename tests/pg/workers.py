"""Code that runs in other processes (spawned, see tests/store/procs.py), each opening the
PostgreSQL store by its URL and talking to the test over a pipe."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from outlast.store import open_store
from outlast.store.postgresql import PostgresStore

TIMEOUT = 60.0


def _park(conn: Connection) -> None:
    with contextlib.suppress(EOFError):
        conn.recv()


def open_together(conn: Connection, url: str, barrier: Any) -> None:
    """Meet the others at the barrier, then open (and so migrate) the store at once."""
    barrier.wait(TIMEOUT)
    with open_store(url) as store:
        store.get  # noqa: B018 - opened is enough
    conn.send("opened")


def claim_and_succeed(conn: Connection, url: str, limit: int) -> None:
    """Claim and succeed until the queue stays empty; report the ids done."""
    done: list[str] = []
    with open_store(url) as store:
        conn.send("ready")
        conn.recv()
        empty_since: float | None = None
        while True:
            tasks = store.claim(limit=limit)
            if not tasks:
                empty_since = empty_since or time.monotonic()
                if time.monotonic() - empty_since > 0.5:
                    break
                time.sleep(0.01)
                continue
            empty_since = None
            for task in tasks:
                task.succeed({"by": os.getpid()})
                task.release_worker_lock()
                done.append(task.id)
    conn.send(done)


def claim_and_hold(conn: Connection, url: str) -> None:
    """Claim one job and hold it; on request, say whether the lock lives, or write late."""
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    [task] = store.claim()
    conn.send((task.id, task.attempt, store._locks.backend))
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        if command == "alive?":
            conn.send(store._lock_alive(task.id, task._lock))
        elif command == "late":
            event = task.report("late", "progress", "from the old worker")
            state = task.succeed("late result")
            conn.send((event, str(state.status), state.attempts, state.result))


def claim_then_fork(conn: Connection, url: str) -> None:
    """Claim a job, fork a child that keeps running (and uses the store itself), then park."""
    store = open_store(url)
    [task] = store.claim()
    pid = os.fork()
    if pid == 0:  # the child: the store still works here, on connections of its own
        try:
            store.get(task.id)
            time.sleep(60)
        finally:
            os._exit(0)
    conn.send((task.id, pid))
    _park(conn)


def listen_for(conn: Connection, url: str, job_id: str | None, queue: bool) -> None:
    """Arm a listener, say so, wait; report whether and when (CLOCK_MONOTONIC) it woke."""
    with open_store(url) as store, store.listen(None if job_id is None else [job_id], queue) as li:
        conn.send("ready")
        woke = li.wait(5.0)
        conn.send((woke, time.monotonic()))


def kill_me_holding(conn: Connection, url: str, job_id: str) -> None:
    """Be a dedicated worker: hold the lock, start the job, then die by SIGKILL on request."""
    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    assert task.start()
    conn.send("holding")
    conn.recv()
    os.kill(os.getpid(), signal.SIGKILL)
