"""Starting a pool's job processes (:mod:`outlast.run.jobproc`), as early as the pool can:
the standard library only, outside the run layer (whose package imports the store), so that
``outlast worker`` starts them before it imports the rest of outlast, and they boot (import,
open the store) while the pool does the same.

A job process is ``python -m outlast.run.jobproc FD URL [MODULE…]``; ``FD`` is its end of a
socket pair. Once booted it waits for the pool's introduction on it — one line of JSON, the
pool's worker name and token, with the pool's liveness descriptor passed along (SCM_RIGHTS)
when the store has one — and answers ``"ready"`` (or ``("error", message)`` when it could
not boot) through :class:`multiprocessing.connection.Connection`, the pipe's language from
then on. The pool can introduce itself only once its store is open; the processes boot
meanwhile.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

#: The longest introduction, bytes.
INTRODUCTION_MAX = 4096


@dataclass
class Booting:
    """A job process started and not yet introduced: its process and the pool's end of its
    socket pair."""

    popen: subprocess.Popen[bytes]
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


def introduce(sock: socket.socket, pool: str, token: str, alive: int | None) -> None:
    """Tell a job process which pool it works for (its journal's names), passing the pool's
    liveness descriptor (so the pool's jobs stay alive while the process lives)."""
    line = json.dumps({"pool": pool, "token": token}).encode() + b"\n"
    socket.send_fds(sock, [line], [] if alive is None else [alive])


def introduced(fd: int) -> tuple[str, str, int | None]:
    """In the job process: wait for the pool's introduction on ``fd`` (left open); returns
    the pool's name, its token and the liveness descriptor (or None)."""
    sock = socket.socket(fileno=fd)
    try:
        data, fds, _, _ = socket.recv_fds(sock, INTRODUCTION_MAX, 1)
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
    return str(told["pool"]), str(told["token"]), (fds[0] if fds else None)


#: Job processes started by :func:`early` for the ``outlast worker`` about to be parsed,
#: with what they were started for: ``(url, imports, processes)``.
EARLY: list[tuple[str | None, list[str], list[Booting]]] = []


def early(argv: list[str]) -> None:
    """For ``outlast worker …`` (a process pool), start its job processes before the command
    line is parsed and the pool imported: the verb takes them if they fit what it parses
    (:func:`take`), else kills them. Reads only ``-c/--concurrency N``, ``--import M``,
    ``--store URL`` and the flags that take no value; anything else, and nothing starts."""
    if argv[:1] != ["worker"]:
        return
    n, url, imports = 1, os.environ.get("OUTLAST_STORE") or None, []
    rest = iter(argv[1:])
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in ("-c", "--concurrency", "--import", "--store"):
            value = value if eq else next(rest, "")
            if name == "--import":
                imports.append(value)
            elif name == "--store":
                url = value or None
            elif value.isdigit() and 0 < int(value) <= 64:
                n = int(value)
            else:
                return
        elif name == "--grace":
            if not eq:
                next(rest, None)
        elif arg != "--burst":
            return  # --async, --queue, --help, anything else: the verb starts them
    EARLY.append((url, imports, spawn_many(n, url, imports)))


def take(n: int, url: str | None, imports: list[str]) -> list[Booting]:
    """The job processes :func:`early` started, if they were started for this pool (the
    same store and imports; at most ``n``); the others are killed."""
    taken: list[Booting] = []
    while EARLY:
        for_url, for_imports, processes = EARLY.pop()
        if for_url == url and for_imports == imports:
            taken, processes = processes[:n], processes[n:]
        for unused in processes:
            unused.kill()
    return taken
