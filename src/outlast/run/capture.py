"""A function or pipeline job's output, routed to the job's log.

While a job runs, file descriptors 1 and 2 of its process are the write end of one pipe, so
everything it prints reaches its log in the order written: Python's ``print`` and
``logging``, C extensions writing to the descriptors, and the processes it starts (they
inherit them). One thread per process (the pump) reads the pipes of its jobs and appends to
each job's log (:meth:`outlast.store.Store.log_writer`: a file, or chunks in PostgreSQL).

When the job returns, the process's own descriptors are put back and the pump reads what is
left; the outcome is sent once the job's pipe is drained, so the log is complete when the
job shows finished. A process the job left running keeps writing to the job's log (its pipe
stays open) without holding up the next job, whose output goes to a pipe of its own.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import threading
from collections.abc import Callable, Iterator

from outlast.store.common import log
from outlast.store.joblog import LogSink

#: Seconds a finished job's pipe may take to drain before its outcome goes without waiting
#: (a process it started still holds the pipe open).
DRAIN_WAIT = 1.0


class Pump(threading.Thread):
    """Reads the pipes of the jobs of this process into their logs (see the module)."""

    def __init__(self) -> None:
        super().__init__(name="outlast-log-pump", daemon=True)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._mutex = threading.Lock()
        self._new: list[tuple[int, LogSink, threading.Event]] = []
        self._sinks: dict[int, tuple[LogSink, threading.Event]] = {}

    def add(self, fd: int, sink: LogSink) -> threading.Event:
        """Read ``fd`` into ``sink`` until its end; the event is set then (``sink`` closed)."""
        done = threading.Event()
        with self._mutex:
            self._new.append((fd, sink, done))
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")
        return done

    def run(self) -> None:
        while True:
            timeout = None
            for sink, _ in self._sinks.values():
                due = self._tick(sink)
                if due is not None:
                    timeout = due if timeout is None else min(timeout, due)
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    self._take_new()
                else:
                    self._read(key.fd)

    def _take_new(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._mutex:
            new, self._new = self._new, []
        for fd, sink, done in new:
            self._sinks[fd] = (sink, done)
            self._selector.register(fd, selectors.EVENT_READ, fd)

    def _read(self, fd: int) -> None:
        sink, done = self._sinks[fd]
        try:
            data = os.read(fd, 256 * 1024)
        except OSError:
            data = b""
        if data:
            try:
                sink.write(data)
            except Exception as exc:  # a full disk: the job goes on, its output is lost
                log.warning("cannot write a job's log: %s", exc)
            return
        self._selector.unregister(fd)
        os.close(fd)
        del self._sinks[fd]
        try:
            sink.close()
        except Exception as exc:
            log.warning("cannot write a job's log: %s", exc)
        done.set()

    @staticmethod
    def _tick(sink: LogSink) -> float | None:
        try:
            return sink.tick()
        except Exception as exc:
            log.warning("cannot write a job's log: %s", exc)
            return None


class Capture:
    """Routes this process's descriptors 1 and 2 to one job's log at a time."""

    def __init__(self) -> None:
        self._pump = Pump()
        self._pump.start()
        # the process's own output (the pool's terminal or log), for between the jobs
        self._out, self._err = os.dup(1), os.dup(2)
        os.set_inheritable(self._out, False)
        os.set_inheritable(self._err, False)

    @contextlib.contextmanager
    def job(self, sink: Callable[[], LogSink]) -> Iterator[None]:
        """Inside: everything written to descriptors 1 and 2 goes to the log ``sink()``
        opens. On leaving, waits (up to :data:`DRAIN_WAIT`) until it is all in the log."""
        _flush()
        try:
            read, write = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # out of descriptors: the job runs, its output goes as before
            log.warning("cannot capture the job's output: %s", exc)
            yield
            return
        done = self._pump.add(read, sink())
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        try:
            yield
        finally:
            _flush()
            os.dup2(self._out, 1)  # the pipe's last write end here: its reader sees the end
            os.dup2(self._err, 2)
            done.wait(DRAIN_WAIT)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
