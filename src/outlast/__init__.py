"""outlast: background jobs that outlast the process that started them.

A job is a durable document with an explicit status machine, driven by a worker that holds a
lock the kernel (or PostgreSQL) frees when it dies, and polled or streamed from anywhere.
"""

from __future__ import annotations

# Not typing.TYPE_CHECKING: importing typing costs the CLI's fast path a third of its time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from outlast.errors import (
        Canceled,
        CorruptJob,
        DuplicateJob,
        Fail,
        InvalidInput,
        InvalidJobId,
        InvalidTransition,
        JobActive,
        JobNotFound,
        OutlastError,
        Pause,
        PollTimeout,
        ScheduleExists,
        ScheduleNotFound,
        StoreError,
        TimedOut,
        WorkerLockHeld,
    )
    from outlast.model import (
        ErrorInfo,
        EventStatus,
        JobState,
        Kind,
        ProgressEvent,
        Schedule,
        Status,
    )
    from outlast.pipeline import Pipeline, Stage, poll
    from outlast.run.api import (
        Job,
        Options,
        aspawn,
        asubmit,
        job,
        run_command,
        schedule,
        set_slots,
        spawn,
        submit,
        use_store,
    )
    from outlast.run.bulk import submit_many
    from outlast.run.context import JobContext, current
    from outlast.run.registry import JobSpec
    from outlast.store import Reporter, Store, Task, open_store

# Names load on first use (PEP 562), so ``import outlast.cli`` for a status call stays light.
_LAZY = {
    "outlast.errors": (
        "Canceled CorruptJob DuplicateJob Fail InvalidInput InvalidJobId InvalidTransition "
        "JobActive JobNotFound OutlastError Pause PollTimeout ScheduleExists ScheduleNotFound "
        "StoreError TimedOut WorkerLockHeld"
    ),
    "outlast.model": "ErrorInfo EventStatus JobState Kind ProgressEvent Schedule Status",
    "outlast.pipeline": "Pipeline Stage poll",
    "outlast.store": "Reporter Store Task open_store",
    "outlast.run.registry": "JobSpec",
    "outlast.run.api": (
        "Job Options aspawn asubmit job run_command schedule set_slots spawn submit use_store"
    ),
    "outlast.run.bulk": "submit_many",
    "outlast.run.context": "JobContext current",
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names.split()}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'outlast' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"

__all__ = [
    "Canceled",
    "CorruptJob",
    "DuplicateJob",
    "ErrorInfo",
    "EventStatus",
    "Fail",
    "InvalidInput",
    "InvalidJobId",
    "InvalidTransition",
    "Job",
    "JobActive",
    "JobContext",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "Kind",
    "Options",
    "OutlastError",
    "Pause",
    "Pipeline",
    "PollTimeout",
    "ProgressEvent",
    "Reporter",
    "Schedule",
    "ScheduleExists",
    "ScheduleNotFound",
    "Stage",
    "Status",
    "Store",
    "StoreError",
    "Task",
    "TimedOut",
    "WorkerLockHeld",
    "__version__",
    "aspawn",
    "asubmit",
    "current",
    "job",
    "open_store",
    "poll",
    "run_command",
    "schedule",
    "set_slots",
    "spawn",
    "submit",
    "submit_many",
    "use_store",
]
