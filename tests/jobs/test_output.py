"""Every job has a log: a function job's stdout and stderr (Python, the descriptors, C
code, child processes) go to its log, in order, and not to the pool's output; on
PostgreSQL every log (commands' too) is kept in the database, readable from any host."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from outlast.model import Status
from outlast.run.api import create_job
from tests.jobs import pyjobs
from tests.pool.conftest import Harness
from tests.store.adapters import ADAPTERS, Adapter


@pytest.fixture(params=ADAPTERS, ids=lambda a: a.name)
def any_pool(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    adapter: Adapter = request.param
    url = adapter.make_url(tmp_path / "store")
    if url is None:
        pytest.skip(f"no {adapter.name} store on this machine")
    harness = Harness(tmp_path, url)
    request.addfinalizer(harness.close)
    return harness


EXPECTED = "".join(f"line {i} {'out' if i % 2 == 0 else 'err'}\n" for i in range(6))
EXPECTED += "from a child\nfrom libc\n"


def test_a_function_jobs_output_is_its_log_on_every_store(any_pool: Harness) -> None:
    pool = any_pool
    job_id = pool.submit("py.noisy", 6)
    worker = pool.worker("--import", pyjobs.MODULE)
    assert pool.wait_for(job_id).status == Status.SUCCEEDED
    shown = pool.cli("logs", job_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == EXPECTED
    assert pool.store.log_tail(job_id, 2) == "from a child\nfrom libc\n"
    worker.popen.terminate()
    worker.wait()
    pool_output = worker.out.read_text() + worker.stderr()
    assert "line 0 out" not in pool_output and "from libc" not in pool_output
    if not pool.store.capabilities.local_logs:  # PostgreSQL: nothing on this machine's disk
        assert not pool.store.log_path(job_id).exists()


def test_logs_follow_a_running_function_job(any_pool: Harness) -> None:
    pool = any_pool
    pool.worker("--import", pyjobs.MODULE)
    pool.ready()
    job_id = pool.submit("py.noisy", 6)
    follow = pool.cli("logs", job_id, "-f", timeout=60)
    assert follow.returncode == 0, follow.stderr
    assert follow.stdout == EXPECTED


def test_ten_megabytes_interleaved_reach_the_log_whole_and_in_order(any_pool: Harness) -> None:
    pool = any_pool
    job_id = pool.submit("py.flood", 10)
    worker = pool.worker("--import", pyjobs.MODULE, env={"OUTLAST_LOG_MAX_BYTES": str(32 << 20)})
    assert pool.wait_for(job_id, timeout=120).status == Status.SUCCEEDED
    cursor = pool.store.log_cursor(job_id)
    data = cursor.read_new()
    lines = data.split(b"\n")[:-1]
    assert len(lines) == 100_000, f"{len(lines)} lines"
    assert [int(line[:9]) for line in lines] == list(range(100_000)), "out of order or lost"
    assert all(line[10:11] == (b"o" if i % 2 == 0 else b"e") for i, line in enumerate(lines))
    worker.popen.terminate()
    worker.wait()
    assert worker.out.stat().st_size < 10_000 and len(worker.stderr()) < 10_000


def test_a_log_over_its_cap_keeps_its_latest_output(any_pool: Harness) -> None:
    pool = any_pool
    cap = 64 * 1024
    job_id = pool.submit("py.flood", 1)
    pool.worker("--import", pyjobs.MODULE, env={"OUTLAST_LOG_MAX_BYTES": str(cap)})
    assert pool.wait_for(job_id, timeout=60).status == Status.SUCCEEDED
    data = pool.store.log_cursor(job_id).read_new()
    assert cap <= len(data) <= 2 * cap, len(data)
    lines = data.split(b"\n")[1:-1]  # the first may be cut
    numbers = [int(line[:9]) for line in lines]
    assert numbers[-1] == 9_999 and numbers == list(range(numbers[0], 10_000))


def test_a_command_jobs_log_on_postgresql_is_in_the_database(tmp_path: Path) -> None:
    from tests.pg.support import make_url

    url = make_url(tmp_path)
    if url is None:
        pytest.skip("no PostgreSQL here")
    pool = Harness(tmp_path, url)
    try:
        run = pool.cli("run", "--", "sh", "-c", "echo to out; echo to err >&2; echo again")
        job_id = run.stdout.strip()
        assert pool.cli("wait", job_id).returncode == 0
        assert pool.cli("logs", job_id).stdout == "to out\nto err\nagain\n"
        assert not pool.store.log_path(job_id).exists()
        assert pool.store.log_tail(job_id, 1) == "again\n"
        pool.store.delete(job_id)  # the log goes with its job
        assert pool.store.log_tail(job_id, 1) is None
    finally:
        pool.close()


def test_a_spawned_jobs_log_on_postgresql_is_in_the_database(tmp_path: Path) -> None:
    from outlast.run.api import spawn_job
    from tests.pg.support import make_url

    url = make_url(tmp_path)
    if url is None:
        pytest.skip("no PostgreSQL here")
    pool = Harness(tmp_path, url)
    try:
        import os

        os.environ["PYTHONPATH"] = pool.env["PYTHONPATH"]
        task = spawn_job(pool.store, "py.noisy", [2])
        assert pool.wait_for(task.id, timeout=60).status == Status.SUCCEEDED
        text = pool.cli("logs", task.id).stdout
        assert re.fullmatch(r"line 0 out\nline 1 err\nfrom a child\nfrom libc\n", text), text
    finally:
        pool.close()


def test_a_job_that_prints_nothing_has_no_log(any_pool: Harness) -> None:
    pool = any_pool
    job_id = create_job(pool.store, "py.one", [1]).id
    pool.worker("--import", pyjobs.MODULE)
    assert pool.wait_for(job_id).status == Status.SUCCEEDED
    time.sleep(0.2)
    assert pool.store.log_tail(job_id, 10) is None
    assert pool.cli("logs", job_id).stdout == ""
