"""``Task``: a handle to one job bound to its store, what workers and pollers act through; and
``Reporter``, which appends a job's progress events."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from outlast import config, machine
from outlast.errors import InvalidInput, WorkerLockHeld
from outlast.machine import Change, check_labels
from outlast.model import (
    JSON,
    ErrorInfo,
    EventStatus,
    JobState,
    ProgressEvent,
    Status,
    clamp_progress,
    utcnow,
)
from outlast.store.common import worker_name

if TYPE_CHECKING:  # only for annotations: the store module imports this one
    from collections.abc import AsyncIterator

    from outlast.store.base import Store, Transition


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

        events = self._task.store.apply(self._task.id, apply).events
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
        #: True when :meth:`Store.create` returned the live job that holds the unique key
        #: it was given, instead of a new one.
        self.existing = False

    def __repr__(self) -> str:
        return f"Task({self.id!r}, attempt={self.attempt})"

    def state(self) -> JobState:
        return self.store.get(self.id)

    def wait(self, timeout: float | None = None, *, through_pause: bool = False) -> JobState:
        """Block until the job is terminal or paused for an answer (or ``timeout`` seconds);
        its latest state. ``through_pause``: wait on through pauses for the end. A canceled
        job is returned once its processes are gone (see :meth:`Store.wait`)."""
        return self.store.wait(self.id, timeout, through_pause=through_pause)

    # ------------------------------------------------------------------ asyncio
    async def astate(self) -> JobState:
        """:meth:`state` for asyncio (the read runs in the loop's executor)."""
        from outlast.store.aio import offload

        return await offload(self.state)

    async def await_done(
        self, timeout: float | None = None, *, through_pause: bool = False
    ) -> JobState:
        """Wait, without blocking the event loop, until the job is terminal or paused for an
        answer, or ``timeout`` seconds passed; returns its latest state (check
        ``state.terminal`` and ``state.status``). ``through_pause``: wait on through pauses
        for the end. Woken by the store's notification; a job whose worker died is
        reconciled after a quiet second; a canceled job is returned once its processes are
        gone (as :meth:`Store.wait`)."""
        import time

        from outlast.store.aio import afollow, offload
        from outlast.store.follower import settled, wait_released

        deadline = None if timeout is None else time.monotonic() + timeout
        until = None if through_pause else settled
        last = None
        async for update in afollow(
            self.store, self.id, timeout=timeout, events=False, until=until
        ):
            last = update[0]
        assert last is not None
        if last.status == Status.CANCELED:
            await offload(wait_released, self.store, last, deadline)
        return last

    async def aevents(
        self, after: int = 0, timeout: float | None = None
    ) -> AsyncIterator[ProgressEvent]:
        """The job's events after ``after`` as they land, for asyncio (``async for``); ends
        after the terminal one, or quietly after ``timeout`` seconds."""
        from outlast.store.aio import afollow

        async for _, events in afollow(self.store, self.id, after, timeout):
            for event in events:
                yield event

    def _apply(self, fn: Transition) -> JobState:
        return self.store.apply(self.id, fn).state

    def hold_worker_lock(self) -> None:
        """Claim the worker lock for the rest of this process's life.

        The kernel (or the database server) releases it when the process exits, crashes or
        is killed. Production code lets it go only to park a job whose concurrency key is
        full (``outlast.run.reap.start_or_park``), before the worker exits, and once the job
        is over, when its supervisor goes on to the next job of its group. Raises
        :class:`WorkerLockHeld` if another live process holds it. Commands started afterwards
        do not inherit it.
        """
        if self._lock is not None:
            return
        store = self.store
        lock = store._lock_acquire(self.id)
        try:
            state = store.get(self.id)
        except BaseException:
            store._lock_release(self.id, lock)
            raise
        # A pool's claim is covered by the pool's liveness lock, not a per-job one.
        if (
            state.status == Status.RUNNING
            and state.worker not in (None, worker_name())
            and store._worker_alive(state.worker)
        ):
            store._lock_release(self.id, lock)
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
        pools use :meth:`Store.claim`). Hold the worker lock first. False if not due/pending,
        or its concurrency key has no free slot (then look again when jobs change)."""
        self.store._live()
        state, events = self.store._start_one(self.id, worker_name(), utcnow())
        if not events:
            return False
        self.attempt = state.attempts
        return True

    def set_pid(self, pid: int, started_at: datetime | None = None) -> None:
        """Record the OS process doing the work and its kernel start time."""
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
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
        trace = None
        if isinstance(exc, BaseException) and exc.__traceback__ is not None:  # a raised one
            import traceback

            trace = "".join(traceback.format_exception(exc))
        error = machine.error_info(exc, code, trace)
        attempt, base = self.attempt, config.retry_delay()
        return self._apply(
            lambda s: machine.fail(s, attempt, error, retry, base, utcnow(), keep_worker)
        )

    def cancel(self) -> JobState:
        """Cancel the job (pending, running or paused); safe at any time.

        The terminal check and the write are one atomic step. The live worker sees the change
        through the store's notification and stops the work; a job already finished keeps its
        outcome, and the returned state says which. A pipeline with ``ALL_DONE`` stages still
        to run is not ``canceled`` at once: ``cancel_requested`` is set and its cleanup runs
        first (a running one, in its worker; one that waits for a retry or an answer after
        an attempt began, in one more run), then it ends ``canceled``. That run needs a
        worker: a pool's job gets one from its pools; a spawned job (``@dedicated``) needs a
        new dedicated worker, which the run layer's cancel (``outlast cancel``, HTTP, MCP,
        ``outlast.run.reap.cancel``) starts at once; after this store-level cancel, whoever
        next reconciles the job through the run layer (a status read, a wait, a pool's
        maintainer) starts it once it has waited ``reap.STRANDED_AFTER`` seconds.
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

    def retry(self) -> Task:
        """A new job with this finished job's definition, linked by ``retry_of`` (see
        :meth:`Store.retry`); this job stays as it was. A command's or spawned job's worker
        is started by ``outlast.retry`` at once, else by the store's maintainer."""
        [state] = self.store.retry([self.id])
        return Task(self.store, state.id)

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
