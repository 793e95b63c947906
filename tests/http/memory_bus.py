"""An in-memory adapter of the bus port, for the bus's own tests: one process, no store.

Kept here, not in the package: a test double (the store adapter is what outlast ships)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncGenerator, Iterator

from outlast.bus import Bus, Progress, _check_after, _wait
from outlast.ids import check_id
from outlast.model import EventStatus, ProgressEvent, utcnow


class MemoryBus(Bus):
    """Events in this process's memory, for tests. Knows no job states: :meth:`finish` marks
    a job finished (what the store's terminal transition does), after which subscribers end
    once they have every event and further publishes are ignored."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._logs: dict[str, list[ProgressEvent]] = {}
        self._finished: set[str] = set()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def _wake(self) -> None:
        self._cond.notify_all()
        for loop, event in list(self._waiters):
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)

    def publish(self, event: Progress) -> ProgressEvent | None:
        with self._cond:
            if event.job_id in self._finished:
                return None
            log = self._logs.setdefault(event.job_id, [])
            stored = ProgressEvent(
                event.job_id,
                len(log) + 1,
                utcnow(),
                event.step,
                EventStatus(event.status),
                event.message,
            )
            log.append(stored)
            self._wake()
            return stored

    def finish(self, job_id: str) -> None:
        """Mark the job finished: its subscribers end after the events published so far."""
        with self._cond:
            self._finished.add(check_id(job_id))
            self._wake()

    def _moved(self, job_id: str, after: int) -> bool:
        return len(self._logs.get(job_id, [])) > after or job_id in self._finished

    def _since(self, job_id: str, after: int) -> tuple[list[ProgressEvent], bool]:
        with self._cond:
            return self._logs.get(job_id, [])[after:], job_id in self._finished

    def subscribe(
        self, job_id: str, after: int = 0, timeout: float | None = None
    ) -> Iterator[ProgressEvent]:
        check_id(job_id)
        _check_after(after)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            events, finished = self._since(job_id, after)
            yield from events
            if events:
                after = events[-1].seq
                continue
            if finished:
                return
            with self._cond:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                self._cond.wait_for(functools.partial(self._moved, job_id, after), remaining)

    async def astream(
        self, job_id: str, after: int = 0, heartbeat: float | None = None
    ) -> AsyncGenerator[list[ProgressEvent], None]:
        check_id(job_id)
        _check_after(after)
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            self._waiters.add(waiter)
        try:
            while True:
                waiter[1].clear()
                events, finished = self._since(job_id, after)
                if events:
                    after = events[-1].seq
                    yield events
                    continue
                if finished:
                    return
                if not await _wait(waiter[1], heartbeat):
                    yield []
        finally:
            with self._cond:
                self._waiters.discard(waiter)
