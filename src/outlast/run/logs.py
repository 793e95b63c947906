"""Reading a job's log as it grows (``outlast logs -f``). The log itself, its rotation and
where each store keeps it: :mod:`outlast.store.joblog`."""

from __future__ import annotations

import select
import sys
from collections.abc import Callable

from outlast.store import Store

#: Seconds between reads of a log that no file event announces (a database's).
POLL = 0.25


def read_slice(
    store: Store, job_id: str, offset: int, limit: int, tail: int | None, finished: bool
) -> dict[str, object]:
    """A piece of a job's log for a reader that pages (the MCP ``logs`` tool, ``outlast logs
    --offset/--tail --json``): ``{text, offset, next_offset, size, done}``. ``tail``: the
    last lines; else up to ``limit`` bytes from byte ``offset``. A UTF-8 character cut by
    ``limit`` is left for the next piece; ``done``: the job is ``finished`` and all was read."""
    import codecs

    if tail is not None:
        _, size = store.log_read(job_id, 0, 0)
        text = store.log_tail(job_id, tail) or ""
        start = max(0, size - len(text.encode()))
        return {"text": text, "offset": start, "next_offset": size, "size": size, "done": finished}
    data, size = store.log_read(job_id, offset, limit)
    end = offset + len(data) >= size
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=end and finished)
    next_offset = offset + len(data) - len(decoder.getstate()[0])
    return {
        "text": text,
        "offset": offset,
        "next_offset": next_offset,
        "size": size,
        "done": finished and next_offset >= size,
    }


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
        from outlast.store.notify import inotify

        inotify_simple = inotify()  # None where there is no inotify
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
