"""Change notification across processes for stores without a server (sqlite, files).

A writer, after it commits, writes one byte at offset 0 of a *pulse file*; a waiter watches the
pulse files it cares about with inotify and wakes on ``IN_MODIFY``. Because the pulse is written
after the commit and the waiter arms its watch before it checks the condition, a wake-up is never
lost: an event that lands between the check and the wait is already queued on the inotify fd.

Channels: ``queue`` (a job became claimable) and ``j0``..``j15`` (a job changed: its state or its
events; the shard is a hash of the id, so a waiter on one job is rarely woken by others).

Where inotify is unavailable (not Linux), waiters fall back to a short poll.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _inotify() -> Any:
    """inotify_simple's module, or None where inotify is unavailable (imported on first use:
    ctypes is too heavy for the CLI's fast path)."""
    try:
        import inotify_simple
    except (ImportError, OSError):  # pragma: no cover - not Linux
        return None
    return inotify_simple


QUEUE = "queue"
SHARDS = 16
FALLBACK_POLL = 0.02


def job_channel(job_id: str) -> str:
    return f"j{zlib.crc32(job_id.encode()) % SHARDS}"


ALL_CHANNELS = (QUEUE, *(f"j{i}" for i in range(SHARDS)))


class Pulses:
    """Both sides of the pulse files of one store, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _fd(self, channel: str) -> int:
        if self._pid != os.getpid():  # forked: our cached fds are the parent's
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(channel)
        if fd is None:
            with self._lock:
                fd = self._fds.get(channel)
                if fd is None:
                    fd = os.open(
                        self.directory / channel, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600
                    )
                    self._fds[channel] = fd
        return fd

    def pulse(self, channels: Iterable[str]) -> None:
        """Wake every waiter on ``channels``. Best effort: a failure here loses no data."""
        for channel in channels:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd(channel), b"\x01", 0)

    def listen(self, channels: Iterable[str] | None = None) -> Listener:
        """A listener on ``channels`` (all of them when None); arm it before checking."""
        chosen = tuple(channels) if channels is not None else ALL_CHANNELS
        for channel in chosen:
            self._fd(channel)  # the file must exist to be watched
        return Listener(self.directory, chosen)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


class Listener:
    """Waits for pulses on some channels. Use as a context manager; one thread at a time."""

    def __init__(self, directory: Path, channels: tuple[str, ...]) -> None:
        self._inotify: Any = None
        self._queue_wd: int | None = None
        module = _inotify()
        if module is not None:
            self._inotify = module.INotify()
            for channel in channels:
                wd = self._inotify.add_watch(str(directory / channel), module.flags.MODIFY)
                if channel == QUEUE:
                    self._queue_wd = wd

    def fileno(self) -> int | None:
        """The fd to select on (for event loops), or None when polling."""
        return self._inotify.fileno() if self._inotify is not None else None

    def drain(self) -> bool:
        """Consume the pulses that arrived, without blocking; True when one of them said a
        job became claimable (the ``queue`` channel), or when it cannot tell (polling)."""
        if self._inotify is None:
            return True
        events = self._inotify.read(timeout=0)
        return any(e.wd == self._queue_wd for e in events)

    def wait(self, timeout: float | None) -> bool:
        """Block until a pulse or ``timeout`` seconds; True when woken by a pulse.

        With inotify this returns within microseconds of a pulse; without it, after a short
        poll interval (the caller re-checks its condition either way).
        """
        if self._inotify is None:
            time.sleep(FALLBACK_POLL if timeout is None else min(timeout, FALLBACK_POLL))
            return True
        ready, _, _ = select.select([self._inotify.fileno()], [], [], timeout)
        if ready:
            self._inotify.read(timeout=0)
            return True
        return False

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
