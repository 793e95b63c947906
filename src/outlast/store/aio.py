"""Asyncio over the store, for async apps (FastAPI, Starlette): nothing here blocks the
event loop.

Each store call runs in the loop's default executor (a short call: one read or one write);
waiting for a change is the store's listener watched by the loop (``loop.add_reader`` on its
fd; a short poll where it has none), with the rules of :mod:`outlast.store.follower` (a job
whose worker died is reconciled after a quiet second). ``Task.astate``, ``Task.await_done``
and ``Task.aevents`` are built on this; the progress bus (:mod:`outlast.bus`) uses its
listener too.

Why a thread offload rather than an async driver: the store's code (its transactions, its
fencing, its translation of errors) is written once and is the same for every caller; a
call costs one hop to a thread and back (0.1-0.3 ms on a busy 2-core machine, see
BENCHMARKS.md) on top of the store's own time, and the loop runs other work meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from outlast.store.follower import Follower, Update

if TYPE_CHECKING:
    from outlast.store.base import Listener, Store

#: Seconds between polls of a store whose listener has no fd to wait on.
POLL = 0.02
#: Seconds an unbounded wait sleeps at most before it looks again (a lost wake-up's net).
LONGEST_WAIT = 60.0

T = TypeVar("T")


async def offload(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the loop's default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


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
        self._fd: int | None = None
        self._draining = False
        self._closed = False
        self._failure: Exception | None = None
        self._watch()

    def _watch(self) -> None:
        """Watch the listener's current fd (a PostgreSQL listener gets a new one when it
        reconnects, and has none while the server cannot be reached)."""
        fd = None if self._closed else self._listener.fileno()
        if fd == self._fd:
            return
        if self._fd is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._fd)
        self._fd = fd
        if fd is not None:
            self._loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        # Drained in a thread: a listener that lost its connection reconnects in drain(),
        # which must not block the event loop. One drain at a time (one thread at a time).
        if self._draining:
            return
        self._draining = True
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        try:
            future = self._loop.run_in_executor(None, self._listener.drain)
        except Exception as exc:  # no thread for it (can't start one, the loop closing):
            self._draining = False  # this listener cannot go on; the next wait says so
            self._failure = exc
            self._ready.set()
            return
        future.add_done_callback(self._drained)

    def _drained(self, future: asyncio.Future[bool]) -> None:
        self._draining = False
        if not future.cancelled():
            future.exception()  # a failure is the next wait's to see; the caller re-checks
        self._ready.set()
        self._watch()

    async def wait(self, timeout: float) -> bool:
        """True when woken by a change (or when polling), False after ``timeout`` seconds.
        Raises what keeps the listener from going on (no thread to drain it in)."""
        self._check()
        if self._fd is None and not self._draining:
            await asyncio.sleep(min(timeout, POLL))
            self._on_readable()  # polling: drain (and maybe reconnect), then look
            self._check()
            return True
        if not self._ready.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
            except TimeoutError:
                return False
        self._check()
        self._ready.clear()
        return True

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._fd)
            self._fd = None
        if self._draining:  # a drain runs in a thread: close once it is done
            self._loop.call_soon(self._close_later)
        else:
            self._close_off_loop()

    def _close_later(self) -> None:
        if self._draining:
            self._loop.call_later(0.01, self._close_later)
        else:
            self._close_off_loop()

    def _close_off_loop(self) -> None:
        """Close the listener in a thread: a database listener's close is network I/O (its
        connection is given back or closed), which must not hold the loop."""
        try:
            self._loop.run_in_executor(None, self._listener.close)
        except RuntimeError:  # the loop is closing: close here
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


class Shared:
    """One :class:`AsyncListener` of ``store.listen(job_ids)`` shared by every waiter of one
    event loop that :meth:`join` s it: a thousand waiters cost one listener (one eventfd on
    a local store, one ``LISTEN`` connection on PostgreSQL), not one each. It is armed by
    the first to join, and closed when the last one leaves (armed again by the next).

    Each waiter's :meth:`Share.wait` says whether a change came since it joined or last
    woke; the waiter then looks at what it waits for itself. As with a listener of its own:
    join, check your condition, then wait — a change in between is not lost."""

    def __init__(self, store: Store, job_ids: list[str] | None) -> None:
        self.store, self.job_ids = store, job_ids
        self.users = 0
        self.error: BaseException | None = None
        self._watch: AsyncListener | None = None
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def join(self) -> Share:
        """A share; raises what arming the listener raised (``OSError`` out of descriptors,
        the store's error)."""
        async with self._lock:
            if self._watch is None:
                watch = await alisten(self.store, self.job_ids)
                self._watch, self.error, self._changed = watch, None, asyncio.Event()
                self._task = asyncio.get_running_loop().create_task(
                    self._run(watch), name="outlast-shared-listener"
                )
            self.users += 1
            return Share(self)

    @property
    def failed(self) -> bool:
        """The shared listener failed, and nobody armed it again since."""
        return self.error is not None and self._watch is None

    def _leave(self) -> None:
        self.users -= 1
        if self.users == 0 and self._watch is not None:
            self._stop()

    def _stop(self) -> None:
        watch, task, self._watch, self._task = self._watch, self._task, None, None
        if task is not None:
            task.cancel()
        if watch is not None:
            watch.close()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _run(self, watch: AsyncListener) -> None:
        try:
            while True:
                if await watch.wait(LONGEST_WAIT):
                    self._notify()
        except Exception as exc:  # every share raises it; the next join arms a new one
            if self._watch is watch:
                self.error = exc
                self._stop()
                self._notify()


class Share:
    """One waiter's share of a :class:`Shared` listener."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._event = shared._changed
        self._left = False

    async def wait(self, timeout: float) -> bool:
        """True once a change came since the join or the last wake-up, False after
        ``timeout`` seconds; raises the shared listener's failure."""
        event = self._event
        if not event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await event.wait()
            except TimeoutError:
                return False
        shared = self._shared
        if shared.failed:
            assert shared.error is not None
            raise shared.error
        self._event = shared._changed
        return True

    def close(self) -> None:
        """Leave (idempotent); the last to leave closes the listener."""
        if not self._left:
            self._left = True
            self._shared._leave()


def _close_landed(future: asyncio.Future[Listener]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()


async def afollow(
    store: Store,
    job_id: str,
    after: int = 0,
    timeout: float | None = None,
    *,
    events: bool = True,
    until: Callable[..., bool] | None = None,
) -> AsyncIterator[Update]:
    """:func:`outlast.store.follow` for asyncio: ``(state, new events)`` as the job changes,
    until it is terminal (or ``until(state)``) or ``timeout`` seconds have passed. The first
    update comes at once; an unknown job raises :class:`~outlast.JobNotFound` there."""
    deadline = None if timeout is None else time.monotonic() + timeout
    follower = Follower(
        store, job_id, after, reconcile=store._reconciler(), events=events, until=until
    )
    listener = await alisten(store, [job_id])
    try:
        while True:
            yield await offload(follower.read)
            if follower.done:
                return
            wait = follower.wait_for(deadline)
            if deadline is not None and time.monotonic() >= deadline:
                return
            await listener.wait(LONGEST_WAIT if wait is None else wait)
    finally:
        listener.close()


__all__ = ["AsyncListener", "Share", "Shared", "afollow", "alisten", "offload"]
