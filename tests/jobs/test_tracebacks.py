"""A failed attempt keeps its traceback (redacted, capped) on the job and in its failure
event; ``outlast status`` shows the last one, ``--traceback`` every attempt's."""

from __future__ import annotations

import json

from outlast.machine import TRACEBACK_MAX
from outlast.model import Status
from tests.jobs import pyjobs
from tests.pool.conftest import Harness


def _failed(pool: Harness, name: str, *args: object, env: dict[str, str] | None = None) -> str:
    job_id = pool.submit(name, *args)
    pool.worker("--import", pyjobs.MODULE, env=env)
    state = pool.wait_for(job_id)
    assert state.status == Status.FAILED, state
    return job_id


def test_each_failed_attempt_keeps_its_traceback(pool: Harness) -> None:
    job_id = _failed(pool, "py.boom", "bad input")
    state = pool.get(job_id)
    assert state.error is not None and state.attempts == 2
    tb = state.error.traceback
    assert tb is not None
    assert tb.startswith("Traceback (most recent call last):")
    assert "pyjobs.py" in tb and "in boom" in tb and "in _deep" in tb
    assert tb.rstrip().endswith("ValueError: bad input")
    assert "outlast/run/execute.py" not in tb, "outlast's own frames are left out"
    failures = [e for e in pool.store.events(job_id) if e.status == "failed"]
    assert [e.message["attempt"] for e in failures] == [1, 2]  # type: ignore[index]
    assert all("in _deep" in e.message["error"]["traceback"] for e in failures)  # type: ignore[index]

    shown = pool.cli("status", job_id)
    assert shown.returncode == 0
    assert "traceback:\n  Traceback (most recent call last):" in shown.stdout
    assert shown.stdout.rstrip().endswith("ValueError: bad input")
    every = pool.cli("status", job_id, "--traceback")
    assert "attempt 1: [error] bad input:" in every.stdout
    assert "attempt 2: [error] bad input:" in every.stdout
    as_json = json.loads(pool.cli("status", job_id, "--json").stdout)
    assert as_json["error"]["traceback"] == tb
    both = json.loads(pool.cli("status", job_id, "--traceback", "--json").stdout)
    assert [f["message"]["attempt"] for f in both["failures"]] == [1, 2]


def test_a_traceback_is_redacted_and_capped(pool: Harness) -> None:
    secret = "hunter2-very-secret"
    job_id = _failed(pool, "py.secret", env={"PYTEST_SECRET_TOKEN": secret})
    error = pool.get(job_id).error
    assert error is not None and error.traceback is not None
    assert secret not in error.traceback and secret not in error.message
    assert "***" in error.traceback

    big = _failed(pool, "py.huge_error")
    error = pool.get(big).error
    assert error is not None and error.traceback is not None
    assert len(error.traceback) <= TRACEBACK_MAX + 100
    assert error.traceback.startswith("[… ")  # the outermost frames were cut
    assert error.traceback.rstrip().endswith("x" * 100)  # the error itself is kept
