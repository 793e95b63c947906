"""Server-Sent Events: a job's events, and the changes of the job list.

``GET /jobs/{id}/events`` — one SSE event per progress event: ``id:`` is its ``seq``, ``event:``
its status, ``data:`` the event JSON. It replays from the start, or after ``?after=N`` or the
``Last-Event-ID`` header (the larger wins: a browser reconnects with the header and the URL's
``after`` unchanged), and ends after the job's terminal event. An unknown job is a 404 before
the stream starts.

``GET /events`` — the dashboard's live list: ``event: ready`` once the stream is armed (fetch
the list then, and miss nothing), then ``event: job`` with the job document each time one of
the newest jobs changes.

Both send a ``: ping`` comment while quiet (every 15 s by default), and take the token as
``?token=`` as well as in the header, since EventSource cannot set headers. When the client goes
away, its subscription's listener and tasks are released at once.

The wire format is FastAPI's own (``fastapi.sse``: ``EventSourceResponse``,
``format_sse_event``, ``KEEPALIVE_COMMENT``), but the routes return the response with the
stream rather than being generators: FastAPI's generator path runs two extra tasks and two
memory streams per client and a cancel scope per message, which capped one server at a couple
of thousand messages a second; here a subscription writes straight to its connection, and an
event is encoded once for all the clients that receive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event
from starlette.responses import StreamingResponse

from outlast import config
from outlast.bus import Bus
from outlast.errors import InvalidInput, OutlastError
from outlast.http.deps import ExistingJob
from outlast.model import JobState, ProgressEvent
from outlast.store import Store
from outlast.store.aio import Share, Shared

log = logging.getLogger("outlast.http")

#: Seconds between keep-alive comments on a quiet stream.
HEARTBEAT = 15.0
#: Jobs the live list watches: the newest this many.
LIST_WINDOW = 200
#: Seconds a burst of changes is gathered before the list is read again.
LIST_COALESCE = 0.1
#: Seconds between re-checks of the listed jobs' workers while nothing changes.
LIST_RECHECK = 5.0
#: Encoded events kept for the other clients of the same job.
ENCODED_CACHE = 4096

HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Documented(StreamingResponse):
    """For the OpenAPI document only: FastAPI runs any route declared with
    ``response_class=EventSourceResponse`` as a generator, so the routes declare this and
    return an ``EventSourceResponse`` themselves."""

    media_type = "text/event-stream"


STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "a text/event-stream; see the route's description",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

TokenQuery = Annotated[
    str | None,
    Query(
        description="the bearer token, for EventSource clients, which cannot set headers; "
        "only the streaming routes accept it here"
    ),
]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class _Encoded:
    """The SSE bytes of recent events, so a hundred clients of a job cost one encoding."""

    def __init__(self, size: int = ENCODED_CACHE) -> None:
        self._size = size
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def __call__(self, event: ProgressEvent) -> bytes:
        key = (event.job_id, event.seq)
        data = self._cache.get(key)
        if data is None:
            data = format_sse_event(
                data_str=_dumps(event.to_dict()), event=str(event.status), id=str(event.seq)
            )
            self._cache[key] = data
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return data


def replay_after(
    after: Annotated[
        int | None,
        Query(ge=0, le=2**62, description="send only the events with seq greater than this"),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(alias="Last-Event-ID", description="the last seq received, on reconnect"),
    ] = None,
) -> int:
    """Where a stream starts: after the larger of ``?after`` and ``Last-Event-ID``."""
    start = after or 0
    if last_event_id is not None and last_event_id.strip():
        value = last_event_id.strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 18):
            raise InvalidInput(f"Last-Event-ID must be an event seq (a number), not {value!r}")
        start = max(start, int(value))
    return start


class TooManyStreams(Exception):
    """A stream over the server's or the client's cap: answered 503 with Retry-After."""


#: Descriptors counted per stream: its socket, and as much again for the connections being
#: answered meanwhile (a crowd refused with 503s holds one each until it is told). The list
#: streams share one listener (:class:`~outlast.store.aio.Shared`), and the job streams one
#: per shard of jobs (:mod:`outlast.bus`), so a stream holds nothing else of its own
#: (measured: 2,000 connections, 1,000 of them streams, peak at 2,051 descriptors).
FDS_PER_STREAM = 2
#: Descriptors kept free of streams: the store, its pulse files and shared listeners, the
#: logs, plain requests, the maintainer...
FD_RESERVE = 128
#: ... and, for each thread that may read the store (a SQLite connection each: the database,
#: its WAL and its shared memory), this many.
FDS_PER_THREAD = 3
#: The threads of the request pool (anyio's default) that run the plain routes.
REQUEST_THREADS = 40


def fd_reserve() -> int:
    """The descriptors kept free of streams: :data:`FD_RESERVE`, and room for a store
    connection in every thread of the request pool and of the loop's default executor."""
    executor_threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    return FD_RESERVE + FDS_PER_THREAD * (REQUEST_THREADS + executor_threads)


def fd_budget() -> int:
    """How many streams this process's descriptor limit (``RLIMIT_NOFILE``) can hold beside
    its reserve: the total cap is lowered to it, so streams past it get a 503, not a
    server out of descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (soft - fd_reserve()) // FDS_PER_STREAM)


class Streams:
    """Counts the open streams, in all and per client address, and refuses one past either
    cap, so no client (or crowd) can take every descriptor of the server or its store."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = min(total, fd_budget()), per_client
        self.open = 0
        self.by_client: dict[str, int] = {}

    def take(self, client: str) -> Callable[[], None]:
        """Count a new stream of ``client``; returns its idempotent release."""
        if self.open >= self.total:
            raise TooManyStreams(f"the server has {self.open} streams open, its most")
        if self.by_client.get(client, 0) >= self.per_client:
            raise TooManyStreams(f"{client} has {self.per_client} streams open, the most")
        self.open += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.open -= 1
                left = self.by_client[client] - 1
                if left:
                    self.by_client[client] = left
                else:
                    del self.by_client[client]

        return release


async def _counted(body: AsyncIterator[bytes], release: Callable[[], None]) -> AsyncIterator[bytes]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        release()


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _stream(body: AsyncIterator[bytes], release: Callable[[], None]) -> EventSourceResponse:
    """The response of a stream counted by ``release``'s :meth:`Streams.take`."""
    counted = _counted(body, release)
    # a response dropped before it started still counts: released on the loop, since the
    # collector may find it in any thread, and the count and the listener are the loop's
    weakref.finalize(counted, _on_loop, asyncio.get_running_loop(), release)
    return EventSourceResponse(counted, headers=HEADERS)


def _on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
    """``call()`` in ``loop``'s thread: now if this is it (or the loop is gone), else soon."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop or loop.is_closed():
        call()
        return
    try:
        loop.call_soon_threadsafe(call)
    except RuntimeError:  # closed meanwhile
        call()


def _once(*calls: Callable[[], None]) -> Callable[[], None]:
    """``calls`` made in order, the first time the returned function is called only; each
    is made even if one before it raised."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            with contextlib.ExitStack() as stack:  # runs every one, raises the first error
                for call in reversed(calls):
                    stack.callback(call)

    return run


def _out_of_descriptors(exc: OSError) -> TooManyStreams:
    """A stream that could not be armed for want of descriptors (``EMFILE``): a 503, not a
    200 whose stream ends at once. Any other ``OSError`` is not this, and is raised."""
    if exc.errno not in (errno.EMFILE, errno.ENFILE):
        raise exc
    log.warning("refused a stream: the server is out of file descriptors (%s)", exc.strerror)
    return TooManyStreams("the server is out of file descriptors for more streams")


def router(
    store: Store,
    bus: Bus,
    recheck: Callable[[JobState], JobState],
    responses: dict[int | str, dict[str, Any]],
    heartbeat: float = HEARTBEAT,
    streams: Streams | None = None,
) -> APIRouter:
    """The streaming routes over ``store`` and ``bus``; ``streams`` caps them."""
    routes = APIRouter(tags=["events"])
    encode = _Encoded()
    streams = streams or Streams(config.max_streams(), config.max_streams_per_client())
    # every list stream of a loop shares one listener of all jobs (see Shared)
    watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Shared] = (
        weakref.WeakKeyDictionary()
    )

    @routes.get(
        "/jobs/{job_id}/events",
        response_class=_Documented,
        response_model=None,
        responses={**STREAM_DOC, **responses},
        summary="Stream a job's events (Server-Sent Events)",
    )
    async def job_events(
        request: Request,
        state: ExistingJob,
        start: Annotated[int, Depends(replay_after)],
        token: TokenQuery = None,
    ) -> EventSourceResponse:
        """The job's events after ``start``, then live; the stream ends after the job's
        terminal event. Each is ``id: <seq>``, ``event: <status>``, ``data: <event JSON>``.
        503 (with ``Retry-After``) past the server's or the client's cap on open streams."""
        release = streams.take(_client(request))
        try:  # armed before the answer: a stream that cannot be is a 503, not a 200 cut short
            armed = await bus.arm(state.id)
        except OSError as exc:
            release()
            raise _out_of_descriptors(exc) from None
        except BaseException:
            release()
            raise
        let_go = _once(armed, release)  # whether the stream ran or was never started
        return _stream(_job_stream(bus, encode, state.id, start, heartbeat), let_go)

    @routes.get(
        "/events",
        response_class=_Documented,
        response_model=None,
        responses={**STREAM_DOC, **responses},
        summary="Stream changes of the newest jobs (Server-Sent Events)",
    )
    async def job_changes(request: Request, token: TokenQuery = None) -> EventSourceResponse:
        """``event: ready`` once armed, then ``event: job`` (the job document) per change.
        503 (with ``Retry-After``) past the server's or the client's cap on open streams."""
        release = streams.take(_client(request))
        try:  # armed before the answer: a stream that cannot be is a 503, not a 200 cut short
            loop = asyncio.get_running_loop()
            shared = watches.get(loop)
            if shared is None:
                shared = watches[loop] = Shared(store, None)
            watch, listed = await _arm_changes(store, shared)
        except BaseException:
            release()
            raise
        let_go = _once(watch.close, release)  # whether the stream ran or was never started
        return _stream(_changes(store, recheck, heartbeat, watch, listed), let_go)

    return routes


async def _job_stream(
    bus: Bus, encode: Callable[[ProgressEvent], bytes], job_id: str, start: int, heartbeat: float
) -> AsyncIterator[bytes]:
    try:
        async with contextlib.aclosing(bus.astream(job_id, start, heartbeat)) as batches:
            async for batch in batches:
                yield b"".join(map(encode, batch)) if batch else KEEPALIVE_COMMENT
    except (OutlastError, OSError) as exc:  # the store failed, or no descriptor was left to
        # watch it: the stream ends, and the log says why in one line
        log.warning("stream of job %s ended early: %s", job_id, exc)


async def _arm_changes(store: Store, shared: Shared) -> tuple[Share, list[JobState]]:
    """The list stream's share of the shared listener, joined, and the list read after it
    (so nothing is missed between them). Out of descriptors: :class:`TooManyStreams`; the
    store failing: its error (a 503 or a 409, as for any request)."""
    loop = asyncio.get_running_loop()
    try:
        watch = await shared.join()
    except OSError as exc:
        raise _out_of_descriptors(exc) from None
    try:
        listed = await loop.run_in_executor(None, _newest, store, None)
    except OSError as exc:
        watch.close()
        raise _out_of_descriptors(exc) from None
    except BaseException:
        watch.close()
        raise
    return watch, listed


async def _changes(
    store: Store,
    recheck: Callable[[JobState], JobState],
    heartbeat: float,
    watch: Share,
    listed: list[JobState],
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    try:
        seen = {s.id: s.updated_at for s in listed}
        yield format_sse_event(event="ready", data_str=_dumps({"window": LIST_WINDOW}), retry=2000)
        quiet_since = loop.time()
        while True:
            woken = await watch.wait(min(LIST_RECHECK, heartbeat))
            if woken:
                await asyncio.sleep(LIST_COALESCE)
            elif loop.time() - quiet_since >= heartbeat:
                quiet_since = loop.time()
                yield KEEPALIVE_COMMENT
            states = await loop.run_in_executor(None, _newest, store, None if woken else recheck)
            for state in reversed(states):  # oldest first, so the newest lands on top
                if seen.get(state.id) != state.updated_at:
                    quiet_since = loop.time()
                    yield format_sse_event(event="job", data_str=_dumps(state.to_dict()))
            seen = {s.id: s.updated_at for s in states}
    except OutlastError as exc:
        log.warning("job list stream ended early: %s", exc)
    except OSError as exc:  # out of descriptors mid-stream: the stream ends, said in one line
        log.warning("job list stream ended early: %s", exc)


def _newest(store: Store, recheck: Callable[[JobState], JobState] | None) -> list[JobState]:
    states = store.list(limit=LIST_WINDOW)
    if recheck is not None:
        states = [s if s.terminal else recheck(s) for s in states]
    return states
