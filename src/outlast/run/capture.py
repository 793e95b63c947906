"""A function or pipeline job's output, routed to the job's log.

While a job runs, file descriptors 1 and 2 of its process are one spool file (unlinked, in
the temporary folder, opened for appending), so everything it prints lands there in the
order written: Python's ``print`` and ``logging``, C extensions writing to the descriptors,
and the processes it starts (they inherit them). What the spool gained is copied to the
job's log (:meth:`outlast.store.Store.log_writer`: a file, or chunks in PostgreSQL) every
:data:`COPY_EVERY` seconds while the job runs, so ``outlast logs -f`` follows it, and the
rest when it returns, before its outcome is sent: the log is complete when the job shows
finished. Then the spool is emptied for the next job.

Why a spool file and not a pipe: a job that prints nothing (most short jobs) costs two
``fstat`` calls and four ``dup2`` calls, no thread hand-off; a pipe needs a reader thread
woken twice per job, which cost a no-op pool 40% of its throughput (BENCHMARKS.md). The
price: a process the job leaves running keeps writing to the spool after the job returned,
and that output is not kept (it is cleared with the spool). A job that writes more than
:data:`SPOOL_MAX` bytes between two copies has the spool emptied under it: a write that
lands between the copy and the emptying is lost (the log, capped by its rotation, keeps the
most recent output anyway).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

from outlast.store.common import log
from outlast.store.joblog import LogSink

#: Seconds between copies of a running job's output to its log.
COPY_EVERY = 0.2
#: Bytes the spool may hold before it is emptied while a job runs.
SPOOL_MAX = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


class Capture:
    """Routes this process's descriptors 1 and 2 to one job's log at a time (see the
    module)."""

    def __init__(self) -> None:
        self._spool = _spool_file()
        # the process's own output (the pool's terminal or log), for between the jobs
        self._out, self._err = os.dup(1), os.dup(2)
        os.set_inheritable(self._out, False)
        os.set_inheritable(self._err, False)
        self._lock = threading.Lock()
        self._factory: Callable[[], LogSink] | None = None
        self._sink: LogSink | None = None
        self._offset = 0
        self._running = False  # read by the copier, which wakes on its own (no hand-off)
        threading.Thread(target=self._copier, name="outlast-log-copier", daemon=True).start()

    @contextlib.contextmanager
    def job(self, sink: Callable[[], LogSink]) -> Iterator[None]:
        """Inside: everything written to descriptors 1 and 2 goes to the log ``sink()``
        opens (at the first byte). On leaving, all of it is in the log."""
        _flush()
        with self._lock:
            self._factory, self._sink, self._offset = sink, None, 0
        os.dup2(self._spool, 1)
        os.dup2(self._spool, 2)
        self._running = True
        try:
            yield
        finally:
            _flush()
            os.dup2(self._out, 1)
            os.dup2(self._err, 2)
            self._running = False
            with self._lock:
                self._copy()
                if self._sink is not None:
                    _quietly(self._sink.close)
                if self._offset:  # the job printed: empty the spool for the next
                    with contextlib.suppress(OSError):
                        os.ftruncate(self._spool, 0)
                self._factory = self._sink = None
                self._offset = 0

    def _copier(self) -> None:
        """While a job runs: copy what it printed every COPY_EVERY seconds, and let a log in
        a database send what it buffered."""
        while True:
            time.sleep(COPY_EVERY)
            if not self._running:
                continue
            with self._lock:
                if self._factory is not None:
                    self._copy()
                    if self._sink is not None:
                        _quietly(self._sink.tick)

    def _copy(self) -> None:
        """Copy what the spool gained since the last copy (under the lock)."""
        try:
            size = os.fstat(self._spool).st_size
        except OSError:
            return
        while self._offset < size:
            try:
                data = os.pread(self._spool, min(_CHUNK, size - self._offset), self._offset)
            except OSError:
                return
            if not data:
                break
            self._offset += len(data)
            if self._sink is None and self._factory is not None:
                try:
                    self._sink = self._factory()
                except Exception as exc:
                    log.warning("cannot open a job's log: %s", exc)
                    self._factory = None
            if self._sink is not None:
                _quietly(partial(self._sink.write, data))
        if self._offset > SPOOL_MAX:  # a flood: start the spool over (see the module)
            with contextlib.suppress(OSError):
                os.ftruncate(self._spool, 0)
            self._offset = 0


def _spool_file() -> int:
    """An unlinked temporary file opened for appending (0600)."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
    with contextlib.suppress(OSError, AttributeError):  # O_TMPFILE: Linux, most filesystems
        return os.open(tempfile.gettempdir(), flags | os.O_TMPFILE, 0o600)
    handle, path = tempfile.mkstemp(prefix="outlast-spool-")  # 0600, close-on-exec
    os.unlink(path)
    fcntl.fcntl(handle, fcntl.F_SETFL, fcntl.fcntl(handle, fcntl.F_GETFL) | os.O_APPEND)
    return handle


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception as exc:  # a full disk, a database away: the job goes on
        log.warning("cannot write a job's log: %s", exc)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
