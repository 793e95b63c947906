"""A PostgreSQL server that restarts under load (issue 12, item 3): pools, supervisors and
waits carry on, what lost its lock is fenced and retried, and no job stays running.

Every test runs its own server (tests/pg/private.py), never the shared one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.model import Status
from outlast.store import open_store
from tests.pg.private import PrivateServer, binaries
from tests.pool.conftest import Harness
from tests.waiting import until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    if binaries() is None:
        pytest.skip("no PostgreSQL binaries to run a private server")
    try:
        private = PrivateServer()
        private.start()
    except (RuntimeError, subprocess.CalledProcessError, KeyError) as exc:
        pytest.skip(f"cannot run a private PostgreSQL server here: {exc}")
    try:
        yield private
    finally:
        private.close()


class PrivateHarness(Harness):
    def __init__(self, tmp: Path, url: str) -> None:
        super().__init__(tmp)
        self.store.close()
        self.url = url
        self.env["OUTLAST_STORE"] = url
        self.env["XDG_STATE_HOME"] = str(tmp / "state")
        self.store = open_store(url)


@pytest.fixture
def pool(tmp_path: Path, server: PrivateServer) -> Iterator[Harness]:
    harness = PrivateHarness(tmp_path, server.url())
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_pools_live_through_restarts_and_every_job_ends(
    pool: Harness, server: PrivateServer, mode: str
) -> None:
    jobs = [pool.submit("pt.sleep", 0.3) for _ in range(24)]
    workers = [pool.worker("-c", "2"), pool.worker("-c", "2")]
    until(lambda: any(pool.get(j).status == Status.SUCCEEDED for j in jobs) or None, 60, "work")
    for _ in range(2):
        server.restart(mode)
        until(lambda: sum(pool.get(j).terminal for j in jobs) > 0 or None, 30, "work after it")
    states = [pool.wait_for(j, timeout=120) for j in jobs]
    for worker in workers:
        assert worker.popen.poll() is None, f"a pool died:\n{worker.stderr()[-2000:]}"
    assert all(s.status == Status.SUCCEEDED for s in states), [(s.status, s.error) for s in states]
    for worker in workers:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.stderr()[-2000:]
    assert not [s for s in pool.store.list(limit=None) if s.status == Status.RUNNING]


def test_a_wait_lives_through_a_restart(pool: Harness, server: PrivateServer) -> None:
    job = pool.store.create(kind="function", name="pt.noop", queue="later")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "outlast", "wait", job.id, "--timeout", "60"],
        env={**pool.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    until(lambda: _waiting(waiter.pid) or None, 30, "the wait to be under way")
    server.restart("fast")
    pool.store.open(job.id).cancel()
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 3, (out, err)  # canceled: it saw the end, after the restart


def _waiting(pid: int) -> bool:
    """The process has the store's LISTEN connection open: beside the one it opened the
    store with (one connection alone may still be opening the store, which a restart then
    fails: not what this test is about)."""
    try:
        return sum("ESTAB" in line for line in _sockets(pid)) >= 2
    except OSError:
        return False


def _sockets(pid: int) -> list[str]:
    done = subprocess.run(["ss", "-tnp"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if f"pid={pid}," in line]


def test_a_supervisor_lives_through_a_restart(pool: Harness, server: PrivateServer) -> None:
    """Its lock is lost with the server: the command is stopped (another may run it now),
    the job retried; nothing is left running or stranded."""
    import outlast

    task = outlast.run_command(
        ["sh", "-c", "sleep 3; echo done"], attempts=3, store=pool.store,
        env={**os.environ, **pool.env},
    )  # fmt: skip
    until(lambda: pool.get(task.id).pid or None, 30, "the command to start")
    server.restart("fast")
    worker = pool.worker("-c", "1")  # a maintainer, to reconcile the fenced attempt
    state = pool.wait_for(task.id, timeout=120)
    assert state.status == Status.SUCCEEDED, (state.error, worker.stderr()[-2000:])
