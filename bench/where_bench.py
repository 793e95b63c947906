"""Where the time goes (issue #18, item 4): per job of a drain of no-op jobs, the CPU of the
pool process and of its job processes, and the SQL it costs (SQLite: statements and commits;
PostgreSQL: statements, round trips and transactions), set against this machine's floors; and
the same for the submit side (per ``submit`` call).

Each run: a fresh store (SQLite: a file in a temporary folder; PostgreSQL: a fresh schema
``where_…``, dropped after), ``JOBS`` no-op jobs queued by ``bench/_where/submit.py`` (one
``bench_jobs.noop.submit(i)`` call each), then one ``outlast worker -c 2 --burst --import
bench_jobs`` drains them. Every process loads ``bench/_where/_where_probe.py`` (through the
``sitecustomize.py`` there, on ``PYTHONPATH``); when 10% and 90% of the jobs are done this
script sends the pool and its job processes SIGUSR2 and each writes a snapshot (CPU from
``getrusage`` and ``/proc/self/task``, counts). A figure per job is its difference between the
two snapshots over the jobs done between them: the steady drain, without start-up or tail.

Three kinds of run per store: ``cpu`` (the probe answers snapshots and hooks nothing: the CPU
figures, medians of ``--runs``), ``count`` (the probe wraps sqlite3's trace callback, psycopg's
execute paths and round trips, ``os`` file writes and ``flock``: the counts, medians of
``--runs``; their CPU is not used) and one ``profile`` run (cProfile on each process's main
thread, on its CPU clock, between the two snapshots).

    python bench/where_bench.py [--jobs 3000] [--runs 3] [--store sqlite|postgresql|both]
        [--pg postgresql://postgres@127.0.0.1:5432/test] [--no-profile] [--src DIR]

``--src DIR`` measures another copy of the package (put first on the measured processes'
``PYTHONPATH``), e.g. a commit's while ``src/`` is being edited:
``git archive HEAD src | tar -x -C /tmp/snap`` then ``--src /tmp/snap/src``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pstats
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
WHERE = os.path.join(HERE, "_where")
ROOT = os.path.dirname(HERE)
OUTLAST = os.path.join(os.path.dirname(sys.executable), "outlast")
PG_BASE = "postgresql://postgres@127.0.0.1:5432/test"
LOW, HIGH = 0.10, 0.90  # the measured window, as shares of the jobs done
POLL = 0.01
TIMEOUT = 600.0
WARM = 20  # bench/_where/submit.py's untimed first submits

Counts = dict[tuple[str, str, str], float]
PIPE = "pipe round trip pool<->job (Channel, ~1 KB)"
LITE_SELECT = "SQLite SELECT 1 (execute + fetchone)"
LITE_COMMIT = "SQLite commit: BEGIN IMMEDIATE; INSERT 1 KB; COMMIT (WAL, NORMAL)"
PG_SELECT = "PG SELECT 1 (one round trip)"
PG_INSERT = "PG autocommit INSERT 1 KB (synchronous_commit=on)"
PG_PIPELINED = "PG BEGIN; INSERT; COMMIT pipelined (1 round trip)"


# ------------------------------------------------------------------------------ helpers
def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows: list[list[Any]], head: list[str] | None = None, left: int = 0) -> str:
    """Columns right-aligned but column ``left`` (and the last one, if it is text)."""
    rows = [head, *rows] if head else rows
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            str(c).ljust(w) if i == left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]
    if head:
        lines.insert(1, "-" * len(lines[0]))
    return "\n".join("  " + line for line in lines)


def fmt(value: float, digits: int = 3) -> str:
    if value != value:  # nan
        return "-"
    if value == 0:
        return "0"
    return f"{value:.{digits}f}"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: ``--src``: the outlast source folder the measured processes import (None: the venv's).
SRC: list[str | None] = [None]


def child_env(out: str, mode: str, url: str, state: str) -> dict[str, str]:
    env = dict(os.environ)
    path = [WHERE, HERE, *filter(None, [SRC[0], env.get("PYTHONPATH")])]
    env.update(
        PYTHONPATH=os.pathsep.join(path),
        WHERE_OUT=out,
        WHERE_MODE=mode,
        OUTLAST_STORE=url,
        XDG_STATE_HOME=state,  # nothing of ours in the user's state folder
    )
    return env


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process group (the pool and its job processes), SIGKILL what is left."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_snaps(out: str) -> dict[int, list[dict[str, Any]]]:
    import json

    snaps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for name in os.listdir(out):
        if name.startswith("snap-") and name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                data = json.load(f)
            snaps[data["pid"]].append(data)
    for items in snaps.values():
        items.sort(key=lambda s: s["n"])
    return snaps


def delta_counts(a: dict[str, Any], b: dict[str, Any]) -> Counts:
    before = {(t, c, d): n for t, c, d, n in a["counts"]}
    return {
        (t, c, d): n - before.get((t, c, d), 0)
        for t, c, d, n in b["counts"]
        if n - before.get((t, c, d), 0)
    }


def delta_threads(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per thread: (CPU, time runnable waiting for a CPU) between the snapshots, seconds."""
    out = {}
    for name, (run, wait) in b["threads"].items():
        run0, wait0 = a["threads"].get(name, (0.0, 0.0))
        out[name] = (run - run0, wait - wait0)
    return out


# --------------------------------------------------------------------------- the stores
@dataclass
class StoreKind:
    name: str
    pg_base: str
    tag: str = ""
    schema: str = ""
    path: str = ""

    @property
    def pg(self) -> bool:
        return self.name == "postgresql"

    def url(self, tmp: str, tag: str) -> str:
        if self.pg:
            self.schema = f"where_{tag}_{os.getpid()}"
            sep = "&" if "?" in self.pg_base else "?"
            return f"{self.pg_base}{sep}schema={self.schema}"
        self.path = os.path.join(tmp, "s.db")
        return f"sqlite://{self.path}"

    @contextlib.contextmanager
    def counter(self) -> Iterator[Callable[[], int]]:
        """A function that counts the succeeded jobs, on a connection of its own."""
        if self.pg:
            import psycopg

            conn = psycopg.connect(self.pg_base, autocommit=True)
            sql = f'SELECT count(*) FROM "{self.schema}".jobs WHERE status = %s'
            try:
                yield lambda: int(conn.execute(sql, ("succeeded",)).fetchone()[0])  # type: ignore[index]
            finally:
                conn.close()
        else:
            lite = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
            sql = "SELECT count(*) FROM jobs WHERE status = 'succeeded'"
            try:
                yield lambda: int(lite.execute(sql).fetchone()[0])
            finally:
                lite.close()

    def drop(self) -> None:
        if self.pg and self.schema:
            import psycopg

            with psycopg.connect(self.pg_base, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def backend_cpu(pids: list[int], pg_base: str) -> dict[int, float]:
    """CPU seconds of the PostgreSQL backends serving ``pids`` (matched by client port)."""
    import psycopg

    ports = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            ports += [c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")]
    with psycopg.connect(pg_base, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
        ).fetchall()
    cpu = {}
    for (bpid,) in rows:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(bpid).cpu_times()
            cpu[bpid] = t.user + t.system
    return cpu


def all_postgres_cpu() -> float:
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("postgres", "postmaster"):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                total += t.user + t.system
    return total


# --------------------------------------------------------------------------------- a run
@dataclass
class Mark:
    done: float
    time: float
    backends: dict[int, float] = field(default_factory=dict)
    postgres: float = 0.0


@dataclass
class RunResult:
    metrics: dict[str, float]
    counts: dict[str, Counts]  # by role: pool, job, submit
    profiles: dict[str, pstats.Stats] = field(default_factory=dict)
    jobs: float = 0.0  # jobs in the window


def mark(store: StoreKind, pids: list[int], out: str, count: Callable[[], int], n: int) -> Mark:
    """Snapshot every process in ``pids`` (their ``n``-th), with the jobs done meanwhile."""
    before = count()
    at = time.time()
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    # the servers' CPU just after (the processes' snapshots take about as long)
    backends = backend_cpu(pids, store.pg_base) if store.pg else {}
    postgres = all_postgres_cpu() if store.pg else 0.0
    deadline = time.monotonic() + 30
    while True:
        have = {p for p, items in read_snaps(out).items() if len(items) >= n}
        if have >= set(pids):
            break
        if time.monotonic() > deadline:
            gone = {p for p in set(pids) - have if not psutil.pid_exists(p)}
            raise RuntimeError(f"no snapshot from {set(pids) - have} (exited: {gone})")
        time.sleep(0.002)
    return Mark((before + count()) / 2, at, backends, postgres)


def wait_for(count: Callable[[], int], target: float, pool: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while count() < target:
        if pool.poll() is not None:
            raise RuntimeError(f"the pool exited ({pool.returncode}) before {target} were done")
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {target} jobs done after {TIMEOUT} s")
        time.sleep(POLL)


def submit(env: dict[str, str], jobs: int, log: str) -> int:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(WHERE, "submit.py"), str(jobs)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        if proc.wait(TIMEOUT) != 0:
            raise RuntimeError(f"submit failed ({proc.returncode}):\n{tail(log)}")
    finally:
        stop(proc)
    return proc.pid


def tail(path: str) -> str:
    with open(path, "rb") as f:
        return f.read()[-3000:].decode(errors="replace")


def one_run(store: StoreKind, mode: str, jobs: int, tag: str) -> RunResult:
    tmp = tempfile.mkdtemp(prefix="outlast-where-")
    out, state, log = (os.path.join(tmp, n) for n in ("out", "state", "log"))
    os.makedirs(out)
    pool: subprocess.Popen[bytes] | None = None
    try:
        url = store.url(tmp, f"{store.name[:2]}_{mode[:2]}{tag}")
        env = child_env(out, mode, url, state)
        submitter = submit(env, jobs, log)
        with open(log, "ab") as logf:
            pool = subprocess.Popen(
                [OUTLAST, "worker", "-c", "2", "--burst", "--import", "bench_jobs"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )
        with store.counter() as count:
            wait_for(count, LOW * jobs, pool)
            pids = [pool.pid] + [c.pid for c in psutil.Process(pool.pid).children(recursive=True)]
            a = mark(store, pids, out, count, 1)
            wait_for(count, HIGH * jobs, pool)
            b = mark(store, pids, out, count, 2)
            try:
                pool.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the pool did not finish:\n{tail(log)}") from None
            if count() != jobs:
                raise RuntimeError(f"{count()} of {jobs} jobs succeeded:\n{tail(log)}")
        result = summarize(read_snaps(out), submitter, a, b, jobs)
        if mode == "profile":
            result.profiles = load_profiles(out)
        return result
    except BaseException:
        if os.path.exists(log):
            print(tail(log), file=sys.stderr)
        raise
    finally:
        stop(pool)
        with contextlib.suppress(Exception):
            store.drop()
        shutil.rmtree(tmp, ignore_errors=True)


def summarize(
    snaps: dict[int, list[dict[str, Any]]], submitter: int, a: Mark, b: Mark, jobs: int
) -> RunResult:
    n = b.done - a.done
    m: dict[str, float] = defaultdict(float)
    counts: dict[str, Counts] = defaultdict(lambda: defaultdict(float))
    m["wall"] = (b.time - a.time) / n
    for pid, items in snaps.items():
        if pid == submitter:
            s0, s1 = items[0], items[1]
            calls = jobs - WARM
            m["submit wall"] += (s1["time"] - s0["time"]) / calls
            m["submit cpu"] += (s1["cpu"] - s0["cpu"]) / calls
            for key, v in delta_counts(s0, s1).items():
                counts["submit"][key] += v / calls
            continue
        if len(items) < 2:
            continue
        s0, s1 = items[0], items[1]
        role = s1["role"]
        m[f"{role} cpu"] += (s1["cpu"] - s0["cpu"]) / n
        m[f"{role} sys"] += (s1["stime"] - s0["stime"]) / n
        m[f"{role} vcsw"] += (s1["nvcsw"] - s0["nvcsw"]) / n
        m[f"{role} ivcsw"] += (s1["nivcsw"] - s0["nivcsw"]) / n
        for thread, (cpu, runq) in delta_threads(s0, s1).items():
            where = "main" if thread == "main" else "other"
            m[f"{role} cpu {where}"] += cpu / n
            m[f"{role} runq {where}"] += runq / n
            m[f"{role} runq"] += runq / n
        for key, v in delta_counts(s0, s1).items():
            counts[role][key] += v / n
    if b.backends:
        ours = sum(v - a.backends.get(p, 0.0) for p, v in b.backends.items())
        m["pg backends"] = ours / n
        m["pg all"] = (b.postgres - a.postgres) / n
    return RunResult(dict(m), {k: dict(v) for k, v in counts.items()}, jobs=n)


def load_profiles(out: str) -> dict[str, pstats.Stats]:
    stats: dict[str, pstats.Stats] = {}
    for name in sorted(os.listdir(out)):
        if name.startswith("prof-"):
            role = name.rsplit("-", 1)[1]
            path = os.path.join(out, name)
            if role in stats:
                stats[role].add(path)
            else:
                stats[role] = pstats.Stats(path)
    return stats


# -------------------------------------------------------------------------------- floors
def timed(fn: Callable[[], None], n: int, batches: int = 3) -> tuple[float, float]:
    """Median over ``batches`` of (wall, CPU of this process) per call of ``fn``, seconds."""
    walls, cpus = [], []
    for _ in range(batches):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        walls.append((time.perf_counter() - t0) / n)
        cpus.append((time.process_time() - c0) / n)
    return med(walls), med(cpus)


def floor_python() -> list[tuple[str, float, float, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHERE_")}
    rows = []
    for label, argv in (
        ("python -c pass (the venv's)", [sys.executable, "-c", "pass"]),
        ("python -I -S -c pass (no site)", [sys.executable, "-I", "-S", "-c", "pass"]),
    ):
        walls = []
        for _ in range(20):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, check=True)
            walls.append(time.perf_counter() - t0)
        rows.append((label, med(walls), float("nan"), float("nan")))
    return rows


def floor_pipe() -> tuple[str, float, float, float]:
    """One message each way between two processes (what a pool and its job process trade
    per job: :class:`outlast.boot.Channel` over a socket pair)."""
    import socket

    from outlast.boot import Channel

    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ours.close()
        conn = Channel(theirs.detach())
        while (msg := conn.recv()) is not None:
            conn.send(msg)
        os._exit(0)
    theirs.close()
    conn = Channel(ours.detach())
    message: tuple[Any, ...] = ("01a2288c2c11b64629d4", 1, b"x" * 900, [])

    def ping() -> None:
        conn.send(message)
        conn.recv()

    wall, cpu = timed(ping, 5000)
    conn.send(None)
    _, _, usage = os.wait4(pid, 0)
    conn.close()
    child = (usage.ru_utime + usage.ru_stime) / 15000
    return (PIPE, wall, cpu, child)


def floor_sqlite() -> list[tuple[str, float, float, float]]:
    tmp = tempfile.mkdtemp(prefix="outlast-where-floor-")
    try:
        conn = sqlite3.connect(os.path.join(tmp, "f.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, doc BLOB)")
        doc = b"x" * 900

        def commit() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (doc) VALUES (?)", (doc,))
            conn.execute("COMMIT")

        def select() -> None:
            conn.execute("SELECT 1").fetchone()

        rows = [
            (LITE_SELECT, *timed(select, 20000), float("nan")),
            (LITE_COMMIT, *timed(commit, 3000), float("nan")),
        ]
        conn.close()
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def floor_pg(base: str) -> list[tuple[str, float, float, float]]:
    import psycopg

    schema = f"where_floor_{os.getpid()}"
    conn = psycopg.connect(base, autocommit=True)
    try:
        backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".t (id bigserial PRIMARY KEY, doc bytea)')
        doc = b"x" * 900
        insert = f'INSERT INTO "{schema}".t (doc) VALUES (%s)'

        def server(fn: Callable[[], None], n: int) -> tuple[float, float, float]:
            t0 = backend.cpu_times()
            wall, cpu = timed(fn, n)
            t1 = backend.cpu_times()
            return wall, cpu, (t1.user + t1.system - t0.user - t0.system) / (3 * n)

        def pipelined() -> None:
            with conn.pipeline():
                conn.execute("BEGIN")
                conn.execute(insert, (doc,))
                conn.execute("COMMIT")

        def select() -> None:
            conn.execute("SELECT 1")

        def autocommit() -> None:
            conn.execute(insert, (doc,))

        return [
            (PG_SELECT, *server(select, 3000)),
            (PG_INSERT, *server(autocommit, 1500)),
            (PG_PIPELINED, *server(pipelined, 1500)),
        ]
    finally:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.close()


Floors = dict[str, tuple[float, float, float]]


def floors(pg_base: str | None) -> Floors:
    rows = [*floor_python(), floor_pipe(), *floor_sqlite()]
    if pg_base:
        rows += floor_pg(pg_base)
    return {label: (wall, cpu, other) for label, wall, cpu, other in rows}


def mean_floors(first: Floors, last: Floors) -> Floors:
    """The mean of the floors measured before and after the runs (the machine is shared)."""
    return {
        k: tuple((a + b) / 2 for a, b in zip(first[k], last[k], strict=True))  # type: ignore[misc]
        for k in first
    }


# ------------------------------------------------------------------------------- reports
def us(seconds: float) -> str:
    return fmt(seconds * 1e6, 1)


def ms(seconds: float) -> str:
    return fmt(seconds * 1e3, 3)


def merge(results: list[RunResult], role: str) -> Counts:
    """Median across runs of each count per job (a count missing from a run is 0)."""
    keys = {k for r in results for k in r.counts.get(role, {})}
    return {k: med([r.counts.get(role, {}).get(k, 0.0) for r in results]) for k in keys}


def total(counts: Counts, category: str, thread: str | None = None, detail: str = "") -> float:
    return sum(
        v
        for (t, c, d), v in counts.items()
        if c == category and (thread is None or (t == "main") == (thread == "main"))
        and (not detail or d.startswith(detail))
    )  # fmt: skip


def medians(results: list[RunResult]) -> dict[str, float]:
    keys = {k for r in results for k in r.metrics}
    return {k: med([r.metrics.get(k, 0.0) for r in results]) for k in keys}


def per_job_table(store: StoreKind, cpu: list[RunResult], cnt: list[RunResult]) -> str:
    m = medians(cpu)
    pool, job = merge(cnt, "pool"), merge(cnt, "job")
    head = ["per job", "pool process", "  its main thread", "job processes (2)", "pool + jobs"]

    def row(label: str, f: Callable[[Counts, str | None], float], digits: int = 3) -> list[Any]:
        a, b, c = f(pool, None), f(pool, "main"), f(job, None)
        return [label, fmt(a, digits), fmt(b, digits), fmt(c, digits), fmt(a + c, digits)]

    def metric(label: str, key: str, scale: Callable[[float], str] = ms) -> list[Any]:
        a, c = m.get(f"pool {key}", 0.0), m.get(f"job {key}", 0.0)
        main = scale(m.get(f"pool {key} main", 0.0)) if key in ("cpu", "runq") else ""
        return [label, scale(a), main, scale(c), scale(a + c)]

    rows: list[list[Any]] = [
        metric("CPU ms", "cpu"),
        metric("  of which kernel (sys) ms", "sys"),
        metric("ms runnable, waiting for a CPU", "runq"),
        metric("voluntary context switches", "vcsw", lambda v: fmt(v, 2)),
        metric("involuntary context switches", "ivcsw", lambda v: fmt(v, 2)),
        row("SQL statements", lambda c, t: total(c, "sql", t)),
        row("  transactions (BEGIN … COMMIT)", lambda c, t: total(c, "tx", t, "begin")),
        row("  commits", lambda c, t: total(c, "tx", t, "commit")),
        row("  autocommit statements (writes)", lambda c, t: total(c, "auto", t, "write")),
        row("  autocommit statements (reads)", lambda c, t: total(c, "auto", t, "read")),
    ]
    if store.pg:
        rows += [
            row("PG round trips", lambda c, t: total(c, "rt", t)),
            row("  of which pipelines (1 sync each)", lambda c, t: total(c, "rt", t, "pipeline:")),
            row("ms waiting in psycopg (server + libpq)", lambda c, t: 1e3 * total(c, "wait", t)),
            row("PG notifications received", lambda c, t: total(c, "notify", t, "received")),
            row("PG connections opened", lambda c, t: total(c, "connect", t)),
        ]
    rows += [
        row("file writes (os.write/pwrite)", lambda c, t: _io(c, t, ("write", "pwrite"))),
        row("flock calls", lambda c, t: _io(c, t, ("flock",))),
        row("fsync/fdatasync", lambda c, t: _io(c, t, ("fsync", "fdatasync"))),
    ]
    wall = m["wall"]
    notes = [
        f"  wall per job in the window: {ms(wall)} ms ({1 / wall:,.0f} jobs/s); pool busy "
        f"{100 * m.get('pool cpu', 0.0) / wall:.0f}% of the wall time, each job process "
        f"{100 * m.get('job cpu', 0.0) / 2 / wall:.0f}%; {len(cpu)} cpu runs, {len(cnt)} count "
        f"runs, {med([r.jobs for r in cpu]):,.0f} jobs in each window",
        "  pool process = all its threads (main + maintainer, pulse watcher); CPU from cpu "
        "runs (no hooks), counts from count runs",
    ]
    if store.pg:
        notes.append(
            f"  CPU of the PostgreSQL backends serving the pool and its job processes: "
            f"{ms(m.get('pg backends', 0.0))} ms/job; of every postgres process (walwriter, "
            f"checkpointer, other sessions too): {ms(m.get('pg all', 0.0))} ms/job"
        )
    return table(rows, head) + "\n" + "\n".join(notes)


def _io(c: Counts, thread: str | None, names: tuple[str, ...]) -> float:
    return sum(
        v
        for (t, cat, d), v in c.items()
        if cat == "io"
        and d.split(" ", 1)[0] in names
        and (thread is None or (t == "main") == (thread == "main"))
    )


def statements_table(counts: Counts, cutoff: float = 0.004, unit: str = "/job") -> str:
    rows = []
    for (thread, cat, detail), v in sorted(counts.items(), key=lambda kv: -kv[1]):
        if v < cutoff or cat not in ("sql", "io", "rt", "notify", "connect", "prepare"):
            continue
        if cat == "io" and detail.split(" ", 1)[0] not in (
            "write", "pwrite", "flock", "fsync", "fdatasync", "open", "unlink", "replace"
        ):  # fmt: skip
            continue
        text = detail if cat == "sql" else f"[{cat}] {detail}"
        rows.append([fmt(v, 3), thread, text[:160]])
    head = [unit, "thread", "statement (or [other] event)"]
    return table(rows, head, left=2) if rows else "  (none)"


def against_floors(
    store: StoreKind,
    cpu: list[RunResult],
    cnt: list[RunResult],
    fl: Floors,
) -> str:
    m = medians(cpu)
    pool, job = merge(cnt, "pool"), merge(cnt, "job")
    lines = []
    pool_cpu, job_cpu = m.get("pool cpu", 0.0), m.get("job cpu", 0.0)
    pg_cpu = m.get("pg backends", 0.0)
    bound = max(pool_cpu, (pool_cpu + job_cpu + pg_cpu) / 2)
    lines.append(
        f"  CPU bound on 2 cores: max(pool {ms(pool_cpu)}, (pool + jobs + PG backends) / 2 = "
        f"{ms((pool_cpu + job_cpu + pg_cpu) / 2)}) = {ms(bound)} ms/job -> "
        f"{1 / bound:,.0f} jobs/s; measured wall {ms(m['wall'])} ms/job"
    )
    lines += wall_split(m, pool, job)
    pipe_wall, pipe_cpu, pipe_child = fl[PIPE]
    lines.append(
        f"  hand-off floor: one pipe round trip per job costs {us(pipe_cpu)} us CPU in the "
        f"pool + {us(pipe_child)} us in the job process ({us(pipe_wall)} us wall); the pool "
        f"spends {fmt(pool_cpu / (pipe_cpu or 1), 1)}x that, the job processes "
        f"{fmt(job_cpu / (pipe_child or 1), 1)}x"
    )
    if store.pg:
        sel_wall, sel_cpu, sel_srv = fl[PG_SELECT]
        ins_wall = fl[PG_INSERT][0]
        for label, c, cpu_ in (("pool", pool, pool_cpu), ("job processes", job, job_cpu)):
            rt = total(c, "rt")
            lines.append(
                f"  {label}: {fmt(rt, 2)} round trips/job x SELECT-1 floor ({us(sel_wall)} us "
                f"wall, {us(sel_cpu)} us client CPU, {us(sel_srv)} us backend CPU) = "
                f"{ms(rt * sel_cpu)} ms client CPU ({fmt(100 * rt * sel_cpu / (cpu_ or 1), 0)}% "
                f"of its {ms(cpu_)} ms), {ms(rt * sel_wall)} ms wall waiting"
            )
        tx = total(pool, "tx", None, "begin") + total(pool, "auto", None, "write")
        lines.append(
            f"  pool: {fmt(tx, 3)} writing transactions/job (status changes: flushed commits) x "
            f"the flushed-commit floor {us(ins_wall)} us = {ms(tx * ins_wall)} ms wall/job; "
            "the job processes' journal writes commit with synchronous_commit=off"
        )
        statements = total(pool, "sql") + total(job, "sql")
        lines.append(
            f"  PG backends: {ms(pg_cpu)} ms CPU/job for {fmt(statements, 2)} statements; "
            f"at the SELECT-1 backend floor ({us(sel_srv)} us each) they would cost "
            f"{ms(statements * sel_srv)} ms"
        )
    else:
        _, sel_cpu, _ = fl[LITE_SELECT]
        com_wall, com_cpu, _ = fl[LITE_COMMIT]
        for label, c, cpu_ in (("pool", pool, pool_cpu), ("job processes", job, job_cpu)):
            st, co = total(c, "sql"), total(c, "tx", None, "commit")
            floor = st * sel_cpu + co * max(com_cpu - 3 * sel_cpu, 0.0)
            lines.append(
                f"  {label}: {fmt(st, 2)} statements/job x {us(sel_cpu)} us (SELECT-1 floor) + "
                f"{fmt(co, 3)} commits/job x {us(com_cpu)} us (commit floor) ~ {ms(floor)} ms "
                f"CPU: {fmt(100 * floor / (cpu_ or 1), 0)}% of its {ms(cpu_)} ms"
            )
        lines.append(
            f"  a commit on this disk: {us(com_wall)} us wall, {us(com_cpu)} us CPU "
            "(synchronous=NORMAL: no fsync per commit in WAL mode)"
        )
    return "\n".join(lines)


def wall_split(m: dict[str, float], pool: Counts, job: Counts) -> list[str]:
    """Where each process's wall time per job goes: running, waiting for a CPU, waiting on
    PostgreSQL (count runs), and the rest (blocked in select/recv: waiting for the others)."""
    wall = m["wall"]
    lines = []
    for label, span, cpu, runq, wait in (
        (
            "pool main thread",
            wall,
            m.get("pool cpu main", 0.0),
            m.get("pool runq main", 0.0),
            total(pool, "wait", "main"),
        ),
        (
            "each job process, per job it runs",
            2 * wall,
            m.get("job cpu", 0.0),
            m.get("job runq", 0.0),
            total(job, "wait"),
        ),
    ):
        rest = span - cpu - runq
        lines.append(
            f"  {label}: wall {ms(span)} ms = running {ms(cpu)} + runnable, waiting for a CPU "
            f"{ms(runq)} + off CPU {ms(rest)} (blocked: select/recv/sleep"
            + (
                f"; in psycopg's waits {ms(wait)} ms, a figure of the count runs that also holds "
                "some of the running and CPU waiting)"
                if wait
                else ")"
            )
        )
    return lines


def _where(fn: tuple[str, int, str]) -> str:
    path, line, name = fn
    if path == "~":
        return name
    for cut in ("/src/", "/site-packages/", "/lib/python3.11/"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{path}:{line}({name})"


def profile_tables(stats: pstats.Stats, jobs: float, top: int = 10) -> str:
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    whole = sum(v[2] for v in raw.values())  # total self time = the profiled CPU
    entries = [(fn, v) for fn, v in raw.items() if "_where_probe" not in fn[0]]
    out = []
    for title, index in (("cumulative", 3), ("self", 2)):
        ranked = sorted(entries, key=lambda e: -e[1][index])[:top]
        rows = [
            [
                _where(fn),
                fmt(v[1] / jobs, 2),
                us(v[index] / jobs),
                f"{100 * v[index] / whole:.0f}%" if whole else "-",
            ]
            for fn, v in ranked
        ]
        out.append(
            f"  top {top} by {title} CPU (profiled, {us(whole / jobs)} us/job in all):\n"
            + table(rows, ["function", "calls/job", f"{title} us/job", "share"])
        )
    return "\n".join(out)


def submit_table(results: list[RunResult], cnt: list[RunResult], store: StoreKind) -> str:
    sub = merge(cnt, "submit")
    wall = med([r.metrics["submit wall"] for r in results])
    cpu = med([r.metrics["submit cpu"] for r in results])
    rows = [
        ["wall ms", ms(wall)],
        ["CPU ms (the submitting process)", ms(cpu)],
        ["SQL statements", fmt(total(sub, "sql"), 2)],
        ["transactions (BEGIN … COMMIT)", fmt(total(sub, "tx", None, "begin"), 2)],
        ["autocommit writes / reads", f"{fmt(total(sub, 'auto', None, 'write'), 2)} / "
         f"{fmt(total(sub, 'auto', None, 'read'), 2)}"],
        ["file writes / flocks", f"{fmt(_io(sub, None, ('write', 'pwrite')), 2)} / "
         f"{fmt(_io(sub, None, ('flock',)), 2)}"],
    ]  # fmt: skip
    if store.pg:
        rows.insert(4, ["PG round trips", fmt(total(sub, "rt"), 2)])
        rows.insert(5, ["ms waiting in psycopg (server + libpq)", ms(total(sub, "wait"))])
    return table(rows, ["per submit() call", "value"]) + "\n" + statements_table(sub, unit="/call")


def report_store(
    store: StoreKind,
    cpu: list[RunResult],
    cnt: list[RunResult],
    prof: RunResult | None,
    fl: Floors,
    jobs: int,
) -> None:
    title = "SQLite (WAL, synchronous=NORMAL)" if not store.pg else "PostgreSQL"
    print(
        f"\n=== {title}: {jobs:,} no-op jobs drained by one `outlast worker -c 2 --burst`; "
        f"per job between {LOW:.0%} and {HIGH:.0%} done; medians ==="
    )
    print(per_job_table(store, cpu, cnt))
    print("\n  against the floors:")
    print(against_floors(store, cpu, cnt, fl))
    for role, label in (("pool", "pool process"), ("job", "job processes (both)")):
        print(f"\n  statements and events per job, {label} (median of {len(cnt)} count runs):")
        print(statements_table(merge(cnt, role)))
    print("\n  submit side (bench_jobs.noop.submit(i) in a loop, one process):")
    print(submit_table(cpu, cnt, store))
    if prof is not None:
        for role, label, n in (
            ("pool", "pool process, main thread, per job", prof.jobs),
            ("job", "job processes, per job", prof.jobs),
            ("submit", "the submitting process, per submit() call", jobs - WARM),
        ):
            if role in prof.profiles:
                print(f"\n  cProfile, {label}, on the CPU clock (time.thread_time):")
                print(profile_tables(prof.profiles[role], n))


def print_floors(first: Floors, last: Floors) -> None:
    rows = []
    for label in first:
        (w0, c0, o0), (w1, c1, o1) = first[label], last[label]
        if label.startswith("python"):
            rows.append([label, f"{ms(w0)} / {ms(w1)} ms", "-", "-"])
        else:
            rows.append(
                [label, f"{us(w0)} / {us(w1)} us", f"{us(c0)} / {us(c1)}", f"{us(o0)} / {us(o1)}"]
            )
    print(
        "\n=== floors on this machine, before / after the runs (medians of 3 batches; "
        "python: of 20 starts) ==="
    )
    head = ["floor", "wall per op", "CPU us/op (caller)", "CPU us/op (other side)"]
    print(table(rows, head))
    print(
        "  other side: the echoing child of the pipe; the PostgreSQL backend of the session. "
        "Above, 'floor' figures are the mean of before and after."
    )


# ---------------------------------------------------------------------------------- main
def run_store(
    store: StoreKind, args: argparse.Namespace
) -> tuple[list[RunResult], list[RunResult], RunResult | None]:
    cpu, cnt = [], []
    for r in range(args.runs):
        cpu.append(one_run(store, "cpu", args.jobs, str(r)))
        cnt.append(one_run(store, "count", args.jobs, str(r)))
        print(
            f"  {store.name} run {r + 1}: {1 / cpu[-1].metrics['wall']:,.0f} jobs/s in the "
            f"window; load {loadavg()}",
            flush=True,
        )
    prof = None if args.no_profile else one_run(store, "profile", args.jobs, "p")
    return cpu, cnt, prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pg", default=PG_BASE, help="PostgreSQL URL (no schema)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--src",
        help="the folder of the outlast package to measure (e.g. a `git archive` of a commit's "
        "src/), put first on the measured processes' PYTHONPATH; default: what the venv imports",
    )
    args = parser.parse_args()
    SRC[0] = os.path.abspath(args.src) if args.src else None

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", SRC[0] or "src", "bench"], cwd=ROOT, check=False
    )
    head = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(
        f"# where_bench: repo {head}, outlast from {SRC[0] or 'the venv (src/)'}; "
        f"cores={os.cpu_count()}; load average at start {loadavg()}"
    )
    kinds = ["sqlite", "postgresql"] if args.store == "both" else [args.store]
    pg = args.pg if "postgresql" in kinds else None
    first = floors(pg)
    results = {}
    for kind in kinds:
        store = StoreKind(kind, args.pg)
        results[kind] = (store, *run_store(store, args))
    last = floors(pg)
    fl = mean_floors(first, last)
    for store, cpu, cnt, prof in results.values():
        report_store(store, cpu, cnt, prof, fl, args.jobs)
    print_floors(first, last)
    print(f"\n# load average at end {loadavg()}")


if __name__ == "__main__":
    main()
