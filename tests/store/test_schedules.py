"""Schedules and retention on every adapter: the store keeps schedules durably, fires each
fire time exactly once (even with several processes firing at once), and removes finished jobs
past their time in short steps."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from outlast import cron
from outlast.errors import InvalidInput, InvalidJobId, ScheduleExists, ScheduleNotFound
from outlast.model import Kind, Status
from outlast.store import Store
from tests.store import procs


def _template(**kw: object) -> object:
    return cron.template(Kind.COMMAND, "t", command=["true"], **kw)  # type: ignore[arg-type]


def _every(name: str, seconds: float, **kw: object) -> object:
    return cron.new_schedule(name, _template(), every=seconds, **kw)  # type: ignore[arg-type]


def test_schedules_are_stored_listed_paused_and_removed(store: Store) -> None:
    nightly = cron.new_schedule("nightly", _template(), cron="0 3 * * *", tz="Europe/Berlin")
    store.add_schedule(nightly)  # type: ignore[arg-type]
    store.add_schedule(_every("often", 60))  # type: ignore[arg-type]
    assert [s.id for s in store.schedules()] == ["nightly", "often"]
    assert store.get_schedule("nightly") == nightly
    with pytest.raises(ScheduleExists, match="nightly"):
        store.add_schedule(nightly)  # type: ignore[arg-type]
    paused = store.pause_schedule("nightly")
    assert paused.paused and store.get_schedule("nightly").paused
    assert store.next_fire() == store.get_schedule("often").next_at  # paused ones don't count
    resumed = store.pause_schedule("nightly", paused=False)
    assert not resumed.paused and resumed.next_at == nightly.next_at
    store.remove_schedule("nightly")
    with pytest.raises(ScheduleNotFound):
        store.get_schedule("nightly")
    with pytest.raises(ScheduleNotFound):
        store.remove_schedule("nightly")
    with pytest.raises(InvalidJobId):
        store.get_schedule("../x")


def test_replacing_keeps_history_and_next_time_when_the_timing_is_the_same(store: Store) -> None:
    first = store.add_schedule(_every("s", 1))  # type: ignore[arg-type]
    time.sleep(1.05)
    [job] = store.fire_schedules()
    fired = store.get_schedule("s")
    store.pause_schedule("s")
    again = cron.new_schedule("s", _template(labels={"v": "2"}), every=1)
    replaced = store.add_schedule(again, replace=True)
    assert replaced.job.labels == {"v": "2"} and replaced.paused
    assert (replaced.fires, replaced.last_job) == (1, job.id)
    assert replaced.next_at == fired.next_at and replaced.created_at == first.created_at


def test_a_fire_makes_one_job_keyed_by_schedule_and_fire_time(store: Store) -> None:
    template = cron.template(
        Kind.FUNCTION,
        "tasks.report",
        call=__import__("outlast.model", fromlist=["Call"]).Call("tasks", [1], {"x": 2}),
        labels={"team": "data"},
        queue="reports",
        max_attempts=2,
        timeout=30,
        keep=3600,
    )
    store.add_schedule(cron.new_schedule("report", template, every=1))
    assert store.fire_schedules() == []  # not due yet
    time.sleep(1.05)
    [job] = store.fire_schedules()
    assert store.fire_schedules() == []
    state = store.get(job.id)
    assert state.fired is not None and state.fired.schedule == "report"
    assert state.id == cron.job_id("report", state.fired.fire_at)
    assert (state.kind, state.name, state.queue, state.labels) == (
        Kind.FUNCTION,
        "tasks.report",
        "reports",
        {"team": "data"},
    )
    assert state.call is not None and state.call.args == [1] and state.call.kwargs == {"x": 2}
    assert (state.max_attempts, state.timeout, state.keep) == (2, 30.0, 3600.0)
    assert state.status == Status.PENDING and store.list(label={"team": "data"}) == [state]
    schedule = store.get_schedule("report")
    assert schedule.last_job == job.id and schedule.fires == 1
    assert schedule.next_at is not None and schedule.next_at > datetime.now(UTC)
    now = store.run_schedule_now("report")  # by hand: another job, the times unchanged
    assert now.fired is not None and now.fired.reason == "manual" and now.id != job.id
    assert store.get_schedule("report").next_at == schedule.next_at
    assert store.get_schedule("report").last_job == now.id


def test_no_overlap_skips_while_the_last_job_is_live(store: Store) -> None:
    store.add_schedule(_every("one", 1, overlap=False))  # type: ignore[arg-type]
    time.sleep(1.05)
    [job] = store.fire_schedules()
    time.sleep(1.0)
    assert store.fire_schedules() == []  # the first is still pending
    assert store.get_schedule("one").skipped == 1
    task = store.open(job.id)
    task.start()
    task.succeed()
    time.sleep(1.0)
    assert len(store.fire_schedules()) == 1


def test_several_processes_firing_at_once_make_each_fire_time_once(
    store: Store, store_url: str
) -> None:
    """Four processes fire the same store as fast as they can for 4 seconds (the maintenance
    lock would let one do it; this is the store's own guarantee): every fire time of two
    one-second schedules makes exactly one job."""
    for name in ("a", "b"):
        store.add_schedule(_every(name, 1))  # type: ignore[arg-type]
    children = [procs.Child(procs.fire_for, store_url, 4.0) for _ in range(4)]
    made: list[str] = []
    try:
        for child in children:
            child.expect("ready")
        for child in children:
            child.send("go")
        for child in children:
            made += child.recv(60)
            child.join()
    finally:
        for child in children:
            child.close()
    stored = [s for s in store.list(limit=None) if s.fired is not None]
    keys = Counter((s.fired.schedule, s.fired.fire_at) for s in stored if s.fired)
    assert [k for k, n in keys.items() if n > 1] == []
    assert len(stored) >= 6, "about four fire times each"
    for name in ("a", "b"):  # no gap: one job per second, in order
        times = sorted(t for s, t in keys if s == name)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(g == timedelta(seconds=1) for g in gaps), gaps
    # a process may report a job another made too (its insert did nothing): never a new one
    assert set(made) == {s.id for s in stored}


def test_retention_removes_finished_jobs_past_their_keep(store: Store) -> None:
    def finished(keep: float | None) -> str:
        task = store.create(command=["true"], keep=keep)
        task.start()
        task.succeed()
        return task.id

    short, long_, default = finished(0.2), finished(3600), finished(None)
    live = store.create(command=["true"], keep=0).id  # never finished: never removed
    finished_at = store.get(short).finished_at
    assert finished_at is not None
    # before its keep is over (a time of our own: the writes since may take 0.2 s on a
    # loaded machine's disk)
    assert store.expired(finished_at + timedelta(seconds=0.1)) == []
    time.sleep(0.3)
    assert [s.id for s in store.expired()] == [short]
    assert {s.id for s in store.expired(keep=0)} == {short, default}  # OUTLAST_KEEP=0
    later = datetime.now(UTC) + timedelta(hours=2)
    assert {s.id for s in store.expired(later, keep=None)} == {short, long_}
    assert store.prune(keep=0, limit=1) == [short]  # bounded: oldest first
    assert store.prune(keep=0) == [default]
    ids = {s.id for s in store.list(limit=None)}
    assert ids == {long_, live}
    assert store.events(short) == []


def test_unclaimed_lists_the_due_command_and_spawned_jobs_nobody_took(store: Store) -> None:
    now = datetime.now(UTC)
    due = store.create(command=["true"]).id
    past = store.create(command=["true"], run_after=now - timedelta(seconds=1)).id
    later = store.create(command=["true"], run_after=now + timedelta(hours=1)).id
    spawned = store.create(kind="function", name="f", queue="@dedicated").id
    store.create(kind="function", name="f", queue="default")  # a pool's to claim
    taken = store.create(command=["true"])
    taken.start()
    store.create(command=["true"], limit_key="g")  # parked: its key's, see below
    assert {s.id for s in store.unclaimed()} == {due, past, spawned}
    assert {s.id for s in store.unclaimed(now + timedelta(hours=2))} == {due, past, later, spawned}


def test_timed_pages_through_the_jobs_waiting_for_their_time_in_time_order(
    store: Store,
) -> None:
    """What the store's timer reads (outlast.run.timer): pending command and spawned jobs
    with a time of their own that nobody is bound to, by ``(run_after, id)``, after a
    cursor; not a pool's jobs, not a job without a time, not a taken one."""
    now = datetime.now(UTC)

    def at(minutes: float, **kw: object) -> str:
        when = now + timedelta(minutes=minutes)
        return store.create(command=["true"], run_after=when, **kw).id  # type: ignore[arg-type]

    third, first = at(30), at(-5)
    second = [at(10), at(10), at(10)]  # the same time: by id
    keyed = at(20, limit_key="g")
    spawned = store.create(kind="function", name="f", queue="@dedicated", run_after=now).id
    store.create(command=["true"])  # no time of its own
    store.create(kind="function", name="f", run_after=now + timedelta(minutes=1))  # a pool's
    taken = store.open(at(-1))
    assert taken.start()
    ended = store.open(at(2))
    ended.cancel()
    expected = [first, spawned, *sorted(second), keyed, third]
    assert [s.id for s in store.timed()] == expected
    page = store.timed(limit=3)
    assert [s.id for s in page] == expected[:3]
    last = page[-1]
    assert last.run_after is not None
    assert [s.id for s in store.timed((last.run_after, last.id), 2)] == expected[3:5]
    assert [s.id for s in store.timed((last.run_after, last.id))] == expected[3:]
    assert store.timed((now + timedelta(hours=1), "")) == []
    with pytest.raises(InvalidInput, match="limit must be at least 1"):
        store.timed(limit=0)


def test_parked_lists_a_keys_waiting_jobs_in_claim_order_as_many_as_it_has_free_slots(
    store: Store,
) -> None:
    """What the workers of a key's parked command and spawned jobs are started for."""
    now = datetime.now(UTC)

    def command(**kw: object) -> str:
        return store.create(command=["true"], limit_key="g", **kw).id  # type: ignore[arg-type]

    first, second = command(), command()
    urgent = command(priority=5)
    command(run_after=now + timedelta(hours=1))  # not due
    held = store.open(command())
    held.hold_worker_lock()  # a worker is on its way to take it: skipped
    spawned = store.create(kind="function", name="f", queue="@dedicated", limit_key="g").id
    store.create(kind="function", name="f", limit_key="g")  # a pool's to claim
    store.create(command=["true"], limit_key="other")
    assert store.parked_keys() == ["g", "other"]
    assert store.waiting_by_key() == {"g": 6, "other": 1}  # the delayed and the held ones too
    assert [s.id for s in store.parked("g")] == [urgent]  # no slots set: the job's limit, 1
    store.set_slots("g", 4)
    assert [s.id for s in store.parked("g")] == [urgent, first, second, spawned]
    running = store.open(urgent)
    running.hold_worker_lock()
    assert running.start()
    assert [s.id for s in store.parked("g")] == [first, second, spawned]  # 3 slots free
    assert {"name": "g", "slots": 4, "running": 1, "waiting": 5} in store.groups()
    store.set_slots("g", 1)
    assert store.parked("g") == []  # full
    assert len(store.parked("other")) == 1
    assert store.parked("nobody") == []
    with pytest.raises(InvalidInput):
        store.parked("")


def test_the_change_watch_is_quiet_while_nothing_changes(store: Store) -> None:
    """What lets an idle maintainer send no query: a watch that changes only with writes
    (after the first look; a write less than 100 ms old may be looked at again)."""
    watch = store.change_watch()
    try:
        assert watch.changed()  # the first look
        time.sleep(0.2)
        assert not watch.changed()
        assert not watch.changed()
        store.add_schedule(_every("w", 60))  # type: ignore[arg-type]
        until_changed = time.monotonic() + 5
        while not watch.changed():
            assert time.monotonic() < until_changed, "a new schedule went unseen"
            time.sleep(0.05)
        time.sleep(0.2)
        watch.changed()
        assert not watch.changed()
        store.create(command=["true"])  # a new job too
        while not watch.changed():
            assert time.monotonic() < until_changed + 5, "a new job went unseen"
            time.sleep(0.05)
    finally:
        watch.close()


def test_more_schedules_than_a_batch_all_fire_in_one_call(store: Store) -> None:
    now = datetime.now(UTC)
    past = now - timedelta(seconds=59.9)
    for i in range(130):  # FIRE_BATCH is 100
        store.add_schedule(cron.new_schedule(f"s{i:03}", _template(), every=60, now=past))  # type: ignore[arg-type]
    time.sleep(0.2)
    made = store.fire_schedules()
    assert len(made) == 130 and len({j.id for j in made}) == 130
    assert store.fire_schedules() == []
    assert all(s.fires == 1 for s in store.schedules())
