"""outlast: background jobs that outlast the process that started them.

A job is a durable document with an explicit status machine, driven by a worker that holds a
lock the kernel (or PostgreSQL) frees when it dies, and polled or streamed from anywhere.
"""

from __future__ import annotations

from outlast.errors import (
    Canceled,
    CorruptJob,
    Fail,
    InvalidInput,
    InvalidJobId,
    InvalidTransition,
    JobActive,
    JobNotFound,
    OutlastError,
    Pause,
    StoreError,
    WorkerLockHeld,
)
from outlast.model import ErrorInfo, EventStatus, JobState, Kind, ProgressEvent, Status
from outlast.store import Reporter, Store, Task, open_store

__version__ = "0.1.0"

__all__ = [
    "Canceled",
    "CorruptJob",
    "ErrorInfo",
    "EventStatus",
    "Fail",
    "InvalidInput",
    "InvalidJobId",
    "InvalidTransition",
    "JobActive",
    "JobNotFound",
    "JobState",
    "Kind",
    "OutlastError",
    "Pause",
    "ProgressEvent",
    "Reporter",
    "Status",
    "Store",
    "StoreError",
    "Task",
    "WorkerLockHeld",
    "__version__",
    "open_store",
]
