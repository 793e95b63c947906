"""The attempt journal's files (local stores): what a reader makes of them, torn or not, and
how they are kept small and removed (see outlast.store.journal)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from outlast.machine import Outcome
from outlast.store import journal, open_store, worker_name
from outlast.store.journal import NOT_STARTED, FileJournal, read_fates

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
    assert fates[("b", 1)] is None  # started: an abandoned attempt
    assert fates[("c", 3)] == Outcome("succeed", {"x": [1]})
    assert ("a", 2) not in fates  # another attempt of the same job is not this one's


def test_a_torn_or_foreign_line_is_skipped(tmp_path: Path) -> None:
    proc = _journal(tmp_path, "t+1")
    proc.started(("a", 1))
    path = tmp_path / journal.journal_name(WORKER, "t+1")
    with open(path, "ab") as f:
        f.write(b'o b 1 {not json}\nx y z\no a 1 {"verb": "succ')  # no newline: torn
    fates = read_fates(tmp_path, WORKER)
    assert fates == {("a", 1): None, ("b", 1): None}  # an unreadable outcome counts as started


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
