"""Worker locks as flock files: the kernel releases them when their holder dies.

A lock file is ``<dir>/<id>.lock``. Acquiring opens it with ``O_CLOEXEC`` (so a command the
worker starts never inherits it) and takes ``LOCK_EX | LOCK_NB``. After the flock succeeds the
inode is compared with the path's, because a releaser may have unlinked the file between our
open and our flock; a lock on an unlinked inode protects nothing.

Probing (``held``) never creates a file: a missing lock file is a free lock. A probe takes the
lock for a few microseconds when it is free, so an acquirer retries briefly before it concludes
that a live holder exists.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from outlast.errors import StoreError, WorkerLockHeld

_RETRY_FOR = 0.2


class WorkerLocks:
    """The worker locks of one store, as files in ``directory``."""

    def __init__(self, directory: Path, suffix: str = ".lock") -> None:
        self.directory = directory
        self.suffix = suffix

    def path(self, name: str) -> Path:
        return self.directory / f"{name}{self.suffix}"

    def try_acquire(self, job_id: str) -> int | None:
        """The fd holding the lock, or None if another open file description holds it."""
        path = self.path(job_id)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise StoreError(f"cannot open worker lock {path}: {exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)  # unlinked under us: take the lock on the file that is there now
        raise StoreError(f"worker lock {path} keeps being replaced")

    def acquire(self, job_id: str) -> int:
        """Take the lock or raise :class:`WorkerLockHeld` (after riding out brief probes)."""
        deadline = time.monotonic() + _RETRY_FOR
        while True:
            fd = self.try_acquire(job_id)
            if fd is not None:
                return fd
            if time.monotonic() >= deadline:
                raise WorkerLockHeld(f"job {job_id} already has a live worker")
            time.sleep(0.005)

    def held(self, job_id: str) -> bool:
        """True while some live process holds the lock."""
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot probe worker lock of {job_id}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError as exc:  # pragma: no cover - e.g. a filesystem without flock
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return True
            raise StoreError(f"cannot probe worker lock of {job_id}: {exc}") from exc
        finally:
            os.close(fd)
        return False

    def release(self, job_id: str, fd: int) -> None:
        """Drop a lock after the job's outcome is written (pools reuse their process)."""
        try:
            if os.fstat(fd).st_ino == os.stat(self.path(job_id)).st_ino:
                os.unlink(self.path(job_id))
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def remove_if_free(self, name: str) -> bool:
        """Remove the lock file if nobody holds it (taking it first, so that a process about
        to lock it finds it replaced and locks a new one); True when removed."""
        try:
            fd = self.try_acquire(name)
        except StoreError:
            return False
        if fd is None:
            return False
        self.release(name, fd)
        return True

    def remove(self, job_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(job_id))
