"""What a store holds at a glance: the numbers behind ``GET /metrics`` and ``outlast stats``.

Computed from the store itself, so they are right whatever number of pools, servers and
hosts share it: counts by queue, status and kind, the oldest due job waiting per queue,
the wait and run times of the jobs that finished in the last ``window`` seconds, the workers
running jobs, and the schedules that are due. On the SQL stores a few grouped, indexed
reads whose cost does not grow with the jobs kept (the engine counts jobs as they change,
:mod:`outlast.store._counts`); the files store reads its scan's index of every document
(BENCHMARKS.md measures both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from outlast.model import Kind, Status

#: Finished jobs read at most for the wait and run times (the most recent): a sample that
#: bounds a scrape's cost whatever the throughput; the window's counts are exact.
RECENT_MAX = 10_000


class Indexed(Protocol):
    """What stats read of a job: a :class:`~outlast.model.JobState`, or the files store's
    index entry of one."""

    @property
    def queue(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def kind(self) -> Kind: ...
    @property
    def worker(self) -> str | None: ...
    @property
    def run_after(self) -> datetime | None: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...


@dataclass
class Stats:
    """A snapshot of a store (see the module)."""

    #: When it was taken (UTC).
    at: datetime
    #: The window of the recent figures, seconds.
    window: float
    #: Jobs by (queue, status, kind).
    jobs: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: Per queue: seconds the longest-waiting due pending job has waited.
    oldest_due: dict[str, float] = field(default_factory=dict)
    #: Jobs that finished within the window, by (kind, status): all of them.
    finished: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: The most recent of them (``RECENT_MAX`` at most: the wait and run times' sample):
    #: (kind, status, seconds waited before the last start, seconds run), one per job.
    recent: list[tuple[str, str, float, float]] = field(default_factory=list)
    #: Distinct workers running jobs now.
    busy_workers: int = 0
    #: Live workers of the registry by kind (``pool``, ``supervisor``, …).
    workers: Counter[str] = field(default_factory=Counter)
    #: Schedules whose fire time has come (not paused).
    schedules_due: int = 0
    #: Schedules in all, and paused.
    schedules: int = 0
    schedules_paused: int = 0

    def add_recent(self, states: Iterable[Indexed]) -> None:
        for state in states:
            if state.finished_at is None:
                continue
            started = state.started_at or state.finished_at
            waited = max(0.0, (started - state.created_at).total_seconds())
            ran = max(0.0, (state.finished_at - started).total_seconds())
            self.recent.append((str(state.kind), str(state.status), waited, ran))

    def by_status(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for (_, status, _), n in self.jobs.items():
            counts[status] += n
        return {s.value: counts.get(s.value, 0) for s in Status}

    def by_queue(self) -> dict[str, dict[str, Any]]:
        """Per queue: its jobs by status, and how long its oldest due job has waited."""
        queues: dict[str, dict[str, Any]] = {}
        for (queue, status, _), n in sorted(self.jobs.items()):
            entry = queues.setdefault(queue, {s.value: 0 for s in Status})
            entry[status] = entry.get(status, 0) + n
        for queue, entry in queues.items():
            entry["oldest_due_seconds"] = round(self.oldest_due.get(queue, 0.0), 3)
        return queues

    def to_dict(self) -> dict[str, Any]:
        """What ``outlast stats --json`` prints."""
        finished: Counter[str] = Counter()
        for (_, status), n in self.finished.items():
            finished[status] += n
        waits = sorted(w for _, _, w, _ in self.recent)
        runs = sorted(r for _, _, _, r in self.recent)
        return {
            "at": self.at.isoformat(),
            "jobs": self.by_status(),
            "queues": self.by_queue(),
            "recent": {
                "window_seconds": self.window,
                "finished": dict(sorted(finished.items())),
                "sampled": len(self.recent),
                "wait_seconds": _quantiles(waits),
                "run_seconds": _quantiles(runs),
                "per_minute": round(sum(finished.values()) / (self.window / 60), 2),
            },
            "busy_workers": self.busy_workers,
            "workers": dict(sorted(self.workers.items())),
            "schedules": {
                "total": self.schedules,
                "paused": self.schedules_paused,
                "due": self.schedules_due,
            },
        }


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "max": None}

    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * len(values)))], 4)

    return {"p50": at(0.5), "p95": at(0.95), "max": round(values[-1], 4)}


def from_states(
    states: Iterable[Indexed], now: datetime, window: float, schedules: list[Any]
) -> Stats:
    """Stats of a store read whole (the files store's index of its documents); the busy
    workers are :meth:`Store.stats`' to count."""
    stats = Stats(at=now, window=window)
    recent = []
    for state in states:
        stats.jobs[(state.queue, str(state.status), str(state.kind))] += 1
        due = state.run_after or state.created_at
        # the oldest due job waiting for a pool (as the SQL stores read it: jobs_due)
        if state.status == Status.PENDING and state.worker is None and due <= now:
            since = (now - due).total_seconds()
            stats.oldest_due[state.queue] = max(stats.oldest_due.get(state.queue, 0.0), since)
        if state.finished_at is not None and (now - state.finished_at).total_seconds() <= window:
            recent.append(state)
            stats.finished[(str(state.kind), str(state.status))] += 1
    recent.sort(key=lambda s: s.finished_at or now, reverse=True)
    stats.add_recent(recent[:RECENT_MAX])
    add_schedules(stats, schedules, now)
    return stats


def add_schedules(stats: Stats, schedules: list[Any], now: datetime) -> None:
    stats.schedules = len(schedules)
    stats.schedules_paused = sum(1 for s in schedules if s.paused)
    stats.schedules_due = sum(
        1 for s in schedules if not s.paused and s.next_at is not None and s.next_at <= now
    )
