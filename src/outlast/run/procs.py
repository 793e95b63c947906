"""Processes: start times, and killing a job's process group without ever hitting a reused PID.

Linux never hands out a PID number while any process still uses it as its PID, process-group id
or session id. So for a command that leads its own group:

- if a process with that PID exists and its kernel start time is the one recorded, it is our
  leader and ``killpg`` reaches exactly our group;
- if a process with that PID exists with another start time, the number was reused, which means
  our whole group is gone: nothing is signaled;
- if no process has that PID but the group still exists, its members are ours (the number
  cannot have been reused while they hold it), and ``killpg`` reaches them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import psutil

# psutil is imported where it is used (killing, command jobs' start times): ~17 ms of a
# worker's start-up here, and a pool of function jobs needs it only to kill (issue #18).

T = TypeVar("T")

START_TOLERANCE = 0.01  # seconds; both sides read the same kernel value through psutil


def start_time(pid: int) -> datetime | None:
    """The kernel's start time of ``pid``, or None when no such process exists."""
    import psutil

    try:
        return datetime.fromtimestamp(psutil.Process(pid).create_time(), UTC)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return None


def is_same(pid: int, started_at: datetime | None) -> bool | None:
    """True: ``pid`` is the process recorded; False: the PID was reused; None: no such PID."""
    now = start_time(pid)
    if now is None:
        return None
    if started_at is None:
        return False
    return abs((now - started_at).total_seconds()) <= START_TOLERANCE


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def terminate_group(pgid: int, grace: float, is_done: object = None, poll: float = 0.02) -> None:
    """SIGTERM the group, wait up to ``grace`` seconds for it to empty, then SIGKILL it.

    ``is_done`` (a callable) may end the wait early, e.g. when the caller reaps the leader
    itself; the group is SIGKILLed afterwards either way if anything of it is left.
    """
    if not signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(pgid):
        if callable(is_done):
            is_done()
        time.sleep(poll)
    if group_alive(pgid):
        signal_group(pgid, signal.SIGKILL)


def kill_leftovers(pid: int, started_at: datetime | None, grace: float = 0.5) -> bool:
    """Terminate what is left of a dead worker's command group, checking identity first.

    Returns True when something was signaled. A PID that now belongs to another process is
    never signaled (see the module docstring).
    """
    same = is_same(pid, started_at)
    if same is False:
        return False
    if same is None and not group_alive(pid):
        return False
    with contextlib.suppress(PermissionError):
        terminate_group(pid, grace)
        return True
    return False


def become_subreaper() -> None:
    """Make this process the child subreaper of its descendants (Linux): an orphaned
    descendant (``setsid`` and a double fork included) is re-parented here, not to init, so
    it can still be found, signaled and reaped."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def descendants(skip_group: int | None = None) -> list[psutil.Process]:
    """This process's live descendants, except those in process group ``skip_group``."""
    import psutil

    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for proc in found:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if skip_group is not None and os.getpgid(proc.pid) == skip_group:
                continue
        except (psutil.Error, ProcessLookupError):
            continue
        out.append(proc)
    return out


def signal_descendants(sig: int, skip_group: int | None = None) -> None:
    """Send ``sig`` to every live descendant (outside group ``skip_group``, which its caller
    signals as a whole)."""
    import psutil

    for proc in descendants(skip_group):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            proc.send_signal(sig)


def reap_adopted(skip: int | None, wait: float = 0.0) -> None:
    """Reap the exited children of this process other than ``skip`` (a leader its Popen
    reaps): orphans adopted as subreaper would stay zombies otherwise. With ``wait``, keep
    at it that long while some are still running."""
    deadline = time.monotonic() + wait
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # no children at all
        if info is None or info.si_pid == skip or info.si_pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


_LIBC: list[Any] = []  # the C library, loaded once (a pool's job process calls this per job)


def _prctl(option: int, value: int) -> None:
    try:
        if not _LIBC:
            import ctypes

            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        _LIBC[0].prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only);
    ``0``: no signal (then look at ``os.getppid()`` to learn whether it died)."""
    _prctl(1, int(sig))  # PR_SET_PDEATHSIG


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it (a pool's job process and what its job
    started), children first looked up, so none is missed when the parent dies."""
    import psutil

    try:
        parent = psutil.Process(pid)
        found = [*parent.children(recursive=True), parent]
    except psutil.Error:
        return
    for proc in found:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            proc.kill()


def patiently(make: Callable[[], T], patience: float = 45.0) -> T:
    """``make()``, tried again with backoff and jitter while the store fails (a database
    restarting as a pool or its job process starts), for up to ``patience`` seconds (less
    than the minute a pool waits for a job process)."""
    import random
    import time

    from outlast.errors import StoreError

    delay, deadline = 0.1, time.monotonic() + patience
    while True:
        try:
            return make()
        except StoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(2.0, delay * 2)


def sd_notify(state: str) -> bool:
    """Tell systemd (a unit of ``Type=notify``) about this service: ``READY=1`` once it
    works, ``STOPPING=1`` as it stops. A no-op (False) outside such a unit
    (``$NOTIFY_SOCKET`` unset) or when the socket cannot be reached."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not address.startswith(("/", "@")):
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError:
        return False
    return True
