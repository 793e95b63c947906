"""Code that runs in other processes, each opening the store by its URL.

Processes are spawned (never forked: a forked child would share the parent's open store, its
connections and its locks). Each child talks to the test over a pipe; an exception in a child
comes back as an ``("error", traceback)`` message so the test fails with the child's traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import subprocess
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from outlast.errors import WorkerLockHeld
from outlast.store import Task, open_store

CTX = multiprocessing.get_context("spawn")
TIMEOUT = 30.0


class Child:
    """A spawned process and the parent's end of its pipe."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self.conn, theirs = CTX.Pipe()
        self.proc = CTX.Process(target=_main, args=(target, theirs, *args), daemon=True)
        self.proc.start()
        theirs.close()

    def recv(self, timeout: float = TIMEOUT) -> Any:
        if not self.conn.poll(timeout):
            raise AssertionError(f"no word from the child in {timeout}s ({self.proc})")
        try:
            message = self.conn.recv()
        except EOFError:
            self.proc.join(TIMEOUT)
            raise AssertionError(f"the child died (exit code {self.proc.exitcode})") from None
        if isinstance(message, tuple) and message and message[0] == "error":
            raise AssertionError(f"the child failed:\n{message[1]}")
        return message

    def expect(self, what: Any, timeout: float = TIMEOUT) -> None:
        message = self.recv(timeout)
        assert message == what, f"child said {message!r}, expected {what!r}"

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def kill(self) -> None:
        """SIGKILL, then reap."""
        self.proc.kill()
        # No timeout: join(timeout) waits on the sentinel pipe, which a command the child
        # started with close_fds=False still holds open; a plain join reaps the child itself.
        self.proc.join()
        assert self.proc.exitcode == -9, f"exit code {self.proc.exitcode} after SIGKILL"

    def join(self) -> None:
        self.proc.join(TIMEOUT)
        assert self.proc.exitcode == 0, f"child exit code {self.proc.exitcode}"

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.proc.join(TIMEOUT)
        self.conn.close()


@contextlib.contextmanager
def spawned(target: Callable[..., None], *args: Any) -> Iterator[Child]:
    child = Child(target, *args)
    try:
        yield child
    finally:
        child.close()


def _main(target: Callable[..., None], conn: Connection, *args: Any) -> None:
    try:
        target(conn, *args)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise


def _park(conn: Connection) -> None:
    """Wait until the parent says so or goes away (a parked child never outlives a test)."""
    with contextlib.suppress(EOFError):
        conn.recv()


# ------------------------------------------------------------------------------- targets
def hold_lock(conn: Connection, url: str, job_id: str, start: bool, grandchild: bool) -> None:
    """Be the job's worker: take its lock, start it, maybe start a command, then park."""
    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    if start and not task.start():
        raise RuntimeError(f"job {job_id} could not be started")
    pid = None
    if grandchild:
        # close_fds=False: only the lock's own close-on-exec flag can keep it from the command.
        pid = subprocess.Popen(["sleep", "30"], close_fds=False).pid
    conn.send(("ready", pid))
    _park(conn)


def hold_lock_busy(conn: Connection, url: str, job_id: str, seconds: float) -> None:
    """PostgreSQL: be the job's worker, then keep its lock connection's backend busy for
    ``seconds`` (a query sent, not awaited): killed meanwhile, the backend goes on holding
    the lock until the query ends and it sees its client gone."""
    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    assert task.start()
    lock_conn = store._locks.conn  # type: ignore[attr-defined]
    lock_conn.pgconn.send_query(f"SELECT pg_sleep({seconds})".encode())
    lock_conn.pgconn.flush()
    conn.send("ready")
    _park(conn)


def try_lock(conn: Connection, url: str, job_id: str) -> None:
    store = open_store(url)
    try:
        store.open(job_id).hold_worker_lock()
    except WorkerLockHeld:
        conn.send("held")
    else:
        conn.send("acquired")


def report_with_acks(conn: Connection, url: str, job_id: str, n: int) -> None:
    """Start the job, report ``n`` times waiting for the parent's ack after each, succeed."""
    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    assert task.start()
    for i in range(n):
        task.report("work", "progress", f"r{i}", progress=(i + 1) * 100 / n)
        if not conn.poll(TIMEOUT):
            raise RuntimeError(f"no ack for report {i}: the watcher did not see it")
        conn.recv()
    task.succeed({"reports": n})
    conn.send("done")


def start_then_succeed(conn: Connection, url: str, job_id: str, delay: float) -> None:
    import time

    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    assert task.start()
    conn.send("started")
    time.sleep(delay)
    task.succeed("ok")
    conn.send("done")


def write_on_go(conn: Connection, url: str, job_id: str) -> None:
    store = open_store(url)
    task = store.open(job_id)
    conn.send("ready")
    conn.recv()
    task.report("ping", "progress", "hello")
    conn.send("done")


def race(conn: Connection, url: str, jobs: list[tuple[str, int]], barrier: Any, op: str) -> None:
    """For each job, meet the other racer at the barrier, then cancel or succeed it."""
    store = open_store(url)
    results: list[tuple[str, str]] = []
    errors: list[str] = []
    for job_id, attempt in jobs:
        barrier.wait(TIMEOUT)
        try:
            if op == "cancel":
                state = store.open(job_id).cancel()
            else:
                state = Task(store, job_id, attempt=attempt).succeed({"by": "worker"})
            results.append((job_id, str(state.status)))
        except Exception as exc:
            errors.append(f"{op} {job_id}: {exc!r}")
    conn.send((results, errors))


def report_many(conn: Connection, url: str, job_id: str, worker: int, n: int) -> None:
    store = open_store(url)
    task = store.open(job_id)
    conn.send("ready")
    conn.recv()
    refused = 0
    for i in range(n):
        if task.report(f"w{worker}", "progress", f"w{worker}-{i}") is None:
            refused += 1
    conn.send(("done", refused))


def claim_all(conn: Connection, url: str, limit: int) -> None:
    store = open_store(url)
    conn.send("ready")
    conn.recv()
    claimed: list[str] = []
    while tasks := store.claim(limit=limit):
        claimed += [t.id for t in tasks]
    conn.send(claimed)


def write_many(conn: Connection, url: str, job_id: str, n: int) -> None:
    """``n`` reports: report i has step ``s<i>``, message i and progress i/10."""
    store = open_store(url)
    task = store.open(job_id)
    conn.send("ready")
    conn.recv()
    for i in range(1, n + 1):
        if i % 2:
            task.report(f"s{i}", "progress", i, progress=i / 10)
        else:
            task.relabel("n", str(i))
    conn.send("done")


def claim_and_park(conn: Connection, url: str) -> None:
    """Be a pool: claim one job, then park holding it."""
    store = open_store(url)
    tasks = store.claim()
    conn.send(("ready", [t.id for t in tasks]))
    _park(conn)


def fire_for(conn: Connection, url: str, seconds: float) -> None:
    """Fire the store's schedules as fast as it can for ``seconds`` (as many maintainers
    would, were the maintenance lock not there); reports the ids of the jobs it made."""
    import time

    store = open_store(url)
    conn.send("ready")
    conn.recv()
    made: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        made += [job.id for job in store.fire_schedules()]
        time.sleep(0.002)
    conn.send(made)
    store.close()


def submit_unique(conn: Connection, url: str, key: str, n: int, barrier: Any) -> None:
    """Create ``n`` jobs with the same unique key, as fast as it can, from the barrier on;
    reports the ids it got back."""
    store = open_store(url)
    conn.send("ready")
    barrier.wait()
    got = [store.create(kind="function", name="u", unique_key=key).id for _ in range(n)]
    conn.send(got)
    store.close()
