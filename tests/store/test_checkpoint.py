"""SQLite's WAL is copied into the database file by a checkpoint thread of the writing process
(``outlast.store.sqlite._Checkpointer``), not in the commits of its writers; the WAL stays
bounded, nothing is lost, and a forked child or a closed store does not inherit a dead one."""

from __future__ import annotations

import os
import select
import signal
import sqlite3
import threading
from pathlib import Path

from outlast.store import open_store
from outlast.store import sqlite as sqlite_store


def _checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "outlast-checkpoint"]


def test_a_busy_writer_leaves_the_checkpoints_to_its_thread_and_the_wal_stays_bounded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    wal = Path(f"{path}-wal")
    before = _checkpoint_threads()
    with open_store(f"sqlite://{path}") as store:
        assert store._writer().execute("PRAGMA wal_autocheckpoint").fetchone() == (  # type: ignore[attr-defined]
            sqlite_store.WAL_AUTOCHECKPOINT,
        )
        few = [store.create(command=["true"]).id for _ in range(sqlite_store.CHECKPOINT_EVERY // 2)]
        assert _checkpoint_threads() == before  # a short-lived process never starts it
        # 5,000 submits write ~150 MB of WAL frames (~8 pages each): never copied back, the
        # WAL would hold them all; the thread's checkpoints let the writers start it over
        # (bounded by WAL_AUTOCHECKPOINT's 16 MB and what comes during one checkpoint)
        ids = few + [store.create(command=["true"]).id for _ in range(5000)]
        started = [t for t in _checkpoint_threads() if t not in before]
        assert len(started) == 1 and started[0].daemon
        assert wal.stat().st_size < 64 * 2**20
        store.close()
        started[0].join(5)
        assert not started[0].is_alive()  # close() stops it
        # used again after close(): works, and starts a thread again when it needs one
        ids += [store.create(command=["true"]).id for _ in range(sqlite_store.CHECKPOINT_EVERY)]
        assert len([t for t in _checkpoint_threads() if t not in before]) == 1
    with open_store(f"sqlite://{path}") as store:
        assert len(store.get_many(ids)) == len(ids)


def test_a_bulk_insert_wakes_the_checkpoint_thread_by_the_rows_it_wrote(tmp_path: Path) -> None:
    """A commit of 1,000 new rows writes the WAL of ~100 single transitions: it counts as
    that many commits, so a ``create_many`` hands its checkpoints to the thread. (Counted as
    one commit each, 20 batches never woke it, and the writer copied 16 MB of WAL in its own
    commits: ~20% of a ``submit_many``.)"""
    before = _checkpoint_threads()
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        counted = store._checkpoints.commits  # type: ignore[attr-defined]
        few = store.create_many([{"command": ["true"]}] * 10)  # one commit of 10 rows: 2
        assert _checkpoint_threads() == before
        assert store._checkpoints.commits == counted + 2  # type: ignore[attr-defined]
        many = store.create_many([{"command": ["true"]}] * store.CREATE_BATCH)
        started = [t for t in _checkpoint_threads() if t not in before]
        assert len(started) == 1  # woken by the one commit of a batch
        assert len(store.get_many([t.id for t in few + many])) == 10 + store.CREATE_BATCH


def test_a_forked_child_checkpoints_on_a_thread_of_its_own(tmp_path: Path) -> None:
    """Forked right as the parent's thread starts a checkpoint: the fork waits for it (a
    child that inherited SQLite's mutexes mid-checkpoint would hang at its first write)."""
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        for _ in range(sqlite_store.CHECKPOINT_EVERY):
            store.create(command=["true"])
        assert _checkpoint_threads()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(read)
                for _ in range(sqlite_store.CHECKPOINT_EVERY):
                    store.create(command=["true"])
                os.write(write, str(len(_checkpoint_threads())).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        ready, _, _ = select.select([read], [], [], 60)
        if not ready:  # hung in SQLite on a mutex the parent's thread held at the fork
            os.kill(pid, signal.SIGKILL)
        said = os.read(read, 16) if ready else b"hung"
        os.close(read)
        _, status = os.waitpid(pid, 0)
        assert said == b"1"  # the parent's thread did not come along; its own started
        assert os.waitstatus_to_exitcode(status) == 0


def test_a_new_connection_waits_for_a_lock_held_while_it_sets_itself_up(tmp_path: Path) -> None:
    # a server thread's first write opened its writing connection while another connection
    # held the database's lock for a moment (the last one out checkpoints and removes the WAL
    # under an exclusive lock): the set-up's PRAGMA failed at once and "database is locked"
    # reached an HTTP client as a 500; the set-up waits now, and the writer still has no busy
    # handler of its own (see SQLiteStore._begin)
    path = tmp_path / "s.db"
    store = open_store(f"sqlite://{path}")
    job = store.create(command=["true"])
    store.close()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, other.close)
    release.start()
    try:
        writer = store._connect(0)  # type: ignore[attr-defined]
    finally:
        release.join()
    assert writer.execute("PRAGMA busy_timeout").fetchone() == (0,)
    assert writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    writer.close()
    with open_store(f"sqlite://{path}") as again:
        assert again.get(job.id).status == "pending"
