"""The pure transitions of a pipeline's cancel and of reconciling it (machine.py)."""

from __future__ import annotations

import pytest

from outlast import machine
from outlast.errors import InvalidInput
from outlast.model import (
    ErrorCode,
    ErrorInfo,
    JobState,
    Kind,
    PipelineState,
    StageRecord,
    Status,
    utcnow,
)


def _running_pipeline(
    canceling: bool = False, stages: dict[str, StageRecord] | None = None
) -> JobState:
    now = utcnow()
    return JobState(
        id="p1",
        kind=Kind.PIPELINE,
        name="p",
        status=Status.RUNNING,
        attempts=1,
        max_attempts=1,
        worker="host:1",
        created_at=now,
        updated_at=now,
        payload={"outputs": {}},
        pipeline=PipelineState(cleanup=("clean",), stages=stages or {}),
        cancel_requested=canceling,
    )


def test_cancel_of_a_running_pipeline_with_cleanup_pending_asks_first() -> None:
    change = machine.cancel(_running_pipeline(), utcnow())
    assert change is not None
    assert change.state.status == Status.RUNNING and change.state.cancel_requested is True
    # asked twice: nothing more to write
    assert machine.cancel(change.state, utcnow()) is None


def test_cancel_after_the_cleanup_ran_is_final() -> None:
    done = _running_pipeline(canceling=True, stages={"clean": StageRecord("succeeded")})
    change = machine.cancel(done, utcnow())
    assert change is not None and change.state.status == Status.CANCELED
    assert change.state.error is not None and change.state.error.code == "canceled"


def test_cancel_of_a_pending_pipeline_that_never_started_is_final_at_once() -> None:
    pending = _running_pipeline().evolve(status=Status.PENDING, attempts=0, worker=None)
    change = machine.cancel(pending, utcnow())
    assert change is not None and change.state.status == Status.CANCELED


@pytest.mark.parametrize("status", [Status.PENDING, Status.PAUSED])
def test_cancel_between_attempts_runs_the_cleanup_first(status: Status) -> None:
    """Waiting for a retry, or paused for an answer, after an attempt started: what it began
    may need the cleanup (the seed's export), so one more run does the ``ALL_DONE`` stages,
    then the job is canceled. (It was canceled at once, its cleanup never run.)"""
    waiting = _running_pipeline().evolve(status=status, worker=None, run_after=utcnow())
    change = machine.cancel(waiting, utcnow())
    assert change is not None and change.claimable
    state = change.state
    assert state.status == Status.PENDING and state.cancel_requested and state.run_after is None
    assert state.pipeline is not None and state.pipeline.finalize is not None
    assert state.pipeline.finalize.code == "canceled" and state.max_attempts == 2
    assert machine.cancel(state, utcnow()) is None  # asked twice: nothing more to write
    cleaned = waiting.evolve(
        pipeline=PipelineState(("clean",), {"clean": StageRecord("succeeded")})
    )
    final = machine.cancel(cleaned, utcnow())  # nothing left to clean up: canceled now
    assert final is not None and final.state.status == Status.CANCELED


def test_a_worker_dying_while_canceling_leads_to_finalize_then_canceled() -> None:
    change = machine.abandon(_running_pipeline(canceling=True), utcnow())
    assert change is not None
    state = change.state
    assert state.status == Status.PENDING and state.pipeline is not None
    assert state.pipeline.finalize is not None and state.pipeline.finalize.code == "canceled"
    assert state.max_attempts == 2  # one more run, for the cleanup only
    cleaned = state.evolve(
        status=Status.RUNNING,
        pipeline=PipelineState(("clean",), {"clean": StageRecord("ok")}, state.pipeline.finalize),
    )
    final = machine.abandon(cleaned, utcnow())
    assert final is not None and final.state.status == Status.CANCELED


def test_an_attempt_failing_while_canceling_is_not_retried() -> None:
    """A pool counts its job process's death as a failed attempt: during a cancel's cleanup
    that finishes the cleanup, then cancels, as a reconcile does (it retried the job, whose
    retry then ended succeeded)."""
    error = ErrorInfo(ErrorCode.ERROR, "the job's process died", type="WorkerDied")
    canceling = _running_pipeline(canceling=True).evolve(max_attempts=3)
    change = machine.fail(canceling, 1, error, True, 1.0, utcnow())
    assert change is not None and change.state.status == Status.PENDING
    assert change.state.pipeline is not None and change.state.pipeline.finalize is not None
    assert change.state.pipeline.finalize.code == "canceled" and change.state.run_after is None
    cleaned = canceling.evolve(
        pipeline=PipelineState(("clean",), {"clean": StageRecord("succeeded")})
    )
    final = machine.fail(cleaned, 1, error, True, 1.0, utcnow())
    assert final is not None and final.state.status == Status.CANCELED
    assert final.state.error is not None and final.state.error.code == "canceled"
    # failed for good (a stage's Fail, no retry) before the cancel came: it stays failed
    refused = ErrorInfo(ErrorCode.ERROR, "refused", type="Fail")
    failed = machine.fail(cleaned, 1, refused, False, 1.0, utcnow())
    assert failed is not None and failed.state.status == Status.FAILED


def test_a_released_attempt_keeps_its_fencing_token() -> None:
    change = machine.release(_running_pipeline(), 1, utcnow())
    assert change is not None
    assert change.state.attempts == 1 and change.state.max_attempts == 2
    assert machine.fenced_out(change.state, 1)  # the old worker can no longer write


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(2**80), 1.5, "ü", [], {}, (1, "a"), {"a": [1, {"b": None}]}],
    ids=repr,
)
def test_check_json_accepts_strict_json(value: object) -> None:
    assert machine.check_json(value, "x") is value


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _cycle() -> object:
    value: list[object] = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (float("nan"), "not a JSON number"),
        (float("-inf"), "not a JSON number"),
        ({1: "a"}, "keys are strings"),
        ({1, 2}, "type set is not JSON"),
        (b"x", "type bytes is not JSON"),
        ({"a": [object()]}, "type object is not JSON"),
        (_nested(machine.MAX_JSON_DEPTH + 1), "nested deeper"),
        (_cycle(), "nested deeper"),
        ([10**5000], "digits"),
    ],
    ids=["nan", "inf", "int-key", "set", "bytes", "object", "deep", "cycle", "huge-int"],
)
def test_check_json_refuses_what_is_not_json_and_says_what(value: object, says: str) -> None:
    with pytest.raises(InvalidInput, match=f"^x must be JSON: .*{says}"):
        machine.check_json(value, "x")


def test_check_json_takes_the_deepest_allowed_nesting() -> None:
    value = _nested(machine.MAX_JSON_DEPTH - 1)
    assert machine.check_json(value, "x") is value


def test_an_attempt_that_never_started_is_given_back() -> None:
    change = machine.give_back(_running_pipeline(), utcnow())
    assert change is not None and change.claimable
    state = change.state
    assert state.status == Status.PENDING and state.worker is None
    assert (state.attempts, state.max_attempts) == (1, 2)  # the token stays; one more allowed
    assert change.events[0].message["released"] is True  # type: ignore[index]
    # a cancel asked meanwhile is abandon's to finish (it may have cleanup to run)
    assert machine.give_back(_running_pipeline(canceling=True), utcnow()) is None


def test_a_journaled_outcome_is_recorded_like_the_pool_would() -> None:
    job = _running_pipeline().evolve(kind=Kind.FUNCTION, pipeline=None)
    done = machine.record(job, machine.Outcome("succeed", {"n": 1}), 1, utcnow(), 0.05)
    assert done is not None and done.state.status == Status.SUCCEEDED
    assert done.state.result == {"n": 1}
    # fenced: an outcome of another attempt, or of a job that moved on, writes nothing
    assert machine.record(job, machine.Outcome("succeed"), 2, utcnow(), 0.05) is None
    assert machine.record(done.state, machine.Outcome("succeed"), 1, utcnow(), 0.05) is None
    assert machine.record(job, machine.Outcome("gone"), 1, utcnow(), 0.05) is None
    # an attempt whose start could not be journaled was not started: given back
    back = machine.record(job, machine.Outcome("release"), 1, utcnow(), 0.05)
    assert back is not None and back.state.status == Status.PENDING
    assert (back.state.attempts, back.state.max_attempts) == (job.attempts, job.max_attempts + 1)


@pytest.mark.parametrize(
    "outcome",
    [
        machine.Outcome("succeed", [1, "x"]),
        machine.Outcome("fail", error=machine.error_info(ValueError("bad")), retry=False),
        machine.Outcome("pause", {"q": "?"}),
        machine.Outcome("cancel"),
    ],
    ids=lambda o: o.verb,
)
def test_an_outcome_survives_its_journal_record(outcome: machine.Outcome) -> None:
    import json

    assert machine.Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome


def test_a_bad_outcome_record_is_refused() -> None:
    with pytest.raises(ValueError):
        machine.Outcome.from_dict({"verb": "explode"})


def test_ids_made_in_one_millisecond_do_not_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids of one millisecond differ only in their random part: 300,000 of them (a
    ``submit_many`` makes ~50 a millisecond) would hold ~10 duplicates with 32 random bits
    (the old ids), none with 64. A duplicate fails its insert and the whole batch."""
    from outlast import ids

    monkeypatch.setattr(ids.time, "time", lambda: 1_764_000_000.123)
    made = [ids.new_id() for _ in range(300_000)]
    assert len(set(made)) == len(made)
    assert {len(i) for i in made} == {28} and len({i[:12] for i in made}) == 1
    assert all(ids.check_id(i) == i for i in made[:10])


def test_a_retry_of_a_long_backoff_lets_its_own_worker_go() -> None:
    """A supervisor (``keep_worker``) keeps the job bound while it waits out a short
    backoff itself; a backoff past ``PARK_AFTER`` unbinds the job, which waits parked for
    the store's timer (outlast.run.timer), holding no process."""
    job = _running_pipeline().evolve(kind=Kind.COMMAND, pipeline=None, max_attempts=3)
    error = ErrorInfo("error", "exit status 1")
    now = utcnow()
    short = machine.fail(job, 1, error, True, machine.PARK_AFTER / 4, now, keep_worker=True)
    assert short is not None and short.state.status == Status.PENDING
    assert short.state.worker == job.worker is not None  # waited out by its supervisor
    long = machine.fail(job, 1, error, True, machine.PARK_AFTER * 2.1, now, keep_worker=True)
    assert long is not None and long.state.status == Status.PENDING
    assert long.state.worker is None and long.state.run_after is not None
    assert machine.parks_at(long.state.run_after, now)
    assert not machine.parks_at(short.state.run_after, now)
    assert not machine.parks_at(None, now)
