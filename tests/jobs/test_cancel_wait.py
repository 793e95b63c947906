"""``wait`` on a canceled function job returns once the job's code has stopped (bounded by
its grace period), as it does for commands: a pool's job that takes a moment to stop, and a
spawned job that ignores the cancel and has a child that ignores SIGTERM (its dedicated
worker stops both, and ends)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from outlast.model import Status
from tests.pool.conftest import Harness, read_lines
from tests.waiting import until

SPAWN = """
import sys
from tests.pool import jobs_for_tests as jobs
print(jobs.stubborn_parent.spawn(sys.argv[1]).id)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["sqlite", "files"])
def test_wait_on_a_canceled_pool_job_returns_once_its_code_stopped(
    tmp_path: Path, kind: str
) -> None:
    url = f"sqlite://{tmp_path}/s.db" if kind == "sqlite" else f"files://{tmp_path}/store"
    pool = Harness(tmp_path, url)
    try:
        marks = tmp_path / "marks.txt"
        pool.worker("-c", "1")
        waits = []
        for how in ("cli", "python", "async"):
            marks.unlink(missing_ok=True)
            job = pool.submit("pt.slow_stop", str(marks), 0.8)
            until(lambda: read_lines(marks) == ["started"], 30, "the job to start")
            pool.store.open(job).cancel()
            if how == "cli":
                result = pool.cli("wait", job, timeout=60)
                assert result.returncode == 3, result
            elif how == "python":
                assert pool.store.open(job).wait(timeout=60).status == Status.CANCELED
            else:
                state = asyncio.run(pool.store.open(job).await_done(timeout=60))
                assert state.status == Status.CANCELED
            # the job's code took 0.8 s to stop after the cancel: the wait saw it stop
            waits.append((how, read_lines(marks)))
        assert waits == [(how, ["started", "stopped"]) for how in ("cli", "python", "async")]
    finally:
        pool.close()


@pytest.mark.timeout(90)
def test_a_canceled_spawned_job_that_ignores_it_is_stopped_and_wait_sees_it(
    pool: Harness,
) -> None:
    marks = pool.tmp / "pids.txt"
    started = pool.python(["-c", SPAWN, str(marks)])
    assert started.returncode == 0, started
    job = started.stdout.strip()
    line = until(lambda: read_lines(marks), 30, "the job to start")[0]
    pids = [int(p) for p in line.split()]
    assert all(psutil.pid_exists(p) for p in pids)

    pool.store.open(job).cancel()
    result = pool.cli("wait", job, timeout=60)

    assert result.returncode == 3, result
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert left == [], f"still running after wait returned: {left}"
    assert pool.get(job).status == Status.CANCELED
    assert not pool.store.worker_holds(job)
