"""What the two single-machine adapters (sqlite, files) share: the folder, its permissions,
the flock worker, liveness and maintenance locks, and the pulse files that wake waiters."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from outlast import paths
from outlast.errors import StoreError
from outlast.model import JobState
from outlast.store import notify
from outlast.store.base import Capabilities, ChangeWatch, MaintenanceLock, Store
from outlast.store.common import log, make_private_dir, worker_name
from outlast.store.journal import Fate, FileJournal, Journal, Key, journal_name, read_fates
from outlast.store.locks import WorkerLocks

#: The maintenance lock's file and the timer lock's (:mod:`outlast.run.timer`), among the
#: liveness locks.
MAINTENANCE = "@maintenance.lock"
TIMER = "@timer.lock"
#: Seconds between tries of a process waiting to become the store's maintainer.
MAINTENANCE_POLL = 0.25

# The liveness locks this process holds: lock path -> (pid, fd). Never released: the kernel
# does that when the process dies. Keyed by pid so a forked child takes its own.
_ALIVE: dict[str, tuple[int, int]] = {}
_ALIVE_LOCK = threading.Lock()


class FlockMaintenance:
    """The maintenance lock of a local store: a flock file beside the liveness locks, tried
    every :data:`MAINTENANCE_POLL` seconds (a system call, not a query) by a waiting process,
    and freed by the kernel when its holder dies."""

    def __init__(self, locks: WorkerLocks, name: str = MAINTENANCE) -> None:
        self._locks, self._name = locks, name
        self._fd: int | None = None
        self._stop = threading.Event()

    def try_acquire(self) -> bool:
        if self._fd is None:
            self._fd = self._locks.try_acquire(self._name)
        return self._fd is not None

    def acquire(self) -> bool:
        while not self._stop.is_set():
            if self.try_acquire():
                return True
            self._stop.wait(MAINTENANCE_POLL)
        return False

    def held(self) -> bool:
        return self._fd is not None

    def interrupt(self) -> None:
        self._stop.set()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the file stays: the next maintainer locks the same one


class LocalParts:
    """The side folder of a local store: ``locks/``, ``pulse/`` and ``logs/``."""

    def __init__(
        self, root: Path, lock_dir: Path | None = None, lock_suffix: str = ".lock"
    ) -> None:
        self.root = make_private_dir(root)
        self.locks = WorkerLocks(make_private_dir(lock_dir or root / "locks"), lock_suffix)
        self.liveness = WorkerLocks(make_private_dir(root / "locks"), suffix="")
        self.pulses = notify.Pulses(make_private_dir(root / "pulse"))
        self.logs = make_private_dir(root / "logs")
        self.journals = make_private_dir(root / "journal")
        self._fates: dict[str, tuple[object, dict[Key, Fate]]] = {}

    def pulse(self, job_id: str, claimable: bool, interrupt: bool = False) -> None:
        self.pulse_many({job_id: claimable}, [job_id] if interrupt else ())

    def pulse_pools(self) -> None:
        """A new job: wake idle pools (and the listeners of every job)."""
        self.pulse_many({}, pools=True)

    def pulse_many(
        self, wakes: dict[str, bool], interrupts: Collection[str] = (), pools: bool = False
    ) -> None:
        """Wake the waiters of several jobs (each channel once), idle pools if any of them
        became claimable (or ``pools``: a new job, whose channel nobody waits on yet), and
        the workers of running jobs if any of them was interrupted (``interrupts``: canceled
        or deleted)."""
        channels = {notify.job_channel(job_id) for job_id in wakes}
        if pools or any(wakes.values()):
            channels.add(notify.QUEUE)
        if interrupts:
            channels.add(notify.INTERRUPT)
        self.pulses.pulse(sorted(channels))

    def listen(
        self, job_ids: list[str] | None, queue: bool, interrupts: bool = False
    ) -> notify.Listener:
        if job_ids is None:
            return self.pulses.listen(None)
        channels = {notify.job_channel(j) for j in job_ids}
        if queue:
            channels.add(notify.QUEUE)
        if interrupts:
            channels.add(notify.INTERRUPT)
        return self.pulses.listen(sorted(channels))

    def log_path(self, job_id: str) -> Path:
        return self.logs / f"{job_id}.log"

    def forget(self, job_id: str) -> None:
        """Remove what a deleted job left on disk beside the store."""
        self.locks.remove(job_id)
        base = self.log_path(job_id)
        # the log, its rotated half, and the run context of a command (cwd and environment)
        for path in (base, Path(f"{base}.1"), base.with_suffix(".ctx")):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove %s of job %s: %s", path.name, job_id, exc)

    def hold_liveness(self, worker: str) -> bool:
        """Hold this process's liveness lock for ``worker`` (once per process); True when it
        was taken just now, so the caller can reconcile jobs of a dead namesake."""
        pid = os.getpid()
        key = str(self.liveness.path(paths.liveness_lock_name(worker)))
        with _ALIVE_LOCK:  # one lock per process and store folder, however many Store objects
            held = _ALIVE.get(key)
            if held is not None and held[0] == pid:
                return False
            _ALIVE[key] = (pid, self.liveness.acquire(paths.liveness_lock_name(worker)))
            return True

    def liveness_fd(self, worker: str) -> int:
        self.hold_liveness(worker)
        with _ALIVE_LOCK:
            return _ALIVE[str(self.liveness.path(paths.liveness_lock_name(worker)))][1]

    def worker_alive(self, worker: str | None) -> bool:
        if not worker:
            return False
        return self.liveness.held(paths.liveness_lock_name(worker))

    def sweep_stale(self, job_locks: bool = False) -> int:
        """Remove the lock files whose holder is gone; returns how many. Every process that
        works on a job holds a liveness lock (pools, supervisors, dedicated workers) and never
        releases it, so a free one is how a dead worker shows on a local store: finding none
        means nobody died since the last sweep, at the cost of listing the liveness folder and
        a non-blocking flock per live process, without a query. ``job_locks``: also remove the
        per-job worker locks finished supervisors leave behind (the files store keeps them
        among its documents, so that folder is listed only then)."""
        removed = 0
        if job_locks:
            suffix = self.locks.suffix
            with os.scandir(self.locks.directory) as entries:
                names = [
                    e.name[: len(e.name) - len(suffix)]
                    for e in entries
                    if e.name.endswith(suffix) and not e.name.startswith("@")
                ]
            for job_id in names:
                removed += self.locks.remove_if_free(job_id)
        with os.scandir(self.liveness.directory) as entries:
            alive = [
                e.name
                for e in entries
                if e.name.startswith("@") and e.name not in (MAINTENANCE, TIMER)
            ]
        for name in alive:
            removed += self.liveness.remove_if_free(name)
        return removed

    def fate(self, state: JobState) -> Fate:
        """What the journal of the job's (dead) worker says of its current attempt. The
        journals of one worker are read once while they do not change (a dead pool's jobs
        are reconciled one by one)."""
        if not state.worker:
            return None
        prefix = paths.worker_file_name(state.worker) + "+"
        try:
            with os.scandir(self.journals) as entries:
                seen = sorted(
                    (e.name, e.stat().st_size, e.stat().st_mtime_ns)
                    for e in entries
                    if e.name.startswith(prefix)
                )
        except OSError as exc:
            raise StoreError(f"cannot read the attempt journals of {state.worker}: {exc}") from exc
        if not seen:
            return None
        cached = self._fates.get(state.worker)
        if cached is None or cached[0] != seen:
            cached = (seen, read_fates(self.journals, state.worker))
            self._fates = {state.worker: cached}  # one worker at a time is enough
        return cached[1].get((state.id, state.attempts))

    def dead_journals(self) -> list[tuple[str, str]]:
        """``(file name, worker)`` of the journals whose worker is dead: taken *before* the
        jobs are listed for :meth:`sweep_journals`, so that every job such a worker claimed
        (before it died) is in that listing."""
        with os.scandir(self.journals) as entries:
            names = [e.name for e in entries]
        found = []
        for name in names:
            worker = name.partition("+")[0]
            if not self.liveness.held(f"@{worker}.lock"):
                found.append((name, worker))
        return found

    def sweep_journals(self, dead: list[tuple[str, str]], live_workers: set[str]) -> None:
        """Remove the journals of dead workers none of whose jobs is left to reconcile."""
        keep = {paths.worker_file_name(w) for w in live_workers}
        for name, worker in dead:
            if worker not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.journals / name)

    def acquire(self, job_id: str) -> Any:
        return self.locks.acquire(job_id)

    def close(self) -> None:
        self.pulses.close()


class LocalStore(Store):
    """The part of the sqlite and files adapters that is the same: worker locks, liveness
    locks, the maintenance lock, pulses and logs live in a side folder (:class:`LocalParts`)
    on this machine."""

    capabilities = Capabilities(pushes_notifications=True, spans_hosts=False)
    parts: LocalParts

    def _lock_acquire(self, job_id: str) -> Any:
        return self.parts.acquire(job_id)

    def _lock_held(self, job_id: str) -> bool:
        return self.parts.locks.held(job_id)

    def _lock_release(self, job_id: str, handle: Any) -> None:
        self.parts.locks.release(job_id, handle)

    def _hold_liveness(self, worker: str) -> bool:
        return self.parts.hold_liveness(worker)

    def _worker_alive(self, worker: str | None) -> bool:
        return self.parts.worker_alive(worker)

    def listen(
        self, job_ids: list[str] | None = None, queue: bool = False, interrupts: bool = False
    ) -> notify.Listener:
        return self.parts.listen(job_ids, queue, interrupts)

    def listen_key(self, job_id: str) -> str:
        return notify.job_channel(job_id)  # the pulse file of its shard

    def log_path(self, job_id: str) -> Path:
        return self.parts.log_path(job_id)

    def maintenance_lock(self) -> MaintenanceLock:
        return FlockMaintenance(self.parts.liveness)

    def timer_lock(self) -> MaintenanceLock:
        return FlockMaintenance(self.parts.liveness, TIMER)

    def timer_running(self) -> bool:
        return self.parts.liveness.held(TIMER)

    def journal(self, worker: str, label: str) -> Journal:
        return FileJournal(self.parts.journals / journal_name(worker, label))

    def _fate(self, state: JobState) -> Fate:
        return self.parts.fate(state)

    def liveness_fd(self) -> int | None:
        self._live()
        return self.parts.liveness_fd(worker_name())

    def abandoned_jobs(self, thorough: bool = False) -> list[JobState]:
        """Only when a lock file was left by a dead holder (or ``thorough``): the live jobs
        whose worker is gone. The stale files are removed first: a missing lock is a free
        one, so nothing is missed."""
        try:
            stale = self.parts.sweep_stale(job_locks=thorough)
        except OSError as exc:
            raise StoreError(f"cannot look at the store's locks: {exc}") from exc
        if not stale and not thorough:
            return []
        dead: list[tuple[str, str]] = []
        if thorough:  # what the previous sweeps reconciled no longer needs its journal
            try:
                dead = self.parts.dead_journals()
            except OSError as exc:
                log.warning("cannot look at the attempt journals: %s", exc)
        live = self._live_jobs()
        if dead:
            try:
                self.parts.sweep_journals(dead, {s.worker for s in live if s.worker})
            except OSError as exc:
                log.warning("cannot sweep the attempt journals: %s", exc)
        return [s for s in live if self.abandoned(s)]


class StatWatch(ChangeWatch):
    """A :class:`~outlast.store.base.ChangeWatch` over files: changed when the inode, size
    or modification time of one of them changed, or one was modified too recently to tell
    (a later write in the same tick of the kernel's clock leaves the same time, "racy git":
    100 ms is many ticks on the filesystems a local store needs, ext4, xfs, btrfs, tmpfs;
    the maintainer's thorough sweep, once a minute, is the net under it)."""

    RACY_NS = 100_000_000

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._seen: tuple[tuple[int, int, int], ...] | None = None

    def changed(self) -> bool:
        keys = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                keys.append((0, 0, 0))
                continue
            keys.append((st.st_ino, st.st_size, st.st_mtime_ns))
        seen, self._seen = self._seen, tuple(keys)
        racy = any(key[2] > time.time_ns() - self.RACY_NS for key in keys)
        return seen != self._seen or racy
