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


@outlast.job(name="bench.ask", attempts=1)
def ask(mark: str) -> object:
    """Pause for a person, noting the wall-clock time just before (the agents benchmark)."""
    import time

    ctx = outlast.current()
    if ctx.answer is not None:
        return ctx.answer
    with open(mark, "w") as out:
        out.write(repr(time.time()))
    raise outlast.Pause("go on?")
