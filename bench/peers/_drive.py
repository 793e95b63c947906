"""The measuring loop of ``bench/peers/run.py``, the same for every queue. Standard library
only: it runs in each system's own virtual environment (outlast: ``.venv``; a peer:
``bench/.peers/NAME``) and drives that system's module ``NAME_jobs.py`` beside it.

    python _drive.py NAME throughput JOBS WORKERS CONCURRENCY
    python _drive.py NAME latency COUNT CONCURRENCY

It prints one JSON line. The environment says where the system keeps its jobs:
``PEERS_DIR`` (a fresh folder, for SQLite files and the workers' logs), ``PEERS_PG`` (a
fresh PostgreSQL database), ``PEERS_STORE`` (outlast: ``sqlite`` or ``postgresql``).

A system module offers ``VERSION``, ``SETTINGS``, ``DURABILITY`` (text for the report) and
``setup()``, ``enqueue(i) -> handle`` (one call of the queue's own enqueue API),
``start_workers(count, concurrency, env) -> [Popen]``, ``done_count()`` (succeeded jobs,
read from the durable record with one cheap query), ``is_done(handle)`` (the queue's normal
status API), ``teardown()``. Its job is :func:`noop`'s shape: it calls :func:`stamp`.

**Throughput.** ``JOBS`` no-op jobs are enqueued one call at a time (each call timed), then
``WORKERS`` workers are started and ``done_count()`` is polled every 10 ms until it reaches
``JOBS``. Reported: ``enqueue_s`` and the per-call p50, ``first_s`` (worker start → first poll
that sees a job done), ``drain_s`` (worker start → the poll that sees the last one), and
``steady`` (jobs/s between the polls that see 10% and 90% of the jobs done, interpolated
linearly between polls: the drain without its start-up and its tail).

**Latency.** One worker (at ``CONCURRENCY``) is started and warmed with one job, then left
idle for 1 s; then ``COUNT`` jobs one after another: the time is read (``time.time()``)
before the enqueue call, the job writes the time of its first line and the time it returns
to a file (``PEERS_STAMPS``, one ``write`` of one line, O_APPEND), and ``is_done`` is polled
every 1 ms until it sees the job done. submit→start = first line - before enqueue;
finish→seen = the poll that saw it done - the job's return. Both clocks are the same
``time.time()`` of one machine, so the figures compare across systems whatever records each
system keeps.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

POLL = 0.010  # the throughput poll of the durable record
STATUS_POLL = 0.001  # the latency poll of the status API
TIMEOUT = 600.0  # a drain that takes longer than this has failed

_STAMPS = os.environ.get("PEERS_STAMPS")
_FD = os.open(_STAMPS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if _STAMPS else -1


def stamp(i: int, started: float) -> None:
    """Record job ``i``'s first line (``started``) and its return (now), in latency runs."""
    if _FD >= 0:
        os.write(_FD, f"{i} {started!r} {time.time()!r}\n".encode())


def noop(i: int) -> int:
    """The job every system runs, registered by each module with its own decorator."""
    started = time.time()
    stamp(i, started)
    return i


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def popen(argv: list[str], env: dict[str, str], tag: str) -> subprocess.Popen[bytes]:
    """Start one worker in its own session, its output to a log in ``PEERS_DIR``."""
    log = open(os.path.join(os.environ["PEERS_DIR"], f"{tag}.log"), "ab")  # noqa: SIM115
    try:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker's process group, SIGKILL what is left after 15 s."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group: pool children included
        proc.wait()


def logs_tail() -> str:
    folder = os.environ["PEERS_DIR"]
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".log"):
            with open(os.path.join(folder, name), "rb") as f:
                out.append(f"--- {name}\n" + f.read()[-2000:].decode(errors="replace"))
    return "\n".join(out)


def check_alive(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"a worker exited with {proc.returncode}\n{logs_tail()}")


def crossing(samples: list[tuple[float, int]], target: float) -> float:
    """The time at which the done count reached ``target``, interpolated between polls."""
    before = samples[0]
    for t, n in samples:
        if n >= target:
            t0, n0 = before
            return t if n == n0 else t0 + (t - t0) * (target - n0) / (n - n0)
        before = (t, n)
    raise ValueError(target)


def throughput(mod: Any, jobs: int, workers: int, concurrency: int) -> dict[str, Any]:
    mod.setup()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        calls = []
        t0 = time.perf_counter()
        for i in range(jobs):
            c = time.perf_counter()
            mod.enqueue(i)
            calls.append(time.perf_counter() - c)
        enqueue_s = time.perf_counter() - t0
        started = time.perf_counter()
        procs = mod.start_workers(workers, concurrency, worker_env())
        samples: list[tuple[float, int]] = [(0.0, 0)]
        tick = started
        while samples[-1][1] < jobs:
            tick += POLL
            time.sleep(max(0.0, tick - time.perf_counter()))
            n = mod.done_count()
            samples.append((time.perf_counter() - started, n))
            if samples[-1][0] > TIMEOUT:
                raise RuntimeError(f"{n} of {jobs} done after {TIMEOUT} s\n{logs_tail()}")
            if n < jobs:
                check_alive(procs)
    finally:
        stop(procs)
        mod.teardown()
    first = next(t for t, n in samples if n > 0)
    low, high = crossing(samples, 0.1 * jobs), crossing(samples, 0.9 * jobs)
    return {
        "jobs": jobs,
        "enqueue_s": enqueue_s,
        "enqueue_p50_s": statistics.median(calls),
        "first_s": first,
        "drain_s": samples[-1][0],
        "steady": 0.8 * jobs / (high - low) if high > low else float("nan"),
    }


def wait_done(mod: Any, handle: Any, procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not mod.is_done(handle):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up job did not finish in {timeout} s\n{logs_tail()}")
        check_alive(procs)
        time.sleep(0.01)


def latency(mod: Any, count: int, concurrency: int) -> dict[str, Any]:
    stamps = os.path.join(os.environ["PEERS_DIR"], "stamps")
    mod.setup()
    procs: list[subprocess.Popen[bytes]] = []
    submitted, seen = [], []
    try:
        procs = mod.start_workers(1, concurrency, worker_env({"PEERS_STAMPS": stamps}))
        wait_done(mod, mod.enqueue(count), procs, 120.0)  # warm-up: the worker is up
        time.sleep(1.0)  # and idle
        for i in range(count):
            t0 = time.time()
            handle = mod.enqueue(i)
            # the first poll at a random phase of the poll's period: else the phase follows
            # the queue's own timing, and a change of submit->start moves finish->seen
            time.sleep(random.uniform(0.0, STATUS_POLL))
            while not mod.is_done(handle):
                time.sleep(STATUS_POLL)
            seen.append(time.time())
            submitted.append(t0)
    finally:
        stop(procs)
        mod.teardown()
    began, ended = {}, {}
    with open(stamps) as f:
        for line in f:
            i, start, end = line.split()
            began[int(i)], ended[int(i)] = float(start), float(end)
    to_start = [began[i] - submitted[i] for i in range(count)]
    to_seen = [seen[i] - ended[i] for i in range(count)]
    return {
        "count": count,
        "start_p50_s": statistics.median(to_start),
        "start_p95_s": sorted(to_start)[int(0.95 * (count - 1))],
        "seen_p50_s": statistics.median(to_seen),
        "seen_p95_s": sorted(to_seen)[int(0.95 * (count - 1))],
    }


def main(argv: list[str]) -> None:
    name, what, *numbers = argv
    mod = importlib.import_module(f"{name}_jobs")
    args = [int(x) for x in numbers]
    result = throughput(mod, *args) if what == "throughput" else latency(mod, *args)
    result.update(version=mod.VERSION, settings=mod.SETTINGS, durability=mod.DURABILITY)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
