"""The pure transitions of a pipeline's cancel and of reconciling it (machine.py)."""

from __future__ import annotations

from outlast import machine
from outlast.model import JobState, Kind, Status, utcnow


def _running_pipeline(**payload: object) -> JobState:
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
        payload={"cleanup": ["clean"], "stages": {}, "outputs": {}, **payload},
    )


def test_cancel_of_a_running_pipeline_with_cleanup_pending_asks_first() -> None:
    change = machine.cancel(_running_pipeline(), utcnow())
    assert change is not None
    assert change.state.status == Status.RUNNING and change.state.payload["canceling"] is True
    # asked twice: nothing more to write
    assert machine.cancel(change.state, utcnow()) is None


def test_cancel_after_the_cleanup_ran_is_final() -> None:
    done = _running_pipeline(canceling=True, stages={"clean": {"status": "succeeded"}})
    change = machine.cancel(done, utcnow())
    assert change is not None and change.state.status == Status.CANCELED
    assert change.state.error is not None and change.state.error.code == "canceled"


def test_cancel_of_a_pending_pipeline_is_final_at_once() -> None:
    pending = _running_pipeline().evolve(status=Status.PENDING)
    change = machine.cancel(pending, utcnow())
    assert change is not None and change.state.status == Status.CANCELED


def test_a_worker_dying_while_canceling_leads_to_finalize_then_canceled() -> None:
    change = machine.abandon(_running_pipeline(canceling=True), utcnow())
    assert change is not None
    state = change.state
    assert state.status == Status.PENDING and state.payload["finalize"]["code"] == "canceled"
    assert state.max_attempts == 2  # one more run, for the cleanup only
    cleaned = state.evolve(
        status=Status.RUNNING, payload={**state.payload, "stages": {"clean": {"status": "ok"}}}
    )
    final = machine.abandon(cleaned, utcnow())
    assert final is not None and final.state.status == Status.CANCELED


def test_a_released_attempt_keeps_its_fencing_token() -> None:
    change = machine.release(_running_pipeline(), 1, utcnow())
    assert change is not None
    assert change.state.attempts == 1 and change.state.max_attempts == 2
    assert machine.fenced_out(change.state, 1)  # the old worker can no longer write
