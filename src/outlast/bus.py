"""The progress bus: a port where a job's events are published and subscribed to.

``publish(event)`` appends one event to a job; ``subscribe(job_id, after)`` yields the job's
events with ``seq > after`` in order — no duplicate, no gap — and ends after the job's terminal
event; ``asubscribe`` is its asyncio twin, and ``astream`` adds heartbeats for a streaming
edge (the HTTP server). Two adapters:

- :class:`StoreBus` (the default): events live in the store beside the job, so a worker in one
  process publishes and a server in another streams. Subscribers are woken by the store's own
  change notification (``store.listen``); in an event loop through the listener's fd
  (``loop.add_reader``), or a short poll where the store has none. In one loop, all the
  subscribers of a job share one listener and one reader of the store, so a hundred clients
  of one job cost one store read per change, not a hundred.
- :class:`MemoryBus`: one process, no store; for tests of code that publishes or subscribes.

Why the stream can end exactly: the store writes a job's terminal event in the same transaction
as its terminal state, so a reader that sees a terminal *state* and then reads the events has
read them all.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass

from outlast.errors import InvalidInput, JobNotFound
from outlast.ids import check_id
from outlast.model import JSON, EventStatus, JobState, ProgressEvent, utcnow
from outlast.store.base import Listener, Store

#: Seconds between polls of a store whose listener has no fd to wait on.
POLL = 0.02
#: Seconds a quiet subscription waits before it re-checks that the job's worker still lives.
RECHECK = 1.0
#: Events one read of the store returns at most; a shared reader keeps this many in memory.
BATCH = 1000


@dataclass(frozen=True, slots=True)
class Progress:
    """An event to publish. The bus assigns ``seq`` and ``at``; ``progress`` (0-100) also
    updates the job's progress where the bus keeps job state (the store)."""

    job_id: str
    step: str
    status: EventStatus | str = EventStatus.PROGRESS
    message: JSON = None
    progress: float | None = None

    def __post_init__(self) -> None:
        check_id(self.job_id)
        if not isinstance(self.step, str) or not self.step:
            raise InvalidInput("step must be a non-empty string")
        try:
            status = EventStatus(self.status)
        except ValueError:
            known = ", ".join(s.value for s in EventStatus)
            raise InvalidInput(f"unknown event status {self.status!r}; one of {known}") from None
        object.__setattr__(self, "status", status)


class Bus(abc.ABC):
    """Where progress events go and where they are read back from."""

    @abc.abstractmethod
    def publish(self, event: Progress) -> ProgressEvent | None:
        """Append ``event`` to its job and wake the job's subscribers.

        Returns the stored event, or None when the job is already finished (nothing written).
        """

    @abc.abstractmethod
    def subscribe(
        self, job_id: str, after: int = 0, timeout: float | None = None
    ) -> Iterator[ProgressEvent]:
        """Yield the job's events with ``seq > after`` as they land, in order, and end after
        its terminal event (or quietly when ``timeout`` seconds have passed)."""

    async def asubscribe(self, job_id: str, after: int = 0) -> AsyncGenerator[ProgressEvent, None]:
        """:meth:`subscribe` for asyncio: never blocks the event loop. Closing the iterator
        (or cancelling its consumer) releases everything the subscription held."""
        async with contextlib.aclosing(self.astream(job_id, after)) as stream:
            async for batch in stream:
                for event in batch:
                    yield event

    @abc.abstractmethod
    def astream(
        self, job_id: str, after: int = 0, heartbeat: float | None = None
    ) -> AsyncGenerator[list[ProgressEvent], None]:
        """:meth:`asubscribe` in batches: the events that are there each time it looks (so a
        streaming edge writes them at once), and with ``heartbeat`` an empty batch each time
        that many seconds pass without an event (so it can keep its connection alive)."""


# --------------------------------------------------------------------------- the store
class AsyncListener:
    """An asyncio view of a store :class:`~outlast.store.Listener`: ``await wait(timeout)``.

    With an fd, the loop watches it (``add_reader``) and drains it on readiness; without one,
    ``wait`` is a short sleep and the caller re-checks. As with the listener itself: create it,
    check your condition, then wait — a change in between is not lost. ``close`` is synchronous
    so it can run in a ``finally`` of a cancelled task.
    """

    def __init__(self, listener: Listener, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._listener = listener
        self._loop = loop or asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._fd = listener.fileno()
        if self._fd is not None:
            self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        self._listener.drain()
        self._ready.set()

    async def wait(self, timeout: float) -> bool:
        """True when woken by a change (or when polling), False after ``timeout`` seconds."""
        if self._fd is None:
            await asyncio.sleep(min(timeout, POLL))
            return True
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return False
        self._ready.clear()
        return True

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        self._listener.close()


async def alisten(store: Store, job_ids: list[str] | None) -> AsyncListener:
    """``store.listen(job_ids)`` opened in a thread (it may do I/O), as an
    :class:`AsyncListener`. Cancelled meanwhile, the listener is closed when it lands."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, store.listen, job_ids)
    try:
        listener = await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_landed)
        raise
    return AsyncListener(listener, loop)


def _close_landed(future: asyncio.Future[Listener]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


class _Hub:
    """One job watched in one event loop, shared by all its subscribers there.

    A single task reads the store when the job changes and keeps a window of the job's events
    (contiguous seqs ``base+1 .. last``, at most ``2 * BATCH``). A subscriber that is behind the
    window reads the store itself until it has caught up.
    """

    def __init__(self, bus: StoreBus, job_id: str, start: int) -> None:
        self.bus, self.job_id = bus, job_id
        self.events: list[ProgressEvent] = []
        self.base = self.last = start
        self.ready = False  # the first read is done
        self.done = False  # the job is terminal (or gone) and every event is in the window
        self.error: BaseException | None = None
        self.users = 0
        self.changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"outlast-{job_id}")

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _read(
        self, after: int, recheck_due: bool
    ) -> tuple[JobState | None, int, list[ProgressEvent]]:
        """In a thread: the job's state, then its events after ``after`` (and the position
        they follow, which the first read may move back to 0)."""
        store, recheck = self.bus.store, self.bus.recheck
        try:
            state = store.get(self.job_id)
        except JobNotFound:
            if not self.ready:
                raise
            return None, after, []  # deleted while watched: the stream ends
        if recheck_due and recheck is not None and not state.terminal:
            state = recheck(state)
        if self.ready or after == 0:
            return state, after, store.events(self.job_id, after, BATCH)
        # The first read, from the first subscriber's position: check that event ``after``
        # exists, or a position past the job's end would leave the window beyond it for good.
        events = store.events(self.job_id, after - 1, BATCH + 1)
        if events and events[0].seq == after:
            return state, after, events[1:]
        return state, 0, store.events(self.job_id, 0, BATCH)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        watch: AsyncListener | None = None
        try:
            watch = await alisten(self.bus.store, [self.job_id])
            due = False
            checked = loop.time()
            while True:
                state, position, events = await loop.run_in_executor(
                    None, self._read, self.last, due
                )
                if position != self.last:  # the first subscriber started past the end
                    self.base = self.last = position
                if events:
                    self.events.extend(events)
                    self.last = events[-1].seq
                    if len(self.events) > 2 * BATCH:
                        drop = len(self.events) - BATCH
                        self.base = self.events[drop - 1].seq
                        del self.events[:drop]
                self.ready = True
                self.done = (state is None or state.terminal) and len(events) < BATCH
                self._notify()
                if self.done:
                    return
                if len(events) < BATCH:
                    await watch.wait(self.bus.recheck_every)
                # Re-check the worker at most once a period, and only while the job is quiet
                # (a change of another job of the same shard also wakes us).
                due = not events and loop.time() - checked >= self.bus.recheck_every
                if due:
                    checked = loop.time()
        except Exception as exc:
            self.error = exc
            self.done = self.ready = True
            self._notify()
        finally:
            if watch is not None:
                watch.close()


class StoreBus(Bus):
    """The bus over a store: durable, and shared by every process that opens the store.

    ``recheck(state) -> state`` is called for a non-terminal job that has been quiet (no new
    event) for ``recheck_every`` seconds, at most once a period; the HTTP edge passes the run
    layer's reconcile, so a stream of a job whose worker died ends with the job's true state
    instead of waiting for a write that will never come.

    A publisher without an attempt token uses :meth:`publish`; a worker reporting on a claimed
    :class:`~outlast.store.Task` reports through the task, whose writes are fenced.
    """

    def __init__(
        self,
        store: Store,
        recheck: Callable[[JobState], JobState] | None = None,
        recheck_every: float = RECHECK,
    ) -> None:
        self.store = store
        self.recheck = recheck
        self.recheck_every = recheck_every
        self._hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Hub]] = (
            weakref.WeakKeyDictionary()
        )

    def publish(self, event: Progress) -> ProgressEvent | None:
        task = self.store.open(event.job_id)
        return task.report(event.step, event.status, event.message, event.progress)

    def subscribe(
        self, job_id: str, after: int = 0, timeout: float | None = None
    ) -> Iterator[ProgressEvent]:
        check_id(job_id)
        _check_after(after)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.store.listen([job_id]) as listener:
            checked = time.monotonic()
            while True:
                state = self.store.get(job_id)
                now = time.monotonic()
                due = now - checked >= self.recheck_every
                if self.recheck is not None and not state.terminal and due:
                    state, checked = self.recheck(state), now
                events = self.store.events(job_id, after)
                yield from events
                if events:
                    after, checked = events[-1].seq, now
                if state.terminal:
                    return
                wait = self.recheck_every
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        return
                listener.wait(wait)

    async def astream(
        self, job_id: str, after: int = 0, heartbeat: float | None = None
    ) -> AsyncGenerator[list[ProgressEvent], None]:
        check_id(job_id)
        _check_after(after)
        loop = asyncio.get_running_loop()
        hubs = self._hubs.setdefault(loop, {})
        hub = hubs.get(job_id)
        if hub is None or hub.error is not None:  # a failed hub is not reused
            hub = hubs[job_id] = _Hub(self, job_id, after)
        hub.users += 1
        try:
            while True:
                if hub.error is not None:
                    raise hub.error
                changed = hub.changed
                if hub.ready and after < hub.base:
                    # Behind the shared window: catch up from the store directly.
                    batch = await loop.run_in_executor(
                        None, self.store.events, job_id, after, BATCH
                    )
                    if not batch:
                        return  # the job was deleted under us
                    after = batch[-1].seq
                    yield batch
                    continue
                if hub.ready and after < hub.last:
                    fresh = hub.events[after - hub.base :]
                    after = fresh[-1].seq
                    yield fresh
                    continue
                if hub.done:
                    return
                if not await _wait(changed, heartbeat):
                    yield []
        finally:
            hub.users -= 1
            if hub.users == 0:
                if hubs.get(job_id) is hub:
                    del hubs[job_id]
                hub.task.cancel()


async def _wait(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event``; False when ``timeout`` seconds passed first."""
    if timeout is None:
        await event.wait()
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _check_after(after: int) -> None:
    if not isinstance(after, int) or isinstance(after, bool) or after < 0:
        raise InvalidInput(f"after must be a whole number >= 0, not {after!r}")


# --------------------------------------------------------------------------- memory
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


__all__ = ["AsyncListener", "Bus", "MemoryBus", "Progress", "StoreBus", "alisten"]
