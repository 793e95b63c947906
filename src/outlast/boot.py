"""Starting a pool's job processes (:mod:`outlast.run.jobproc`): the standard library only,
outside the run layer.

``outlast worker`` forks its first job processes (:func:`fork`, from
:func:`outlast.run.pool.fork_job_processes`): once the pool has imported what a job process
needs (the store's driver: psycopg alone is ~150 ms of CPU) and before it has a thread or a
connection, a fork costs a few milliseconds, where each spawned interpreter would import
everything again on the cores the pool boots on (BENCHMARKS.md, issue #18). A job process that
replaces a dead one later, or one of a pool started with threads running, is spawned
(:func:`spawn`): ``python -m outlast.run.jobproc FD URL [MODULE…]``.

Either way ``FD`` is the job process's end of a socket pair. Once booted it waits for the
pool's introduction on it — one line of JSON, the pool's worker name and token, with the
pool's liveness descriptor passed along (SCM_RIGHTS) when the store has one, and the memory
file of the :class:`Words` they share — and answers
``"ready"`` (or ``("error", message)`` when it could not boot) through :class:`Channel`,
the pipe's language from then on. The pool can introduce itself only once its store is open;
the processes boot meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: The longest introduction, bytes.
INTRODUCTION_MAX = 4096

_LENGTH = struct.Struct("!I")  # a message's length, before it


class Channel:
    """One end of the socket pair between a pool and a job process, after the introduction:
    Python objects both ways, each message its pickle's length (4 bytes, big-endian) and the
    pickle. What :class:`multiprocessing.connection.Connection` does over a Unix socket,
    without importing :mod:`multiprocessing` (~20 ms of a worker's start-up here, issue #18);
    both ends are the same outlast, a pool and a job process it started.

    Blocking: :meth:`recv` reads a whole message (call it once :meth:`poll` or a ``select`` on
    :meth:`fileno` says there is one); :meth:`send` writes a whole one. Both raise
    :class:`EOFError` when the other end has closed, and :class:`OSError` when this one is."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def fileno(self) -> int:
        if self._fd is None:
            raise OSError("the channel is closed")
        return self._fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        if len(data) > 0xFFFFFFFF:
            raise ValueError(f"a message of {len(data)} bytes is too long for the channel")
        view = memoryview(_LENGTH.pack(len(data)) + data)
        fd = self.fileno()
        while view:
            view = view[os.write(fd, view) :]

    def recv(self) -> Any:
        (length,) = _LENGTH.unpack(self._read(_LENGTH.size))
        return pickle.loads(self._read(length))

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether a message (or the other end's close) is waiting, within ``timeout``
        seconds (None: as long as it takes)."""
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))

    def _read(self, size: int) -> bytes:
        fd, chunks = self.fileno(), []
        while size:
            chunk = os.read(fd, size)
            if not chunk:
                raise EOFError("the other end of the channel closed it")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


class Process(Protocol):
    """What a pool needs of a job process: ``subprocess.Popen``'s verbs it uses."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class Forked:
    """A forked child as :class:`Process` (``subprocess.Popen``'s ``poll``, ``wait``,
    ``kill`` and ``returncode``: negative for a signal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone, how is not known
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


@dataclass
class Booting:
    """A job process started and not yet introduced: its process and the pool's end of its
    socket pair."""

    popen: Process
    sock: socket.socket

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self.sock.close()


def spawn(url: str | None, imports: list[str]) -> Booting:
    """Start one job process for the store at ``url`` (None: the default store, found the
    same way as this process finds it), importing ``imports``."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ, OUTLAST_SYS_PATH=json.dumps(sys.path))
    env["OUTLAST_POOL_PID"] = str(os.getpid())
    argv = [sys.executable, "-m", "outlast.run.jobproc", str(theirs.fileno()), url or ""]
    try:
        popen = subprocess.Popen(
            [*argv, *imports], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return Booting(popen, ours)


def spawn_many(n: int, url: str | None, imports: list[str]) -> list[Booting]:
    """Start ``n`` job processes side by side; kills those started if one cannot be."""
    started: list[Booting] = []
    try:
        for _ in range(n):
            started.append(spawn(url, imports))
    except BaseException:
        for booting in started:
            booting.kill()
        raise
    return started


def fork(
    main: Callable[[list[str]], int],
    url: str | None,
    imports: list[str],
    siblings: Sequence[Booting] = (),
) -> Booting:
    """Fork one job process that runs ``main`` (:func:`outlast.run.jobproc.main`) with the
    argv a spawned one gets, then exits; for a process with no other thread (the caller
    checks: :func:`can_fork`). ``siblings``: the job processes forked before it, whose
    sockets (the pool's ends) the child closes: it must not keep them open for them."""
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            ours.close()
            for sibling in siblings:
                sibling.sock.close()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
            os.environ["OUTLAST_POOL_PID"] = str(parent)
            code = main([str(theirs.fileno()), url or "", *imports])
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    theirs.close()
    return Booting(Forked(pid), ours)


def can_fork() -> bool:
    """Whether this process may fork job processes: it has no other thread (a lock one of
    them holds would stay held in the child forever), and the platform forks."""
    return hasattr(os, "fork") and threading.active_count() == 1


def introduce(
    sock: socket.socket, pool: str, token: str, alive: int | None, words: int | None = None
) -> None:
    """Tell a job process which pool it works for (its journal's names), passing the pool's
    liveness descriptor (so the pool's jobs stay alive while the process lives) and the
    descriptor of the :class:`Words` they share."""
    fds = [fd for fd in (alive, words) if fd is not None]
    told = {"pool": pool, "token": token, "alive": alive is not None, "words": words is not None}
    socket.send_fds(sock, [json.dumps(told).encode() + b"\n"], fds)


def introduced(fd: int) -> tuple[str, str, int | None, int | None]:
    """In the job process: wait for the pool's introduction on ``fd`` (left open); returns
    the pool's name, its token, the liveness descriptor and that of the shared
    :class:`Words` (each None when not given)."""
    sock = socket.socket(fileno=fd)
    try:
        data, fds, _, _ = socket.recv_fds(sock, INTRODUCTION_MAX, 2)
        while data and not data.endswith(b"\n") and len(data) < INTRODUCTION_MAX:
            more = sock.recv(INTRODUCTION_MAX - len(data))
            if not more:
                break
            data += more
    finally:
        sock.detach()
    if not data:
        raise EOFError("the pool went away before it introduced itself")
    told = json.loads(data)
    given = list(fds)
    alive = given.pop(0) if told.get("alive") and given else None
    words = given.pop(0) if told.get("words") and given else None
    return str(told["pool"]), str(told["token"]), alive, words


class Words:
    """Two numbers a pool and one of its job processes share (a memory file both map): which
    job the pool's cancel signal is for, and which job not to start. A job is named by its
    number on the channel (1, 2, … in the order the pool sent them: both ends count).

    A pool may send a process its next job before the current one ends (:mod:`outlast.run.pool`,
    "sent ahead"). The cancel signal (SIGUSR1) names no job, so one meant for the job that just
    ended could land on the next: the process's handler acts only when :attr:`cancel` is the
    number of the job it runs. And a job sent ahead is taken back by setting :attr:`skip` to
    its number: the process answers ``(number, "held")`` instead of starting it (the pool
    knows it has not started when no outcome is waiting on the channel after the write: the
    process reads :attr:`skip` only after it has sent the outcome before)."""

    SIZE = 16
    _PAIR = struct.Struct("=qq")

    def __init__(self, fd: int) -> None:
        """Map the memory file ``fd`` (closed here: the mapping stays)."""
        try:
            self._map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)

    @classmethod
    def create(cls) -> tuple[Words, int]:
        """New words (both 0) and a descriptor of their file, to pass to a job process (the
        caller closes it once passed)."""
        fd = os.memfd_create("outlast-words", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, cls.SIZE)
            passed = os.dup(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd), passed

    @property
    def cancel(self) -> int:
        return int(self._PAIR.unpack_from(self._map, 0)[0])

    @cancel.setter
    def cancel(self, number: int) -> None:
        struct.pack_into("=q", self._map, 0, number)

    @property
    def skip(self) -> int:
        return int(self._PAIR.unpack_from(self._map, 0)[1])

    @skip.setter
    def skip(self, number: int) -> None:
        struct.pack_into("=q", self._map, 8, number)

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self._map.close()
