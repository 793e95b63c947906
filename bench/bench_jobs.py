"""The no-op job the worker benchmark runs (imported by the pool with --import bench_jobs)."""

from __future__ import annotations

import outlast


@outlast.job(name="bench.noop", attempts=1)
def noop(i: int = 0) -> int:
    return i


@outlast.job(name="bench.asleep", attempts=1)
async def asleep(seconds: float = 0.0) -> float:
    """An I/O-bound job: waits ``seconds`` on the event loop (the async benchmark's)."""
    if seconds:
        import asyncio

        await asyncio.sleep(seconds)
    return seconds
