"""Inside a job: ``outlast.current()`` gives the job's reporter, answer and cancel checks."""

from __future__ import annotations

import contextvars
import signal
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from outlast.errors import Canceled, OutlastError
from outlast.model import JSON, EventStatus, JobState, ProgressEvent, Status, utcnow
from outlast.store import Task

CANCEL_SIGNAL = signal.SIGUSR1


class JobContext:
    """What a running job knows about itself. Obtained with :func:`outlast.current`."""

    def __init__(self, task: Task, state: JobState) -> None:
        self.task = task
        self.state = state
        self._cancel = threading.Event()
        self._on_cancel: Callable[[], object] | None = None
        #: Its worker watches the store for a cancel and says so (an async pool): the flag
        #: alone answers :attr:`cancel_requested`, with no read of the store in the loop.
        self.watched = False
        #: When this attempt is stopped for its ``timeout`` (UTC), or None: a job that can
        #: stop cleanly on its own looks at it (or :meth:`time_left`) and finishes first.
        self.deadline: datetime | None = None
        if state.timeout is not None:
            self.deadline = utcnow() + timedelta(seconds=state.timeout)

    def time_left(self) -> float | None:
        """Seconds until :attr:`deadline` (0 once passed), or None without a timeout."""
        if self.deadline is None:
            return None
        return max(0.0, (self.deadline - utcnow()).total_seconds())

    @property
    def job_id(self) -> str:
        return self.task.id

    @property
    def attempt(self) -> int:
        return self.state.attempts

    @property
    def payload(self) -> dict[str, Any]:
        return self.state.payload

    @property
    def answer(self) -> JSON:
        """The person's answer after a :class:`~outlast.Pause` and resume, else None."""
        return self.state.answer

    def report(
        self,
        step: str,
        status: EventStatus | str = EventStatus.PROGRESS,
        message: JSON = None,
        progress: float | None = None,
    ) -> ProgressEvent | None:
        """Record a progress event (ignored once the job is no longer this attempt's)."""
        return self.task.report(step, status, message, progress)

    async def areport(
        self,
        step: str,
        status: EventStatus | str = EventStatus.PROGRESS,
        message: JSON = None,
        progress: float | None = None,
    ) -> ProgressEvent | None:
        """:meth:`report` for an ``async def`` job: the write runs in a thread, so the event
        loop (and the other jobs on it) go on meanwhile."""
        import asyncio

        return await asyncio.to_thread(self.task.report, step, status, message, progress)

    @property
    def cancel_requested(self) -> bool:
        """True once the job was canceled (the worker is told at once; the store is asked)."""
        if self._cancel.is_set() or self.watched:
            return self._cancel.is_set()
        try:
            state = self.task.state()
        except OutlastError:
            return False
        if state.status == Status.CANCELED or state.cancel_requested:
            self._cancel.set()
        return self._cancel.is_set()

    def check_cancel(self) -> None:
        """Raise :class:`~outlast.Canceled` if the job was canceled: call it between steps."""
        if self._cancel.is_set() or self.cancel_requested:
            raise Canceled(f"job {self.job_id} was canceled")

    def request_cancel(self) -> None:
        self._cancel.set()
        hook = self._on_cancel
        if hook is not None:
            hook()

    def on_cancel(self, hook: Callable[[], object] | None) -> None:
        """Call ``hook`` when the job is canceled (an async job's: cancel its task); at
        once if it was already."""
        self._on_cancel = hook
        if hook is not None and self._cancel.is_set():
            hook()


_current: JobContext | None = None
# The job of the running asyncio task (an async pool runs many jobs in one process); it
# wins over the process's one job.
_task_job: contextvars.ContextVar[JobContext | None] = contextvars.ContextVar(
    "outlast_job", default=None
)


def current() -> JobContext:
    """The context of the job running here (in this asyncio task, or this process); raises
    outside a job."""
    found = _task_job.get() or _current
    if found is None:
        raise OutlastError("outlast.current() is only available inside a running job")
    return found


def current_or_none() -> JobContext | None:
    """The running job's context, or None outside a job."""
    return _task_job.get() or _current


def enter(context: JobContext | None) -> None:
    """Make ``context`` the job of this process (None: no job)."""
    global _current
    _current = context


def enter_task(context: JobContext | None) -> contextvars.Token[JobContext | None]:
    """Make ``context`` the job of the running asyncio task (and what it starts)."""
    return _task_job.set(context)


def install_cancel_handler(meant: Callable[[], bool] | None = None) -> None:
    """Let the pool tell this process that its job was canceled (SIGUSR1 sets the flag).
    ``meant``: whether a signal is for the job running now (a pool's job process: the
    signal names no job, see :class:`outlast.boot.Words`); without it, every one is."""

    def handler(signum: int, frame: Any) -> None:
        if _current is not None and (meant is None or meant()):
            _current.request_cancel()

    signal.signal(CANCEL_SIGNAL, handler)
