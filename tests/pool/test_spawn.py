"""``outlast.spawn``: a function job in its own detached worker."""

from __future__ import annotations

import pytest

from outlast.model import Status
from tests.pool.conftest import Harness, read_lines

SPAWN = """
import sys
import outlast
from tests.pool import jobs_for_tests as jobs
task = jobs.record.spawn(sys.argv[1])
by_name = outlast.spawn("pt.record", sys.argv[1], sleep=0.01)
print(task.id, by_name.id)
"""

IN_MAIN = """
import outlast

@outlast.job(name="pt.in_main")
def in_main():
    return 1

try:
    outlast.spawn(in_main)
except outlast.InvalidInput as exc:
    print("refused:", exc)
else:
    print("spawned")
"""


@pytest.mark.timeout(60)
def test_spawn_runs_a_registered_function_in_a_detached_worker(pool: Harness) -> None:
    out = pool.tmp / "ids.txt"

    started = pool.python(["-c", SPAWN, str(out)])  # returns at once; no pool is running

    assert started.returncode == 0, started
    jobs = started.stdout.split()
    assert len(jobs) == 2
    for job in jobs:
        state = pool.wait_for(job, timeout=30)
        assert state.status == Status.SUCCEEDED, f"{state}\n{pool.store.log_path(job).read_text()}"
        assert state.result == job
        assert state.queue == "@dedicated"
    assert sorted(read_lines(out)) == sorted(jobs)


@pytest.mark.timeout(60)
def test_spawn_of_a_function_defined_in_main_is_refused(pool: Harness) -> None:
    result = pool.python(["-c", IN_MAIN])

    assert result.returncode == 0, result
    assert result.stdout.startswith("refused:"), result
    assert "__main__" in result.stdout and "importable module" in result.stdout
    assert pool.all() == []
