"""The seams made true (issue 11), on every adapter: typed system fields (and documents of the
first shape still read), states no caller can change under another, and waits that end when
the worker died."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from outlast import codec, machine
from outlast.errors import InvalidInput, JobNotFound
from outlast.frozen import thaw
from outlast.machine import Change
from outlast.model import (
    Call,
    EventStatus,
    JobState,
    Kind,
    PipelineState,
    StageRecord,
    Status,
    utcnow,
)
from outlast.stages import checkpoint
from outlast.store import Store, open_store
from tests.store import procs
from tests.store.adapters import Adapter

# A document as the first version wrote it: the system's keys in the user's payload.
FIRST_SHAPE: dict[str, dict[str, Any]] = {
    "function": {
        "payload": {"args": [1, {"k": "v"}], "kwargs": {"n": 2}, "module": "mod", "timeout": 5},
        "max_attempts": 3,
    },
    "pipeline": {
        "payload": {
            "status_file": "/tmp/s",
            "outputs": {"spawn": {"pid": 7}},
            "cleanup": ["clean"],
            "module": "pipes",
            "timeout": 30.0,
            "stages": {"spawn": {"status": "succeeded", "message": "started"}},
            "canceling": True,
        },
        "status": "running",
        "attempts": 1,
        "worker": "elsewhere:1",
    },
    "command": {"payload": {"grace": 2.5}, "command": ["sleep", "1"]},
}


def _first_shape_doc(job_id: str, kind: str) -> bytes:
    doc = {
        "id": job_id,
        "kind": kind,
        "name": "old",
        "command": None,
        "labels": {"team": "a"},
        "queue": "default",
        "status": "pending",
        "phase": None,
        "step": None,
        "progress": None,
        "payload": {},
        "result": None,
        "error": None,
        "attempts": 0,
        "max_attempts": 1,
        "run_after": None,
        "question": None,
        "answer": None,
        "pid": None,
        "pid_started_at": None,
        "worker": None,
        "created_at": "2026-11-29T18:11:10.123456+00:00",
        "started_at": None,
        "updated_at": "2026-11-29T18:11:10.123456+00:00",
        "finished_at": None,
    }
    doc.update(FIRST_SHAPE[kind])
    return json.dumps(doc).encode()


@pytest.mark.parametrize("kind", ["function", "pipeline", "command"])
def test_a_document_of_the_first_shape_reads_with_typed_fields(
    store: Store, store_url: str, adapter: Adapter, kind: str
) -> None:
    write_raw = adapter.need("write_raw")
    job = store.create(kind=kind, name="placeholder")
    write_raw(store_url, job.id, _first_shape_doc(job.id, kind))
    with open_store(store_url) as fresh:  # no state cached from the write above
        state = fresh.get(job.id)
    assert state.labels == {"team": "a"}
    if kind == "function":
        assert state.payload == {}
        assert state.call == Call("mod", [1, {"k": "v"}], {"n": 2})
        assert state.timeout == 5 and state.max_attempts == 3
    elif kind == "pipeline":
        # a pipeline's timeout was also stage input then: it stays, and is the deadline
        assert state.payload == {
            "status_file": "/tmp/s",
            "outputs": {"spawn": {"pid": 7}},
            "timeout": 30.0,
        }
        assert state.call is not None and state.call.module == "pipes"
        assert state.timeout == 30.0 and state.cancel_requested is True
        assert state.pipeline == PipelineState(
            ("clean",), {"spawn": StageRecord("succeeded", "started")}
        )
    else:
        assert state.payload == {} and state.grace == 2.5 and state.call is None
    # ...and it lives on: a transition writes this version's shape back
    after = store.open(job.id).relabel("x", "y")
    raw = json.loads(codec.encode(after))
    assert "call" in raw and "module" not in raw["payload"] and "grace" not in raw["payload"]


def test_a_first_shape_pipelines_own_keys_stay_its_own(
    store: Store, store_url: str, adapter: Adapter
) -> None:
    """``canceling: false`` was the user's (the system only ever wrote true), and so is a
    timeout in a pipeline's payload: neither is taken from it."""
    write_raw = adapter.need("write_raw")
    job = store.create(kind="pipeline", name="placeholder")
    doc = json.loads(_first_shape_doc(job.id, "pipeline"))
    doc["payload"] = {"canceling": False, "timeout": 5, "module": "pipes", "cleanup": []}
    doc["status"] = "pending"
    write_raw(store_url, job.id, json.dumps(doc).encode())
    with open_store(store_url) as fresh:
        state = fresh.get(job.id)
    assert state.payload == {"canceling": False, "timeout": 5}
    assert not state.cancel_requested and state.timeout == 5


def test_a_users_payload_is_data_and_changes_nothing(store: Store) -> None:
    """What the system keeps has typed fields: a payload that happens to use the first
    version's key names sets no kill deadline and asks for no cancel."""
    payload = {"timeout": 0.001, "grace": 0, "canceling": True, "cleanup": ["x"], "args": [9]}
    job = store.create(kind="function", name="f", payload=payload, call=Call("m", [1], {}))
    state = store.get(job.id)
    assert state.payload == payload
    assert state.timeout is None and state.grace is None and not state.cancel_requested
    assert state.call == Call("m", [1], {}) and state.pipeline is None
    [claimed] = store.claim()
    assert claimed.cancel().status == Status.CANCELED  # no cleanup to wait for


def test_states_handed_out_cannot_be_changed(store: Store) -> None:
    job = store.create(kind="function", name="f", payload={"a": {"b": [1]}}, labels={"k": "v"})
    state = store.get(job.id)
    for change in (
        lambda: state.payload.__setitem__("a", 2),
        lambda: state.payload["a"]["b"].append(2),
        lambda: state.payload["a"].update(c=3),
        lambda: state.labels.pop("k"),
        lambda: state.payload["a"]["b"].sort(),
    ):
        with pytest.raises(TypeError, match="immutable"):
            change()
    assert store.get(job.id).payload == {"a": {"b": [1]}}
    # a plain copy is the caller's own
    mine = thaw(state.payload)
    mine["a"]["b"].append(2)
    assert store.get(job.id).payload == {"a": {"b": [1]}}
    assert state.to_dict()["payload"] is not state.payload  # to_dict gives plain values


def test_a_failed_transition_leaves_nothing_behind(store: Store, store_url: str) -> None:
    """The poisoning sequence: a transition that edits a nested value and then fails must
    leave every later reader (this store's cache, and a fresh store) the same state."""
    job = store.create(
        kind="pipeline",
        name="p",
        payload={"outputs": {}},
        pipeline=PipelineState(("clean",), {}),
    )
    before = store.get(job.id)

    def edit_in_place_then_fail(state: JobState) -> Change | None:
        state.payload["outputs"]["spawn"] = {"pid": 1}  # refused: states are immutable
        return None

    with pytest.raises(TypeError, match="immutable"):
        store.apply(job.id, edit_in_place_then_fail)

    def build_then_fail(state: JobState) -> Change | None:
        change = checkpoint(state, None, "spawn", "succeeded", "ok", {"pid": 1}, utcnow())
        assert change is not None and change.state.pipeline is not None
        assert "spawn" in change.state.pipeline.stages
        raise RuntimeError("the write fails after the new state was built")

    with pytest.raises(RuntimeError):
        store.apply(job.id, build_then_fail)
    with open_store(store_url) as fresh:
        assert fresh.get(job.id) == before
    assert store.get(job.id) == before
    assert store.get(job.id).pipeline == PipelineState(("clean",), {})


def test_values_given_to_a_state_are_copied_not_shared(store: Store) -> None:
    """A caller that keeps changing the result (or payload) it passed in changes nothing
    stored, in this process or another."""
    payload: dict[str, Any] = {"items": [1]}
    job = store.create(kind="function", name="f", payload=payload)
    payload["items"].append(2)
    result: dict[str, Any] = {"rows": [1]}
    [claimed] = store.claim()
    claimed.succeed(result)
    result["rows"].append(2)
    state = store.get(job.id)
    assert state.payload == {"items": [1]} and state.result == {"rows": [1]}


def test_checkpoints_go_to_their_typed_field_and_outputs_to_the_payload(store: Store) -> None:
    job = store.create(
        kind="pipeline", name="p", payload={"in": 1}, pipeline=PipelineState(("clean",))
    )
    [claimed] = store.claim()
    attempt = claimed.attempt
    store.apply(job.id, lambda s: checkpoint(s, attempt, "a", "succeeded", "m", {"o": 1}, utcnow()))
    store.apply(job.id, lambda s: checkpoint(s, attempt, "b", "skipped", "t", None, utcnow()))
    state = store.get(job.id)
    assert state.payload == {"in": 1, "outputs": {"a": {"o": 1}}}
    assert state.pipeline is not None and list(state.pipeline.stages) == ["a", "b"]
    assert state.pipeline.stages["b"] == StageRecord("skipped", "t")
    assert state.pipeline.cleanup_pending
    # a stale attempt's checkpoint is refused
    claimed.release()
    assert (
        store.apply(job.id, lambda s: checkpoint(s, attempt, "c", "ok", "", None, utcnow()))[1]
        == []
    )
    with pytest.raises(InvalidInput):
        store.apply(job.id, lambda s: checkpoint(s, None, "c", "ok", "", {"x": {1}}, utcnow()))


# ------------------------------------------------------------- waits end when the worker dies
@contextlib.contextmanager
def _worker(store: Store, store_url: str, attempts: int) -> Iterator[tuple[str, procs.Child]]:
    """A job started by another process that holds its worker lock (kill it to let go)."""
    job = store.create(kind="function", name="f", max_attempts=attempts)
    with procs.spawned(procs.hold_lock, store_url, job.id, True, False) as worker:
        assert worker.recv()[0] == "ready"
        yield job.id, worker


def test_wait_returns_the_reconciled_state_when_the_worker_died(
    store: Store, store_url: str
) -> None:
    """The wait would time out after 30 s on a live worker; it returns the job's true state
    instead, about a second after the kill (BENCHMARKS.md: bench/reconcile_bench.py)."""
    with _worker(store, store_url, attempts=1) as (job_id, worker):
        got: list[JobState] = []
        waiter = threading.Thread(target=lambda: got.append(store.wait(job_id, timeout=30)))
        waiter.start()
        time.sleep(0.3)  # the wait is under way, on a live worker
        assert not got
        worker.kill()
        waiter.join(30)
    [state] = got
    assert state.status == Status.FAILED, state
    assert state.error is not None and state.error.code == "abandoned"


def test_watch_ends_with_the_terminal_event_when_the_worker_died(
    store: Store, store_url: str
) -> None:
    with _worker(store, store_url, attempts=1) as (job_id, worker):
        events = store.watch(job_id, timeout=30)
        first = next(iter(events))
        assert first.status == EventStatus.STARTED
        worker.kill()
        rest = list(events)
    assert rest and rest[-1].status == EventStatus.FAILED
    assert rest[-1].message["error"]["code"] == "abandoned"  # type: ignore[index]
    assert store.get(job_id).terminal


def test_a_job_retried_after_its_worker_died_is_waited_for_to_its_end(
    store: Store, store_url: str
) -> None:
    """With attempts left the wait goes on: the retry (here: this test, as the new worker)
    ends the job."""
    with _worker(store, store_url, attempts=2) as (job_id, worker):
        got: list[JobState] = []
        waiter = threading.Thread(target=lambda: got.append(store.wait(job_id, timeout=30)))
        waiter.start()
        worker.kill()
        retry = None
        deadline = time.monotonic() + 20
        while retry is None and time.monotonic() < deadline:
            claimed = store.claim()
            retry = claimed[0] if claimed else None
            time.sleep(0.05)
        assert retry is not None, "the job never went back to pending"
        assert not got  # still waiting: the job is not over
        retry.succeed("second time")
        waiter.join(30)
    assert [s.status for s in got] == [Status.SUCCEEDED]
    assert store.get(job_id).attempts == 2


def test_the_store_numbers_events_once_for_every_adapter() -> None:
    now = utcnow()
    events = machine.number(
        "j", 4, [machine.NewEvent("s", EventStatus.PROGRESS, {"m": [1]})] * 2, now
    )
    assert [e.seq for e in events] == [5, 6] and {e.at for e in events} == {now}
    raw = codec.encode_event(events[0])
    assert codec.decode_event("j", raw) == events[0]
    with pytest.raises(Exception, match="names job"):
        codec.decode_event("other", raw)


def test_the_job_kind_of_a_new_state_is_checked(store: Store) -> None:
    with pytest.raises(InvalidInput, match="call must be"):
        store.create(kind=Kind.FUNCTION, name="f", call={"module": "m"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="timeout"):
        store.create(kind=Kind.FUNCTION, name="f", timeout=-1)
    with pytest.raises(InvalidInput, match="grace"):
        store.create(kind=Kind.COMMAND, command=["x"], grace=float("nan"))


def test_a_wait_on_a_due_job_nobody_claims_does_not_poll_the_store(store: Store) -> None:
    """Before: once a pending job's run_after had passed, the follower waited 0 s and read
    the store tens of thousands of times a second until a pool claimed the job."""
    from datetime import timedelta

    job = store.create(kind="function", name="f", run_after=utcnow() + timedelta(seconds=0.2))
    reads = [0]
    real = store.get

    def counted(job_id: str) -> JobState:
        reads[0] += 1
        return real(job_id)

    store.get = counted  # type: ignore[method-assign]
    state = store.wait(job.id, timeout=1.5)
    assert state.status == Status.PENDING
    assert reads[0] < 20, f"{reads[0]} reads in 1.5 s"


def test_a_busy_neighbour_does_not_keep_a_dead_worker_from_being_seen(
    store: Store, store_url: str
) -> None:
    """Jobs share notification channels: before, every wake-up by another job's change
    reset the quiet period, so a job whose worker died next to a busy one was never
    reconciled."""
    from outlast.store import notify

    with _worker(store, store_url, attempts=1) as (job_id, worker):
        channel = notify.job_channel(job_id)
        neighbour = store.create(kind="function", name="n")
        while notify.job_channel(neighbour.id) != channel:
            neighbour = store.create(kind="function", name="n")
        stop = threading.Event()

        def chatter() -> None:
            while not stop.wait(0.2):
                store.open(neighbour.id).relabel("tick", str(time.monotonic()))

        talker = threading.Thread(target=chatter)
        talker.start()
        try:
            worker.kill()
            state = store.wait(job_id, timeout=8)
        finally:
            stop.set()
            talker.join()
    assert state.status == Status.FAILED, state


def test_a_transition_that_writes_to_the_store_is_refused(store: Store) -> None:
    """Transitions are pure; one that writes (a nested transaction) is an error, not a
    commit of the outer transaction half-way (PostgreSQL) with its numbering broken."""
    from outlast.errors import StoreError

    job = store.create(kind="function", name="f")
    [claimed] = store.claim()
    if store.url.startswith("files://"):
        pytest.skip("the files store locks each job on its own: nothing nests")

    def writes(state: JobState) -> Change | None:
        store.open(job.id).report("inner", "progress")
        return None

    with pytest.raises(StoreError):
        store.apply(job.id, writes)
    claimed.report("after", "progress")
    assert [e.seq for e in store.events(job.id)] == [1, 2]


def test_frozen_containers_cannot_be_refilled_through_init() -> None:
    from outlast.frozen import FrozenDict, FrozenList, freeze

    frozen = freeze({"a": [1]})
    for attempt in (
        lambda: frozen.__init__({"b": 2}),
        lambda: frozen["a"].__init__([9]),
        lambda: FrozenDict({"a": 1}),
        lambda: FrozenList([1]),
    ):
        with pytest.raises(TypeError, match="immutable"):
            attempt()
    assert frozen == {"a": [1]}


def test_a_sql_store_reuses_a_state_only_while_its_stored_bytes_are_the_same(
    store: Store, store_url: str
) -> None:
    """SQLite and PostgreSQL keep the states they last wrote or read (``StateCache``): a job
    read again unchanged is the same state object (no parse, no check); a change from
    another store object (another process) is read fresh, as is a deleted job."""
    if not store_url.startswith(("sqlite", "postgresql")):
        pytest.skip("the files store reads each job's file")
    from outlast.store import open_store

    job = store.create(name="cached", queue="default")
    first = store.get(job.id)
    assert store.get(job.id) is first
    with open_store(store_url) as other:  # another writer
        [task] = other.claim(None, 1)
        task.report("halfway", progress=40)
    changed = store.get(job.id)
    assert changed is not first and changed.progress == 40 and changed.step == "halfway"
    assert store.get(job.id) is changed
    task.succeed("done")
    assert store.get(job.id).result == "done"
    store.delete(job.id)
    with pytest.raises(JobNotFound):
        store.get(job.id)


def test_the_state_cache_keeps_the_newest_states_and_lets_the_oldest_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``StateCache`` holds at most ``STATE_CACHE`` states: past it the oldest written goes
    first (a state written again keeps its place), whatever the number of writes."""
    from outlast.store import sql

    monkeypatch.setattr(sql, "STATE_CACHE", 3)
    cache = sql.StateCache()
    states = [JobState(id=f"j{i}", kind=Kind.FUNCTION, name="f") for i in range(6)]
    for state in states[:3]:
        cache.remember(state, b"doc", 1)
    cache.remember(states[0], b"doc", 2)  # again: still the oldest
    cache.remember(states[3], b"doc", 1)
    assert cache.guess("j0") is None and cache.guess("j1") is not None
    for state in states[4:]:
        cache.remember(state, b"doc", 1)
    assert [s.id for s in states if cache.guess(s.id)] == ["j3", "j4", "j5"]
