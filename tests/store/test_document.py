"""The job document and the status machine: the shape every interface shows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from outlast import codec
from outlast.errors import InvalidTransition
from outlast.model import (
    TERMINAL,
    TRANSITIONS,
    ErrorInfo,
    EventStatus,
    JobState,
    Kind,
    ProgressEvent,
    Status,
    check_transition,
)
from outlast.store import Store

#: DESIGN.md, "The job document", plus ``pid_started_at`` (an addition) and the typed
#: system fields: the call of a function job, options, a cancel in progress, pipeline state.
DOC_FIELDS = {
    "id", "kind", "name", "command", "labels", "queue", "status", "phase", "step", "progress",
    "payload", "result", "error", "attempts", "max_attempts", "run_after", "question", "answer",
    "pid", "worker", "created_at", "started_at", "updated_at", "finished_at",
    "pid_started_at", "call", "timeout", "grace", "cancel_requested", "pipeline",
    "keep", "fired", "priority", "retry_of", "unique_key", "limit_key", "limit", "trace",
}  # fmt: skip
ERROR_FIELDS = {"code", "message", "hint", "type", "traceback"}
EVENT_FIELDS = {"job_id", "seq", "at", "step", "status", "message"}
TIME_FIELDS = ("run_after", "created_at", "started_at", "updated_at", "finished_at")

T0 = datetime(2026, 11, 29, 18, 11, 10, 123456, tzinfo=UTC)


def full_state() -> JobState:
    """A job with every field set to something other than its default."""
    return JobState(
        id="0193a1b2c3d4deadbeef",
        kind=Kind.PIPELINE,
        name="nightly",
        status=Status.FAILED,
        command=["bash", "-c", "echo 'ünïcode' \"quoted\""],
        labels={"team": "data", "env": "prod"},
        queue="slow",
        phase="failed",
        step="load",
        progress=42.5,
        payload={"outputs": {"fetch": {"rows": 3, "ok": True, "none": None}}, "n": [1, 2.5]},
        result={"nested": [1, {"a": None}]},
        error=ErrorInfo("error", "boom", hint="retry later", type="ValueError"),
        attempts=3,
        max_attempts=3,
        run_after=T0 + timedelta(seconds=5),
        question={"q": "go on?"},
        answer=["yes"],
        pid=4242,
        pid_started_at=T0 - timedelta(microseconds=1),
        worker="host:99",
        created_at=T0,
        started_at=T0 + timedelta(seconds=1),
        updated_at=T0 + timedelta(seconds=2, microseconds=7),
        finished_at=T0 + timedelta(seconds=3),
    )


def test_to_dict_has_exactly_the_documented_fields() -> None:
    doc = full_state().to_dict()
    assert set(doc) == DOC_FIELDS
    assert set(doc["error"]) == ERROR_FIELDS
    assert JobState(id="a", kind=Kind.COMMAND, name="n").to_dict().keys() == DOC_FIELDS


def test_times_are_iso8601_utc_strings() -> None:
    local = timezone(timedelta(hours=5, minutes=30))
    doc = full_state().evolve(created_at=T0.astimezone(local)).to_dict()
    for name in (*TIME_FIELDS, "pid_started_at"):
        value = doc[name]
        assert isinstance(value, str), name
        parsed = datetime.fromisoformat(value)
        assert parsed.utcoffset() == timedelta(0), (name, value)
    assert datetime.fromisoformat(doc["created_at"]) == T0


def test_document_is_plain_json() -> None:
    doc = full_state().to_dict()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    assert doc["kind"] == "pipeline" and doc["status"] == "failed"
    assert type(doc["kind"]) is str and type(doc["status"]) is str


@pytest.mark.parametrize(
    "state",
    [
        full_state(),
        JobState(id="minimal", kind=Kind.FUNCTION, name="f"),
        full_state().evolve(error=None, run_after=None, finished_at=None, progress=None),
        full_state().evolve(progress=100.0, result="text", error=ErrorInfo("canceled", "c")),
    ],
    ids=["full", "minimal", "nulls", "other"],
)
def test_job_state_round_trip_is_lossless(state: JobState) -> None:
    assert JobState.from_dict(state.to_dict()) == state
    through_json = json.loads(json.dumps(state.to_dict()))
    again = JobState.from_dict(through_json)
    assert again == state
    assert again.to_dict() == state.to_dict()
    for name in (*TIME_FIELDS, "pid_started_at", "created_at"):
        assert getattr(again, name) == getattr(state, name), name


def test_round_trip_keeps_microseconds_and_the_instant_of_non_utc_times() -> None:
    local = timezone(timedelta(hours=-7))
    state = full_state().evolve(started_at=T0.astimezone(local))
    again = JobState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.started_at == T0 + timedelta(0)  # same instant
    assert again.started_at is not None and again.started_at.microsecond == T0.microsecond
    assert again == state


@pytest.mark.parametrize(
    "state",
    [
        full_state(),
        JobState(id="minimal", kind=Kind.FUNCTION, name="f"),
        full_state().evolve(created_at=T0.replace(microsecond=0)),  # orjson would drop ".000000"
        full_state().evolve(started_at=T0.astimezone(timezone(timedelta(hours=5)))),
        full_state().evolve(payload={"big": 2**64 + 1, "neg": -(2**63) - 1}),  # beyond 64 bits
        full_state().evolve(result=[10**200 + 1, "1234567890123456789012"]),
    ],
    ids=["full", "minimal", "whole-second", "non-utc", "big-int", "huge-int"],
)
def test_the_stored_encoding_is_exactly_to_dict(state: JobState) -> None:
    """The fast encoder (orjson over the dataclass) writes what ``to_dict`` says, times
    always with microseconds, whatever path it takes."""
    raw = codec.encode(state)
    assert json.loads(raw) == state.to_dict()
    assert list(json.loads(raw)) == list(state.to_dict())  # the documented order, too
    back = codec.decode(state.id, raw)
    assert back == state
    assert repr(back.payload) == repr(state.payload) and repr(back.result) == repr(state.result)
    for name in (*TIME_FIELDS, "pid_started_at", "created_at"):
        value = json.loads(raw)[name]
        assert value is None or (len(value) == 32 and value.endswith("+00:00")), (name, value)


@pytest.mark.parametrize("name", [*TIME_FIELDS, "pid_started_at"])
def test_every_time_of_a_whole_second_is_written_with_its_fraction(name: str) -> None:
    """Each time the encoder checks by name: a whole second (which orjson writes without
    ".000000") of any of them is written in the one format."""
    state = full_state().evolve(**{name: T0.replace(microsecond=0)})
    value = json.loads(codec.encode(state))[name]
    assert value == "2026-11-29T18:11:10.000000+00:00", value


def test_progress_event_round_trip() -> None:
    events = [
        ProgressEvent("job1", 1, T0, "job", EventStatus.STARTED, {"attempt": 1}),
        ProgressEvent("job1", 2, T0 + timedelta(microseconds=3), "fetch", EventStatus.PROGRESS),
        ProgressEvent("job1", 3, T0, "load", EventStatus.FAILED, "bad ünïcode"),
        ProgressEvent("job1", 4, T0, "x", EventStatus.SKIPPED, [1, None, {"k": 2.5}]),
    ]
    for event in events:
        doc = event.to_dict()
        assert set(doc) == EVENT_FIELDS
        assert ProgressEvent.from_dict(json.loads(json.dumps(doc))) == event
        assert isinstance(doc["at"], str) and isinstance(doc["status"], str)


def test_status_machine_covers_every_status() -> None:
    assert set(TRANSITIONS) == set(Status)
    assert {Status.SUCCEEDED, Status.FAILED, Status.CANCELED} == TERMINAL
    for status in Status:
        assert status.terminal == (status in TERMINAL)


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_have_no_moves(terminal: Status) -> None:
    assert TRANSITIONS[terminal] == frozenset()
    for target in Status:
        with pytest.raises(InvalidTransition):
            check_transition("job1", terminal, target)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (Status.PENDING, Status.RUNNING),
        (Status.PENDING, Status.CANCELED),
        (Status.RUNNING, Status.SUCCEEDED),
        (Status.RUNNING, Status.FAILED),
        (Status.RUNNING, Status.CANCELED),
        (Status.RUNNING, Status.PAUSED),
        (Status.RUNNING, Status.PENDING),
        (Status.PAUSED, Status.PENDING),
        (Status.PAUSED, Status.CANCELED),
    ],
)
def test_the_designed_moves_are_allowed(old: Status, new: Status) -> None:
    check_transition("job1", old, new)
    assert new in TRANSITIONS[old]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (Status.PENDING, Status.SUCCEEDED),
        (Status.PENDING, Status.PAUSED),
        (Status.PAUSED, Status.RUNNING),
        (Status.PAUSED, Status.SUCCEEDED),
    ],
)
def test_moves_outside_the_diagram_are_refused(old: Status, new: Status) -> None:
    with pytest.raises(InvalidTransition, match="job1"):
        check_transition("job1", old, new)


def test_stored_document_has_the_documented_fields_and_round_trips(store: Store) -> None:
    task = store.create(
        kind="function",
        name="f",
        labels={"a": "b"},
        payload={"args": [1, "x"], "kw": {"n": None}},
        max_attempts=2,
    )
    [claimed] = store.claim()
    assert claimed.id == task.id
    claimed.set_pid(123, started_at=T0)
    claimed.report("step", "progress", {"m": "ü"}, progress=10)
    claimed.fail(ValueError("first"))
    state = store.get(task.id)
    doc = state.to_dict()
    assert set(doc) == DOC_FIELDS
    assert JobState.from_dict(json.loads(json.dumps(doc))) == state
    assert state.payload == {"args": [1, "x"], "kw": {"n": None}}
    assert state.pid == 123 and state.pid_started_at == T0
    assert state.error is not None and state.error.type == "ValueError"
    for event in store.events(task.id):
        assert ProgressEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event


def test_evolve_is_dataclasses_replace() -> None:
    import dataclasses

    state = full_state()
    changes = {"status": Status.SUCCEEDED, "result": {"x": 1}, "worker": None}
    assert state.evolve(**changes) == dataclasses.replace(state, **changes)
    assert state.evolve() == state and state.evolve() is not state
    with pytest.raises(TypeError, match="no fields"):
        state.evolve(colour="red")
