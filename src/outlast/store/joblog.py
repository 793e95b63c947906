"""A job's log: stdout and stderr interleaved, capped by rotation; how stores keep it.

Every kind of job has one: a command's supervisor reads the command's output from one pipe,
and a function or pipeline job's process routes its file descriptors 1 and 2 through a pipe
(:mod:`outlast.run.capture`), so the two streams interleave in the order they were written.

On a local store (SQLite, files) the log is ``<store logs>/<id>.log``. When the file would
pass ``OUTLAST_LOG_MAX_BYTES`` (default 10 MiB) it is renamed to ``<id>.log.1`` (replacing the
previous one) and a new file is started: a job's log never takes more than twice the cap, and
the most recent output is always kept. On PostgreSQL the log is stored in the database in
chunks (see :class:`outlast.store.postgresql.PgLogWriter`), under the same rule, so that it
can be read from any host.

A writer is opened by the store (:meth:`outlast.store.Store.log_writer`); readers go through
:meth:`~outlast.store.Store.log_cursor` (everything, then what was appended since) and
:meth:`~outlast.store.Store.log_tail` (the last lines).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

from outlast.errors import InvalidInput

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
#: Bytes of a log read at most for one tail.
TAIL_BYTES = 1024 * 1024


def max_bytes() -> int:
    raw = os.environ.get("OUTLAST_LOG_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit() or int(raw) < 1024:
        raise InvalidInput(f"$OUTLAST_LOG_MAX_BYTES must be a whole number >= 1024, not {raw!r}")
    return int(raw)


class LogSink(Protocol):
    """Where a job's output goes: appended in order, rotated at the cap."""

    def write(self, data: bytes) -> None: ...
    def tick(self) -> float | None:
        """Do what is due (a database writer sends what it buffered); returns seconds until
        it wants to be called again, or None."""
        ...

    def close(self) -> None: ...


class LogCursor(Protocol):
    """Reads a log: the first call everything, then what was appended since."""

    def read_new(self) -> bytes: ...
    def close(self) -> None: ...


class LogWriter:
    """Appends to a job's log file, rotating it at the cap. ``lazy``: the file is made with
    the first byte (a job that prints nothing has no log)."""

    def __init__(self, path: Path, cap: int | None = None, lazy: bool = False) -> None:
        self.path = path
        self.cap = cap or max_bytes()
        self._fd = -1
        self._size = 0
        if not lazy:
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
        if self._fd < 0:
            if not data:
                return
            self._fd = self._open()
            self._size = os.fstat(self._fd).st_size
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

    def tick(self) -> float | None:
        return None

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def log_files(path: Path) -> list[Path]:
    """The files of a log, oldest first (the rotated one, then the current one)."""
    return [p for p in (Path(f"{path}.1"), path) if p.exists()]


def read_log(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in log_files(path))


def read_range(path: Path, offset: int, limit: int) -> tuple[bytes, int]:
    """Up to ``limit`` bytes of a log from byte ``offset`` of what is kept (its rotated part,
    then the current file), and the size of what is kept."""
    parts = [(p, p.stat().st_size) for p in log_files(path)]
    size = sum(length for _, length in parts)
    out, start = b"", 0
    for part, length in parts:
        if offset < start + length and len(out) < limit:
            with contextlib.suppress(FileNotFoundError), open(part, "rb") as handle:
                handle.seek(max(0, offset - start))
                out += handle.read(min(limit - len(out), length - max(0, offset - start)))
        start += length
    return out, size


def check_range(offset: int, limit: int) -> None:
    for name, value in (("offset", offset), ("limit", limit)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"{name} must be a whole number >= 0, not {value!r}")


class FileCursor:
    """Reads a log file: first its rotated part and the file, then what was appended since,
    across rotations."""

    def __init__(self, path: Path) -> None:
        self.path, self.rotated = path, Path(f"{path}.1")
        self.offset, self.inode = 0, -1

    def read_new(self) -> bytes:
        out = b""
        if self.inode == -1:  # the first read: the rotated part first
            with contextlib.suppress(FileNotFoundError):
                out = self.rotated.read_bytes()
        try:
            with open(self.path, "rb") as handle:
                inode = os.fstat(handle.fileno()).st_ino
                if self.inode not in (-1, inode):
                    out += self._finish_rotated()
                self.inode = inode
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            if self.inode == -1 and out:
                self.inode = -2  # read the rotated part once
            return out
        self.offset += len(chunk)
        return out + chunk

    def _finish_rotated(self) -> bytes:
        """The log was rotated under us: the rest of the old file from where we were."""
        self_offset, self.offset = self.offset, 0
        with contextlib.suppress(FileNotFoundError), open(self.rotated, "rb") as old:
            if os.fstat(old.fileno()).st_ino == self.inode:
                old.seek(self_offset)
                return old.read()
        return b""

    def close(self) -> None:
        pass


def tail_lines(data: bytes, lines: int, cut: bool) -> str:
    """The last ``lines`` lines of ``data`` as text; ``cut``: its first line may be partial
    (it is dropped)."""
    text = data.decode("utf-8", "replace")
    if cut:
        text = text.partition("\n")[2]
    return "\n".join(text.splitlines()[-lines:]) + ("\n" if text.endswith("\n") else "")


def tail_file(path: Path, lines: int) -> str | None:
    """The last ``lines`` lines of a log (its rotated part too, when needed), reading at most
    :data:`TAIL_BYTES`; None when there is no log."""
    data, cut = b"", False
    for part in reversed(log_files(path)):
        with open(part, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            start = end
            chunk = b""
            while start > 0 and (chunk + data).count(b"\n") <= lines:
                if end - start + len(data) >= TAIL_BYTES:
                    break
                step = min(64 * 1024, start)
                start -= step
                f.seek(start)
                chunk = f.read(step) + chunk
            data = chunk + data
            cut = start > 0
            if cut or data.count(b"\n") > lines:
                break
    else:
        if not log_files(path):
            return None
    return tail_lines(data, lines, cut)
