"""Throughput and waiting time over time, for the dashboard's chart and ``GET
/stats/timeline``: per step of a window (a minute of the last hour by default), the jobs that
finished in it by outcome, and the median and 95th percentile of how long they waited (from
creation to their last start, as ``/metrics`` counts it).

Read from the store, so it is right for every pool on every host. Steps are aligned to
multiples of ``step`` since the epoch, so two reads agree on every step but the last, which
is the one still filling. The SQL stores read three numbers per finished job through the
``jobs_finished`` index (no document is parsed); the files store reads its scan index.

**Settled steps are read once.** A step that ended more than :data:`SETTLE` seconds ago
cannot gain jobs any more (a job's ``finished_at`` is its writer's clock in the transaction
that ends it), so each store object keeps the figures of settled steps and later reads ask
the store only for the jobs that finished since the first step it does not know: a
dashboard polling the last hour reads about the last two minutes' jobs each time. (A host
whose clock is behind by more than that writes into steps already kept; a new process sees
them. Jobs deleted afterwards stay counted: they did finish then.)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outlast.errors import InvalidInput
from outlast.model import TERMINAL

#: At most this many steps in a window.
MAX_STEPS = 1440
#: The longest window, seconds (a week).
MAX_WINDOW = 7 * 86400.0
#: Seconds after its end when a step is settled (kept, not read again).
SETTLE = 90.0
#: Step sizes whose settled steps are kept at once.
_KEPT_STEPS = 8
OUTCOMES = tuple(sorted(str(s) for s in TERMINAL))
#: ``(finished at, seconds since the epoch; outcome; seconds waited)`` of a finished job.
Row = tuple[Any, Any, Any]
#: Reads the rows of the jobs that finished in ``[since, until)``.
Source = Callable[[datetime, datetime], Iterable[Row]]


def check(window: object, step: object) -> tuple[float, float]:
    """``(window, step)`` as floats, or :class:`InvalidInput` saying what is wrong."""
    for name, value in (("window", window), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(f"{name} must be a number of seconds, not {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise InvalidInput(f"{name} must be a number of seconds > 0, not {value!r}")
    window, step = float(window), float(step)  # type: ignore[arg-type]
    if window > MAX_WINDOW:
        raise InvalidInput(f"window is at most {MAX_WINDOW:g} seconds (a week), not {window:g}")
    if step < 1:
        raise InvalidInput(f"step is at least 1 second, not {step:g}")
    if step > window:
        raise InvalidInput(f"step ({step:g} s) is longer than the window ({window:g} s)")
    if math.ceil(window / step) > MAX_STEPS:
        raise InvalidInput(
            f"{window:g} s in steps of {step:g} s is {math.ceil(window / step)} steps; "
            f"at most {MAX_STEPS} (take a longer step)"
        )
    return window, step


@dataclass(frozen=True)
class Step:
    """One step's figures."""

    #: Jobs finished in the step, per outcome (succeeded, failed, canceled).
    finished: tuple[int, ...]
    #: Their waits' median and 95th percentile, seconds (None: none finished).
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class Timeline:
    """The steps of a window (see the module)."""

    #: When it was read.
    at: datetime
    window: float
    step: float
    #: Seconds since the epoch when the first step starts; step ``i`` is
    #: ``[start + i*step, start + (i+1)*step)``, the last one holds ``at``.
    start: float
    steps: tuple[Step, ...]

    def to_dict(self) -> dict[str, Any]:
        """What ``GET /stats/timeline`` answers: columns, one value per step (the form a
        chart takes); a step with no finished job has null waits."""
        return {
            "at": self.at.isoformat(),
            "window_seconds": self.window,
            "step_seconds": self.step,
            "start": datetime.fromtimestamp(self.start, UTC).isoformat(),
            "times": [self.start + i * self.step for i in range(len(self.steps))],
            "finished": {
                outcome: [s.finished[k] for s in self.steps] for k, outcome in enumerate(OUTCOMES)
            },
            "wait_seconds": {
                "p50": [s.p50 for s in self.steps],
                "p95": [s.p95 for s in self.steps],
            },
        }


def bounds(now: datetime, window: float, step: float) -> tuple[float, int]:
    """The first step's start (seconds since the epoch) and the number of steps."""
    steps = math.ceil(window / step)
    end = (math.floor(now.timestamp() / step) + 1) * step
    return end - steps * step, steps


def summarize(rows: Iterable[Row], start: float, step: float, count: int) -> list[Step]:
    """The ``count`` steps from ``start`` of finished jobs' rows (others are left out)."""
    index = {outcome: k for k, outcome in enumerate(OUTCOMES)}
    finished = [[0] * len(OUTCOMES) for _ in range(count)]
    waits: list[list[float]] = [[] for _ in range(count)]
    for at, outcome, waited in rows:
        i, k = int((float(at) - start) // step), index.get(outcome)
        if k is None or not 0 <= i < count:
            continue
        finished[i][k] += 1
        waits[i].append(max(0.0, float(waited or 0.0)))
    out = []
    for counts, values in zip(finished, waits, strict=True):
        values.sort()
        out.append(Step(tuple(counts), _at(values, 0.5), _at(values, 0.95)))
    return out


def _at(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (the rule of ``outlast stats``), or None."""
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


class Kept:
    """The settled steps a store object has read (see the module); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: step size -> {step start: its figures}
        self._steps: dict[float, dict[float, Step]] = {}

    def read(self, now: datetime, window: float, step: float, source: Source) -> Timeline:
        """The timeline, asking ``source`` only for the jobs of the steps not kept."""
        start, count = bounds(now, window, step)
        starts = [start + i * step for i in range(count)]
        with self._lock:
            known = dict(self._steps.get(step, {}))
        first = next((i for i, s in enumerate(starts) if s not in known), count)
        fresh: list[Step] = []
        if first < count:
            since = datetime.fromtimestamp(starts[first], UTC)
            until = datetime.fromtimestamp(start + count * step, UTC)
            fresh = summarize(source(since, until), starts[first], step, count - first)
        steps = [known[s] for s in starts[:first]] + fresh
        settled = now.timestamp() - SETTLE
        with self._lock:
            kept = self._steps.pop(step, {})
            kept.update((s, f) for s, f in zip(starts, steps, strict=True) if s + step <= settled)
            oldest = now.timestamp() - MAX_WINDOW - step
            self._steps[step] = {s: f for s, f in kept.items() if s >= oldest}
            while len(self._steps) > _KEPT_STEPS:  # the step size read longest ago goes
                self._steps.pop(next(iter(self._steps)))
        return Timeline(now, window, step, start, tuple(steps))
