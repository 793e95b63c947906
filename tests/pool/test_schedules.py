"""Schedules with real pools: whichever pool holds the store's maintenance lock fires them,
each fire time exactly once, through pool deaths; after downtime, the misfire policy decides;
``@outlast.job(cron=…)`` is stored by the pools that import it."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from outlast import cron
from outlast.model import JobState, Kind, Status
from outlast.run import registry
from outlast.run.api import schedule
from tests.pool import jobs_for_tests, scheduled_jobs
from tests.pool.conftest import Harness
from tests.store.adapters import ADAPTERS
from tests.waiting import until


def _fired(pool: Harness, name: str) -> list[JobState]:
    return sorted(
        (s for s in pool.all() if s.fired is not None and s.fired.schedule == name),
        key=lambda s: s.fired.fire_at if s.fired else s.created_at,
    )


def _every_second(pool: Harness, name: str, misfire: str = "once") -> None:
    spec = registry.lookup("pt.noop")
    schedule(spec, name=name, every=1, misfire=misfire, args=[name], store=pool.store)


@pytest.mark.timeout(120)
def test_a_pool_fires_a_schedule_and_runs_its_jobs(pool: Harness) -> None:
    _every_second(pool, "tick")
    pool.worker()
    jobs = until(lambda: len(_fired(pool, "tick")) >= 3 and _fired(pool, "tick"), 20, "3 fires")
    for job in jobs[:3]:
        state = pool.wait_for(job.id, {Status.SUCCEEDED}, 20)
        assert state.result == "tick" and state.fired is not None
        lateness = (state.created_at - state.fired.fire_at).total_seconds()
        assert 0 <= lateness < 1.0, lateness  # fired at its time, not at the next sweep
    listed = pool.cli("schedule", "ls", "--json")
    assert listed.returncode == 0, listed
    [doc] = __import__("json").loads(listed.stdout)["schedules"]
    assert (
        doc["id"] == "tick"
        and doc["fires"] >= 3
        and doc["last_status"]
        in (
            "pending",
            "running",
            "succeeded",
        )
    )


@pytest.mark.timeout(60)
def test_declared_schedules_are_stored_by_the_pools_that_import_them(pool: Harness) -> None:
    pool.worker("--import", scheduled_jobs.MODULE)
    until(lambda: len(pool.store.schedules()) == 2, 20, "the declared schedules to be stored")
    nightly = pool.store.get_schedule("pt.nightly")
    assert (nightly.cron, nightly.tz, nightly.misfire) == ("30 2 * * *", "Europe/Berlin", "skip")
    assert nightly.job.kind == Kind.FUNCTION and nightly.job.call is not None
    assert nightly.job.call.module == scheduled_jobs.MODULE
    tick = pool.store.get_schedule("pt.tick")
    assert tick.every == 1.0 and not tick.overlap
    job = until(lambda: _fired(pool, "pt.tick"), 20, "pt.tick to fire")[0]
    assert pool.wait_for(job.id, {Status.SUCCEEDED}, 20).result == "tick"
    # a second pool importing the same module changes nothing (same definition)
    before = pool.store.get_schedule("pt.tick")
    pool.worker("--import", scheduled_jobs.MODULE)
    time.sleep(1.5)
    assert pool.store.get_schedule("pt.tick").created_at == before.created_at


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_after_downtime_once_makes_one_catch_up_and_skip_none(
    tmp_path: Path, adapter: object
) -> None:
    """Two schedules every second, one ``misfire="once"`` and one ``"skip"``; no process
    maintains the store for five fire times; then a pool starts."""
    url = adapter.make_url(tmp_path)  # type: ignore[attr-defined]
    if url is None:
        pytest.skip("no such store on this machine")
    pool = Harness(tmp_path, url)
    try:
        for misfire in ("once", "skip"):
            _every_second(pool, misfire, misfire)
        firsts = {m: pool.store.get_schedule(m).next_at for m in ("once", "skip")}
        time.sleep(5.5)  # five fire times, and no process maintains the store
        started = datetime.now(UTC)
        pool.worker()
        for misfire in ("once", "skip"):
            until(lambda m=misfire: pool.store.get_schedule(m).next_at > started, 20, "a fire")
        # what the downtime made, read at once: a later fire a loaded machine makes a second
        # late is a miss of its own, with its own catch-up (not this test's)
        jobs, skipped = _fired(pool, "once"), _fired(pool, "skip")
        misses = {m: pool.store.get_schedule(m).skipped for m in ("once", "skip")}
        catch_ups = [j for j in jobs if j.fired and j.fired.reason == "catch_up"]
        assert len(catch_ups) == 1, jobs
        fired = catch_ups[0].fired
        first = firsts["once"]
        assert fired is not None and first is not None
        assert fired.fire_at >= first + timedelta(seconds=4)  # the latest one missed
        assert all(j.fired and j.fired.fire_at > fired.fire_at for j in jobs if j not in catch_ups)
        first = firsts["skip"]
        assert first is not None
        assert not [j for j in skipped if j.fired and j.fired.reason == "catch_up"]
        assert all(j.fired and j.fired.fire_at >= first + timedelta(seconds=5) for j in skipped)
        assert misses == {"once": 1, "skip": 1}
        assert pool.wait_for(catch_ups[0].id, {Status.SUCCEEDED}, 20)
    finally:
        pool.close()


def _pg_url(tmp: Path) -> str | None:
    return ADAPTERS[2].make_url(tmp)


@pytest.mark.timeout(240)
def test_every_fire_time_makes_one_job_while_pools_are_killed(tmp_path: Path) -> None:
    """Four pools on one SQLite store and four on one PostgreSQL store, a schedule every
    second for 30 s, one pool SIGKILLed every 5 s and started again: one job per fire time,
    never two; a fire time with no job only in a misfire window (the moment the maintainer
    died), where the catch-up job that follows stands in for it."""
    harnesses = [Harness(tmp_path / "sqlite")] if (tmp_path / "sqlite").mkdir() is None else []
    pg = _pg_url(tmp_path)
    if pg is not None:
        (tmp_path / "pg").mkdir()
        harnesses.append(Harness(tmp_path / "pg", pg))
    try:
        threads = [threading.Thread(target=_trial, args=(h,)) for h in harnesses]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for h in harnesses:
            _check_trial(h)
    finally:
        for h in harnesses:
            h.close()


#: The trial's length and the time between kills: five kills, as the 60 s trial had.
TRIAL_SECONDS, KILL_EVERY = 30.0, 5.0


def _trial(pool: Harness, seconds: float = TRIAL_SECONDS, kill_every: float = KILL_EVERY) -> None:
    _every_second(pool, "tick")
    pools = [pool.worker() for _ in range(4)]
    # the trial's time counts from the first fire: eight pools starting on two loaded cores
    # may take seconds, which would otherwise come off the fires counted
    until(lambda: _fired(pool, "tick"), 60, "the first fire")
    end = time.monotonic() + seconds
    victim = 0
    while time.monotonic() < end:
        time.sleep(min(kill_every, max(0.0, end - time.monotonic())))
        if time.monotonic() >= end:
            break
        pools[victim].popen.send_signal(signal.SIGKILL)
        pools[victim].wait()
        pools[victim] = pool.worker()
        victim = (victim + 1) % len(pools)
    pool.store.pause_schedule("tick")
    pool.kills = seconds // kill_every  # type: ignore[attr-defined]


def _check_trial(pool: Harness) -> None:
    jobs = _fired(pool, "tick")
    keys = Counter((j.fired.schedule, j.fired.fire_at) for j in jobs if j.fired)
    assert [k for k, n in keys.items() if n > 1] == [], "a fire time made two jobs"
    least = int(TRIAL_SECONDS * 5 / 6)  # a fire time a second, but for the misfire windows
    assert len(jobs) >= least, f"{pool.url}: only {len(jobs)} fires in {TRIAL_SECONDS} s"
    times = [j.fired.fire_at for j in jobs if j.fired]
    reasons = {j.fired.fire_at: j.fired.reason for j in jobs if j.fired}
    expected, missing = times[0], []
    while expected <= times[-1]:
        if expected not in reasons:
            missing.append(expected)
        expected += timedelta(seconds=1)
    # each missing fire time is in a misfire window: the next fire time that made a job
    # made it as a catch-up
    for gap in missing:
        after = min(t for t in times if t > gap)
        assert reasons[after] == "catch_up", f"{pool.url}: {gap} has no job and no catch-up"
    assert len(missing) <= 3 * pool.kills, (pool.url, missing)  # type: ignore[attr-defined]
    for job in jobs:
        state = pool.wait_for(job.id, {Status.SUCCEEDED}, 60)
        assert state.result == "tick"
    catch_ups = sum(1 for r in reasons.values() if r == "catch_up")
    print(
        f"{pool.url.split(':')[0]}: {len(jobs)} jobs, {len(missing)} fire times in misfire "
        f"windows, {catch_ups} catch-ups, no duplicate"
    )


def test_the_module_of_jobs_is_importable() -> None:
    assert jobs_for_tests.MODULE == "tests.pool.jobs_for_tests"
    assert cron.job_id("tick", datetime(2026, 1, 1, tzinfo=UTC)) == "tick.20260101T000000Z"
