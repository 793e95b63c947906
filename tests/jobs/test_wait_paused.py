"""``wait`` never hangs on a person: on a paused job the CLI's ``wait`` exits 4 with the
question, and the Python waits return the paused state, unless asked to wait through."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from outlast.model import Status
from tests.pool.conftest import Harness


@pytest.fixture
def paused(pool: Harness) -> str:
    """A function job paused with the question ``ship it?`` by a real pool."""
    pool.worker()
    job_id = pool.submit("pt.ask", "ship it?")
    pool.wait_for(job_id, {Status.PAUSED}, 60, "the job to pause")
    return job_id


def test_wait_returns_exit_4_with_the_question_on_a_paused_job(pool: Harness, paused: str) -> None:
    started = time.monotonic()
    plain = pool.cli("wait", paused, timeout=30)
    assert plain.returncode == 4, plain
    assert time.monotonic() - started < 20, "wait hung on a paused job"
    assert plain.stdout.strip() == f'{paused} paused: "ship it?"'
    assert f"outlast resume {paused}" in plain.stderr

    as_json = pool.cli("wait", paused, "--json", timeout=30)
    assert as_json.returncode == 4, as_json
    doc = json.loads(as_json.stdout)
    assert doc["status"] == "paused" and doc["question"] == "ship it?"

    through = pool.cli("wait", paused, "--through-pause", "--timeout", "0.5", timeout=30)
    assert through.returncode == 124, through  # it waited on through the pause
    assert "paused" in through.stderr

    # the Python API's two waits say the same
    state = pool.store.wait(paused, timeout=10)
    assert state.status == Status.PAUSED
    task = pool.store.open(paused)
    assert task.wait(timeout=10).status == Status.PAUSED
    assert task.wait(timeout=0.3, through_pause=True).status == Status.PAUSED
    assert asyncio.run(task.await_done(timeout=10)).status == Status.PAUSED

    # answered, the same wait runs on to the end
    assert pool.cli("resume", paused, "--answer", '"yes"').returncode == 0
    done = pool.cli("wait", paused, "--json", "--timeout", "60", timeout=90)
    assert done.returncode == 0, done
    assert json.loads(done.stdout)["result"] == {"answer": "yes"}
