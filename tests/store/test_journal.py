"""The attempt journal's files (local stores): what a reader makes of them, torn or not, and
how they are kept small and removed (see outlast.store.journal)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from outlast.machine import Outcome
from outlast.run.api import create_job
from outlast.run.execute import run_attempt
from outlast.store import journal, open_store, worker_name
from outlast.store.journal import NOT_STARTED, STARTED, FileJournal, read_fates
from tests.pool import jobs_for_tests  # registers pt.noop and pt.record
from tests.waiting import until

WORKER = "host.example:12"


def _journal(folder: Path, label: str, worker: str = WORKER) -> FileJournal:
    return FileJournal(folder / journal.journal_name(worker, label))


def test_each_attempt_reads_back_as_its_furthest_record(tmp_path: Path) -> None:
    pool, proc = _journal(tmp_path, "t+pool"), _journal(tmp_path, "t+99")
    pool.claimed([("a", 1), ("b", 1), ("c", 3)])
    proc.started(("b", 1))
    proc.started(("c", 3))
    proc.returned(("c", 3), Outcome("succeed", {"x": [1]}))
    fates = read_fates(tmp_path, WORKER)
    assert fates[("a", 1)] == NOT_STARTED
    assert fates[("b", 1)] == STARTED  # started, never returned: an abandoned attempt
    assert fates[("c", 3)] == Outcome("succeed", {"x": [1]})
    assert ("a", 2) not in fates  # another attempt of the same job is not this one's


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    proc = _journal(tmp_path, "t+1")
    proc.started(("a", 1))
    path = tmp_path / journal.journal_name(WORKER, "t+1")
    with open(path, "ab") as f:
        f.write(b'o b 1 {not json}\nx y z\no a 1 {"verb": "succ')  # no newline: torn
    fates = read_fates(tmp_path, WORKER)
    # a's outcome is torn: it started; b's outcome is unreadable: nothing known (as started)
    assert fates == {("a", 1): STARTED, ("b", 1): None}


def test_workers_whose_names_share_a_prefix_do_not_mix(tmp_path: Path) -> None:
    _journal(tmp_path, "t+pool", "h:1").claimed([("a", 1)])
    _journal(tmp_path, "t+pool", "h:12").claimed([("b", 1)])
    assert set(read_fates(tmp_path, "h:1")) == {("a", 1)}
    assert set(read_fates(tmp_path, "h:12")) == {("b", 1)}


def test_the_file_is_compacted_to_what_is_not_written_yet(tmp_path: Path) -> None:
    proc = _journal(tmp_path, "t+1")
    path = tmp_path / journal.journal_name(WORKER, "t+1")
    big = "x" * 1000
    proc.started(("keep", 1))
    proc.returned(("keep", 1), Outcome("succeed", "kept"))  # never acknowledged
    for n in range(500):
        proc.started(("j", n))
        proc.returned(("j", n), Outcome("succeed", big))
        proc.written([("j", n)])
    assert path.stat().st_size <= journal.LIMIT + 2000
    fates = read_fates(tmp_path, WORKER)
    assert fates[("keep", 1)] == Outcome("succeed", "kept")
    assert ("j", 0) not in fates  # written long ago: compacted away
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_journal_that_cannot_be_written_warns_once_and_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = _journal(tmp_path / "gone", "t+1")
    with caplog.at_level(logging.WARNING):
        proc.started(("a", 1))
        proc.returned(("a", 1), Outcome("succeed"))
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "cannot write the attempt journal" in caplog.records[0].message


def test_a_dead_workers_journal_goes_once_its_jobs_are_reconciled(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    store = open_store(f"sqlite://{tmp_path}/s.db")
    try:
        folder = tmp_path / "s.db.d" / "journal"
        dead = store.journal("elsewhere:4242", "t+pool")
        dead.claimed([("a", 1)])
        alive = store.journal(worker_name(), "t+pool")
        store.create(name="x")
        store.claim()  # this process becomes a live worker of the store
        alive.claimed([("b", 1)])
        assert len(list(folder.iterdir())) == 2
        store.abandoned_jobs(thorough=True)
        assert [p.name for p in folder.iterdir()] == [journal.journal_name(worker_name(), "t+pool")]
        alive.discard()
        assert not list(folder.iterdir())
    finally:
        store.close()


class _Witness(journal.Journal):
    """Looks, from another handle on the store, at each attempt the claim journals."""

    def __init__(self, url: str) -> None:
        self.other = open_store(url)
        self.seen: list[tuple[str, int, str]] = []

    def claimed(self, keys: Sequence[journal.Key]) -> None:
        for job_id, attempt in keys:
            self.seen.append((job_id, attempt, self.other.get(job_id).status))


def test_a_claim_journals_each_attempt_before_it_is_claimed(store_url: str) -> None:
    """A pool killed between its claim and the journal would burn the claimed attempts: the
    store journals each one before the write that claims it (pending still, seen from
    outside), on every store."""
    store = open_store(store_url)
    ids = [create_job(store, "pt.noop", [], {}).id for _ in range(3)]
    witness = _Witness(store_url)
    try:
        tasks = store.claim(limit=3, journal=witness)
        assert sorted(t.id for t in tasks) == sorted(ids)
        assert sorted(witness.seen) == sorted((t.id, t.attempt, "pending") for t in tasks)
    finally:
        witness.other.close()
        store.close()


_RUNNER = """
import sys, time
from outlast.store import open_store
store = open_store(sys.argv[1])
journal = store.journal("pool", "t+1")  # kept: its connection holds the job on PostgreSQL
journal.started((sys.argv[2], int(sys.argv[3])))
print("started", flush=True)
time.sleep(60)
"""

_POOL = """
import os, subprocess, sys
from outlast.store import open_store
store = open_store(sys.argv[1])
[task] = store.claim()
alive = store.liveness_fd()
runner = subprocess.Popen(
    [sys.executable, "-c", sys.argv[2], sys.argv[1], task.id, str(task.attempt)],
    pass_fds=[] if alive is None else [alive], stdout=subprocess.PIPE, text=True,
    stderr=subprocess.DEVNULL,
)
assert runner.stdout.readline() == "started\\n"
print(runner.pid, flush=True)
os._exit(0)
"""


@pytest.mark.timeout(60)
def test_a_claimed_job_lives_while_the_process_running_it_lives(store_url: str) -> None:
    """A pool killed while its job process still runs (the process dies a moment later, by
    its parent-death signal) must not have its job reconciled in that moment, before the
    process journals the outcome: the job lives as long as either does (the liveness lock
    inherited on the local stores, the job process's own advisory lock on PostgreSQL)."""
    store = open_store(store_url)
    try:
        job = create_job(store, "pt.noop", [], {})
        pool = subprocess.run(
            [sys.executable, "-c", _POOL, store_url, _RUNNER],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        runner = int(pool.stdout)
        try:
            state = store.get(job.id)
            assert state.status == "running"
            assert not store.abandoned(state), "the pool is gone, but its job process lives"
        finally:
            os.kill(runner, signal.SIGKILL)
        until(lambda: store.abandoned(store.get(job.id)), 10, "the job to be abandoned")
    finally:
        store.close()


def test_a_start_that_cannot_be_journaled_is_not_made(tmp_path: Path) -> None:
    """A start record that cannot be written (a full disk, a folder gone) says so, and the
    attempt is given back instead of run (see ``run_attempt``'s ``on_start``)."""
    gone = FileJournal(tmp_path / "no-such-folder" / "j")
    assert gone.started(("a", 1)) is False
    assert _journal(tmp_path, "t+1").started(("a", 1)) is True


_CLAIM_AND_DIE = """
import os, sys
from outlast.store import open_store, worker_name
store = open_store(sys.argv[1])
store.claim(limit=1, journal=store.journal(worker_name(), "t+pool"))
os._exit(0)
"""


def test_a_sweep_keeps_the_journal_of_a_worker_that_died_while_it_listed_jobs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A maintainer's thorough sweep forgets the journals of dead workers with no live job.
    A worker that claims, then dies, while the sweep lists the jobs is not in that list: its
    journal must stay (its claim is not started, and reconciling gives the attempt back)."""
    if store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL forgets only the records of finished jobs")
    store = open_store(store_url)
    try:
        job = create_job(store, "pt.noop", [], {})
        listing = store._live_jobs  # type: ignore[attr-defined]

        def listed_then_claimed() -> list[Any]:
            live = listing()
            subprocess.run([sys.executable, "-c", _CLAIM_AND_DIE, store_url], check=True)
            return live  # type: ignore[no-any-return]

        monkeypatch.setattr(store, "_live_jobs", listed_then_claimed)
        store.abandoned_jobs(thorough=True)
        monkeypatch.undo()
        state = store.get(job.id)
        assert state.status == "running" and store.abandoned(state)
        back = store.reconcile(state)
        assert back.status == "pending", back  # given back, not failed over
        assert (back.attempts, back.max_attempts) == (state.attempts, state.max_attempts + 1)
    finally:
        store.close()


def test_nothing_but_the_call_comes_between_the_start_record_and_the_function(
    tmp_path: Path,
) -> None:
    """A pool's job process journals the start in ``on_start`` and dies with its pool from
    then on: an attempt killed before its function's first line is counted but never run, so
    no Python code of outlast's may run in that moment (its arguments are thawed before, its
    trace span opened before). The first function entered after ``on_start`` returns is the
    job's own; and an ``on_start`` that says no gives the attempt back, uncalled."""
    store = open_store(f"sqlite://{tmp_path}/s.db")
    try:
        out = tmp_path / "out"
        job = create_job(store, "pt.record", [str(out)], {"sleep": 0.0})
        [task] = store.claim(limit=1)
        entered: list[str] = []

        def watch(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                entered.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
                sys.setprofile(None)  # the first one is all this asks

        def on_start() -> bool:
            sys.setprofile(watch)  # from here on, every Python function entered
            return True

        assert task.attempt is not None
        outcome = run_attempt(store, job.id, task.attempt, None, on_start)
        sys.setprofile(None)
        assert outcome.verb == "succeed", outcome
        assert entered == [f"{jobs_for_tests.__file__}:record"]
        assert out.read_text().splitlines() == [job.id]
        task.release_worker_lock()

        again = create_job(store, "pt.record", [str(out)], {})
        [task] = store.claim(limit=1)
        assert task.id == again.id and task.attempt is not None
        refused = run_attempt(store, again.id, task.attempt, None, lambda: False)
        assert refused.verb == "release"
        assert out.read_text().splitlines() == [job.id]  # not called
        task.release_worker_lock()
    finally:
        store.close()
