"""The peers' side of ``bench/async_bench.py``: arq and SAQ on the local Redis, run with the
peers' own virtual environment (``bench/.peers/async``), printing one JSON line.

    python peers_async.py PEER throughput JOBS CONCURRENCY SLEEP
    python peers_async.py PEER latency COUNT

Each peer runs with its documented defaults, except the concurrency (arq ``max_jobs``, SAQ
``concurrency``); arq runs in burst mode (it exits once the queue is empty), SAQ's queue is
polled every 10 ms until nothing is incomplete (its burst mode waits out a dequeue timeout).
Redis database 15 is flushed first. Neither keeps jobs durably: Redis without persistence
(the machine's default) loses them on a restart.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

REDIS = "redis://127.0.0.1:6379/15"


async def asleep_arq(ctx: dict, seconds: float) -> float:
    if seconds:
        await asyncio.sleep(seconds)
    return seconds


async def asleep_saq(ctx: dict, *, seconds: float) -> float:
    if seconds:
        await asyncio.sleep(seconds)
    return seconds


async def arq_throughput(jobs: int, concurrency: int, sleep: float) -> dict:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker

    settings = RedisSettings.from_dsn(REDIS)
    redis = await create_pool(settings)
    await redis.flushdb()
    started = time.perf_counter()
    for _ in range(jobs):
        await redis.enqueue_job("asleep_arq", sleep)
    enqueued = time.perf_counter()
    worker = Worker(
        functions=[asleep_arq],
        redis_settings=settings,
        max_jobs=concurrency,
        burst=True,
        handle_signals=False,
    )
    await worker.main()
    drained = time.perf_counter()
    done = worker.jobs_complete
    await worker.close()
    await redis.aclose()
    return {"enqueue_s": enqueued - started, "drain_s": drained - enqueued, "done": done}


async def arq_latency(count: int) -> dict:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.jobs import JobStatus
    from arq.worker import Worker

    settings = RedisSettings.from_dsn(REDIS)
    redis = await create_pool(settings)
    await redis.flushdb()
    worker = Worker(functions=[asleep_arq], redis_settings=settings, handle_signals=False)
    runner = asyncio.create_task(worker.main())
    await asyncio.sleep(1.0)
    seen = []
    for _ in range(count):
        t0 = time.perf_counter()
        job = await redis.enqueue_job("asleep_arq", 0)
        while await job.status() != JobStatus.complete:
            await asyncio.sleep(0.001)
        seen.append(time.perf_counter() - t0)
    runner.cancel()
    await worker.close()
    await redis.aclose()
    return {"p50_ms": statistics.median(seen) * 1000}


async def saq_throughput(jobs: int, concurrency: int, sleep: float) -> dict:
    from saq import Queue, Worker

    queue = Queue.from_url(REDIS)
    await queue.connect()
    await queue.redis.flushdb()
    started = time.perf_counter()
    for _ in range(jobs):
        await queue.enqueue("asleep_saq", seconds=sleep)
    enqueued = time.perf_counter()
    # (SAQ's burst mode waits out a dequeue timeout at the end: the queue is polled instead)
    worker = Worker(queue, functions=[asleep_saq], concurrency=concurrency)
    runner = asyncio.create_task(worker.start())
    while await queue.count("incomplete") > 0:
        await asyncio.sleep(0.01)
    drained = time.perf_counter()
    await worker.stop()
    runner.cancel()
    await queue.disconnect()
    return {"enqueue_s": enqueued - started, "drain_s": drained - enqueued, "done": jobs}


async def saq_latency(count: int) -> dict:
    from saq import Queue, Worker
    from saq.job import Status

    queue = Queue.from_url(REDIS)
    await queue.connect()
    await queue.redis.flushdb()
    worker = Worker(queue, functions=[asleep_saq])
    runner = asyncio.create_task(worker.start())
    await asyncio.sleep(1.0)
    seen = []
    for _ in range(count):
        t0 = time.perf_counter()
        job = await queue.enqueue("asleep_saq", seconds=0)
        while job.status != Status.COMPLETE:
            await asyncio.sleep(0.001)
            await job.refresh()
        seen.append(time.perf_counter() - t0)
    await worker.stop()
    runner.cancel()
    await queue.disconnect()
    return {"p50_ms": statistics.median(seen) * 1000}


def main(argv: list[str]) -> None:
    peer, what, *rest = argv
    numbers = [float(x) for x in rest]
    if what == "throughput":
        fn = {"arq": arq_throughput, "saq": saq_throughput}[peer]
        result = asyncio.run(fn(int(numbers[0]), int(numbers[1]), numbers[2]))
    else:
        fn = {"arq": arq_latency, "saq": saq_latency}[peer]
        result = asyncio.run(fn(int(numbers[0])))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
