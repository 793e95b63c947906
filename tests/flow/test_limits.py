"""Concurrency limits: at most N jobs of a key run at once across every pool (counted by
the store in the claim's transaction), a dead worker's slots free when its death is seen,
and command groups wait for a slot."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from outlast.errors import InvalidInput
from outlast.model import Status
from outlast.run.api import create_job
from outlast.store import Store
from tests.pool import jobs_for_tests  # noqa: F401 - registers pt.limited
from tests.pool.conftest import Harness, read_lines
from tests.waiting import until


def _most_at_once(lines: list[str]) -> int:
    running, most = set(), 0
    for line in lines:
        sign, job = line.split()
        if sign == "+":
            running.add(job)
        else:
            running.discard(job)
        most = max(most, len(running))
    return most


def _most_at_once_alive(pool: Harness, key: str) -> int:
    return sum(1 for s in pool.all() if s.limit_key == key and s.status == Status.RUNNING)


def test_claims_take_a_key_only_while_it_has_a_free_slot(store: Store) -> None:
    ids = [store.create(kind="function", name="f", limit_key="t", limit=2).id for _ in range(5)]
    other = store.create(kind="function", name="g").id
    got = store.claim(limit=10, kinds=["function"])
    assert len(got) == 3 and other in {t.id for t in got}
    assert store.slots() == {"t": (None, 2)}
    assert store.claim(limit=10, kinds=["function"]) == []  # full
    next(t for t in got if t.id in ids).succeed()
    assert len(store.claim(limit=10, kinds=["function"])) == 1  # one slot freed
    store.set_slots("t", 4)  # the store's slots win over the jobs' own limit
    assert len(store.claim(limit=10, kinds=["function"])) == 2
    assert store.slots() == {"t": (4, 4)}
    store.set_slots("t", None)
    assert store.slots() == {"t": (None, 4)}
    first = store.create(command=["true"], limit_key="gpu")  # no limit given: one slot
    second = store.create(command=["true"], limit_key="gpu")
    assert first.start() and not second.start()
    assert store.get(second.id).status == Status.PENDING
    first.succeed()
    assert second.start()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"limit_key": "t", "limit": 0}, "limit must be a whole number from 1"),
        ({"limit_key": "t", "limit": 1.5}, "limit must be a whole number"),
        ({"limit": 2}, "a limit needs a limit key"),
        ({"limit_key": "  "}, "limit key"),
    ],
)
def test_bad_limits_are_refused_and_nothing_is_stored(
    store: Store, options: dict[str, object], says: str
) -> None:
    with pytest.raises(InvalidInput, match=says):
        store.create(kind="function", name="x", **options)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="slots"):
        store.set_slots("t", 0)
    assert store.list() == [] and store.slots() == {}


@pytest.mark.timeout(120)
def test_fifty_jobs_of_one_key_across_three_pools_never_run_more_than_two_at_once(
    pool: Harness,
) -> None:
    marks = pool.tmp / "marks.txt"
    for i in range(50):
        create_job(pool.store, "pt.limited", [str(marks)], {"tenant": "t1", "sleep": 0.05})
        if i % 10 == 0:  # and a free job now and then, which runs beside them
            create_job(pool.store, "pt.noop", [i])
    for _ in range(3):
        pool.worker("-c", "2")
    pool.wait_all(55, timeout=90)
    lines = read_lines(marks)
    assert len(lines) == 100
    assert _most_at_once(lines) == 2  # never more, and the slots were used
    states = [s for s in pool.all() if s.name == "pt.limited"]
    assert all(s.status == Status.SUCCEEDED and s.limit_key == "tenant:t1" for s in states)


@pytest.mark.timeout(120)
def test_a_killed_pool_frees_its_slots_as_soon_as_its_death_is_seen(pool: Harness) -> None:
    marks = pool.tmp / "marks.txt"
    holder = pool.worker("-c", "2")
    pool.ready()
    jobs = [
        create_job(pool.store, "pt.limited", [str(marks)], {"tenant": "k", "sleep": 30}).id
        for _ in range(2)
    ]
    until(lambda: len(read_lines(marks)) == 2, 30, "both slots taken")
    waiting = create_job(pool.store, "pt.limited", [str(marks)], {"tenant": "k", "sleep": 0}).id
    other = pool.worker("-c", "2")  # its maintainer reconciles the dead pool's jobs
    pool.ready()  # (the holder's processes are busy: the probe is other's) up, so its start
    time.sleep(1.0)  # is not counted in `freed` on a loaded machine
    assert pool.get(waiting).status == Status.PENDING  # no slot
    holder.popen.send_signal(signal.SIGKILL)
    holder.wait()
    killed = time.monotonic()
    starts = lambda: sum(1 for line in read_lines(marks) if line.startswith("+"))  # noqa: E731
    until(lambda: starts() > 2, 30, "a start in a freed slot")
    freed = time.monotonic() - killed
    assert freed < 5.0, freed  # about a second: the maintainer's sweep (loaded boxes: slack)
    # the waiting job and both retries (the waiting job may take a slot first: then the
    # second retry starts once it is done)
    until(lambda: starts() >= 5, 30, "both slots used again")
    assert _most_at_once_alive(pool, "tenant:k") <= 2
    retried = [pool.get(job) for job in jobs]
    assert all(s.attempts == 2 for s in retried), retried  # the killed attempts, retried
    print(f"slots freed {freed:.2f} s after the SIGKILL")
    other.popen.send_signal(signal.SIGTERM)


@pytest.mark.timeout(90)
def test_a_command_group_with_one_slot_runs_its_commands_one_at_a_time(pool: Harness) -> None:
    marks = pool.tmp / "marks.txt"
    set_slots = pool.cli("group", "set", "gpu", "--slots", "1")
    assert set_slots.returncode == 0 and "gpu: 1 slot(s)" in set_slots.stdout
    script = f'echo "+ $OUTLAST_JOB_ID" >> {marks}; sleep 0.5; echo "- $OUTLAST_JOB_ID" >> {marks}'
    jobs = [
        pool.cli("run", "--group", "gpu", "--", "sh", "-c", script).stdout.strip() for _ in range(3)
    ]
    shown = pool.cli("group", "ls")
    assert "gpu" in shown.stdout
    for job in jobs:
        pool.wait_for(job, {Status.SUCCEEDED}, 60)
    lines = read_lines(marks)
    assert len(lines) == 6 and _most_at_once(lines) == 1
    assert '"slots": 1' in pool.cli("group", "ls", "--json").stdout
    assert "limit key: gpu" in pool.cli("status", jobs[0]).stdout


@pytest.mark.timeout(60)
def test_a_limit_key_template_naming_a_missing_argument_is_refused(pool: Harness) -> None:
    result = pool.cli(
        "submit", "pt.limited", "--import", "tests.pool.jobs_for_tests", "--args", '["/tmp/x"]'
    )
    assert result.returncode == 2, result
    assert "missing a required argument: 'tenant'" in result.stderr or "tenant" in result.stderr
    assert pool.all() == []
    bad = pool.cli("group", "set", "gpu", "--slots", "0")
    assert bad.returncode == 2 and "0" in bad.stderr


def test_an_explicit_limit_key_per_call(tmp_path: Path) -> None:
    from outlast.run import registry
    from outlast.store import open_store

    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        spec = registry.lookup("pt.limited")
        job = create_job(store, spec, ["/tmp/x"], {"tenant": "a"})
        assert store.get(job.id).limit_key == "tenant:a" and store.get(job.id).limit == 2
        other = create_job(store, spec, ["/tmp/x"], {"tenant": "a"}, limit_key="all", limit=5)
        assert (store.get(other.id).limit_key, store.get(other.id).limit) == ("all", 5)
