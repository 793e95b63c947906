"""Before/after, paired (issue #18): the same figure from two copies of outlast's source, run
alternately, medians. How this session's changes were measured (BENCHMARKS.md).

    python bench/pair_bench.py latency|first|submit|bulk|drain|claim BEFORE_SRC AFTER_SRC
        [--store sqlite|postgresql]
        [--reps 5] [--jobs 200] [--pg postgresql://postgres@127.0.0.1:5432/test]
        [--waiting N] [--limit L] [--keys K]

A source is a folder holding the ``outlast`` package (e.g. ``git worktree add /tmp/before
HEAD~1`` then ``/tmp/before/src``); each run puts it first on ``PYTHONPATH`` (the editable
install's path comes after it) and compiles it first.

- ``latency``: one ``outlast worker -c 2``, then ``--jobs`` sequential no-op jobs (after 10
  unmeasured): submit→start from before the ``submit`` call to the job's first line, and
  finish→seen from the job's return to a ``store.get`` poll (every 1 ms, the first one after
  a random fraction of a millisecond: a poll in step with the submit aliases with the job's
  timing, and moved finish→seen by 0.3 ms when submit→start changed) seeing it done; p50.
- ``first``: one pending job, then ``outlast worker -c 2`` started; from just before the start
  to a poll (every 5 ms) seeing the job done.
- ``submit``: ``--jobs`` no-op jobs submitted one call at a time by one process into a fresh
  store (after one unmeasured): jobs/s, the p50 and p99 of one call in ms, and the share of
  the time spent in calls slower than 3x the p50 (SQLite's checkpoints land there).
- ``bulk``: ``--jobs`` no-op calls (one argument each) queued by one ``submit_many`` into a
  fresh store, three times in one process (the first unmeasured): jobs/s, the median.
- ``drain``: ``--jobs`` no-op jobs queued with one ``submit_many`` (not timed), then one
  ``outlast worker -c 2 --burst`` drains them: jobs/s between the first job's first line and
  the last job's return (the jobs' own clocks: no polling), and the worker's wall time
  (start-up included). ``--keys K``: each job has one of K concurrency keys (a limit no
  drain reaches), for what keys cost a pool's claims and outcomes.
- ``claim``: in one process, ``--jobs`` times (after 20 unmeasured): create a function job,
  then time ``store.claim(limit=L)`` (``--limit``, default 1) of a pool's kinds, with a pool's
  journal (the job then succeeds and its lock goes): the p50 and p10 of the claim call in ms,
  the store's own part of submit→start.

``--waiting N`` queues N jobs before ``latency`` or ``claim`` (PostgreSQL's table then
analyzed): function jobs delayed by a day (``--waiting-kind function``, the default), due
command jobs of one group (``command``; pending, as those of a full group wait for their
supervisors), or due function jobs of a concurrency key of one slot that a running job holds
(``keyed``, for ``claim`` only; a tenant's backlog): what a store of scheduled jobs, a group's
queue, or a full key's backlog, costs the claims of the jobs due now.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

JOBS = """
import time

import outlast


@outlast.job(name="pair.stamp", attempts=1)
def stamp() -> list:
    start = time.time()
    return [start, time.time()]


@outlast.job(name="pair.kstamp", attempts=1, limit=100_000, limit_key="k{key}")
def kstamp(key: int) -> list:
    start = time.time()
    return [start, time.time()]


@outlast.job(name="pair.echo", attempts=1)
def echo(value: int) -> int:
    return value
"""
LATENCY = """
import json, os, random, statistics, sys, time
import outlast, pair_jobs
from outlast.model import Status
store = outlast.use_store(os.environ["OUTLAST_STORE"])
n = int(sys.argv[1])
time.sleep(1.5)  # the worker up and idle
starts, seen = [], []
for i in range(n + 10):
    t0 = time.time()
    task = pair_jobs.stamp.submit()
    time.sleep(random.uniform(0.0, 0.001))  # the poll's phase: random, not the queue's
    while (state := store.get(task.id)).status != Status.SUCCEEDED:
        time.sleep(0.001)
    done = time.time()
    began, ended = state.result
    if i >= 10:
        starts.append(began - t0)
        seen.append(done - ended)
print(json.dumps([statistics.median(starts) * 1e3, statistics.median(seen) * 1e3]))
"""
SUBMIT = """
import json, os, sys, time
import outlast, pair_jobs
outlast.use_store(os.environ["OUTLAST_STORE"])
n = int(sys.argv[1])
pair_jobs.stamp.submit()
took = []
t0 = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    pair_jobs.stamp.submit()
    took.append(time.perf_counter() - t)
total = time.perf_counter() - t0
took.sort()
p50 = took[n // 2]
slow = sum(t for t in took if t > 3 * p50) / total
print(json.dumps([n / total, p50 * 1e3, took[int(0.99 * (n - 1))] * 1e3, slow * 100]))
"""
BULK = """
import json, os, statistics, sys, time
import outlast, pair_jobs
outlast.use_store(os.environ["OUTLAST_STORE"])
n = int(sys.argv[1])
rates = []
for i in range(4):
    calls = [[i] for i in range(n)]
    t = time.perf_counter()
    outlast.submit_many(pair_jobs.echo, calls)
    if i:
        rates.append(n / (time.perf_counter() - t))
print(json.dumps([statistics.median(rates)]))
"""
DRAIN = """
import json, os, subprocess, sys, time
import outlast, pair_jobs
from outlast.model import Status
store = outlast.use_store(os.environ["OUTLAST_STORE"])
n, keys = int(sys.argv[1]), int(sys.argv[3])
if keys:  # each job of one of `keys` concurrency keys, none of them ever full
    outlast.submit_many(pair_jobs.kstamp, [[i % keys] for i in range(n)])
else:
    outlast.submit_many(pair_jobs.stamp, [[] for _ in range(n)])
t0 = time.monotonic()
argv = [sys.executable, "-m", "outlast", "worker", "-c", "2", "--burst", "--import", "pair_jobs"]
subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wall = time.monotonic() - t0
jobs = store.list(limit=None)
assert len(jobs) == n and all(j.status == Status.SUCCEEDED for j in jobs)
first = min(j.result[0] for j in jobs)
last = max(j.result[1] for j in jobs)
print(json.dumps([(n - 1) / (last - first), wall]))
"""
CLAIM = """
import json, os, statistics, sys, time
import outlast
from outlast.model import Kind
store = outlast.open_store(os.environ["OUTLAST_STORE"])
n, limit = int(sys.argv[1]), int(sys.argv[2])
journal = store.journal("pair", "claim")
took = []
pools = [Kind.FUNCTION, Kind.PIPELINE]  # what a pool claims
for _ in range(n + 20):
    store.create(name="c", kind=Kind.FUNCTION)
    t = time.perf_counter()
    [task] = store.claim(limit=limit, kinds=pools, journal=journal)
    took.append(time.perf_counter() - t)
    task.succeed(None)
    task.release_worker_lock()
took = sorted(took[20:])
print(json.dumps([took[len(took) // 2] * 1e3, took[len(took) // 10] * 1e3]))
"""
WAITING = """
import os, sys
from datetime import timedelta
import outlast
from outlast.model import Kind, utcnow
store = outlast.open_store(os.environ["OUTLAST_STORE"])
n, kind = int(sys.argv[1]), sys.argv[2]
later = {"name": "w", "kind": kind, "run_after": utcnow() + timedelta(days=1)}
if kind == "command":  # due commands of a group, as a full group's wait (no pool's to take)
    later = {"name": "w", "kind": kind, "limit_key": "pair.group"}
if kind == "keyed":  # due functions of a key whose one slot is taken: a pool passes them over
    later = {"name": "w", "kind": "function", "limit_key": "pair.full", "limit": 1}
    store.create(**later)
    assert len(store.claim(None, 1, None, [Kind.FUNCTION])) == 1  # running (its claimer gone)
for start in range(0, n, 10_000):
    store.create_many([{} for _ in range(min(10_000, n - start))], later)
if os.environ["PAIR_SCHEMA"]:  # its statistics, as autovacuum would have them
    import psycopg
    with psycopg.connect(os.environ["PAIR_PG"], autocommit=True) as conn:
        conn.execute(f'ANALYZE "{os.environ["PAIR_SCHEMA"]}".jobs')
"""
FIRST = """
import json, os, sys, time
import outlast
from outlast.model import Status
store = outlast.open_store(os.environ["OUTLAST_STORE"])
[job] = store.list()
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
while store.get(job.id).status != Status.SUCCEEDED:
    time.sleep(0.005)
print(json.dumps([(time.monotonic() - t0) * 1e3]), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("figure", choices=["latency", "first", "submit", "bulk", "drain", "claim"])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--waiting",
        type=int,
        default=0,
        help="latency, claim: this many jobs queued first, not due (see --waiting-kind)",
    )
    parser.add_argument(
        "--waiting-kind",
        choices=["function", "command", "keyed"],
        default="function",
        help="function: delayed by a day; command: due commands of a group (as a full group's);"
        " keyed: due functions of a concurrency key of one slot, taken",
    )
    parser.add_argument("--limit", type=int, default=1, help="claim: the claim's limit")
    parser.add_argument(
        "--keys",
        type=int,
        default=0,
        help="drain: each job of one of this many concurrency keys (never full); 0: none",
    )
    args = parser.parse_args()
    if args.waiting_kind == "keyed" and args.figure != "claim":
        # a pool's maintainer would reconcile the holder (its claimer has exited) and run
        # the key's jobs one by one: the figure would measure that, not the claims
        parser.error("--waiting-kind keyed is for the claim figure (no pool runs there)")
    trees = [os.path.abspath(args.before), os.path.abspath(args.after)]
    for tree in trees:
        if not os.path.isdir(os.path.join(tree, "outlast")):
            parser.error(f"{tree}: no outlast package there")
        compileall.compile_dir(tree, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="outlast-pair-"))
    (work / "pair_jobs.py").write_text(JOBS)
    results: dict[str, list[list[float]]] = {tree: [] for tree in trees}
    print(f"load at the start {os.getloadavg()}")
    for rep in range(args.reps):
        for tree in trees if rep % 2 == 0 else trees[::-1]:
            results[tree].append(_one(args, tree, work))
    names = {
        "latency": ["submit→start p50 ms", "finish→seen p50 ms"],
        "first": ["ms"],
        "submit": ["jobs/s", "p50 ms", "p99 ms", "% in slow calls"],
        "bulk": ["jobs/s"],
        "drain": ["jobs/s", "worker wall s"],
        "claim": ["p50 ms", "p10 ms"],
    }[args.figure]
    for label, tree in zip(("before", "after"), trees, strict=True):
        runs = results[tree]
        figures = ", ".join(
            f"{name} {statistics.median(r[i] for r in runs):.2f}" for i, name in enumerate(names)
        )
        print(f"{label:6s} {tree}: {figures}   runs {[[round(x, 2) for x in r] for r in runs]}")
    print(f"load at the end {os.getloadavg()}")


def _one(args: argparse.Namespace, tree: str, work: Path) -> list[float]:
    if args.store == "sqlite":
        url, schema = f"sqlite://{tempfile.mkdtemp(dir=work)}/s.db", None
    else:
        schema = f"pair_{uuid.uuid4().hex[:12]}"
        url = f"{args.pg}?schema={schema}"
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{work}", OUTLAST_STORE=url)
    env.update(PAIR_PG=args.pg, PAIR_SCHEMA=schema or "")
    py = sys.executable
    try:
        if args.waiting and args.figure in ("latency", "claim"):
            argv = [py, "-c", WAITING, str(args.waiting), args.waiting_kind]
            subprocess.run(argv, env=env, check=True)
        if args.figure in ("submit", "bulk", "drain", "claim"):
            script = {"submit": SUBMIT, "bulk": BULK, "drain": DRAIN, "claim": CLAIM}[args.figure]
            argv = [py, "-c", script, str(args.jobs), str(args.limit), str(args.keys)]
            out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout
            submitted: list[float] = json.loads(out)
            return submitted
        if args.figure == "latency":
            setup = "import outlast, os; outlast.use_store(os.environ['OUTLAST_STORE'])"
            subprocess.run([py, "-c", setup], env=env, check=True)
            worker = _worker(env)
            try:
                out = subprocess.run(
                    [py, "-c", LATENCY, str(args.jobs)], env=env, capture_output=True, check=True
                ).stdout
            finally:
                _stop(worker)
            figures: list[float] = json.loads(out)
            return figures
        setup = (
            "import outlast, os, pair_jobs; outlast.use_store(os.environ['OUTLAST_STORE']);"
            " pair_jobs.stamp.submit()"
        )
        subprocess.run([py, "-c", setup], env=env, check=True)
        poll = subprocess.Popen(
            [py, "-c", FIRST], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert poll.stdin is not None and poll.stdout is not None
        assert poll.stdout.readline().strip() == "ready"
        poll.stdin.write("go\n")
        poll.stdin.flush()
        worker = _worker(env)
        try:
            took: list[float] = json.loads(poll.stdout.readline())
        finally:
            _stop(worker)
            poll.wait()
        return took
    finally:
        if schema is not None:
            import psycopg

            with psycopg.connect(args.pg, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "outlast", "worker", "-c", "2", "--import", "pair_jobs"]
    return subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.DEVNULL)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


if __name__ == "__main__":
    main()
