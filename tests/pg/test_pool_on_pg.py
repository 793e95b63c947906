"""The pool suite (tests/pool: real ``outlast worker`` processes) on a PostgreSQL store.

Each ``test_*`` of the pool modules is collected here again with a ``pool`` harness whose
store is a fresh PostgreSQL schema.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from _pytest.fixtures import FixtureFunctionDefinition

from outlast.model import Status
from outlast.store import open_store
from tests.pg import support
from tests.pool.conftest import Harness, read_lines
from tests.waiting import until

pytestmark = pytest.mark.timeout(180)


class PgHarness(Harness):
    def __init__(self, tmp: Path, url: str) -> None:
        super().__init__(tmp)
        self.store.close()
        self.url = url
        self.env["OUTLAST_STORE"] = url
        self.store = open_store(url)

    def close(self) -> None:
        schema = support.schema_of(self.url)
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if schema in proc.environ().get("OUTLAST_STORE", "") or any(
                    schema in arg for arg in proc.cmdline()
                ):
                    os.kill(proc.pid, signal.SIGKILL)
        super().close()


@pytest.fixture
def pool(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    harness = PgHarness(tmp_path, store_url)
    try:
        yield harness
    finally:
        harness.close()


_SUITE = (
    "test_bad_input",
    "test_exactly_once",
    "test_failures",
    "test_lifecycle",
    "test_pause_cancel",
    "test_spawn",
)

for _name in _SUITE:
    _module = importlib.import_module(f"tests.pool.{_name}")
    for _attr, _value in vars(_module).items():
        if _attr.startswith("test_") and callable(_value):
            globals()[f"{_attr}__{_name[5:]}"] = _value
        elif isinstance(_value, FixtureFunctionDefinition) and _attr != "pool":
            globals()[_attr] = _value


def _lock_backends(pid: int) -> list[int]:
    """The backends of the lock connections of process ``pid`` (matched by client port)."""
    ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.laddr}
    with support.connect() as admin:
        rows = admin.execute(
            "SELECT pid, client_port FROM pg_stat_activity"
            " WHERE application_name LIKE 'outlast-locks %'"
        ).fetchall()
    return [backend for backend, port in rows if port in ports]


@pytest.mark.timeout(90)
def test_a_job_whose_lock_connection_is_cut_is_stopped_not_canceled(pool: Harness) -> None:
    """The pool loses the worker lock of a running job (its lock connection is terminated):
    it stops the job, and what the stopped job says is not written — the job was not
    canceled, it was abandoned, and reconcile fails it over like any abandoned job."""
    marks = pool.tmp / "marks.txt"
    worker = pool.worker("-c", "1")
    job = pool.submit("pt.cooperative", str(marks))
    until(lambda: read_lines(marks) == ["started"], 30, "the job to start")
    backends = until(lambda: _lock_backends(worker.popen.pid), 10, "the lock connection")
    with support.connect() as admin:
        for backend in backends:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    until(lambda: "stopped" in read_lines(marks), 10, "the pool to stop the job")
    time.sleep(0.5)  # time for a wrong outcome to be written, if one were
    state = pool.get(job)
    assert state.status == Status.RUNNING, pool.describe()
    assert pool.store.abandoned(state)
    after = pool.store.reconcile(state)
    assert after.status == Status.FAILED and after.error is not None
    assert after.error.code == "abandoned"
    assert worker.popen.poll() is None  # the pool carries on
    assert pool.wait_for(pool.submit("pt.noop", 1), timeout=30).status == Status.SUCCEEDED
