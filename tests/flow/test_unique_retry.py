"""Unique jobs (one live job per key, enforced by the store across processes) and retry of
finished jobs (a new job linked by ``retry_of``; bulk, batched), on every store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from outlast.errors import DuplicateJob, InvalidInput, InvalidTransition
from outlast.model import Call, Kind, Status
from outlast.store import Store
from tests.pool.conftest import Harness
from tests.store import procs


def test_a_live_job_holds_its_unique_key(store: Store) -> None:
    first = store.create(kind="function", name="export", unique_key="export:42")
    again = store.create(kind="function", name="export", unique_key="export:42")
    assert again.id == first.id and again.existing and not first.existing
    with pytest.raises(DuplicateJob, match="export:42") as caught:
        store.create(kind="function", name="export", unique_key="export:42", on_conflict="raise")
    assert caught.value.existing == first.id
    other = store.create(kind="function", name="export", unique_key="export:43")
    assert other.id != first.id
    assert len(store.list()) == 2
    first.start()  # running and paused still hold it
    assert store.create(kind="function", name="x", unique_key="export:42").id == first.id
    first.succeed()  # finished: the key is free again
    fresh = store.create(kind="function", name="export", unique_key="export:42")
    assert fresh.id != first.id and not fresh.existing
    assert store.get(fresh.id).unique_key == "export:42"


@pytest.mark.parametrize("bad", ["", "   ", "k" * 501, 5])
def test_a_bad_unique_key_is_refused_and_nothing_is_stored(store: Store, bad: object) -> None:
    with pytest.raises(InvalidInput, match="unique key"):
        store.create(kind="function", name="x", unique_key=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="on_conflict"):
        store.create(kind="function", name="x", unique_key="k", on_conflict="ignore")
    assert store.list() == []


def test_eight_processes_submitting_one_key_make_one_live_job(store: Store, store_url: str) -> None:
    barrier = procs.CTX.Barrier(8)
    children = [procs.Child(procs.submit_unique, store_url, "one", 100, barrier) for _ in range(8)]
    got: list[str] = []
    try:
        for child in children:
            child.expect("ready")
        for child in children:
            got += child.recv(120)
            child.join()
    finally:
        for child in children:
            child.close()
    assert len(got) == 800 and len(set(got)) == 1
    [job] = store.list(limit=None)
    assert job.id == got[0] and job.unique_key == "one"
    task = store.open(job.id)
    task.start()
    task.fail(RuntimeError("done"), retry=False)
    assert store.create(kind="function", name="u", unique_key="one").id != job.id


def test_retry_makes_a_new_linked_job_and_keeps_the_old_one(store: Store) -> None:
    call = Call("mod", [1, {"a": 2}], {"k": "v"})
    failed = store.create(
        kind="function",
        name="f",
        call=call,
        labels={"team": "t"},
        queue="q1",
        max_attempts=2,
        timeout=30,
        priority=4,
        keep=60,
        payload={"p": 1},
    )
    failed.start()
    failed.fail(RuntimeError("boom"), retry=False)
    before = store.get(failed.id)
    new = failed.retry()
    state = store.get(new.id)
    assert state.status == Status.PENDING and state.retry_of == failed.id and state.attempts == 0
    assert (state.kind, state.name, state.call, state.labels, state.queue) == (
        Kind.FUNCTION,
        "f",
        call,
        {"team": "t"},
        "q1",
    )
    assert (state.max_attempts, state.timeout, state.priority, state.keep) == (2, 30.0, 4, 60.0)
    assert state.payload == {"p": 1} and state.error is None and state.result is None
    assert store.get(failed.id) == before  # the finished job stays as it was
    assert store.retries_of(failed.id) == [new.id]
    canceled = store.create(command=["true"])
    canceled.cancel()
    succeeded = store.create(command=["true"])
    succeeded.start()
    succeeded.succeed()
    made = store.retry([canceled.id, succeeded.id])
    assert [m.retry_of for m in made] == [canceled.id, succeeded.id]
    live = store.create(command=["true"])
    with pytest.raises(InvalidTransition, match="only a finished job can be retried"):
        store.retry([succeeded.id, live.id])  # nothing written: checked first
    assert store.retries_of(succeeded.id) == [made[1].id]


def test_bulk_retry_of_a_thousand_failed_jobs_is_batched(store: Store) -> None:
    ids = []
    for i in range(1000):
        task = store.create(kind="function", name=f"f{i % 7}", labels={"batch": "b"})
        ids.append(task.id)
    store.apply_many([(i, _failed) for i in ids])
    began = time.perf_counter()
    made = store.retry(ids)
    took = time.perf_counter() - began
    assert len(made) == 1000 and {m.retry_of for m in made} == set(ids)
    assert len(store.list(status="pending", limit=None)) == 1000
    print(f"bulk retry of 1,000 failed jobs: {took:.2f} s on {store.url.split(':')[0]}")


def _failed(state):  # type: ignore[no-untyped-def]
    from outlast.machine import Change
    from outlast.model import ErrorInfo, utcnow

    now = utcnow()
    error = ErrorInfo("error", "boom")
    return Change(state.evolve(status=Status.FAILED, error=error, finished_at=now, updated_at=now))


@pytest.mark.timeout(90)
def test_retry_and_bulk_actions_from_the_cli(pool: Harness) -> None:
    bad = pool.cli("run", "--label", "k=v", "--", "sh", "-c", "echo $OUTLAST_JOB_ID; exit 3")
    job = bad.stdout.strip()
    pool.wait_for(job, {Status.FAILED}, 30)
    again = pool.cli("retry", job)
    assert again.returncode == 0, again
    new = again.stdout.strip()
    state = pool.wait_for(new, {Status.FAILED}, 30)  # its supervisor ran it
    assert state.retry_of == job and pool.cli("logs", new).stdout.strip() == new
    shown = pool.cli("status", job).stdout
    assert f"retried as: {new}" in shown
    assert f"retry of: {job}" in pool.cli("status", new).stdout
    live = pool.cli("run", "--in", "1h", "--", "true").stdout.strip()
    refused = pool.cli("retry", live)
    assert refused.returncode == 2 and "only a finished job" in refused.stderr
    unconfirmed = pool.cli("retry", "--status", "failed")
    assert unconfirmed.returncode == 2 and "2 job(s) match: pass --yes" in unconfirmed.stderr
    dry = pool.cli("retry", "--label", "k=v", "--dry-run")
    assert dry.stdout.strip().endswith("would retry 2 job(s)")
    assert len(pool.all()) == 3  # nothing made by a refusal or a dry run
    done = pool.cli("retry", "--status", "failed", "--yes", "--json")
    assert done.returncode == 0, done
    retried = json.loads(done.stdout)["jobs"]
    assert len(retried) == 2
    for doc in retried:  # their supervisors run them (exit 3): none is pending any more
        pool.wait_for(doc["id"], {Status.FAILED}, 30)
    canceled = pool.cli("cancel", "--status", "pending", "--yes")
    assert canceled.returncode == 0 and f"{live} canceled" in canceled.stdout
    nothing = pool.cli("rm")
    assert nothing.returncode == 2 and "give job ids" in nothing.stderr
    removed = pool.cli("rm", "--status", "canceled", "--yes")
    assert removed.stdout.strip() == f"{live} removed"


@pytest.mark.timeout(60)
def test_unique_from_the_cli(pool: Harness) -> None:
    first = pool.cli("run", "--unique", "nightly", "--in", "1h", "--", "true").stdout.strip()
    again = pool.cli("run", "--unique", "nightly", "--", "true")
    assert again.stdout.strip() == first
    raised = pool.cli("run", "--unique", "nightly", "--on-conflict", "raise", "--", "true")
    assert raised.returncode == 2 and "holds the unique key 'nightly'" in raised.stderr
    empty = pool.cli("run", "--unique", "", "--", "true")
    assert empty.returncode == 2 and "unique key" in empty.stderr
    assert [s.id for s in pool.all()] == [first]
    sub = pool.cli("submit", "pt.noop", "--import", "tests.pool.jobs_for_tests", "--unique", "u1")
    again = pool.cli("submit", "pt.noop", "--import", "tests.pool.jobs_for_tests", "--unique", "u1")
    assert sub.stdout == again.stdout and len(pool.all()) == 2


@pytest.mark.timeout(60)
def test_a_job_submitted_in_a_postgresql_transaction_exists_only_if_it_commits(
    tmp_path: Path,
) -> None:
    import psycopg

    from outlast.run.api import create_job
    from tests.pg.support import make_url

    url = make_url(tmp_path)
    if url is None:
        pytest.skip("no PostgreSQL here")
    pool = Harness(tmp_path, url)
    try:
        pool.worker()
        with psycopg.connect(url.partition("?")[0]) as conn:
            with pytest.raises(RuntimeError), conn.transaction():
                conn.execute("SELECT 1")
                create_job(pool.store, "pt.noop", ["rolled back"], connection=conn)
                raise RuntimeError("the caller's transaction fails")
            assert pool.all() == []  # rolled back: no job
            with conn.transaction():
                task = create_job(pool.store, "pt.noop", ["committed"], connection=conn)
                assert pool.all() == []  # not visible before the commit
            state = pool.wait_for(task.id, {Status.SUCCEEDED}, 30)  # a pool claimed it
            assert state.result == "committed"
            with conn.transaction():
                a = create_job(pool.store, "pt.noop", [1], unique_key="tx", connection=conn)
                b = create_job(pool.store, "pt.noop", [2], unique_key="tx", connection=conn)
            assert b.id == a.id and b.existing
        with pytest.raises(InvalidInput, match="psycopg"):
            create_job(pool.store, "pt.noop", [], connection=object())
    finally:
        pool.close()


def test_connection_is_for_postgresql_only(tmp_path: Path) -> None:
    from outlast.store import open_store

    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        with pytest.raises(InvalidInput, match="postgresql:// store"):
            store.create(kind="function", name="x", connection=object())
        assert store.list() == []
