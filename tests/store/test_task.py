"""The task handle: claim, report, succeed, fail and retry, pause and resume, release, fencing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from outlast.errors import Fail, InvalidInput, InvalidTransition, JobNotFound
from outlast.model import EventStatus, Status
from outlast.store import Store, Task, worker_name
from tests.store import procs


class BoomError(Exception):
    pass


def statuses(store: Store, job_id: str) -> list[tuple[int, str, str]]:
    return [(e.seq, e.step, str(e.status)) for e in store.events(job_id)]


def claim_one(store: Store) -> Task:
    tasks = store.claim()
    assert len(tasks) == 1, f"expected one claimable job, got {tasks}"
    return tasks[0]


def test_create_records_a_pending_job(store: Store) -> None:
    before = datetime.now(UTC)
    task = store.create(command=["echo", "hi"], labels={"k": "v"}, payload={"a": 1}, max_attempts=3)
    state = store.get(task.id)
    assert state.id == task.id
    assert state.status == Status.PENDING
    assert state.command == ["echo", "hi"] and state.name == "echo"
    assert state.labels == {"k": "v"} and state.payload == {"a": 1}
    assert state.attempts == 0 and state.max_attempts == 3
    assert state.worker is None and state.started_at is None and state.finished_at is None
    assert before <= state.created_at <= datetime.now(UTC)
    assert store.events(task.id) == []
    assert store.open(task.id).state() == state


def test_claim_returns_a_task_with_attempt_token_and_worker_lock(
    store: Store, store_url: str
) -> None:
    job = store.create(name="j")
    task = claim_one(store)
    assert task.id == job.id
    assert task.attempt == 1
    state = store.get(job.id)
    assert state.status == Status.RUNNING
    assert state.attempts == 1 and state.worker == worker_name()
    assert state.started_at is not None
    assert statuses(store, job.id) == [(1, "job", "started")]
    assert not store.abandoned(state)
    assert store.claim() == []  # running jobs are never claimed again
    # The worker lock is held: another process cannot take it...
    with procs.spawned(procs.try_lock, store_url, job.id) as other:
        other.expect("held")
        other.join()
    # ...until the job is finished and the task lets go of it. (While the job runs, the
    # claimer's liveness covers it even without a per-job lock.)
    task.succeed(None)
    task.release_worker_lock()
    with procs.spawned(procs.try_lock, store_url, job.id) as other:
        other.expect("acquired")
        other.join()


def test_claim_takes_oldest_first_and_respects_limit_and_queues(store: Store) -> None:
    ids = [store.create(name=f"j{i}").id for i in range(3)]
    other = store.create(name="o", queue="other").id
    first = store.claim(limit=2)
    assert [t.id for t in first] == ids[:2]
    assert [t.id for t in store.claim(limit=5, queues=["other"])] == [other]
    assert [t.id for t in store.claim(limit=5)] == ids[2:]
    assert store.claim(limit=5) == []


def test_report_updates_phase_step_progress_and_appends_events(store: Store) -> None:
    store.create(name="j")
    task = claim_one(store)
    first = task.report("fetch", "started", "fetching", progress=10)
    assert first is not None and first.seq == 2 and first.step == "fetch"
    state = store.get(task.id)
    assert (state.phase, state.step, state.progress) == ("started", "fetch", 10.0)

    second = task.reporter().report("fetch", EventStatus.PROGRESS, {"rows": 5})
    assert second is not None and second.seq == 3
    state = store.get(task.id)
    assert (state.phase, state.step, state.progress) == ("progress", "fetch", 10.0)

    third = task.report("load", "completed", "done", progress=150)
    assert third is not None and third.seq == 4
    assert store.get(task.id).progress == 100.0  # clamped

    events = store.events(task.id)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[1:] == [first, second, third]
    assert [e.message for e in events[1:]] == ["fetching", {"rows": 5}, "done"]
    assert all(e.job_id == task.id for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("", "progress"), {}),
        (("s", "bogus"), {}),
        (("s", "progress"), {"progress": float("nan")}),
        (("s", "progress", {1, 2}), {}),
        (("s", "progress", {1: "int keys turn into strings"}), {}),
    ],
    ids=["empty-step", "unknown-status", "nan-progress", "set-message", "int-key-message"],
)
def test_report_refuses_bad_input(store: Store, args: tuple, kwargs: dict) -> None:  # type: ignore[type-arg]
    store.create(name="j")
    task = claim_one(store)
    with pytest.raises(InvalidInput):
        task.report(*args, **kwargs)
    assert len(store.events(task.id)) == 1


def test_events_after(store: Store) -> None:
    store.create(name="j")
    task = claim_one(store)
    for i in range(5):
        task.report("s", "progress", i)
    assert [e.seq for e in store.events(task.id, after=3)] == [4, 5, 6]
    assert [e.message for e in store.events(task.id, after=3)] == [2, 3, 4]
    assert store.events(task.id, after=6) == []
    assert store.events(task.id, after=100) == []
    assert [e.seq for e in store.events(task.id)] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(InvalidInput):
        store.events(task.id, after=-1)


def test_succeed_records_the_result(store: Store) -> None:
    store.create(name="j")
    task = claim_one(store)
    state = task.succeed({"answer": 42, "list": [1, None]})
    assert state.status == Status.SUCCEEDED
    assert state == store.get(task.id)
    assert state.result == {"answer": 42, "list": [1, None]}
    assert state.error is None and state.progress == 100.0
    assert state.finished_at is not None and state.terminal
    assert statuses(store, task.id) == [(1, "job", "started"), (2, "job", "completed")]
    with pytest.raises(InvalidInput):
        task.succeed(float("nan"))


def test_fail_with_attempts_left_retries_later_then_fails(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "0.6")
    store.create(name="j", max_attempts=2)
    task = claim_one(store)
    state = task.fail(BoomError("first try"))
    task.release_worker_lock()  # as a pool does once the outcome is written
    assert state == store.get(task.id)
    assert state.status == Status.PENDING
    assert state.attempts == 1 and state.worker is None and state.finished_at is None
    assert state.run_after is not None and state.run_after > datetime.now(UTC)
    assert state.run_after < datetime.now(UTC) + timedelta(seconds=5)
    assert state.error is not None
    assert state.error.code == "error" and state.error.message == "first try"
    assert state.error.type is not None and state.error.type.endswith("BoomError")
    assert store.claim() == []  # not due yet

    deadline = time.monotonic() + 5
    while not (again := store.claim()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [t.id for t in again] == [task.id]
    assert again[0].attempt == 2
    final = again[0].fail(ValueError("second try"))
    assert final.status == Status.FAILED and final.attempts == 2
    assert final.error is not None
    assert (final.error.code, final.error.type, final.error.message) == (
        "error",
        "ValueError",
        "second try",
    )
    assert final.finished_at is not None
    assert statuses(store, task.id) == [
        (1, "job", "started"),
        (2, "job", "failed"),
        (3, "job", "started"),
        (4, "job", "failed"),
    ]


def test_fail_without_attempts_fails_at_once(store: Store) -> None:
    store.create(name="j", max_attempts=1)
    task = claim_one(store)
    state = task.fail(KeyError("missing"))
    assert state.status == Status.FAILED
    assert state.error is not None
    assert state.error.code == "error" and state.error.type == "KeyError"
    assert store.claim() == []


def test_fail_without_retry_ignores_attempts_left(store: Store) -> None:
    store.create(name="j", max_attempts=5)
    task = claim_one(store)
    state = task.fail(Fail("not worth retrying"), retry=False)
    assert state.status == Status.FAILED and state.attempts == 1
    assert state.error is not None and state.error.message == "not worth retrying"
    assert state.error.type is not None and state.error.type.endswith("Fail")
    assert store.claim() == []


def test_pause_and_resume(store: Store) -> None:
    store.create(name="j", max_attempts=1)
    task = claim_one(store)
    paused = task.pause({"question": "deploy?"})
    task.release_worker_lock()  # as a pool does once the outcome is written
    assert paused.status == Status.PAUSED and paused.question == {"question": "deploy?"}
    assert paused == store.get(task.id)
    assert statuses(store, task.id)[-1] == (2, "job", "paused")
    assert not store.abandoned(paused)  # nobody works on a paused job
    assert store.claim() == []
    assert task.report("s", "progress") is None  # the worker let go of it

    resumed = store.open(task.id).resume("yes")
    assert resumed.status == Status.PENDING and resumed.answer == "yes"
    assert resumed == store.get(task.id)
    with pytest.raises(InvalidTransition):
        store.open(task.id).resume("again")

    again = claim_one(store)
    assert again.id == task.id
    state = store.get(task.id)
    assert state.status == Status.RUNNING and state.answer == "yes"
    assert again.succeed(1).status == Status.SUCCEEDED


def test_release_returns_the_job_without_counting_the_attempt(store: Store) -> None:
    store.create(name="j", max_attempts=1)
    task = claim_one(store)
    state = task.release()
    assert state.status == Status.PENDING
    assert state.worker is None and state.error is None
    # attempts is the fencing token and never goes down; the attempt is given back instead
    assert state.attempts == 1 and state.max_attempts == 2
    task.release_worker_lock()
    again = claim_one(store)
    assert again.id == task.id and again.attempt == 2
    again.fail(RuntimeError("the one real attempt failed"))
    assert store.get(task.id).status == Status.FAILED  # one attempt allowed, one used


def test_relabel(store: Store) -> None:
    task = store.create(name="j", labels={"a": "1"})
    assert task.relabel("b", "2").labels == {"a": "1", "b": "2"}
    assert task.relabel("a", "3").labels == {"a": "3", "b": "2"}
    assert store.get(task.id).labels == {"a": "3", "b": "2"}
    assert [s.id for s in store.list(label="a=3")] == [task.id]
    assert store.list(label="a=1") == []
    assert task.relabel("a", None).labels == {"b": "2"}
    assert store.list(label={"a": "3"}) == []
    assert [s.id for s in store.list(label={"b": "2"})] == [task.id]
    with pytest.raises(InvalidInput):
        task.relabel("", "x")
    with pytest.raises(InvalidInput):
        task.relabel("k=v", "x")


def test_set_pid(store: Store) -> None:
    store.create(name="j")
    task = claim_one(store)
    started = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    task.set_pid(4321, started_at=started)
    state = store.get(task.id)
    assert state.pid == 4321 and state.pid_started_at == started
    with pytest.raises(InvalidInput):
        task.set_pid(0)
    with pytest.raises(InvalidInput):
        task.set_pid(-5)


def test_stale_task_after_release_and_reclaim_cannot_write(store: Store) -> None:
    store.create(name="j")
    old = claim_one(store)
    old.release()
    old.release_worker_lock()
    new = claim_one(store)
    assert new.id == old.id
    before = store.get(old.id)
    events = store.events(old.id)

    assert old.report("s", "progress", "late") is None
    assert old.succeed("stale result").status == Status.RUNNING
    assert old.fail(RuntimeError("stale failure")).status == Status.RUNNING
    assert old.pause("stale question").status == Status.RUNNING
    assert store.get(old.id) == before
    assert store.events(old.id) == events

    assert new.succeed("fresh").result == "fresh"


def test_stale_task_after_cancel_cannot_write(store: Store) -> None:
    store.create(name="j", max_attempts=3)
    task = claim_one(store)
    canceled = store.open(task.id).cancel()
    assert canceled.status == Status.CANCELED
    events = store.events(task.id)
    assert task.report("s", "progress", "late") is None
    assert task.succeed("late").status == Status.CANCELED
    assert task.fail(RuntimeError("late")).status == Status.CANCELED
    assert task.pause("late").status == Status.CANCELED
    task.set_pid(99)
    task.release()
    state = store.get(task.id)
    assert state == canceled
    assert state.error is not None and state.error.code == "canceled"
    assert store.events(task.id) == events


def test_cancel_from_every_live_status(store: Store) -> None:
    pending = store.create(name="p")
    assert pending.cancel().status == Status.CANCELED
    store.create(name="r")
    running = claim_one(store)
    assert store.open(running.id).cancel().status == Status.CANCELED
    store.create(name="q")
    paused = claim_one(store)
    paused.pause("?")
    assert store.open(paused.id).cancel().status == Status.CANCELED
    for job_id in (pending.id, running.id, paused.id):
        state = store.get(job_id)
        assert state.error is not None and state.error.code == "canceled"
        assert state.finished_at is not None
        assert statuses(store, job_id)[-1][1:] == ("job", "failed")


def test_missing_job(store: Store) -> None:
    with pytest.raises(JobNotFound):
        store.get("nosuchjob")
    with pytest.raises(JobNotFound):
        store.open("nosuchjob").cancel()
    with pytest.raises(JobNotFound):
        store.delete("nosuchjob")


def test_many_outcomes_in_one_write_each_land_on_their_own_job(store: Store) -> None:
    """The batched write of a pool: several jobs, one transaction, each with its own events;
    an unknown job in the batch is skipped, and the same job twice sees its first change."""
    from outlast import machine
    from outlast.model import utcnow

    for i in range(5):
        store.create(name=f"j{i}")
    tasks = store.claim(limit=5)
    assert len(tasks) == 5
    items = [
        (t.id, lambda s, t=t: machine.succeed(s, t.attempt, {"n": t.id}, utcnow())) for t in tasks
    ]
    items.insert(2, ("nosuchjob", lambda s: None))
    first = tasks[0]
    late = EventStatus.PROGRESS
    items.append(
        (first.id, lambda s: machine.report(s, first.attempt, "late", late, None, None, utcnow()))
    )
    results = store.apply_many(items)
    assert [r[0].id for r in results] == [t.id for t in tasks] + [first.id]
    for task in tasks:
        state = store.get(task.id)
        assert state.status == Status.SUCCEEDED and state.result == {"n": task.id}
        assert statuses(store, task.id) == [(1, "job", "started"), (2, "job", "completed")]
    # the repeated job was read again after its first change: terminal, so nothing more
    assert results[-1] == (store.get(first.id), [])


def test_the_same_job_twice_in_one_batch_gets_both_changes_in_order(store: Store) -> None:
    from outlast import machine
    from outlast.model import utcnow

    store.create(name="j")
    task = claim_one(store)

    def report(step: str) -> tuple[str, object]:
        return (
            task.id,
            lambda s: machine.report(
                s, task.attempt, step, EventStatus.PROGRESS, None, 5, utcnow()
            ),
        )

    results = store.apply_many([report("a"), report("b")])
    assert [[e.seq for e in events] for _, events in results] == [[2], [3]]
    assert statuses(store, task.id)[1:] == [(2, "a", "progress"), (3, "b", "progress")]
    assert store.get(task.id).step == "b"


def test_jobs_of_a_dead_namesake_are_failed_over_when_this_process_goes_live(
    store: Store,
) -> None:
    """A job left ``running`` under this process's ``host:pid`` by an earlier process that had
    the same PID would look alive once we hold our liveness lock: the first claim fails it
    over first (and leaves other workers' jobs alone)."""
    from outlast import machine
    from outlast.model import utcnow

    if store.capabilities.spans_hosts:
        pytest.skip("PostgreSQL locks each job itself; no per-process liveness to mistake")
    me = worker_name()
    ghost = store.create(name="ghost", max_attempts=1)
    other = store.create(name="other")
    store.apply(ghost.id, lambda s: machine.start(s, me, utcnow()))  # behind our own back
    store.apply(other.id, lambda s: machine.start(s, "elsewhere:1", utcnow()))
    assert store.claim() == []
    state = store.get(ghost.id)
    assert state.status == Status.FAILED and state.error is not None
    assert state.error.code == "abandoned"
    assert store.get(other.id).status == Status.RUNNING


def test_two_jobs_alternating_in_one_batch_each_see_their_own_earlier_change(
    store: Store,
) -> None:
    """A, B, A, B: when A comes back, the pending changes of both are written and read back,
    so B's second change builds on its first (no lost change, no duplicate event seq)."""
    from outlast import machine
    from outlast.model import utcnow

    store.create(name="a")
    store.create(name="b")
    tasks = store.claim(limit=2)

    def report(task: Task, step: str) -> tuple[str, object]:
        return (
            task.id,
            lambda s: machine.report(
                s, task.attempt, step, EventStatus.PROGRESS, None, 5, utcnow()
            ),
        )

    a, b = tasks
    results = store.apply_many([report(a, "a1"), report(b, "b1"), report(a, "a2"), report(b, "b2")])
    assert [[e.seq for e in events] for _, events in results] == [[2], [2], [3], [3]]
    for task, steps in ((a, ["a1", "a2"]), (b, ["b1", "b2"])):
        assert [step for _, step, _ in statuses(store, task.id)[1:]] == steps
        assert store.get(task.id).step == steps[-1]
