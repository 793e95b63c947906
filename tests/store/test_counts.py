"""The job counts ``Store.stats()`` reads (``GET /metrics``, ``outlast stats``, ``outlast
queues``) stay equal to the jobs the store holds through every way a job comes, changes and
goes: one at a time and in bulk, claims, outcomes, retries, cancels, pauses, deletes,
retention, schedule fires, a refused unique job; with writers and readers at once on
PostgreSQL (where the counts are changes folded by whoever reads); and on a store written
before the counts existed."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from outlast import cron, machine
from outlast.errors import JobActive
from outlast.model import Kind, Status, utcnow
from outlast.store import Store, open_store
from outlast.store import postgresql as pg
from outlast.store import sqlite as sq
from outlast.store import stats as stats_module
from tests.pg import support


def _held(store: Store) -> Counter[tuple[str, str, str]]:
    """The jobs the store holds by (queue, status, kind), counted one by one."""
    return Counter((s.queue, str(s.status), str(s.kind)) for s in store.list(limit=None))


def _counted(store: Store) -> Counter[tuple[str, str, str]]:
    return Counter({key: n for key, n in store.stats().jobs.items() if n})


def test_the_counts_follow_every_transition(store: Store) -> None:
    store.create_many(
        [{"kind": Kind.FUNCTION, "name": "bulk", "queue": q} for q in ("default", "mail") * 5]
    )
    store.create(kind=Kind.FUNCTION, name="u", unique_key="one")
    store.create(kind=Kind.FUNCTION, name="u", unique_key="one")  # returns the live holder
    assert _counted(store) == _held(store)
    claimed = store.claim(limit=4, queues=["default"])
    assert len(claimed) == 4
    claimed[0].succeed({"ok": True})
    claimed[1].fail("boom", retry=True)  # back to pending, later
    claimed[2].fail("boom", retry=False)
    claimed[3].pause("sure?")
    assert _counted(store) == _held(store)
    claimed[3].resume("yes")
    store.open(claimed[2].id).retry()  # a new job beside the failed one
    pending = store.list(status=Status.PENDING, limit=None)
    store.open(pending[0].id).cancel()
    running = store.create(kind=Kind.COMMAND, command=["true"])
    running.start()
    running.cancel()
    assert _counted(store) == _held(store)
    store.delete(claimed[0].id)
    with pytest.raises(JobActive):
        store.delete(pending[1].id)  # refused: counts unchanged
    store.delete(pending[1].id, force=True)
    old = machine.new_job(kind=Kind.FUNCTION, name="old", now=utcnow() - timedelta(days=3))
    old = old.evolve(status=Status.SUCCEEDED, finished_at=old.created_at, attempts=1)
    store._insert_many([old])
    assert _counted(store) == _held(store)
    assert old.id in store.prune(keep=86400.0)
    template = cron.template(Kind.FUNCTION, "tick")
    store.add_schedule(cron.new_schedule("tick", template, every=60.0))
    assert store.fire_schedules(utcnow() + timedelta(minutes=2))
    assert _counted(store) == _held(store)
    assert sum(_counted(store).values()) == len(store.list(limit=None))


def test_postgresql_counts_with_many_writers_and_readers() -> None:
    """Four threads with a store object each (a connection each) create, claim and finish
    jobs while a fifth reads the stats (and so folds the counts) the whole time."""
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            with open_store(url) as store:
                for i in range(40):
                    store.create_many([{"kind": Kind.FUNCTION, "name": "w"} for _ in range(3)])
                    for task in store.claim(limit=2):
                        if i % 3:
                            task.succeed(i)
                        else:
                            task.fail("no", retry=bool(i % 2))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        try:
            with open_store(url) as store:
                while not stop.is_set():
                    store.stats()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        reader = threading.Thread(target=read)
        reader.start()
        for t in writers:
            t.start()
        for t in writers:
            t.join(120)
        stop.set()
        reader.join(60)
        assert not errors, errors
        with open_store(url) as store:
            held = _held(store)
            assert sum(held.values()) == 4 * 40 * 3
            assert _counted(store) == held
            store.prune()  # folds what is left: the counts read the same from the fold alone
            with support.connect() as conn:
                schema = support.schema_of(url)
                left = conn.execute(f'SELECT count(*) FROM "{schema}".job_count_changes')
                assert left.fetchone() == (0,)
            assert _counted(store) == held
    finally:
        support.drop_schema(url)


def _jobs_of_every_status() -> list[machine.JobState]:
    now = utcnow()
    states = [machine.new_job(kind=Kind.FUNCTION, name="p", queue="mail", now=now)]
    for status in (Status.SUCCEEDED, Status.FAILED, Status.SUCCEEDED):
        done = machine.new_job(kind=Kind.COMMAND, name="c", command=["true"], now=now)
        states.append(done.evolve(status=status, attempts=1, finished_at=now))
    return states


def _counts_version(migrations: Sequence[Sequence[object]]) -> int:
    """The schema version that brought the counts (the versions after it come again too)."""
    return next(i for i, steps in enumerate(migrations, 1) if "job_counts" in str(steps))


def test_a_sqlite_store_of_the_version_before_counts_its_jobs(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    path = tmp_path / "old.db"
    url = f"sqlite://{path}"
    with open_store(url) as store:
        store._insert_many(_jobs_of_every_status())
    conn = sqlite3.connect(path)
    with conn:  # as the version before left it: no counts
        conn.execute("DROP TABLE job_counts")
        conn.execute(f"PRAGMA user_version = {_counts_version(sq.MIGRATIONS) - 1}")
    conn.close()
    with open_store(url) as store:
        assert (
            _counted(store)
            == _held(store)
            == Counter(
                {
                    ("mail", "pending", "function"): 1,
                    ("default", "succeeded", "command"): 2,
                    ("default", "failed", "command"): 1,
                }
            )
        )
        store.claim(queues=["mail"])[0].succeed(None)
        assert _counted(store) == _held(store)


def test_a_postgresql_store_of_the_version_before_counts_its_jobs() -> None:
    url = support.make_url()
    if url is None:
        pytest.skip("no PostgreSQL server here")
    schema = support.schema_of(url)
    s = f'"{schema}"'
    try:
        with open_store(url) as store:
            store._insert_many(_jobs_of_every_status())
        with support.connect() as conn:  # as the version before left it
            conn.execute(f"DROP TABLE {s}.job_counts, {s}.job_count_changes")
            for trigger in ("jobs_counted_in", "jobs_counted_out", "jobs_counted_move"):
                conn.execute(f"DROP TRIGGER {trigger} ON {s}.jobs")
                conn.execute(f"DROP FUNCTION {s}.{trigger}()")
            counts = _counts_version(pg.migrations(schema))
            conn.execute(f"DELETE FROM {s}.schema_version WHERE version >= %s", (counts,))
        with open_store(url) as store:
            assert _counted(store) == _held(store)
            assert sum(_counted(store).values()) == 4
            store.claim(queues=["mail"])[0].succeed(None)
            assert _counted(store) == _held(store)
    finally:
        support.drop_schema(url)


def test_the_window_counts_every_finished_job_and_samples_the_times(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More jobs finished in the window than the times' sample holds: the counts by kind and
    outcome are all of them; the wait and run times are of the most recent."""
    monkeypatch.setattr(stats_module, "RECENT_MAX", 3)
    now = utcnow()
    jobs = []
    for i in range(5):
        created = now - timedelta(minutes=10 - i)
        state = machine.new_job(kind=Kind.FUNCTION, name="w", now=created)
        jobs.append(
            state.evolve(
                status=Status.FAILED if i == 0 else Status.SUCCEEDED,
                attempts=1,
                started_at=created + timedelta(seconds=i),  # waited i seconds
                finished_at=created + timedelta(seconds=i + 2),  # ran 2
            )
        )
    store._insert_many(jobs)
    stats = store.stats()
    assert stats.finished == Counter({("function", "succeeded"): 4, ("function", "failed"): 1})
    assert sorted(round(w, 3) for _, _, w, _ in stats.recent) == [2.0, 3.0, 4.0]
    assert all(round(r, 3) == 2.0 for _, _, _, r in stats.recent)
    doc = stats.to_dict()["recent"]
    assert doc["finished"] == {"failed": 1, "succeeded": 4} and doc["sampled"] == 3
