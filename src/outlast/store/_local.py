"""What the two single-machine adapters (sqlite, files) share: the folder, its permissions,
the flock worker locks and the pulse files that wake waiters. The JSON of the stored
documents is :mod:`outlast.codec`."""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from outlast import paths
from outlast.codec import decode
from outlast.errors import CorruptJob, StoreError
from outlast.model import JobState
from outlast.store import notify
from outlast.store.base import Capabilities, Store
from outlast.store.locks import WorkerLocks

log = logging.getLogger("outlast.store")

# The liveness locks this process holds: lock path -> (pid, fd). Never released: the kernel
# does that when the process dies. Keyed by pid so a forked child takes its own.
_ALIVE: dict[str, tuple[int, int]] = {}
_ALIVE_LOCK = threading.Lock()


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) 0700; warn when an existing one is open to others."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise StoreError(f"cannot create the store folder {path}: {exc}") from exc
    if mode & 0o077:
        log.warning(
            "store folder %s is readable by others (mode %o); job payloads, results and logs "
            "can hold secrets: chmod 700 it",
            path,
            mode,
        )
    return path


def decode_listing(rows: Iterable[tuple[str, bytes | str | None]]) -> list[JobState]:
    """The jobs of a listing's ``(id, document)`` rows; a corrupt one is skipped, with a
    warning, instead of failing the whole listing."""
    states = []
    for job_id, doc in rows:
        try:
            states.append(decode(job_id, doc))
        except CorruptJob as exc:
            log.warning("skipping a corrupt job in the listing: %s", exc)
    return states


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

    def pulse(self, job_id: str, claimable: bool) -> None:
        channels = [notify.job_channel(job_id)]
        if claimable:
            channels.append(notify.QUEUE)
        self.pulses.pulse(channels)

    def listen(self, job_ids: list[str] | None, queue: bool) -> notify.Listener:
        if job_ids is None:
            return self.pulses.listen(None)
        channels = {notify.job_channel(j) for j in job_ids}
        if queue:
            channels.add(notify.QUEUE)
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

    def worker_alive(self, worker: str | None) -> bool:
        if not worker:
            return False
        return self.liveness.held(paths.liveness_lock_name(worker))

    def acquire(self, job_id: str) -> Any:
        return self.locks.acquire(job_id)

    def close(self) -> None:
        self.pulses.close()


class LocalStore(Store):
    """The part of the sqlite and files adapters that is the same: worker locks, liveness
    locks, pulses and logs live in a side folder (:class:`LocalParts`) on this machine."""

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

    def _pulse(self, job_id: str, claimable: bool = False) -> None:
        self.parts.pulse(job_id, claimable)

    def listen(self, job_ids: list[str] | None = None, queue: bool = False) -> notify.Listener:
        return self.parts.listen(job_ids, queue)

    def log_path(self, job_id: str) -> Path:
        return self.parts.log_path(job_id)
