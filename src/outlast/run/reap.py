"""Reconciling jobs whose worker died, and killing what such a worker left behind.

The store decides *whether* a job is abandoned (its worker lock is free) and writes its true
state; this layer adds what only processes can do: kill the leftover process group of a
command (identity checked by start time, so a reused PID is never signaled), start a new
supervisor for a command job that goes back to ``pending`` to retry, and start one again for
a command job whose supervisor died before taking it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from functools import partial

from outlast.ids import DEDICATED
from outlast.model import ErrorInfo, JobState, Kind, ProgressEvent, Status, utcnow
from outlast.store import Store, use_reconciler, worker_name
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
    command or spawned job, never took it: see :data:`STRANDED_AFTER`)."""
    if _stranded(state) and not store.worker_holds(state.id):
        log.warning("job %s: its worker never started it; starting another", state.id)
        return _restart(store, state)
    if not store.abandoned(state):
        return state
    if state.pid is not None and _same_host(state):
        from outlast.run import procs

        procs.kill_leftovers(state.pid, state.pid_started_at)
    after = store.reconcile(state)
    if after.status != Status.PENDING or after.worker is not None:
        return after
    return _restart(store, after)


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


def _restart(store: Store, after: JobState) -> JobState:
    """Restart the dedicated worker of a pending job nobody is bound to, where pools won't
    (two reconcilers may both start one: the second finds the job taken and exits)."""
    from outlast.run import spawn  # not at import: `outlast ls` and `status` rarely need it

    try:
        if after.kind == Kind.COMMAND:
            spawn.spawn_supervisor(store, after.id)
        elif after.queue == DEDICATED:
            spawn.spawn_dedicated(store, after.id)
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
