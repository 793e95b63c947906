"""The progress bus: a port where a job's events are published and subscribed to.

``publish(event)`` appends one event to a job; ``subscribe(job_id, after)`` yields the job's
events with ``seq > after`` in order — no duplicate, no gap — and ends after the job's terminal
event; ``asubscribe`` is its asyncio twin, and ``astream`` adds heartbeats for a streaming
edge (the HTTP server).

:class:`StoreBus` is the adapter: events live in the store beside the job, so a worker in one
process publishes and a server in another streams. Subscribers follow the job with the store's
one follower (:mod:`outlast.store.follower`: woken by the store's notification, reconciling a
job whose worker died); in an event loop through the listener's fd (``loop.add_reader``), or a
short poll where the store has none. In one loop, all the subscribers of a job share one
listener and one reader of the store, so a hundred clients of one job cost one store read per
change, not a hundred. (The tests have an in-memory adapter of their own.)

Why the stream can end exactly: the store writes a job's terminal event in the same transaction
as its terminal state, so a reader that sees a terminal *state* and then reads the events has
read them all.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass

from outlast.errors import InvalidInput, JobNotFound
from outlast.ids import check_id
from outlast.model import JSON, EventStatus, JobState, ProgressEvent
from outlast.store import Follower, Store, follow
from outlast.store.aio import AsyncListener, Share, Shared, alisten

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

    async def arm(self, job_id: str) -> Callable[[], None]:
        """Ready what a stream of ``job_id`` will need (a listener), before a streaming edge
        answers: what cannot be had is raised then (``OSError`` out of descriptors), not
        after a 200. Returns its release, to call once the stream is over. Nothing to ready
        here."""
        return _nothing


def _nothing() -> None:
    pass


# --------------------------------------------------------------------------- the store
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
        self.follower = Follower(
            bus.store,
            job_id,
            start,
            reconcile=bus.recheck,
            batch=BATCH,
            recheck=bus.recheck_every,
        )
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"outlast-{job_id}")

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _read(self) -> tuple[int, bool, list[ProgressEvent]]:
        """In a thread: the follower's next read, as ``(position it read after, done, new
        events)``. The first read starts from the first subscriber's position if event
        ``after`` exists (a position past the job's end would leave the window beyond it for
        good), else from 0."""
        follower = self.follower
        if not self.ready and follower.after > 0:
            first = self.bus.store.events(self.job_id, follower.after - 1, 1)
            if not first or first[0].seq != follower.after:
                follower.after = 0
        start = follower.after
        try:
            _, events = follower.read()
        except JobNotFound:
            if not self.ready:
                raise
            return start, True, []  # deleted while watched: the stream ends
        return start, follower.done, events

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        watch: Share | None = None
        try:
            watch = await self.bus._share(self.job_id)
            while True:
                start, done, events = await loop.run_in_executor(None, self._read)
                if start != self.last:  # the first subscriber started past the end
                    self.base = self.last = start
                if events:
                    self.events.extend(events)
                    self.last = events[-1].seq
                    if len(self.events) > 2 * BATCH:
                        drop = len(self.events) - BATCH
                        self.base = self.events[drop - 1].seq
                        del self.events[:drop]
                self.ready = True
                self.done = done
                self._notify()
                if done:
                    return
                wait = self.follower.wait_for(None)
                await watch.wait(self.bus.recheck_every if wait is None else wait)
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
        # by loop, then by listen key; a listener nobody shares any more is let go
        self._shared: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, weakref.WeakValueDictionary[str, Shared]
        ] = weakref.WeakKeyDictionary()

    async def _share(self, job_id: str) -> Share:
        """A share of the listener of the job's key (:meth:`Store.listen_key`): the hubs of
        all the jobs of one shard share one listener, so a server streaming a thousand jobs
        holds one listener per shard (16 on the local stores and PostgreSQL), not one per
        job. A hub woken for another job of its shard reads nothing new, and waits again."""
        loop = asyncio.get_running_loop()
        shared = self._shared.setdefault(loop, weakref.WeakValueDictionary())
        key = self.store.listen_key(job_id)
        one = shared.get(key)
        if one is None:
            one = shared[key] = Shared(self.store, [job_id])
        return await one.join()

    async def arm(self, job_id: str) -> Callable[[], None]:
        """The listener of the job's shard, joined (and armed, if no stream had it yet)."""
        share = await self._share(job_id)
        return share.close

    def publish(self, event: Progress) -> ProgressEvent | None:
        task = self.store.open(event.job_id)
        return task.report(event.step, event.status, event.message, event.progress)

    def subscribe(
        self, job_id: str, after: int = 0, timeout: float | None = None
    ) -> Iterator[ProgressEvent]:
        check_id(job_id)
        _check_after(after)
        updates = follow(self.store, job_id, after, timeout, reconcile=self.recheck)
        return (event for _, events in updates for event in events)

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


__all__ = ["AsyncListener", "Bus", "Progress", "StoreBus", "alisten"]
