"""``Store.timeline()`` on every adapter: the jobs that finished in each step by outcome, the
median and 95th percentile of their waits, steps aligned to the epoch, settled steps read
once per store object, and bad windows refused."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest

from outlast import machine
from outlast.errors import InvalidInput
from outlast.model import ErrorInfo, JobState, Kind, Status, utcnow
from outlast.store import Store, open_store
from outlast.store.timeline import MAX_STEPS, SETTLE


def _finished(
    finished: datetime, waited: float, status: Status = Status.SUCCEEDED, ran: float = 0.5
) -> JobState:
    """A job that waited ``waited`` seconds, ran ``ran`` and ended at ``finished``."""
    started = finished - timedelta(seconds=ran)
    created = started - timedelta(seconds=waited)
    state = machine.new_job(kind=Kind.FUNCTION, name="tl", now=created)
    return state.evolve(
        status=status,
        attempts=1,
        started_at=started,
        finished_at=finished,
        updated_at=finished,
        error=None if status == Status.SUCCEEDED else ErrorInfo(str(status), "x"),
    )


def _step_start(now: datetime, step: float, back: int) -> datetime:
    """The start of the step ``back`` steps before the one holding ``now``."""
    start = math.floor(now.timestamp() / step) * step - back * step
    return datetime.fromtimestamp(start, now.tzinfo)


def test_the_steps_count_what_finished_in_them(store: Store) -> None:
    now = utcnow()
    five_ago = _step_start(now, 60, 5) + timedelta(seconds=10)
    jobs = [_finished(five_ago, w) for w in (0.1, 0.2, 0.3, 0.4, 10.0)]
    jobs += [_finished(five_ago, 1.0, Status.FAILED), _finished(five_ago, 2.0, Status.CANCELED)]
    jobs += [_finished(now - timedelta(hours=3), 1.0)]  # before the window
    store._insert_many(jobs)
    store.create(kind="function", name="pending")  # not finished: not counted
    doc = store.timeline(3600, 60).to_dict()
    after = utcnow()
    assert len(doc["times"]) == 60 and doc["step_seconds"] == 60 and doc["window_seconds"] == 3600
    assert all(t % 60 == 0 for t in doc["times"])  # aligned to the epoch
    # the last step holds the time of the call (a minute may have turned since `now`)
    last = doc["times"][-1]
    assert last <= after.timestamp() < last + 60 and now.timestamp() < last + 60
    i = doc["times"].index(_step_start(now, 60, 5).timestamp())
    finished = doc["finished"]
    assert (finished["succeeded"][i], finished["failed"][i], finished["canceled"][i]) == (5, 1, 1)
    assert sum(map(sum, finished.values())) == 7
    # waits of the step's seven jobs: 0.1 0.2 0.3 0.4 1 2 10 -> median 0.4, p95 10
    assert doc["wait_seconds"]["p50"][i] == pytest.approx(0.4, abs=1e-3)
    assert doc["wait_seconds"]["p95"][i] == pytest.approx(10.0, abs=1e-3)
    assert [w for k, w in enumerate(doc["wait_seconds"]["p50"]) if k != i] == [None] * 59


def test_jobs_ending_now_show_in_the_last_step(store: Store) -> None:
    for ok in (True, True, False):
        task = store.create(kind="function", name="live")
        task.start()
        if ok:
            task.succeed(1)
        else:
            task.fail("boom", retry=False)
    canceled = store.create(kind="function", name="never ran")
    canceled.cancel()
    doc = store.timeline(600, 10).to_dict()
    assert len(doc["times"]) == 60
    tail = {k: sum(v[-2:]) for k, v in doc["finished"].items()}  # the step may just have turned
    assert tail == {"succeeded": 2, "failed": 1, "canceled": 1}
    waits = [w for w in doc["wait_seconds"]["p95"][-2:] if w is not None]
    assert waits and all(0 <= w < 5 for w in waits)


def test_settled_steps_are_read_once_per_store_object(store: Store, store_url: str) -> None:
    """A step that ended over SETTLE seconds ago is kept: a job written into it behind the
    store's back (a host whose clock is far behind) is not seen by the object that kept it,
    only by a new one; the last steps are read again each time."""
    now = utcnow()
    old = _step_start(now, 60, math.ceil(SETTLE / 60) + 3) + timedelta(seconds=1)
    store._insert_many([_finished(old, 1.0)])
    first = store.timeline(3600, 60).to_dict()
    assert sum(first["finished"]["succeeded"]) == 1
    store._insert_many([_finished(old, 2.0)])  # into a settled step
    task = store.create(kind="function", name="now")  # into the last step
    task.start()
    task.succeed(None)
    again = store.timeline(3600, 60).to_dict()
    assert sum(again["finished"]["succeeded"]) == 2  # the settled step as it was kept
    with open_store(store_url) as fresh:
        assert sum(fresh.timeline(3600, 60).to_dict()["finished"]["succeeded"]) == 3
    # another step size is its own
    assert sum(store.timeline(3600, 300).to_dict()["finished"]["succeeded"]) == 3


@pytest.mark.parametrize(
    ("window", "step", "message"),
    [
        (0, 60, "> 0"),
        (-5, 60, "> 0"),
        (3600, 0, "> 0"),
        (float("nan"), 60, "> 0"),
        (float("inf"), 60, "> 0"),
        (3600, 0.5, "at least 1 second"),
        (60, 120, "longer than the window"),
        (8 * 86400, 3600, "a week"),
        (86400 * 2, 60, f"at most {MAX_STEPS}"),
        ("1h", 60, "number of seconds"),
        (True, 60, "number of seconds"),
        (3600, None, "number of seconds"),
    ],
)
def test_bad_windows_are_refused(store: Store, window: Any, step: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        store.timeline(window, step)
