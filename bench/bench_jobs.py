"""The no-op job the worker benchmark runs (imported by the pool with --import bench_jobs)."""

from __future__ import annotations

import outlast


@outlast.job(name="bench.noop", attempts=1)
def noop(i: int = 0) -> int:
    return i
