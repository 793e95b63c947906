"""Reconciling jobs whose worker died, and killing what such a worker left behind.

The store decides *whether* a job is abandoned (its worker lock is free) and writes its true
state; this layer adds what only processes can do: kill the leftover process group of a
command (identity checked by start time, so a reused PID is never signaled) and start a new
supervisor for a command job that goes back to ``pending`` to retry.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from outlast.model import JobState, Kind, ProgressEvent, Status
from outlast.store import Store, worker_name


def _same_host(state: JobState) -> bool:
    host = (state.worker or "").rpartition(":")[0]
    return not host or host == worker_name().rpartition(":")[0]


def reconcile(store: Store, state: JobState) -> JobState:
    """Return the job's true state, reconciling it first if its worker is gone."""
    if not store.abandoned(state):
        return state
    if state.pid is not None and _same_host(state):
        from outlast.run import procs

        procs.kill_leftovers(state.pid, state.pid_started_at)
    after = store.reconcile(state)
    if after.status != Status.PENDING or after.worker is not None:
        return after
    # Back to pending with nobody bound to it: restart a dedicated worker where pools won't
    # (two reconcilers may both start one: the second finds the worker lock held and exits).
    if after.kind == Kind.COMMAND:
        from outlast.run.spawn import spawn_supervisor

        spawn_supervisor(store, after.id)
    elif after.queue == "@dedicated":
        from outlast.run.api import spawn_dedicated

        spawn_dedicated(store, after.id)
    return after


def reconcile_all(store: Store, states: list[JobState]) -> list[JobState]:
    return [reconcile(store, s) for s in states]


RECHECK = 1.0  # seconds between checks that the worker of a job being waited on still lives


def follow(
    store: Store, job_id: str, after: int = 0, timeout: float | None = None
) -> Iterator[tuple[JobState, list[ProgressEvent]]]:
    """Yield ``(state, new events)`` as the job changes, until it is terminal or ``timeout``.

    Woken by the store's notification; every second it also checks that the job's worker is
    alive, and reconciles the job if not (a dead worker writes nothing that would wake us).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    with store.listen([job_id]) as listener:
        state = reconcile(store, store.get(job_id))
        while True:
            events = store.events(job_id, after)
            if events:
                after = events[-1].seq
            yield state, events
            if state.terminal:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            woken = listener.wait(RECHECK if remaining is None else min(remaining, RECHECK))
            state = store.get(job_id)
            if not woken:
                state = reconcile(store, state)


def wait_for(store: Store, job_id: str, timeout: float | None = None) -> JobState:
    """Block until the job is terminal or ``timeout`` passes; returns its latest state."""
    state = store.get(job_id)
    for update in follow(store, job_id, after=1 << 62, timeout=timeout):
        state = update[0]
    return state


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
    return before, after


def resume(store: Store, job_id: str, answer: object = None) -> JobState:
    """Answer a paused job and queue it again; a spawned job gets a new dedicated worker
    (pools never claim those)."""
    state = store.open(job_id).resume(answer)
    if state.status == Status.PENDING and state.queue == "@dedicated" and state.worker is None:
        from outlast.run.api import spawn_dedicated

        spawn_dedicated(store, job_id)
    return state
