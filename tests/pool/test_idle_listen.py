"""An idle pool is not woken by other queues' jobs (its listener stops waking it for job
changes once it has been idle a moment), yet it still takes its own queue's jobs at once,
and a cancel of a job it runs still reaches it, on every store that pushes notifications."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from outlast.model import Kind, Status
from outlast.run.api import create_job
from outlast.run.pool import NARROW_AFTER, Pool
from outlast.store import open_store
from tests.pg import support
from tests.pool import jobs_for_tests
from tests.pool.conftest import read_lines
from tests.waiting import until


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sqlite", "files", "postgresql"])
def test_an_idle_pool_sleeps_through_other_queues_jobs(tmp_path: Path, kind: str) -> None:
    tmp_path.chmod(0o700)
    url = {"sqlite": f"sqlite://{tmp_path}/s.db", "files": f"files://{tmp_path}/store"}.get(
        kind
    ) or support.make_url(tmp_path)
    if url is None:
        pytest.skip("no PostgreSQL server here")
    try:
        with open_store(url) as store:
            pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
            runner = threading.Thread(target=pool.run)
            runner.start()
            try:
                first = create_job(store, "pt.noop", [1], {}, queue="mine").id
                until(lambda: store.get(first).terminal or None, 30, "the first job")
                until(lambda: not pool._watching_jobs or None, 10 + NARROW_AFTER, "idle")
                with open_store(url) as other:  # another process's jobs, another queue
                    made = [
                        other.create(kind=Kind.FUNCTION, name="x", queue="theirs").id
                        for _ in range(30)
                    ]  # (a new job wakes every idle pool: the queue channel is one)
                    until(lambda: not pool._watching_jobs or None, 10 + NARROW_AFTER, "idle")
                    before = pool.loops
                    for job_id in made:
                        [claimed] = other.claim(limit=1, queues=["theirs"])
                        claimed.reporter().report("half", "progress")
                        claimed.succeed(None)
                        assert claimed.id in made and job_id in made
                turns = pool.loops - before
                assert turns < 10, f"90 changes of other jobs woke the idle pool {turns} times"
                # its own queue still wakes it, and a cancel of its job still reaches it
                marks = tmp_path / "marks.txt"
                job = create_job(store, "pt.cooperative", [str(marks)], {}, queue="mine").id
                until(lambda: read_lines(marks) == ["started"] or None, 30, "the job to start")
                store.open(job).cancel()
                until(lambda: "stopped" in read_lines(marks) or None, 30, "the cancel to reach it")
                assert store.get(job).status == Status.CANCELED
            finally:
                pool.stop()
                runner.join(60)
    finally:
        if kind == "postgresql":
            support.drop_schema(url)
