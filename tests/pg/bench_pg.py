"""Rough numbers for the PostgreSQL store (not a test): ``python -m tests.pg.bench_pg``.

Prints create→claim→succeed cycles/s from one process, get/s, claim+succeed throughput with
two processes (claims of 1 and of 16 with outcomes written in one transaction), and the
write→wake latency of a listener in another process. Uses a throwaway schema.
``--async-commit`` runs every transaction with ``synchronous_commit=off``.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from typing import Any

from outlast import machine
from outlast.model import utcnow
from outlast.store import Store, open_store
from tests.pg import support

CTX = multiprocessing.get_context("spawn")


def cycles(store: Store, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        store.create(name="c")
        [task] = store.claim()
        task.succeed(1)
        task.release_worker_lock()
    return n / (time.perf_counter() - started)


def gets(store: Store, n: int) -> float:
    job = store.create(name="g")
    started = time.perf_counter()
    for _ in range(n):
        store.get(job.id)
    rate = n / (time.perf_counter() - started)
    job.cancel()
    return rate


def _drain(url: str, limit: int, ready: Any, go: Any, out: Any) -> None:
    store = open_store(url)
    ready.release()
    go.wait()
    done, idle = 0, 0
    while idle < 3:
        tasks = store.claim(limit=limit)
        if not tasks:
            idle += 1
            time.sleep(0.01)
            continue
        idle = 0
        items = [(t.id, _succeed(t.attempt)) for t in tasks]
        store.apply_many(items)
        for t in tasks:
            t.release_worker_lock()
        done += len(tasks)
    out.put(done)
    store.close()


def _succeed(attempt: int | None) -> Any:
    return lambda s: machine.succeed(s, attempt, 1, utcnow())


def claim_throughput(url: str, store: Store, n: int, limit: int, workers: int = 2) -> float:
    for _ in range(n):
        store.create(name="t")
    ready, go, out = CTX.Semaphore(0), CTX.Event(), CTX.Queue()
    procs = [CTX.Process(target=_drain, args=(url, limit, ready, go, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    started = time.perf_counter()
    go.set()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - started - 0.03  # the workers' idle tail
    for p in procs:
        p.join()
    assert total == n, (total, n)
    return n / elapsed


def _wake(url: str, job_id: str, ready: Any, ack: Any, out: Any, rounds: int) -> None:
    store = open_store(url)
    woke = []
    with store.listen([job_id]) as listener:
        ready.release()
        for _ in range(rounds):
            listener.wait(5)
            woke.append(time.monotonic())
            ack.release()
    out.put(woke)
    store.close()


def wake_latency(url: str, store: Store, rounds: int = 200) -> tuple[list[float], list[float]]:
    """Seconds from the start of a write (a relabel) to the wake-up of a listener in another
    process, and the write's own duration, per round (CLOCK_MONOTONIC is system-wide)."""
    job = store.create(name="w")
    ready, ack, out = CTX.Semaphore(0), CTX.Semaphore(0), CTX.Queue()
    proc = CTX.Process(target=_wake, args=(url, job.id, ready, ack, out, rounds))
    proc.start()
    ready.acquire()
    time.sleep(0.2)
    sent, writes = [], []
    for i in range(rounds):
        sent.append(time.monotonic())
        job.relabel("i", str(i))
        writes.append(time.monotonic() - sent[-1])
        ack.acquire()
        time.sleep(0.002)
    woke = out.get()
    proc.join()
    return sorted(w - s for w, s in zip(woke, sent, strict=True)), sorted(writes)


def main() -> None:
    url = support.make_url()
    if url is None:
        sys.exit(f"no PostgreSQL at {support.BASE_URL}")
    if sys.argv[1:] == ["--async-commit"]:  # what the WAL flush of each commit costs
        url += "&options=-csynchronous_commit%3Doff"
        print("synchronous_commit=off for every transaction")
    store = open_store(url)
    try:
        with open("/proc/loadavg") as f:
            print("load average:", f.read().split()[:3])
        print(f"create->claim->succeed, one process: {cycles(store, 500):.0f} cycles/s")
        print(f"get, one process: {gets(store, 2000):.0f} /s")
        for limit in (1, 16):
            rate = claim_throughput(url, store, 2000, limit)
            print(f"claim+succeed, 2 processes, claim(limit={limit}): {rate:.0f} jobs/s")
        lat, writes = wake_latency(url, store)
        p50, p99 = statistics.median(lat), lat[int(len(lat) * 0.99) - 1]
        print(
            f"write start -> wake of a listener in another process: p50 {p50 * 1000:.2f} ms,"
            f" p99 {p99 * 1000:.2f} ms (the write itself: p50"
            f" {statistics.median(writes) * 1000:.2f} ms)"
        )
    finally:
        store.close()
        support.drop_schema(url)


if __name__ == "__main__":
    main()
