"""Following one job until it ends: the one mechanism every waiter uses.

``Store.wait``/``watch``, the CLI's ``wait``/``watch``/``logs -f``, the bus (and through it
the HTTP server's streams), and a dedicated worker waiting out a retry's backoff all follow a
job the same way, written once here:

1. arm the store's listener (so a change between the check and the wait is not lost);
2. read the state, then the events after the last one seen (the terminal event is written in
   the same step as the terminal state, so a reader that sees a terminal state and then reads
   the events has them all);
3. stop once the job is terminal (or what the caller waits for holds), or the time is up;
4. else wait for the listener, at most until a pending job's ``run_after`` comes (it becomes
   due without anyone writing) and at most ``RECHECK`` seconds while a reconciler is given:
   a dead worker writes nothing that would wake us, so after a quiet period the job is
   reconciled (its worker lock is free: it goes to its true state).

:class:`Follower` holds steps 2-4 without the waiting itself, so that the asyncio edge
(:mod:`outlast.bus`) waits its own way and follows by the same rules.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from outlast.errors import StoreError
from outlast.ids import DEDICATED
from outlast.model import JobState, Kind, ProgressEvent, Status, utcnow
from outlast.store.common import log
from outlast.store.journal import STARTED

if TYPE_CHECKING:  # only for annotations: the store module imports this one
    from outlast.store.base import Reconciler, Store

#: Seconds a quiet follower waits before it asks the reconciler about the job's worker.
RECHECK = 1.0

Update = tuple[JobState, list[ProgressEvent]]


class Follower:
    """The rules of following one job (see the module docstring), without the waiting."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        after: int = 0,
        *,
        reconcile: Reconciler | None = None,
        until: Callable[[JobState], bool] | None = None,
        events: bool = True,
        batch: int | None = None,
        recheck: float = RECHECK,
    ) -> None:
        self.store, self.job_id, self.after = store, job_id, after
        self.reconcile, self.events, self.batch = reconcile, events, batch
        self.until = until or _terminal
        self.recheck = recheck
        #: The state seen by the last :meth:`read`.
        self.state: JobState | None = None
        #: True once the follower has seen all there is to see.
        self.done = False
        self.more = False
        self._quiet_since = time.monotonic()
        self._first = True

    def read(self) -> Update:
        """Step 2 and 3: the job's state and its new events. The job is reconciled at the
        first read, and whenever it has been quiet (no change of its state, no new event)
        for ``recheck`` seconds: a wake-up alone does not count, since other jobs' changes
        wake this follower too (a busy neighbour must not keep a dead job from being seen)."""
        now = time.monotonic()
        state = self.store.get(self.job_id)
        if self.state is not None and state.updated_at != self.state.updated_at:
            self._quiet_since = now
        due = self._first or now - self._quiet_since >= self.recheck
        if self.reconcile is not None and due and not state.terminal:
            state = self.reconcile(state)
            self._quiet_since = now
        self._first = False
        events: list[ProgressEvent] = []
        if self.events:
            events = self.store.events(self.job_id, self.after, self.batch)
            if events:
                self.after = events[-1].seq
                self._quiet_since = now
        self.state = state
        #: A full batch was read: there may be more events to read at once.
        self.more = self.batch is not None and len(events) >= self.batch
        self.done = self.until(state) and not self.more
        return state, events

    def wait_for(self, deadline: float | None) -> float | None:
        """Step 4: seconds to wait before the next read (None: until woken); 0 when the
        deadline (``time.monotonic()``) has passed."""
        waits: list[float] = []
        if deadline is not None:
            waits.append(deadline - time.monotonic())
        if self.reconcile is not None:
            waits.append(self._quiet_since + self.recheck - time.monotonic())
        state = self.state
        if state is not None and state.status == Status.PENDING and state.run_after is not None:
            due_in = (state.run_after - utcnow()).total_seconds()
            if due_in > 0:  # it becomes due without a write: look then (once due, a pool's
                waits.append(due_in + 0.001)  # claim is a write that wakes us)
        if self.more:
            waits.append(0.0)
        return max(0.0, min(waits)) if waits else None


def _terminal(state: JobState) -> bool:
    return state.terminal


def settled(state: JobState) -> bool:
    """What a waiter waits for: the job ended, or it is paused and waits for a person (a
    wait that went on would hang until somebody answers)."""
    return state.terminal or state.status == Status.PAUSED


#: Seconds a canceled job's worker gets, beyond its grace period, to stop the job's processes
#: and free its lock before a waiter stops waiting for that.
CANCEL_MARGIN = 5.0
#: The grace period of a job that does not carry one (pools stop a canceled job within it).
CANCEL_GRACE = 10.0
RELEASE_POLL = 0.02


def wait_released(store: Store, state: JobState, deadline: float | None = None) -> bool:
    """For a canceled job: wait until no process runs it any more (its supervisor, dedicated
    worker or pool has stopped what it ran), at most its grace period and
    :data:`CANCEL_MARGIN` (or until ``deadline``, ``time.monotonic()``). True once stopped."""
    bound = time.monotonic() + (state.grace or CANCEL_GRACE) + CANCEL_MARGIN
    if deadline is not None:
        bound = min(bound, deadline)
    while still_runs(store, state):
        if time.monotonic() >= bound:
            return False
        time.sleep(RELEASE_POLL)
    return True


def still_runs(store: Store, state: JobState) -> bool:
    """Whether a process still runs the job: one holds its worker lock (a supervisor, a
    dedicated worker, a PostgreSQL pool), or the journal of the live pool that claimed it
    (whose liveness lock covers its jobs on the local stores) says that its attempt's
    function was called and has not returned."""
    if store.worker_holds(state.id):
        return True
    if state.worker is None or state.kind == Kind.COMMAND or state.queue == DEDICATED:
        return False
    return store._worker_alive(state.worker) and store._fate(state) == STARTED


def follow(
    store: Store,
    job_id: str,
    after: int = 0,
    timeout: float | None = None,
    *,
    reconcile: Reconciler | None = None,
    until: Callable[[JobState], bool] | None = None,
    events: bool = True,
) -> Iterator[Update]:
    """Yield ``(state, new events)`` as the job changes, until ``until(state)`` (default: the
    job is terminal) or ``timeout`` seconds. The first update comes at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    follower = Follower(store, job_id, after, reconcile=reconcile, until=until, events=events)
    with store.listen([job_id]) as listener:
        while True:
            yield _read_through_outages(follower, deadline)
            if follower.done:
                return
            wait = follower.wait_for(deadline)
            if deadline is not None and time.monotonic() >= deadline:
                return
            listener.wait(wait)


def _read_through_outages(follower: Follower, deadline: float | None) -> Update:
    """:meth:`Follower.read`, riding out a store that fails for a while (a database
    restarting): tried again with backoff and jitter until it answers, or ``deadline``
    passes (then the store's error is raised)."""
    delay = 0.0
    while True:
        try:
            update = follower.read()
        except StoreError as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            if not delay:
                log.warning("following job %s: %s; retrying", follower.job_id, exc)
            delay = min(5.0, max(0.1, delay * 2))
            pause = delay * (0.5 + random.random())
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
            continue
        if delay:
            log.warning("following job %s: the store answers again", follower.job_id)
        return update


def wait_until_due(
    store: Store, job_id: str, unless: Callable[[JobState], bool] | None = None
) -> JobState | None:
    """Sleep until the pending job is due (its ``run_after`` passed), or ``unless(state)``
    (then that state is returned at once); None once it is not pending (canceled, deleted
    meanwhile, or claimed by someone else). For the job's own dedicated worker, which holds
    its lock: nothing to reconcile."""
    until = _due_or_gone if unless is None else lambda s: unless(s) or _due_or_gone(s)
    updates = follow(store, job_id, events=False, until=until)
    state = deque(updates, maxlen=1)[0][0]  # the last update's state
    return state if state.status == Status.PENDING else None


def _due_or_gone(state: JobState) -> bool:
    return state.status != Status.PENDING or state.run_after is None or state.run_after <= utcnow()
