"""Change notification across processes for stores without a server (sqlite, files).

A writer, after it commits, writes one byte at offset 0 of a *pulse file*; a waiter watches the
pulse files it cares about with inotify and wakes on ``IN_MODIFY``. Because the pulse is written
after the commit and the waiter arms its watch before it checks the condition, a wake-up is never
lost: an event that lands between the check and the wait is already queued on the inotify fd.

Channels: ``queue`` (a job became claimable), ``j0``..``j15`` (a job changed: its state or its
events; the shard is a hash of the id, so a waiter on one job is rarely woken by others) and
``interrupt`` (a running job was canceled or deleted: its worker must act). Pools listen to
``queue`` and ``interrupt`` only, so the claims and outcomes they write themselves, and other
pools' jobs, never wake them.

One inotify instance per process and store folder serves all its listeners (see
:class:`_Watcher`). Where inotify is unavailable (not Linux, or its per-user limits are
reached), waiters fall back to a short poll, and a warning says so once.
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

from outlast.store.common import log


def inotify() -> Any:
    """inotify_simple's module, or None where inotify is unavailable (imported on first use:
    ctypes is too heavy for the CLI's fast path)."""
    try:
        import ctypes

        import inotify_simple
    except (ImportError, OSError):  # pragma: no cover - not Linux
        return None
    if getattr(inotify_simple, "_libc", None) is None:
        # inotify_simple finds libc with ctypes.util.find_library("c"), which runs
        # `ldconfig -p` in a subprocess: about 200 ms of every process's first listener (a
        # CLI `wait`, a pool's start). The process's own symbols hold libc's inotify calls.
        with contextlib.suppress(OSError, AttributeError):
            inotify_simple._libc = ctypes.CDLL(None, use_errno=True)
    return inotify_simple


QUEUE = "queue"
INTERRUPT = "interrupt"
SHARDS = 16
FALLBACK_POLL = 0.02


def job_channel(job_id: str) -> str:
    return f"j{zlib.crc32(job_id.encode()) % SHARDS}"


#: What a listener of every job hears: the queue and every job shard.
ALL_CHANNELS = (QUEUE, *(f"j{i}" for i in range(SHARDS)))
#: Every pulse file of a store.
CHANNELS = (*ALL_CHANNELS, INTERRUPT)


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
        for channel in CHANNELS:
            self._fd(channel)  # every file must exist to be watched (by one watcher, for all)
        return Listener(self.directory, chosen)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


class _Watcher:
    """The one inotify instance of this process for one pulse folder, shared by all its
    listeners: a thread reads it and wakes the listeners of the channels that changed, each
    through an eventfd of its own. So a process never needs more than one inotify instance
    per store (the per-user limit is small: 128 by default) and a store never more than its
    18 watches, however many waiters it has (a server streaming to a thousand clients).

    A channel is watched while some listener wants it: a process that waits on the queue
    alone (an idle pool) is not woken by every job's change."""

    def __init__(self, directory: Path, module: Any) -> None:
        self.inotify = module.INotify()
        self.directory, self.mask = directory, module.flags.MODIFY
        self.channels: dict[int, str] = {}  # watch descriptor -> channel
        self.wds: dict[str, int] = {}
        self.lock = threading.Lock()
        self.listeners: dict[str, set[Listener]] = {channel: set() for channel in CHANNELS}
        threading.Thread(target=self._run, name="outlast-pulses", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                events = self.inotify.read()
            except OSError:  # pragma: no cover - the instance went away
                return
            with self.lock:  # a listener closes under the same lock: never a stale fd
                fired = {self.channels.get(e.wd) for e in events}
                for channel in fired:
                    for listener in self.listeners.get(channel or "", ()):
                        listener._wake(channel)

    def add(self, listener: Listener, channels: Iterable[str]) -> None:
        """``listener`` wants ``channels`` too: watched before this returns (armed)."""
        with self.lock:
            for channel in channels:
                if not self.listeners[channel] and channel not in self.wds:
                    wd = self.inotify.add_watch(str(self.directory / channel), self.mask)
                    self.wds[channel], self.channels[wd] = wd, channel
                self.listeners[channel].add(listener)

    def drop(self, listener: Listener, channels: Iterable[str], close: bool = False) -> None:
        """``listener`` no longer wants ``channels`` (and, with ``close``, is closed)."""
        with self.lock:
            for channel in channels:
                self.listeners[channel].discard(listener)
                wd = self.wds.get(channel)
                if not self.listeners[channel] and wd is not None:
                    del self.wds[channel], self.channels[wd]
                    with contextlib.suppress(OSError):
                        self.inotify.rm_watch(wd)
            if close:
                listener._close_fd()


_WATCHERS: dict[tuple[int, str], _Watcher | None] = {}
_WATCHERS_LOCK = threading.Lock()


def _watcher(directory: Path) -> _Watcher | None:
    """This process's watcher of ``directory``, or None where inotify cannot be had (not
    Linux, or the user's inotify instances or watches are all taken): then listeners poll,
    and a warning says why, once."""
    key = (os.getpid(), str(directory))  # a forked child has no thread: it makes its own
    with _WATCHERS_LOCK:
        if key in _WATCHERS:
            return _WATCHERS[key]
        module = inotify()
        watcher = None
        if module is not None:
            try:
                watcher = _Watcher(directory, module)
            except OSError as exc:
                log.warning(
                    "cannot watch %s with inotify (%s): waiting falls back to polling every "
                    "%.0f ms; raise fs.inotify.max_user_instances or max_user_watches",
                    directory,
                    exc,
                    FALLBACK_POLL * 1000,
                )
        _WATCHERS[key] = watcher
        return watcher


class Listener:
    """Waits for pulses on some channels. Use as a context manager; one thread at a time.

    Its ``fileno()`` is an eventfd the process's watcher writes to (select on it, or use
    :meth:`wait`); where there is no watcher it is None and :meth:`wait` polls."""

    def __init__(self, directory: Path, channels: tuple[str, ...]) -> None:
        self.channels = channels
        self._fd: int | None = None
        self._queue = self._interrupt = False
        #: See :class:`outlast.store.Listener`.
        self.interrupted = False
        self._watcher = _watcher(directory)
        if self._watcher is not None:
            self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._watcher.add(self, channels)

    def _wake(self, channel: str | None) -> None:
        """From the watcher's thread, under its lock."""
        if self._fd is not None:
            self._queue = self._queue or channel == QUEUE
            self._interrupt = self._interrupt or channel == INTERRUPT
            with contextlib.suppress(OSError):
                os.eventfd_write(self._fd, 1)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def fileno(self) -> int | None:
        """The fd to select on (for event loops), or None when polling."""
        return self._fd

    def drain(self) -> bool:
        """Consume the pulses that arrived, without blocking; True when one of them said a
        job became claimable (the ``queue`` channel), or when it cannot tell (polling).
        ``interrupted`` says whether one came on the ``interrupt`` channel (or, polling,
        that it cannot tell)."""
        if self._fd is None or self._watcher is None:
            self.interrupted = True
            return True
        with contextlib.suppress(BlockingIOError, OSError):
            os.eventfd_read(self._fd)
        with self._watcher.lock:  # the flags and the eventfd are set together under it
            queue, self._queue = self._queue, False
            self.interrupted, self._interrupt = self._interrupt, False
        return queue

    def wait(self, timeout: float | None) -> bool:
        """Block until a pulse or ``timeout`` seconds; True when woken by a pulse.

        With inotify this returns within a fraction of a millisecond of a pulse; without
        it, after a short poll interval (the caller re-checks its condition either way).
        """
        fd = self._fd
        if fd is None:
            time.sleep(FALLBACK_POLL if timeout is None else min(timeout, FALLBACK_POLL))
            return True
        ready, _, _ = select.select([fd], [], [], timeout)
        if ready:
            self.drain()
            return True
        return False

    def close(self) -> None:
        if self._watcher is not None and self._fd is not None:
            self._watcher.drop(self, self.channels, close=True)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
