"""Reconciling jobs whose worker died, and killing what such a worker left behind.

The store decides *whether* a job is abandoned (its worker lock is free) and writes its true
state; this layer adds what only processes can do: kill the leftover process group of a
command (identity checked by start time, so a reused PID is never signaled), start a new
supervisor for a command job that goes back to ``pending`` to retry, and start one again for
a command job whose supervisor died before taking it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from functools import partial

from outlast.errors import OutlastError, WorkerLockHeld
from outlast.ids import DEDICATED
from outlast.model import ErrorInfo, JobState, Kind, ProgressEvent, Status, utcnow
from outlast.store import Store, Task, use_reconciler, worker_name
from outlast.store import follow as store_follow

log = logging.getLogger("outlast.reap")


def _same_host(state: JobState) -> bool:
    host = (state.worker or "").rpartition(":")[0]
    return not host or host == worker_name().rpartition(":")[0]


#: Seconds after which a command or spawned job that no worker ever took (its worker died
#: before its first write: a full disk) gets its worker started again by whoever looks.
STRANDED_AFTER = 5.0


def reconcile(store: Store, state: JobState) -> JobState:
    """Return the job's true state, reconciling it first if its worker is gone (or, for a
    command or spawned job, never took it: see :data:`STRANDED_AFTER`; one of a concurrency
    key is parked, and waits for its turn: :func:`start_parked`)."""
    if _stranded(state) and not store.worker_holds(state.id):
        if state.limit_key is not None:
            _look_at_parked(store, state.limit_key)
            return state
        log.warning("job %s: its worker never started it; starting another", state.id)
        return _restart(store, state)
    if not store.abandoned(state):
        return state
    if state.pid is not None and _same_host(state):
        from outlast.run import procs

        procs.kill_leftovers(state.pid, state.pid_started_at)
    after = store.reconcile(state)
    if state.limit_key is not None and state.status == Status.RUNNING:
        start_parked(store, state.limit_key)  # its slot is free
    if after.status != Status.PENDING or after.worker is not None:
        return after
    return _restart(store, after)


#: Seconds a process waits before it looks again at a key's parked jobs for a reader (a
#: listing of 50 parked jobs of one key looks once, not 50 times).
PARKED_LOOK_EVERY = 1.0
_parked_looks: dict[tuple[str, str], float] = {}


def _look_at_parked(store: Store, key: str) -> None:
    """What a reader of a parked job does where no maintainer may run, at most once a second
    per key in this process: start the workers of the key's parked jobs if it has a free
    slot (a hand-off lost with a worker killed at the wrong moment); else reconcile the
    key's running jobs whose workers died, which frees their slots and hands them on."""
    now = time.monotonic()
    if now < _parked_looks.get((store.url, key), 0.0):
        return
    _parked_looks[(store.url, key)] = now + PARKED_LOOK_EVERY
    if start_parked(store, key):
        return
    for state in _dead_holders(store).get(key, []):
        reconcile(store, state)


_dead_looks: dict[str, tuple[float, dict[str, list[JobState]]]] = {}


def _dead_holders(store: Store) -> dict[str, list[JobState]]:
    """The store's live jobs of a concurrency key whose workers are gone, by key: one look
    (:meth:`Store.abandoned_jobs`) a second per store in this process, however many keys
    its readers ask about. Empty when the store cannot say (the maintainer looks again)."""
    now = time.monotonic()
    seen = _dead_looks.get(store.url)
    if seen is not None and now < seen[0]:
        return seen[1]
    found: dict[str, list[JobState]] = {}
    try:
        for state in store.abandoned_jobs(thorough=True):
            if state.limit_key is not None:
                found.setdefault(state.limit_key, []).append(state)
    except OutlastError as exc:
        log.warning("cannot look for the jobs of dead workers: %s", exc)
    _dead_looks[store.url] = (now + PARKED_LOOK_EVERY, found)
    return found


def start_parked(store: Store, key: str) -> int:
    """Start the workers of the jobs of concurrency ``key`` that wait for a slot with none
    (:meth:`Store.parked`: as many as the key has free slots, in claim order); returns how
    many were started.

    Called wherever a slot may have freed: by a spawned job's worker once an attempt ended
    (a command's supervisor runs the next command itself: :func:`take_parked`), when a dead
    worker's job is reconciled, when a key's slots are set, by a pool whose jobs of the key
    ended (:class:`HandOffs`), and by the store's maintainer (the safety net: a worker
    killed before its hand-off). A worker started a moment ago that has not taken its job
    yet looks parked too, and may get a second worker: that one finds the job taken and
    exits. Never raises for the store: a failure is logged, and the maintainer looks again."""
    try:
        parked = store.parked(key)
    except OutlastError as exc:
        log.warning("cannot look for the parked jobs of %s: %s", key, exc)
        return 0
    return _start_workers(store, parked)


#: Seconds between a pool's looks for the parked jobs of its ended jobs' keys (see
#: :class:`HandOffs`): a look is one query, and a busy pool writes outcomes every few ms.
HAND_OFF_EVERY = 0.05


class HandOffs:
    """A pool's hand-off of concurrency slots to parked jobs. When a pool's job of a key
    ends (``outlast run --group G`` beside ``@job(limit_key=G)``), a slot of the key may
    have freed, and the key's next parked command or spawned job has no process to take it:
    the pool starts its worker (:func:`start_parked`), once the job's outcome is written.

    The keys of ended jobs are gathered and looked at together, at most every
    :data:`HAND_OFF_EVERY` seconds: one :meth:`Store.parked_keys` read (only keys that have
    parked jobs are read further), so a pool draining keyed jobs pays a query per 50 ms,
    not one per batch of outcomes. Jobs without a key cost nothing. Exact all the same: a
    look after the outcome is written sees every job parked before it (one parked later
    found the slot free and got its worker). A pool killed before its look leaves it to
    the store's maintainer. :meth:`ended` and :meth:`run` are called from one thread (the
    async pool's store thread); :meth:`due_at` only reads, from any."""

    def __init__(self, store: Store, every: float = HAND_OFF_EVERY) -> None:
        self.store, self.every = store, every
        self._keys: set[str] = set()
        self._next = 0.0  # monotonic: no look before then
        #: Workers started (for tests and benchmarks).
        self.started = 0

    def ended(self, tasks: list[Task]) -> None:
        """Note the keys of ``tasks``, whose outcomes were just written (or that a stopping
        pool gave back)."""
        for task in tasks:
            if task.snapshot is not None and task.snapshot.limit_key is not None:
                self._keys.add(task.snapshot.limit_key)

    def due_at(self) -> float | None:
        """The monotonic time of the next look, None when there is nothing to look at."""
        return max(self._next, time.monotonic()) if self._keys else None

    def run(self, force: bool = False) -> int:
        """Look now if it is time (or ``force``: a pool that stops); returns the workers
        started. Never raises for the store: a failure is logged, and the maintainer
        looks again."""
        now = time.monotonic()
        if not self._keys or (now < self._next and not force):
            return 0
        keys, self._keys, self._next = self._keys, set(), now + self.every
        try:
            waiting = keys.intersection(self.store.parked_keys())
        except OutlastError as exc:
            log.warning("cannot look for parked jobs: %s", exc)
            return 0
        started = sum(start_parked(self.store, key) for key in sorted(waiting))
        self.started += started
        return started


def _start_workers(store: Store, states: list[JobState]) -> int:
    """Start the worker of each of ``states``; returns how many were started (a failure is
    logged: the maintainer looks again)."""
    started = 0
    for state in states:
        try:
            started += start_worker(store, state)
        except OutlastError as exc:
            log.warning("job %s: cannot start its worker: %s", state.id, exc)
    return started


def take_parked(store: Store, key: str) -> str | None:
    """For a supervisor whose job of ``key`` ended: the first command job of those
    :func:`start_parked` would start, for it to run itself; the workers of the others are
    started. None when there is none."""
    try:
        parked = store.parked(key)
    except OutlastError as exc:
        log.warning("cannot look for the parked jobs of %s: %s", key, exc)
        return None
    mine = next((state for state in parked if state.kind == Kind.COMMAND), None)
    _start_workers(store, [state for state in parked if state is not mine])
    return None if mine is None else mine.id


def parked_at_start(store: Store, state: JobState) -> bool:
    """Whether a new command or spawned job waits parked: its concurrency key is full (or
    others of it come first), so no worker is started for it now; whoever frees a slot of
    the key starts one (:func:`start_parked`). A delayed job's worker is started at once, to
    wait for its time (one far ahead is the store's timer's:
    :func:`outlast.run.timer.parked_at_start`); a job without a key always gets its worker."""
    if state.limit_key is None or state.run_after is not None:
        return False
    return not its_turn(store, state.id, state.limit_key)


def its_turn(store: Store, job_id: str, key: str) -> bool:
    """Whether the parked job ``job_id`` is among those of ``key`` to start now (False
    too when the store cannot say: the maintainer then looks again)."""
    try:
        return any(state.id == job_id for state in store.parked(key))
    except OutlastError as exc:
        log.warning("cannot look for the parked jobs of %s: %s", key, exc)
        return False


def start_or_park(store: Store, task: Task, state: JobState) -> bool:
    """Start the due job as ``task``'s attempt (its own worker's, holding its lock); False if
    it is not pending any more (canceled, taken) or its concurrency key is full. Then the job
    is *parked*: the lock is let go and the worker should exit; a worker is started for it
    when a slot frees (:func:`start_parked`). A slot freed while the lock was let go is not
    missed: the key is looked at again afterwards, and the lock taken back if it is the job's
    turn."""
    while True:
        if task.start():
            return True
        now = store.get(state.id)
        if now.status != Status.PENDING or now.limit_key is None:
            return False
        task.release_worker_lock()
        log.info("job %s: its key %s is full; parked until a slot frees", state.id, now.limit_key)
        # Whoever freed a slot while the lock was held started the workers of the parked
        # jobs it saw, and skipped this one: it takes the job back if it is its turn.
        if not its_turn(store, state.id, now.limit_key):
            return False
        try:
            task.hold_worker_lock()
        except WorkerLockHeld:
            return False  # another worker was started for it meanwhile


def _stranded(state: JobState) -> bool:
    if state.status != Status.PENDING or state.worker is not None:
        return False
    if state.kind != Kind.COMMAND and state.queue != DEDICATED:
        return False  # a pool's to claim
    now = utcnow()
    since = state.updated_at  # its worker was started then, or woke at its time
    if state.run_after is not None:
        since = max(since, state.run_after)
    return (now - since).total_seconds() > STRANDED_AFTER


def start_worker(store: Store, state: JobState, wait: bool = False) -> bool:
    """Start the worker of a pending command or spawned job nobody is bound to; False if it
    could not be (the job then failed, saying why). ``wait``: the worker waits for the
    job's time however far ahead (the store's timer starts it early on purpose)."""
    return _restart(store, state, wait) is state


def _restart(store: Store, after: JobState, wait: bool = False) -> JobState:
    """Restart the dedicated worker of a pending job nobody is bound to, where pools won't
    (two reconcilers may both start one: the second finds the job taken and exits)."""
    from outlast.run import spawn  # not at import: `outlast ls` and `status` rarely need it

    try:
        if after.kind == Kind.COMMAND:
            spawn.spawn_supervisor(store, after.id, wait)
        elif after.queue == DEDICATED:
            spawn.spawn_dedicated(store, after.id, wait)
    except OSError as exc:  # nobody else would run it: say so on the job, not stranded
        error = ErrorInfo("error", f"cannot restart the job's worker: {exc}", type="OSError")
        return store.open(after.id).fail(error, retry=False)
    return after


def reconcile_all(store: Store, states: list[JobState]) -> list[JobState]:
    return [reconcile(store, s) for s in states]


def follow(
    store: Store, job_id: str, after: int = 0, timeout: float | None = None
) -> Iterator[tuple[JobState, list[ProgressEvent]]]:
    """Yield ``(state, new events)`` as the job changes, until it is terminal or ``timeout``:
    the store's one follower (:func:`outlast.store.follow`), reconciling through this layer, so
    a dead command's leftovers are killed and its retry gets a new supervisor."""
    return store_follow(store, job_id, after, timeout, reconcile=partial(reconcile, store))


def wait_for(
    store: Store, job_id: str, timeout: float | None = None, through_pause: bool = False
) -> JobState:
    """Block until the job is terminal or paused (unless ``through_pause``), or ``timeout``
    passes; returns its latest state (see :meth:`Store.wait`)."""
    return store.wait(
        job_id, timeout, reconcile=partial(reconcile, store), through_pause=through_pause
    )


def cancel(store: Store, job_id: str) -> tuple[JobState, JobState]:
    """Cancel a job; returns its state before and after.

    A live worker sees the cancel and stops the work itself. If the job's worker is already
    dead, what it left running on this machine is killed here.
    """
    before = store.get(job_id)
    dead = store.abandoned(before)
    after = store.open(job_id).cancel()
    if dead and before.pid is not None and _same_host(before):
        from outlast.run import procs

        procs.kill_leftovers(before.pid, before.pid_started_at)
    if after.status == Status.PENDING and after.queue == DEDICATED and after.worker is None:
        from outlast.run.spawn import spawn_dedicated  # a paused spawned pipeline's cleanup

        spawn_dedicated(store, job_id)
    return before, after


def resume(store: Store, job_id: str, answer: object = None) -> JobState:
    """Answer a paused job and queue it again; a spawned job gets a new dedicated worker
    (pools never claim those)."""
    state = store.open(job_id).resume(answer)
    if state.status == Status.PENDING and state.queue == DEDICATED and state.worker is None:
        from outlast.run.spawn import spawn_dedicated

        spawn_dedicated(store, job_id)
    return state


# Waits on the store (Store.wait, Store.watch) reconcile through this layer from now on.
use_reconciler(lambda store: partial(reconcile, store))
