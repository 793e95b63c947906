"""The store port: DESIGN.md's contract, implemented once over a small adapter interface.

An adapter (sqlite, files, postgresql) implements the underscored methods: insert a state, read
one, *modify* one atomically (read, apply a pure transition from :mod:`outlast.machine`, write
the state and its events in one lock or transaction), select, remove, claim, read events, take
and probe worker locks, and wake waiters. Everything a user calls is written here, once.
"""

from __future__ import annotations

import abc
import builtins
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from outlast import config, machine
from outlast.errors import CorruptJob, InvalidInput, JobNotFound, WorkerLockHeld
from outlast.ids import check_id, check_queue, new_id
from outlast.machine import Change
from outlast.model import (
    JSON,
    ErrorInfo,
    EventStatus,
    JobState,
    Kind,
    ProgressEvent,
    Status,
    clamp_progress,
    utcnow,
)

Transition = Callable[[JobState], Change | None]
_LIVE_LOCK = threading.RLock()
_log = logging.getLogger("outlast.store")


@dataclass(frozen=True)
class Capabilities:
    """What an adapter can do; workers and watchers read these instead of checking types."""

    #: Writers wake waiters (``listen``) within milliseconds, so nobody needs to poll.
    pushes_notifications: bool
    #: Workers on several machines may share the store.
    spans_hosts: bool
    #: Logs live as files on this machine (``log_path``).
    local_logs: bool = True


class Listener(Protocol):
    """Wakes a waiter when the store changes. Arm it, check your condition, then ``wait``."""

    def wait(self, timeout: float | None) -> bool: ...
    def fileno(self) -> int | None: ...
    def drain(self) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Listener: ...
    def __exit__(self, *exc: object) -> None: ...


def worker_name() -> str:
    """``host:pid`` of this process: how a job names the process that holds it."""
    return f"{os.uname().nodename}:{os.getpid()}"


def parse_label(label: str | Mapping[str, str] | None) -> dict[str, str]:
    """Labels to filter on, from ``"k=v"`` or a mapping; raises :class:`InvalidInput`."""
    if label is None:
        return {}
    if isinstance(label, str):
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise InvalidInput(f"a label filter is key=value, not {label!r}")
        return {key: value}
    return check_labels(label)


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    labels = dict(labels or {})
    for key, value in labels.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise InvalidInput(f"labels are non-empty str keys (no '=') to str values: {key!r}")
    return labels


class Store(abc.ABC):
    """Where jobs and their events live. Thread-safe; open one per process (not across fork)."""

    capabilities: Capabilities
    url: str

    # ----------------------------------------------------------------- the public contract
    def create(
        self,
        *,
        kind: Kind | str = Kind.COMMAND,
        name: str | None = None,
        command: builtins.list[str] | None = None,
        labels: Mapping[str, str] | None = None,
        queue: str = "default",
        payload: dict[str, Any] | None = None,
        max_attempts: int = 1,
        run_after: datetime | None = None,
    ) -> Task:
        """Record a new pending job and return its handle."""
        try:
            kind = Kind(kind)
        except ValueError:
            raise InvalidInput(f"kind is command, function or pipeline, not {kind!r}") from None
        if command is not None and (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise InvalidInput("command must be a non-empty list of strings")
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise InvalidInput(f"max_attempts must be a whole number >= 1, not {max_attempts!r}")
        if queue != "@dedicated":  # the queue of spawned jobs, which pools never claim
            check_queue(queue)
        if payload is not None and not isinstance(payload, dict):
            raise InvalidInput("payload must be a JSON object")
        now = utcnow()
        state = JobState(
            id=new_id(),
            kind=kind,
            name=name or (command[0] if command else str(kind)),
            command=list(command) if command else None,
            labels=check_labels(labels),
            queue=queue,
            payload=machine.check_json(payload or {}, "payload"),
            max_attempts=max_attempts,
            run_after=run_after,
            created_at=now,
            updated_at=now,
        )
        self._insert(state)
        self._pulse(state.id, claimable=True)
        return Task(self, state.id)

    def open(self, job_id: str) -> Task:
        """A handle to an existing job (the id is checked now, existence on first use)."""
        return Task(self, check_id(job_id))

    def get(self, job_id: str) -> JobState:
        """The job's state; :class:`JobNotFound` or :class:`CorruptJob` naming the job."""
        return self._read(check_id(job_id))

    def list(
        self,
        status: Status | str | None = None,
        label: str | Mapping[str, str] | None = None,
        limit: int | None = 100,
        before: str | None = None,
    ) -> builtins.list[JobState]:
        """Jobs newest first, filtered; ``before`` is the last id of the previous page.

        A corrupt job is skipped with a warning (logged) instead of failing the listing.
        """
        if status is not None:
            try:
                status = Status(status)
            except ValueError:
                known = ", ".join(s.value for s in Status)
                raise InvalidInput(f"unknown status {status!r}; one of {known}") from None
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be a whole number >= 1, not {limit!r}")
        if before is not None:
            check_id(before)
        return self._select(status, parse_label(label), limit, before)

    def delete(self, job_id: str, force: bool = False) -> None:
        """Remove the job, its events, lock and log. Refuses a live job without ``force``."""
        self._remove(check_id(job_id), force)

    def abandoned(self, state: JobState) -> bool:
        """True when the job is not finished and nobody holds its worker lock any more.

        A running job, or a pending one waiting for its dedicated worker's retry, whose worker
        lock is free was left behind by a dead worker. A job nobody has started is never
        abandoned, nor is a paused one.
        """
        if state.status == Status.RUNNING or (
            state.status == Status.PENDING and state.worker is not None
        ):
            return not self._lock_held(state.id) and not self._worker_alive(state.worker)
        return False

    def reconcile(self, state: JobState) -> JobState:
        """Turn an abandoned job into its true state (``pending`` to retry, or ``failed``).

        Re-checked inside the write, so a job that a live worker claimed meanwhile is left as
        it is. Returns the state after reconciling.
        """

        def apply(current: JobState) -> Change | None:
            if not self.abandoned(current):
                return None
            return machine.abandon(current, utcnow())

        return self._modify(state.id, apply)[0]

    def claim(
        self,
        worker: str | None = None,
        limit: int = 1,
        queues: builtins.list[str] | None = None,
        kinds: builtins.list[Kind] | None = None,
    ) -> builtins.list[Task]:
        """Atomically take up to ``limit`` due pending jobs of ``queues`` and ``kinds``, oldest
        first, as this process (``worker`` may only name it).

        Two claimers never get the same job. The jobs stay alive while this process lives: on
        the local stores its liveness lock covers them, on PostgreSQL each task holds an
        advisory lock (drop it with ``release_worker_lock`` once the outcome is written). Each
        task carries its attempt token, so its writes are refused once it loses the job.
        """
        if limit < 1:
            raise InvalidInput("limit must be >= 1")
        me = worker_name()
        if worker not in (None, me):
            raise InvalidInput(f"a claim is made as this process ({me}), not {worker!r}")
        self._live()
        claimed = self._claim(me, limit, queues, kinds, utcnow())
        return [Task(self, s.id, attempt=s.attempts, lock=lock, snapshot=s) for s, lock in claimed]

    def events(
        self, job_id: str, after: int = 0, limit: int | None = None
    ) -> builtins.list[ProgressEvent]:
        """The job's events with ``seq > after``, in order."""
        check_id(job_id)
        if not isinstance(after, int) or after < 0:
            raise InvalidInput(f"after must be a whole number >= 0, not {after!r}")
        return self._events(job_id, after, limit)

    def watch(
        self, job_id: str, after: int = 0, timeout: float | None = None
    ) -> Iterator[ProgressEvent]:
        """Yield the job's events after ``after`` as they land; end after the terminal one.

        Woken by the store's notification; ``timeout`` (seconds) bounds the whole wait and
        ends the iteration quietly when it runs out. A bad id or an unknown job raises here,
        before iteration starts.
        """
        self.get(job_id)
        return self._watch(job_id, after, timeout)

    def _watch(self, job_id: str, after: int, timeout: float | None) -> Iterator[ProgressEvent]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.listen([job_id]) as listener:
            while True:
                state = self.get(job_id)
                events = self.events(job_id, after)
                yield from events
                if events:
                    after = events[-1].seq
                if state.terminal:
                    final = self.events(job_id, after)
                    yield from final
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                listener.wait(remaining)

    def wait(self, job_id: str, timeout: float | None = None) -> JobState:
        """Block until the job is terminal (or ``timeout``); returns its latest state."""
        check_id(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.listen([job_id]) as listener:
            while True:
                state = self.get(job_id)
                if state.terminal:
                    return state
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return state
                listener.wait(remaining)

    def log_path(self, job_id: str) -> Path:
        """Where a local worker writes the job's output (stdout and stderr)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no local logs")

    def close(self) -> None:  # noqa: B027 - adapters without resources need not override
        """Release the store's connections and descriptors. Local worker locks stay held until
        the process exits; PostgreSQL's live on a connection, so closing releases them."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- the adapter interface
    @abc.abstractmethod
    def listen(self, job_ids: builtins.list[str] | None = None, queue: bool = False) -> Listener:
        """A listener woken by changes of ``job_ids`` (all jobs when None) and, if ``queue``,
        when a job becomes claimable."""

    @abc.abstractmethod
    def _insert(self, state: JobState) -> None: ...

    @abc.abstractmethod
    def _read(self, job_id: str) -> JobState: ...

    @abc.abstractmethod
    def _modify(self, job_id: str, fn: Transition) -> tuple[JobState, builtins.list[ProgressEvent]]:
        """Atomically: read, ``change = fn(state)``, write ``change`` (state and events, with
        seq numbers assigned after the last) and wake waiters. ``fn`` returning None writes
        nothing. Returns the state as it is now and the events appended."""

    def _modify_many(
        self, items: builtins.list[tuple[str, Transition]]
    ) -> builtins.list[tuple[JobState, builtins.list[ProgressEvent]]]:
        """Apply transitions to several jobs; each is atomic on its own. Adapters may write
        them in one transaction (a pool recording the outcomes of many jobs at once)."""
        results = []
        for job_id, fn in items:
            try:
                results.append(self._modify(job_id, fn))
            except (JobNotFound, CorruptJob) as exc:  # one bad job must not lose the others
                _log.warning("not updating job %s: %s", job_id, exc)
        return results

    @abc.abstractmethod
    def _select(
        self, status: Status | None, labels: dict[str, str], limit: int | None, before: str | None
    ) -> builtins.list[JobState]: ...

    @abc.abstractmethod
    def _remove(self, job_id: str, force: bool) -> None: ...

    @abc.abstractmethod
    def _claim(
        self,
        worker: str,
        limit: int,
        queues: builtins.list[str] | None,
        kinds: builtins.list[Kind] | None,
        now: datetime,
    ) -> builtins.list[tuple[JobState, Any]]: ...

    @abc.abstractmethod
    def _events(
        self, job_id: str, after: int, limit: int | None
    ) -> builtins.list[ProgressEvent]: ...

    @abc.abstractmethod
    def _lock_acquire(self, job_id: str) -> Any:
        """Take the job's worker lock or raise :class:`WorkerLockHeld`; returns a handle."""

    @abc.abstractmethod
    def _lock_held(self, job_id: str) -> bool: ...

    @abc.abstractmethod
    def _lock_release(self, job_id: str, handle: Any) -> None: ...

    @abc.abstractmethod
    def _pulse(self, job_id: str, claimable: bool = False) -> None: ...

    # Liveness: a worker process holds one lock for its whole life, named by its ``host:pid``;
    # a job it claimed is alive while that lock is held. Adapters without it keep per-job locks.
    def _hold_liveness(self, worker: str) -> bool:
        """Hold this process's liveness lock; True when taken just now."""
        return False

    def _worker_alive(self, worker: str | None) -> bool:
        return False

    def _lock_alive(self, job_id: str, handle: Any) -> bool:
        """Whether this process still holds the lock behind ``handle`` (a database can take
        it away: a killed connection); local locks live as long as the process."""
        return True

    def release_worker_locks(self, tasks: builtins.list[Task]) -> None:
        """Drop the worker locks of several finished tasks at once (a pool after writing their
        outcomes; one round trip on PostgreSQL)."""
        items = [(t.id, t._lock) for t in tasks if t._lock is not None]
        for task in tasks:
            task._lock = None
        if items:
            self._lock_release_many(items)

    def _lock_release_many(self, items: builtins.list[tuple[str, Any]]) -> None:
        for job_id, handle in items:
            self._lock_release(job_id, handle)

    def check_locks(self) -> None:  # noqa: B027 - only stores whose locks can be lost act
        """Take note of a lost lock connection after :meth:`lock_fileno` became readable."""

    def lock_fileno(self) -> int | None:
        """An fd that becomes readable when this process may have lost worker locks (the
        PostgreSQL lock connection), for a worker's ``select``; None when locks cannot be
        lost. After it is readable, check ``Task.lock_alive()`` of each task."""
        return None

    def _live(self) -> None:
        """Make this process a live worker of the store (once), first failing over the jobs of
        a dead process that had the same ``host:pid`` (a reused PID), which the new lock
        would otherwise make look alive. Other threads wait until that sweep is done, so it
        never touches a job this process has claimed."""
        me = worker_name()
        if getattr(self, "_live_as", None) == (os.getpid(), me):
            return
        with _LIVE_LOCK:
            if getattr(self, "_live_as", None) == (os.getpid(), me):
                return
            if self._hold_liveness(me):
                for state in self._held_by(me):
                    self._modify(state.id, lambda s: _namesake(s, me))
            self._live_as = (os.getpid(), me)

    def _held_by(self, worker: str) -> builtins.list[JobState]:
        """The running and pending jobs that name ``worker`` (adapters may narrow the read)."""
        return [
            state
            for status in (Status.RUNNING, Status.PENDING)
            for state in self.list(status=status, limit=None)
            if state.worker == worker
        ]


def _namesake(state: JobState, me: str) -> Change | None:
    if state.worker != me or state.status not in (Status.RUNNING, Status.PENDING):
        return None
    return machine.abandon(state, utcnow())


class Reporter:
    """Appends progress events to one job; ignored once the job is terminal."""

    def __init__(self, task: Task) -> None:
        self._task = task

    def report(
        self,
        step: str,
        status: EventStatus | str = EventStatus.PROGRESS,
        message: JSON = None,
        progress: float | None = None,
    ) -> ProgressEvent | None:
        """Record an event and update the job's ``phase``, ``step`` and ``progress``.

        Returns the stored event, or None when the job was already finished (or this worker
        lost the job), in which case nothing is written.
        """
        if not isinstance(step, str) or not step:
            raise InvalidInput("step must be a non-empty string")
        try:
            status = EventStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in EventStatus)
            raise InvalidInput(f"unknown event status {status!r}; one of {known}") from None
        try:
            progress = clamp_progress(progress)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        machine.check_json(message, "message")
        attempt = self._task.attempt

        def apply(state: JobState) -> Change | None:
            return machine.report(state, attempt, step, status, message, progress, utcnow())

        _, events = self._task.store._modify(self._task.id, apply)
        return events[0] if events else None


class Task:
    """A handle to one job bound to its store; what workers and pollers act through.

    A task from :meth:`Store.claim` (or :meth:`start`) carries an *attempt token*: its writes
    (report, succeed, fail, pause, release) are refused once the job was reclaimed, released or
    finished by someone else, so a worker that lost its job can never overwrite the outcome.
    """

    def __init__(
        self,
        store: Store,
        job_id: str,
        attempt: int | None = None,
        lock: Any = None,
        snapshot: JobState | None = None,
    ) -> None:
        self.store = store
        self.id = job_id
        self.attempt = attempt
        self._lock = lock
        #: The state as it was when this task was claimed, if it was (may be stale).
        self.snapshot = snapshot

    def __repr__(self) -> str:
        return f"Task({self.id!r}, attempt={self.attempt})"

    def state(self) -> JobState:
        return self.store.get(self.id)

    def _apply(self, fn: Transition) -> JobState:
        return self.store._modify(self.id, fn)[0]

    def hold_worker_lock(self) -> None:
        """Claim the worker lock for the rest of this process's life.

        Never released by production code: the kernel (or the database server) releases it
        when the process exits, crashes or is killed. Raises :class:`WorkerLockHeld` if another
        live process holds it. Commands started afterwards do not inherit it.
        """
        if self._lock is not None:
            return
        lock = self.store._lock_acquire(self.id)
        try:
            state = self.store.get(self.id)
        except BaseException:
            self.store._lock_release(self.id, lock)
            raise
        # A pool's claim is covered by the pool's liveness lock, not a per-job one.
        if (
            state.status == Status.RUNNING
            and state.worker not in (None, worker_name())
            and self.store._worker_alive(state.worker)
        ):
            self.store._lock_release(self.id, lock)
            raise WorkerLockHeld(f"job {self.id} is being run by live worker {state.worker}")
        self._lock = lock

    def lock_alive(self) -> bool:
        """False once this task's worker lock was taken away (PostgreSQL: the lock
        connection died); the worker must then stop the job, whose writes are refused."""
        return self._lock is None or self.store._lock_alive(self.id, self._lock)

    def release_worker_lock(self) -> None:
        """Drop the worker lock: for pools, after the job's outcome is written, and for tests
        that simulate a dead worker."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            self.store._lock_release(self.id, lock)

    def start(self) -> bool:
        """Move the job from pending to running as this process's attempt (a dedicated worker;
        pools use :meth:`Store.claim`). Hold the worker lock first. False if not due/pending."""
        self.store._live()
        who = worker_name()
        state, events = self.store._modify(self.id, lambda s: machine.start(s, who, utcnow()))
        if not events:
            return False
        self.attempt = state.attempts
        return True

    def set_pid(self, pid: int, started_at: datetime | None = None) -> None:
        """Record the OS process doing the work and its kernel start time."""
        if not isinstance(pid, int) or pid <= 0:
            raise InvalidInput(f"pid must be a positive integer, not {pid!r}")
        attempt = self.attempt

        def apply(state: JobState) -> Change | None:
            if machine.fenced_out(state, attempt):
                return None
            return Change(state.evolve(pid=pid, pid_started_at=started_at, updated_at=utcnow()))

        self._apply(apply)

    def reporter(self) -> Reporter:
        return Reporter(self)

    def report(
        self,
        step: str,
        status: EventStatus | str = EventStatus.PROGRESS,
        message: JSON = None,
        progress: float | None = None,
    ) -> ProgressEvent | None:
        """Shorthand for ``reporter().report(...)``."""
        return Reporter(self).report(step, status, message, progress)

    def succeed(self, result: JSON = None) -> JobState:
        """Record success. A no-op on a terminal job (succeed after cancel keeps canceled)."""
        machine.check_json(result, "result")
        attempt = self.attempt
        return self._apply(lambda s: machine.succeed(s, attempt, result, utcnow()))

    def fail(
        self,
        exc: BaseException | ErrorInfo | str,
        *,
        retry: bool = True,
        code: str = "error",
        keep_worker: bool = False,
    ) -> JobState:
        """Record a failed attempt: back to ``pending`` with backoff while attempts are left
        (and ``retry``), else ``failed``. On a terminal job a no-op: fail after cancel keeps
        ``canceled``."""
        if isinstance(exc, str):
            exc = ErrorInfo(code, exc)
        error = machine.error_info(exc, code)
        attempt, base = self.attempt, config.retry_delay()
        return self._apply(
            lambda s: machine.fail(s, attempt, error, retry, base, utcnow(), keep_worker)
        )

    def cancel(self) -> JobState:
        """Mark the job canceled (from pending, running or paused); safe at any time.

        The terminal check and the write are one atomic step. The live worker sees the change
        through the store's notification and stops the work; a job already finished keeps its
        outcome, and the returned state says which.
        """
        return self._apply(lambda s: machine.cancel(s, utcnow()))

    def pause(self, question: JSON = None) -> JobState:
        """Park the running job until a person answers ``question`` (see :meth:`resume`)."""
        machine.check_json(question, "question")
        attempt = self.attempt
        return self._apply(lambda s: machine.pause(s, attempt, question, utcnow()))

    def resume(self, answer: JSON = None) -> JobState:
        """Store the answer of a paused job and queue it again."""
        machine.check_json(answer, "answer")
        return self._apply(lambda s: machine.resume(s, answer, utcnow()))

    def release(self) -> JobState:
        """Give the running job back to the queue without counting the attempt."""
        attempt = self.attempt
        return self._apply(lambda s: machine.release(s, attempt, utcnow()))

    def relabel(self, key: str, value: str | None) -> JobState:
        """Set (or, with None, remove) one label."""
        check_labels({key: value or ""})

        def apply(state: JobState) -> Change:
            labels = dict(state.labels)
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
            return Change(state.evolve(labels=labels, updated_at=utcnow()))

        return self._apply(apply)

    def update_payload(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> JobState:
        """Replace the payload with ``fn(payload)`` atomically (pipeline checkpoints)."""
        attempt = self.attempt

        def apply(state: JobState) -> Change | None:
            if machine.fenced_out(state, attempt):
                return None
            payload = machine.check_json(fn(dict(state.payload)), "payload")
            return Change(state.evolve(payload=payload, updated_at=utcnow()))

        return self._apply(apply)
