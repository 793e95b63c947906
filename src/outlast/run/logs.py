"""A job's log: stdout and stderr interleaved in one file, capped by rotation.

The supervisor reads the command's output from one pipe (so the two streams interleave in the
order the command wrote them) and appends it to ``<store logs>/<id>.log``. When the file would
pass ``OUTLAST_LOG_MAX_BYTES`` (default 10 MiB) it is renamed to ``<id>.log.1`` (replacing the
previous one) and a new file is started: a job's log never takes more than twice the cap, and
the most recent output is always kept.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
from collections.abc import Callable
from pathlib import Path

from outlast.errors import InvalidInput

DEFAULT_MAX_BYTES = 10 * 1024 * 1024


def max_bytes() -> int:
    raw = os.environ.get("OUTLAST_LOG_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit() or int(raw) < 1024:
        raise InvalidInput(f"$OUTLAST_LOG_MAX_BYTES must be a whole number >= 1024, not {raw!r}")
    return int(raw)


class LogWriter:
    """Appends to a job's log file, rotating it at the cap."""

    def __init__(self, path: Path, cap: int | None = None) -> None:
        self.path = path
        self.cap = cap or max_bytes()
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write(self, data: bytes) -> None:
        """Append ``data``, rotating first if it would pass the cap.

        A chunk larger than the cap supersedes everything before it: its last ``2 * cap``
        bytes are kept, split over the two files, so the log always reads as one unbroken
        tail of the output.
        """
        if len(data) > self.cap:
            keep = data[-2 * self.cap :]
            os.close(self._fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}.1")
            self._fd = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
            self._size = 0
            self._append(keep[: -self.cap])
            self._append(keep[-self.cap :])
            return
        self._append(data)

    def _append(self, data: bytes) -> None:
        if not data:
            return
        if self._size + len(data) > self.cap and self._size > 0:
            os.close(self._fd)
            os.replace(self.path, f"{self.path}.1")
            self._fd, self._size = self._open(), 0
        while data:
            written = os.write(self._fd, data)
            self._size += written
            data = data[written:]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def log_files(path: Path) -> list[Path]:
    """The files of a log, oldest first (the rotated one, then the current one)."""
    return [p for p in (Path(f"{path}.1"), path) if p.exists()]


def read_log(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in log_files(path))


def follow(
    path: Path,
    out: Callable[[bytes], None],
    finished: Callable[[], bool],
    listener_fd: int | None,
    drain: Callable[[], object],
) -> None:
    """Print the log and everything appended to it until ``finished()`` is true.

    Woken by inotify on the log's folder (a write to the log) or by ``listener_fd`` (the job's
    state changed); without inotify it polls every 50 ms.
    """
    try:
        import inotify_simple
    except (ImportError, OSError):  # pragma: no cover - not Linux
        inotify_simple = None
    watcher = None
    if inotify_simple is not None:
        watcher = inotify_simple.INotify()
        mask = inotify_simple.flags
        watcher.add_watch(str(path.parent), mask.MODIFY | mask.CREATE | mask.MOVED_TO)
    reader = _Tail(path, out)
    for old in log_files(path)[:-1] if path.exists() else []:
        out(old.read_bytes())
    try:
        while True:
            done = finished()  # check before reading, so the last output is read after it
            reader.read_new()
            if done:
                return
            fds = [fd for fd in (listener_fd, watcher.fileno() if watcher else None) if fd]
            if not fds:
                select.select([], [], [], 0.05)
                continue
            ready, _, _ = select.select(fds, [], [], 1.0)
            if watcher is not None and watcher.fileno() in ready:
                watcher.read(timeout=0)
            if listener_fd in ready:
                drain()
    finally:
        if watcher is not None:
            watcher.close()


class _Tail:
    """Reads what was appended to a log since the last call, across one rotation."""

    def __init__(self, path: Path, out: Callable[[bytes], None]) -> None:
        self.path, self.rotated, self.out = path, Path(f"{path}.1"), out
        self.offset, self.inode = 0, -1

    def read_new(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                inode = os.fstat(handle.fileno()).st_ino
                if self.inode not in (-1, inode):
                    self._finish_rotated()
                self.inode = inode
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        if chunk:
            self.out(chunk)

    def _finish_rotated(self) -> None:
        """The log was rotated under us: print the rest of the old file from where we were."""
        with contextlib.suppress(FileNotFoundError):
            if self.rotated.stat().st_ino == self.inode:
                with open(self.rotated, "rb") as old:
                    old.seek(self.offset)
                    self.out(old.read())
        self.offset = 0


def write_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
