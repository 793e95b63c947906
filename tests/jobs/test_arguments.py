"""Arguments are checked against the function's signature when the job is submitted; a
call that no longer fits at run time (the function changed) fails at once, not retried."""

from __future__ import annotations

import json

import pytest

import outlast
from outlast.errors import InvalidInput
from outlast.model import Call, Kind, Status
from outlast.run import api
from outlast.run.api import create_job
from tests.jobs import pyjobs
from tests.pool.conftest import Harness


def test_python_submit_refuses_arguments_the_function_does_not_take(pool: Harness) -> None:
    with pytest.raises(InvalidInput, match=r"takes py.one\(x\): too many positional"):
        create_job(pool.store, "py.one", [1, 2, 3, 4])
    with pytest.raises(InvalidInput, match="unexpected keyword argument 'bogus'"):
        create_job(pool.store, "py.one", [1], {"bogus": 1})
    with pytest.raises(InvalidInput, match="missing a required argument: 'x'"):
        create_job(pool.store, pyjobs.one)
    assert pool.all() == []  # nothing was stored


def test_the_cli_refuses_them_too_with_a_clear_error(pool: Harness) -> None:
    for args in (["--args", "[1,2,3,4]"], ["--kwargs", '{"bogus": 1}']):
        result = pool.cli("submit", "py.one", "--import", pyjobs.MODULE, *args)
        assert result.returncode == 2, result
        assert result.stderr.startswith("outlast: error: job 'py.one' takes py.one(x)")
        assert "Traceback" not in result.stderr
    ok = pool.cli("submit", "py.one", "--import", pyjobs.MODULE, "--args", "[1]", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["call"]["args"] == [1]
    assert len(pool.all()) == 1


def test_a_call_that_no_longer_fits_fails_at_once_without_retries(pool: Harness) -> None:
    # as if py.one had taken two arguments when this job was submitted
    task = pool.store.create(
        kind=Kind.FUNCTION,
        name="py.one",
        call=Call(pyjobs.MODULE, [1, 2], {}),
        max_attempts=3,
    )
    pool.worker("--import", pyjobs.MODULE)
    state = pool.wait_for(task.id)
    assert state.status == Status.FAILED
    assert state.attempts == 1, "a call that cannot bind was retried"
    assert state.error is not None
    assert "too many positional arguments" in state.error.message
    assert "changed since the job was submitted" in state.error.message


def test_per_call_options_never_collide_with_the_functions_keywords(pool: Harness) -> None:
    saved = api._default
    outlast.use_store(pool.store)
    try:
        task = outlast.submit(
            pyjobs.kw.options(queue="other", labels={"team": "a"}, priority=4),
            1,
            queue="the function's",
            labels={"its": "own"},
        )
        same = pyjobs.kw.options(queue="other").submit(2, queue="again")
    finally:
        api._default = saved
    state = task.state()
    assert (state.queue, state.labels, state.priority) == ("other", {"team": "a"}, 4)
    assert state.call is not None
    assert state.call.kwargs == {"queue": "the function's", "labels": {"its": "own"}}
    assert same.state().queue == "other"
    with pytest.raises(InvalidInput, match="unexpected keyword argument 'bogus'"):
        pyjobs.kw.options(queue="other").submit(1, bogus=2)
