"""The ``LISTEN`` side of the PostgreSQL store: a listener that wakes a waiter on
``pg_notify`` of the channels it cares about, reconnecting after a lost connection."""

from __future__ import annotations

import contextlib
import os
import random
import time

import psycopg

from outlast.errors import StoreError
from outlast.store._pg import Conn, Connections, on_fork, orphan, socket_of, translated
from outlast.store.common import log

#: Seconds between looks while the server cannot be reached.
DISCONNECTED_POLL = 0.5


class PgListener:
    """Wakes a waiter on ``pg_notify`` of some channels. One thread at a time.

    ``wait`` returns True for a notification about one of ``jobs`` (any job when None) or on
    ``queue_channel`` or ``interrupt_channel``; ``fileno`` is the connection's socket for
    ``select()``. After a lost connection it reconnects and reports a wake-up (the caller
    re-checks what it waits for); while the server cannot be reached (a restart) ``fileno``
    is None, ``wait`` polls, and each ``wait`` or ``drain`` tries again, with backoff and
    jitter, up to every few seconds.
    """

    RETRY_MIN, RETRY_MAX = 0.1, 5.0

    def __init__(
        self,
        conns: Connections,
        channels: list[str],
        jobs: set[str] | None,
        queue_channel: str,
        interrupt_channel: str | None = None,
    ) -> None:
        self._conns, self._channels, self._jobs = conns, channels, jobs
        self._queue_channel, self._interrupt_channel = queue_channel, interrupt_channel
        self._pid = os.getpid()
        self._conn: Conn | None = None  # before anything can fail: __del__ reads it
        self._closed = False
        self._retry_at, self._delay = 0.0, self.RETRY_MIN
        #: See :class:`outlast.store.Listener`.
        self.interrupted = False
        self._subscribe()
        on_fork(self)

    def _subscribe(self) -> None:
        conn = self._conns.take_listener()
        try:
            with translated("listen"):
                conn.execute("; ".join(f'LISTEN "{c}"' for c in self._channels))
        except StoreError:
            conn.close()
            raise
        self._conn = conn

    def _live(self) -> Conn | None:
        """The connection, or None while the server cannot be reached."""
        if self._pid != os.getpid():
            raise StoreError("a postgresql store listener cannot be used across fork")
        if self._closed:
            raise StoreError("the listener is closed")
        if self._conn is None:
            self._try_subscribe()
        return self._conn

    def _try_subscribe(self) -> None:
        now = time.monotonic()
        if now < self._retry_at:
            return
        try:
            self._subscribe()
        except StoreError as exc:
            if self._delay == self.RETRY_MIN:
                log.warning("a listener cannot reconnect (%s); retrying with backoff", exc)
            self._retry_at = now + self._delay * (0.5 + random.random())
            self._delay = min(self._delay * 2, self.RETRY_MAX)
            return
        if self._delay > self.RETRY_MIN:
            log.warning("a listener reconnected")
        self._delay = self.RETRY_MIN

    def _relevant(self, note: psycopg.Notify) -> bool:
        if self._jobs is None or note.channel in (self._queue_channel, self._interrupt_channel):
            return True
        return note.payload in self._jobs

    def _reconnect(self, exc: psycopg.Error) -> None:
        log.warning("a listener lost its connection (%s); reconnecting", exc)
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._retry_at = 0.0
        self._try_subscribe()

    def _forget_after_fork(self) -> None:
        orphan(self._conn)
        self._conn = None

    def fileno(self) -> int | None:
        return socket_of(self._conn)

    def wait(self, timeout: float | None) -> bool:
        """Block until a relevant notification or ``timeout`` seconds; True when woken (or
        while the server cannot be reached, after a short poll: the caller re-checks).
        ``interrupted`` then says, as after :meth:`drain`, whether it was an interrupt."""
        self.interrupted = True
        conn = self._live()
        if conn is None:
            time.sleep(DISCONNECTED_POLL if timeout is None else min(timeout, DISCONNECTED_POLL))
            return True
        try:
            for note in conn.notifies(timeout=timeout):
                if self._relevant(note):
                    self.interrupted = note.channel == self._interrupt_channel
                    return True
        except psycopg.Error as exc:
            self._reconnect(exc)
            return True
        self.interrupted = False
        return False

    def drain(self) -> bool:
        """Consume the notifications that have arrived, without blocking; True when one said
        a job became claimable (or the connection was lost: the caller re-checks).
        ``interrupted`` says whether one came on the interrupt channel (or, the connection
        lost, that it cannot tell)."""
        self.interrupted = True
        conn = self._live()
        if conn is None:
            return True  # cannot tell: the caller looks
        claimable = interrupted = False
        try:
            for note in conn.notifies(timeout=0):
                claimable = claimable or note.channel == self._queue_channel
                interrupted = interrupted or note.channel == self._interrupt_channel
        except psycopg.Error as exc:
            self._reconnect(exc)
            return True
        self.interrupted = interrupted
        return claimable

    def drain_any(self) -> bool:
        """Consume what has arrived, without blocking; True when anything did (or the
        connection was lost: the caller re-checks)."""
        conn = self._live()
        if conn is None:
            return True
        try:
            return bool(list(conn.notifies(timeout=0)))
        except psycopg.Error as exc:
            self._reconnect(exc)
            return True

    def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            self._conns.give_listener(conn)

    def __del__(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._conn.close()

    def __enter__(self) -> PgListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
