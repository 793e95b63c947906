"""Bad input is refused clearly, before anything is written: from Python (InvalidInput) and
from the CLI (one line ``outlast: error: …`` on stderr, exit 2, no traceback)."""

from __future__ import annotations

import math

import pytest

import outlast
from outlast.errors import InvalidInput
from outlast.run import api
from outlast.run.api import create_job
from outlast.run.pool import Pool
from tests.pool import jobs_for_tests
from tests.pool.conftest import JOBS, Harness


@pytest.fixture
def default_store(pool: Harness):  # type: ignore[no-untyped-def]
    """Point ``outlast.submit`` at the test's store, and back afterwards."""
    saved = api._default
    api._default = pool.store
    try:
        yield pool.store
    finally:
        api._default = saved


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ([{1, 2}], {}),
        ([object()], {}),
        ([math.nan], {}),
        ([math.inf], {}),
        ([], {"value": {1, 2}}),
        ([], {"value": b"bytes"}),
    ],
    ids=["set", "object", "nan", "inf", "kwarg-set", "kwarg-bytes"],
)
def test_non_json_arguments_are_refused_at_submit(
    pool: Harness, default_store: object, args: list[object], kwargs: dict[str, object]
) -> None:
    with pytest.raises(InvalidInput, match="must be JSON"):
        outlast.submit("pt.noop", *args, **kwargs)
    with pytest.raises(InvalidInput, match="must be JSON"):
        jobs_for_tests.noop.submit(*args, **kwargs)
    with pytest.raises(InvalidInput, match="must be JSON"):
        create_job(pool.store, "pt.noop", args, kwargs)
    assert pool.all() == []


def test_an_unknown_job_name_is_refused(pool: Harness, default_store: object) -> None:
    with pytest.raises(InvalidInput, match=r"unknown job name 'pt\.nope'"):
        outlast.submit("pt.nope")
    with pytest.raises(InvalidInput, match="unknown job name"):
        create_job(pool.store, "pt.nope", [], {})
    assert pool.all() == []


@pytest.mark.parametrize("concurrency", [0, -1])
def test_a_pool_needs_a_positive_concurrency(pool: Harness, concurrency: int) -> None:
    with pytest.raises(InvalidInput, match="concurrency"):
        Pool(pool.store, concurrency=concurrency)


@pytest.mark.parametrize("queue", ["a/b", "../x"])
def test_an_invalid_queue_name_is_refused(pool: Harness, queue: str) -> None:
    """``outlast submit/worker --queue`` refuse these names; the Python API must refuse them
    too rather than create jobs (or pools) that no ``outlast worker --queue`` can match."""
    accepted = []
    try:
        create_job(pool.store, "pt.noop", [], {}, queue=queue)
        accepted.append("create_job(queue=...)")
    except InvalidInput:
        pass
    try:
        Pool(pool.store, queues=[queue])
        accepted.append("Pool(queues=[...])")
    except InvalidInput:
        pass
    try:
        outlast.job(name=f"pt.bad-queue.{queue}", queue=queue)(jobs_for_tests.noop.fn)
        accepted.append("@outlast.job(queue=...)")
    except InvalidInput:
        pass
    assert accepted == [], f"queue {queue!r} accepted by {accepted}"


def test_an_in_process_burst_pool_runs_jobs_and_returns(pool: Harness) -> None:
    """The Pool class itself (no CLI): burst mode drains what is pending, then returns."""
    jobs = [create_job(pool.store, "pt.noop", [i], {}).id for i in range(5)]
    processed = Pool(pool.store, concurrency=2, imports=[JOBS], burst=True).run()
    assert processed == 5
    assert [pool.get(j).result for j in jobs] == list(range(5))


# ---------------------------------------------------------------------- the CLI


def refused(pool: Harness, *args: str, what: str) -> str:
    """Run ``outlast ARGS``; check the one-line refusal and that nothing was written."""
    result = pool.cli(*args)
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("outlast: error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert what.lower() in lines[0].lower(), lines[0]
    assert result.stdout == ""
    assert pool.all() == []
    return lines[0]


SUBMIT = ("submit", "--import", JOBS)


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (("pt.nope",), "unknown job name"),
        (("pt.noop", "--args", '{"a": 1}'), "--args"),
        (("pt.noop", "--args", '"text"'), "--args"),
        (("pt.noop", "--args", "[1,"), "--args"),
        (("pt.noop", "--args", "[NaN]"), "JSON"),
        (("pt.noop", "--kwargs", "[1]"), "--kwargs"),
        (("pt.noop", "--kwargs", "{'a': 1}"), "--kwargs"),
        (("pt.noop", "--queue", "a/b"), "queue"),
    ],
    ids=[
        "unknown-name",
        "args-object",
        "args-string",
        "args-malformed",
        "args-nan",
        "kwargs-list",
        "kwargs-malformed",
        "queue",
    ],
)
def test_cli_submit_refuses_bad_input(pool: Harness, args: tuple[str, ...], what: str) -> None:
    refused(pool, *SUBMIT, *args, what=what)


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (("-c", "0"), "concurrency"),
        (("-c", "-1"), "concurrency"),
        (("--concurrency", "two"), "concurrency"),
        (("--queue", "a/b"), "queue"),
        (("--import", "no_such_module_for_outlast"), "no_such_module_for_outlast"),
    ],
    ids=["c0", "c-1", "c-text", "queue", "import"],
)
def test_cli_worker_refuses_bad_input(pool: Harness, args: tuple[str, ...], what: str) -> None:
    pool.submit("pt.noop", 1)  # something it could claim: a refused worker must not
    before = [s.to_dict() for s in pool.all()]
    result = pool.cli("worker", "--burst", *args)
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("outlast: error: "), result.stderr
    assert what in lines[0], lines[0]
    assert [s.to_dict() for s in pool.all()] == before


def test_cli_submit_with_good_input_queues_the_job(pool: Harness) -> None:
    """The counterpart of the refusals: the same command with good input works."""
    result = pool.cli(*SUBMIT, "pt.noop", "--args", '[{"k": [1, 2]}]', "--queue", "q1", "--json")
    assert result.returncode == 0, result
    (state,) = pool.all()
    assert state.call is not None and state.call.args == [{"k": [1, 2]}]
    assert state.queue == "q1"
    worker = pool.worker("--queue", "q1", "--burst")
    assert worker.wait(60) == 0
    assert pool.get(state.id).result == {"k": [1, 2]}
