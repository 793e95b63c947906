"""Reading a job's log as it grows (``outlast logs -f``). The log itself, its rotation and
where each store keeps it: :mod:`outlast.store.joblog`."""

from __future__ import annotations

import select
import sys
from collections.abc import Callable

from outlast.store import Store

#: Seconds between reads of a log that no file event announces (a database's).
POLL = 0.25


def follow(
    store: Store,
    job_id: str,
    out: Callable[[bytes], None],
    finished: Callable[[], bool],
    listener_fd: int | None,
    drain: Callable[[], object],
) -> None:
    """Print the job's log and everything appended to it until ``finished()`` is true.

    A local log: woken by inotify on the log's folder (a write to the log) or by
    ``listener_fd`` (the job's state changed); without inotify it polls every 50 ms. A log
    in the database is read every :data:`POLL` seconds.
    """
    watcher = None
    wait = 0.05
    if store.capabilities.local_logs:
        try:
            import inotify_simple
        except (ImportError, OSError):  # pragma: no cover - not Linux
            inotify_simple = None
        if inotify_simple is not None:
            watcher = inotify_simple.INotify()
            mask = inotify_simple.flags
            watcher.add_watch(
                str(store.log_path(job_id).parent), mask.MODIFY | mask.CREATE | mask.MOVED_TO
            )
            wait = 1.0
    else:
        wait = POLL
    cursor = store.log_cursor(job_id)
    try:
        while True:
            done = finished()  # check before reading, so the last output is read after it
            data = cursor.read_new()
            if data:
                out(data)
            if done:
                return
            fds = [fd for fd in (listener_fd, watcher.fileno() if watcher else None) if fd]
            ready, _, _ = select.select(fds, [], [], wait)
            if watcher is not None and watcher.fileno() in ready:
                watcher.read(timeout=0)
            if listener_fd in ready:
                drain()
    finally:
        cursor.close()
        if watcher is not None:
            watcher.close()


def write_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
