"""Priorities: claims take due jobs by (priority descending, due time, id) on every store, a
pool runs them in that order, and a priority that is not a whole number in range is refused
everywhere, with nothing stored."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from outlast.errors import InvalidInput
from outlast.model import Status
from outlast.run.api import create_job
from outlast.store import Store
from tests.pool.conftest import Harness, read_lines


def test_claims_take_higher_priority_first_then_the_earliest_due(store: Store) -> None:
    now = datetime.now(UTC)
    made = []
    for i, priority in enumerate([0, 5, -3, 5, 10, 0, 5]):
        # ties broken by due time: a job due earlier (run_after in the past) goes first
        due = now - timedelta(seconds=100 - i) if i == 6 else None
        task = store.create(kind="function", name=f"j{i}", priority=priority, run_after=due)
        made.append((task.id, priority, i))
    later = store.create(
        kind="function", name="later", priority=99, run_after=now + timedelta(hours=1)
    )
    order = []
    while tasks := store.claim(limit=2, kinds=["function"]):
        order += [t.id for t in tasks]
    names = [store.get(j).name for j in order]
    assert names == ["j4", "j6", "j1", "j3", "j0", "j5", "j2"]
    assert store.get(later.id).status == Status.PENDING  # not due: never claimed early


@pytest.mark.parametrize("bad", [1.5, "3", True, 10**7, -(10**7), None])
def test_a_bad_priority_is_refused_and_nothing_is_stored(store: Store, bad: object) -> None:
    if bad is None:
        bad = [1]
    with pytest.raises(InvalidInput, match="priority must be a whole number"):
        store.create(kind="function", name="x", priority=bad)  # type: ignore[arg-type]
    assert store.list() == []


@pytest.mark.timeout(120)
def test_a_pool_runs_200_jobs_of_mixed_priority_in_order(pool: Harness) -> None:
    out = pool.tmp / "order.txt"
    rng = random.Random(13)
    jobs = {}
    for _ in range(200):
        priority = rng.choice([-10, 0, 0, 3, 7, 50])
        job = create_job(pool.store, "pt.record", [str(out)], priority=priority)
        jobs[job.id] = (priority, pool.get(job.id).created_at)
    pool.worker("-c", "1")
    pool.wait_all(200, timeout=90)
    ran = read_lines(out)
    assert len(ran) == 200
    expected = sorted(jobs, key=lambda j: (-jobs[j][0], jobs[j][1], j))
    assert ran == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--priority", "1.5"], "'1.5' is not a valid integer"),
        (["--priority", "high"], "'high' is not a valid integer"),
        (["--priority", "99999999"], "99999999 is not in the range"),
    ],
)
def test_the_cli_refuses_a_bad_priority(pool: Harness, args: list[str], says: str) -> None:
    for verb in (["run", *args, "--", "true"], ["submit", "pt.noop", *args]):
        result = (
            pool.cli(*verb, "--import", "tests.pool.jobs_for_tests")
            if verb[0] == "submit"
            else pool.cli(*verb)
        )
        assert result.returncode == 2 and says in result.stderr, result
    assert pool.all() == []


@pytest.mark.timeout(60)
def test_priority_shows_in_status_and_ls(pool: Harness) -> None:
    job = pool.cli("run", "--priority", "7", "--in", "1h", "--", "true").stdout.strip()
    assert pool.get(job).priority == 7
    assert "priority: 7" in pool.cli("status", job).stdout
    assert "p+7" in pool.cli("ls").stdout
    doc = __import__("json").loads(pool.cli("status", job, "--json").stdout)
    assert doc["priority"] == 7
    pool.cli("cancel", job)
