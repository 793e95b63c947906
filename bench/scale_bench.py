"""Scale curves (issue #18, item 3): what a store costs as it fills up, and as pools are added.

1. **Store size.** A store is filled with N finished (succeeded) no-op jobs, N = 1k, 100k and
   1M by default, each row and its two events copied from a job that really ran (same
   columns, same document and event bytes; only the id and the times differ: the jobs
   finished one after another over the last 7 days, ids in time order as ``new_id`` makes
   them). Then, on each of the filled stores in turn (the order alternates between
   repetitions), with the fillers' pages in the OS cache:

   - ``store.get(id)`` of 2,000 fillers picked at random (p50 / p95);
   - ``store.claim(limit=1)`` then ``task.succeed`` of 300 jobs, one at a time, from a
     backlog of 620 pending no-op jobs (p50 of each), and ``claim(limit=16)`` then
     ``apply_many`` of their 16 outcomes, what a pool does (per job);
   - ``store.list(limit=50)`` (``outlast ls``, the dashboard's first page),
     ``store.stats()`` (``outlast stats``, ``outlast queues``, ``GET /metrics``,
     ``GET /queues``) and ``store.timeline()`` (the dashboard's chart), p50;
   - the drain of 2,000 no-op jobs by one ``outlast worker -c 2``: jobs/s from the first
     job's start to the last one's end, and between the 10% and 90% finish times.

   The jobs a repetition made are deleted afterwards, so each store keeps its N. SQLite:
   the WAL is checkpointed (TRUNCATE) after filling; PostgreSQL: ``VACUUM ANALYZE`` (what
   autovacuum would have done by then). A PostgreSQL fill projected to take longer than
   ``--pg-budget`` seconds (default 180) for 1M is cut to 300k, and the table says so.

2. **Pools.** 1, 2, 4, 8 ``outlast worker -c 2`` processes on one fresh store (SQLite file,
   PostgreSQL schema) each run; once every pool is registered and idle, 4,000 no-op jobs
   are queued with one ``submit_many``, all due at one moment just after the insert, so
   every pool starts on a full queue at once. Reported: jobs/s (first start → last end;
   10%→90% of finishes), how late the first job started after its due time, CPU seconds of
   the pools' processes and of PostgreSQL's per 1,000 jobs, the PostgreSQL connections the
   pools' processes hold (TCP sockets to the server, counted per process), and the checks:
   every job ``succeeded`` with ``attempts == 1`` and exactly two events (one start), and
   no ``database is locked`` / ``Traceback`` in any worker's output. Then once more with one
   working pool and 7 idle pools of another queue (``--idle``): what pools that have
   nothing to do cost while others work (the wake-ups every pool gets for every job).

Figures are medians of ``--runs`` repetitions (default 3), with each repetition's ratio to
the smallest store (or to one pool) and its median, since a shared 2-core machine moves
absolute numbers by 2x from one minute to the next. The load average is printed at the start
and the end. Every worker is started in its own session and its process group is killed
afterwards; temporary folders and PostgreSQL schemas are removed.

    python bench/scale_bench.py [--quick] [--runs 3] [--only sizes|pools]
        [--stores sqlite,postgresql] [--sizes 1000,100000,1000000] [--pools 1,2,4,8]
        [--pg postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_jobs  # noqa: E402

import outlast  # noqa: E402
from outlast.machine import Outcome  # noqa: E402
from outlast.model import format_time, utcnow  # noqa: E402
from outlast.run.execute import transition  # noqa: E402
from outlast.store import Store, open_store  # noqa: E402

DAY = 86400.0
SPAN = 7 * DAY  # the fillers finished over the last week
CHUNK = 50_000  # filler rows per transaction
PG_CAP = 300_000  # the size a PostgreSQL fill is cut to when 1M would take too long
GET_SAMPLE = 2000
CLAIM_ONE, CLAIM_BATCHES, BATCH = 300, 20, 16
DRAIN_TIMEOUT = 600.0
TIME_RE = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00")
PROBLEMS = {"locked": re.compile(rb"database is locked"), "traceback": re.compile(rb"Traceback")}

_procs: list[subprocess.Popen[bytes]] = []  # every worker started, killed at exit
PG_PORT = 5432  # --pg's


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# ---------------------------------------------------------------------- stores


@dataclass
class Target:
    """One store under test: its URL, a folder (SQLite file, worker logs), raw SQL access."""

    kind: str  # sqlite | postgresql
    url: str
    folder: str
    schema: str = ""
    pg_base: str = ""
    store: Store | None = None
    size: int = 0  # fillers in it
    note: str = ""
    sample: list[str] = field(default_factory=list)  # filler ids for the gets

    @property
    def ph(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"

    def table(self, name: str) -> str:
        return f'"{self.schema}".{name}' if self.kind == "postgresql" else name

    def raw(self) -> Any:
        """A plain connection (autocommit) to the store's database, outside outlast."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(os.path.join(self.folder, "s.db"), isolation_level=None)
            conn.execute("PRAGMA busy_timeout=60000")
            return conn
        import psycopg

        return psycopg.connect(self.pg_base, autocommit=True)

    def open(self) -> Store:
        self.store = open_store(self.url)
        return self.store

    def destroy(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.kind == "postgresql":
            with contextlib.closing(self.raw()) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        shutil.rmtree(self.folder, ignore_errors=True)


_made = 0


def new_target(kind: str, tag: str, pg_base: str) -> Target:
    global _made
    _made += 1
    folder = tempfile.mkdtemp(prefix=f"outlast-scale-{tag}-")
    if kind == "sqlite":
        return Target(kind, f"sqlite://{folder}/s.db", folder)
    schema = f"scale_{os.getpid()}_{_made}"
    sep = "&" if "?" in pg_base else "?"
    url = f"{pg_base}{sep}schema={schema}"
    return Target(kind, url, folder, schema=schema, pg_base=pg_base)


# ---------------------------------------------------------------------- filling


@dataclass
class Template:
    """A job that really ran, as its stored rows: each filler is a copy of it."""

    columns: list[str]
    values: list[Any]
    events: list[tuple[int, bytes]]  # (seq, doc)
    doc_at: int  # index of the doc column
    times: list[int]  # offsets (µs) of its distinct time strings from the first
    plan: list[Callable[[dict[bytes, bytes], str], Any]]  # each column's value for a filler
    event_docs: list[bytes]  # templates with %(…)s holes


def _us(text: bytes) -> int:
    moment = datetime.fromisoformat(text.decode())
    return round(moment.timestamp() * 1_000_000)


def _fmt(us: int) -> bytes:
    secs, frac = divmod(us, 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(secs))}.{frac:06d}+00:00".encode()


def _holes(raw: bytes, job_id: str, times: list[bytes]) -> bytes:
    out = raw.replace(b"%", b"%%").replace(job_id.encode(), b"%(id)s")
    for n, t in enumerate(times):
        out = out.replace(t, b"%%(t%d)s" % n)
    return out


def template(target: Target, store: Store) -> Template:
    """Run one no-op job through the store (submit, claim, succeed) and read its rows back."""
    [made] = outlast.submit_many(bench_jobs.noop, [[0]], store=store)
    [task] = store.claim(limit=1)
    assert task.id == made.id
    task.succeed(0)
    task.release_worker_lock()
    with contextlib.closing(target.raw()) as conn:
        cur = conn.execute(
            f"SELECT * FROM {target.table('jobs')} WHERE id = {target.ph}", (task.id,)
        )
        columns = [d[0] for d in cur.description]
        values = list(cur.fetchone())
        events = conn.execute(
            f"SELECT seq, doc FROM {target.table('events')} WHERE job_id = {target.ph}"
            " ORDER BY seq",
            (task.id,),
        ).fetchall()
    events = [(int(seq), bytes(doc)) for seq, doc in events]
    as_text = [(format_time(v) or "").encode() if isinstance(v, datetime) else v for v in values]
    doc_at = columns.index("doc")
    doc = bytes(values[doc_at])
    found = set(TIME_RE.findall(doc))
    for _, ev in events:
        found |= set(TIME_RE.findall(ev))
    for v in as_text:
        if isinstance(v, str) and TIME_RE.fullmatch(v.encode()):
            found.add(v.encode())
        if isinstance(v, bytes) and TIME_RE.fullmatch(v):
            found.add(v)
    times = sorted(found)
    first = _us(times[0])
    doc_t = _holes(doc, task.id, times)
    schema = target.schema

    def column(name: str, value: Any) -> Callable[[dict[bytes, bytes], str], Any]:
        text = value.encode() if isinstance(value, str) else value
        if name == "id":
            return lambda m, job_id: job_id
        if name == "doc":
            return lambda m, job_id: doc_t % m
        if name == "lock_key":
            return lambda m, job_id: _lock_key(schema, job_id)
        if isinstance(text, bytes) and text in times:
            hole = b"t%d" % times.index(text)
            return lambda m, job_id: m[hole].decode()
        return lambda m, job_id: value

    return Template(
        columns=columns,
        values=values,
        events=events,
        doc_at=doc_at,
        times=[_us(t) - first for t in times],
        plan=[column(n, v) for n, v in zip(columns, as_text, strict=True)],
        event_docs=[_holes(ev, task.id, times) for _, ev in events],
    )


def _lock_key(schema: str, job_id: str) -> int:
    """The PostgreSQL adapter's advisory lock key of a job (``_pglocks.lock_key``)."""
    digest = hashlib.blake2b(f"{schema}/{job_id}".encode(), digest_size=8, person=b"outlast")
    return int.from_bytes(digest.digest(), "big", signed=True)


def fillers(
    tpl: Template, start: int, stop: int, n: int, now_us: int
) -> Iterator[tuple[list[Any], list[tuple[str, int, bytes]]]]:
    """Filler ``start``…``stop`` of ``n``: a job row and its event rows."""
    first = now_us - int(SPAN * 1_000_000)
    step = (SPAN - 60.0) * 1_000_000 / max(n, 1)
    seqs = [seq for seq, _ in tpl.events]
    for i in range(start, stop):
        base = first + int(i * step)
        job_id = f"{base // 1000:012x}{i:08x}"
        holes = {b"id": job_id.encode()}
        for k, off in enumerate(tpl.times):
            holes[b"t%d" % k] = _fmt(base + off)
        row = [make(holes, job_id) for make in tpl.plan]
        events = [(job_id, seq, ev % holes) for seq, ev in zip(seqs, tpl.event_docs, strict=True)]
        yield row, events


def fill(target: Target, n: int, budget: float) -> tuple[int, float, float]:
    """Put ``n - 1`` fillers beside the template job; (fillers stored, seconds, seconds of
    the checkpoint or VACUUM ANALYZE after)."""
    store = target.store
    assert store is not None
    tpl = template(target, store)
    now_us = int(time.time() * 1_000_000)
    total = n - 1
    cols = ", ".join(tpl.columns)
    t0 = time.perf_counter()
    done = 0
    with contextlib.closing(target.raw()) as conn:
        if target.kind == "sqlite":
            conn.execute("PRAGMA synchronous=NORMAL")
            marks = ", ".join("?" * len(tpl.columns))
            job_sql = f"INSERT INTO jobs ({cols}) VALUES ({marks})"
            event_sql = "INSERT INTO events (job_id, seq, doc) VALUES (?, ?, ?)"
        while done < total:
            upto = min(total, done + CHUNK)
            rows, events = [], []
            for row, evs in fillers(tpl, done, upto, total, now_us):
                rows.append(row)
                events += evs
            if target.kind == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(job_sql, rows)
                conn.executemany(event_sql, events)
                conn.execute("COMMIT")
            else:
                with conn.transaction(), conn.cursor() as cur:
                    with cur.copy(f"COPY {target.table('jobs')} ({cols}) FROM STDIN") as cp:
                        for row in rows:
                            cp.write_row(row)
                    with cur.copy(
                        f"COPY {target.table('events')} (job_id, seq, doc) FROM STDIN"
                    ) as cp:
                        for ev in events:
                            cp.write_row(ev)
            target.sample += random.sample([r[tpl.columns.index("id")] for r in rows], 500)
            done = upto
            elapsed = time.perf_counter() - t0
            if target.kind == "postgresql" and total > PG_CAP and done < PG_CAP:
                projected = elapsed / done * total
                if projected > budget:
                    target.note = (
                        f"cut to {PG_CAP:,}: 1M projected at {projected:.0f} s "
                        f"(> --pg-budget {budget:.0f} s) from the first {done:,}"
                    )
                    total = PG_CAP - 1
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        if target.kind == "sqlite":
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            for name in ("jobs", "events"):
                conn.execute(f"VACUUM ANALYZE {target.table(name)}")
        after = time.perf_counter() - t1
    target.size = done + 1
    return done, seconds, after


def db_bytes(target: Target) -> int:
    if target.kind == "sqlite":
        return sum(
            os.path.getsize(os.path.join(target.folder, f))
            for f in os.listdir(target.folder)
            if f.startswith("s.db") and os.path.isfile(os.path.join(target.folder, f))
        )
    with contextlib.closing(target.raw()) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (target.schema,),
        ).fetchone()
    return int(row[0] or 0)


def trim(target: Target, marker: str) -> None:
    """Delete what a repetition made (ids sort by time: every id above ``marker``)."""
    tables = [("events", "job_id"), ("labels", "job_id")]
    if target.kind == "postgresql":
        tables += [("job_logs", "job_id"), ("journal", "id")]
    with contextlib.closing(target.raw()) as conn:
        if target.kind == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
        for name, column in [*tables, ("jobs", "id")]:
            conn.execute(
                f"DELETE FROM {target.table(name)} WHERE {column} > {target.ph}", (marker,)
            )
        if target.kind == "sqlite":
            conn.execute("COMMIT")


# ---------------------------------------------------------------------- workers


def start_worker(
    target: Target, tag: str, concurrency: int, queue: str | None = None
) -> subprocess.Popen[bytes]:
    env = dict(os.environ, OUTLAST_STORE=target.url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "outlast", "worker", "-c", str(concurrency)]
    argv += ["--import", "bench_jobs", *(["--queue", queue] if queue else [])]
    with open(os.path.join(target.folder, f"worker-{tag}.log"), "ab") as log:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _procs.append(proc)
    return proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each worker's process group; SIGKILL the group of any left after 15 s."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the pool's job processes too
        proc.wait()
        if proc in _procs:
            _procs.remove(proc)


def cpu_of(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds (user + system) of these processes and all their descendants."""
    out: dict[int, float] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pid)
            for proc in [top, *top.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    out[proc.pid] = t.user + t.system
    return out


def pg_conns(pids: Iterator[int] | dict[int, float]) -> int:
    """TCP connections to PostgreSQL (``--pg``'s port) held by these processes."""
    count = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == PG_PORT:
                    count += 1
    return count


def postgres_cpu() -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["name"]):
        if (proc.info.get("name") or "").startswith("postgres"):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
    return out


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


def scan_logs(folder: str) -> dict[str, int]:
    found = dict.fromkeys(PROBLEMS, 0)
    for name in os.listdir(folder):
        if name.startswith("worker-") and name.endswith(".log"):
            with open(os.path.join(folder, name), "rb") as f:
                text = f.read()
            for key, pattern in PROBLEMS.items():
                found[key] += len(pattern.findall(text))
    return found


def logs_tail(folder: str) -> str:
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".log"):
            with open(os.path.join(folder, name), "rb") as f:
                out.append(f"--- {name}\n" + f.read()[-3000:].decode(errors="replace"))
    return "\n".join(out)


def stamp(value: datetime | None) -> float:
    assert value is not None
    return value.timestamp()


def drain(
    target: Target, jobs: int, pools: int, concurrency: int, tag: str, idle: int = 0
) -> dict[str, Any]:
    """Start ``pools`` workers (and ``idle`` more on another queue, which never get a job),
    wait until each is registered, queue ``jobs`` no-op jobs all due at one moment, wait
    until they are done, stop the workers; the figures."""
    store = target.store
    assert store is not None
    procs: list[subprocess.Popen[bytes]] = []
    counter = target.raw()
    pg = target.kind == "postgresql"
    try:
        t0 = time.perf_counter()
        procs = [start_worker(target, f"{tag}-{n}", concurrency) for n in range(pools)]
        procs += [
            start_worker(target, f"{tag}-idle{n}", concurrency, "elsewhere") for n in range(idle)
        ]
        while sum(1 for w in store.workers() if w.get("kind") == "pool") < pools + idle:
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"a worker exited ({proc.returncode})\n" + logs_tail(target.folder)
                    )
            if time.perf_counter() - t0 > 120:
                raise RuntimeError("the pools did not register in 120 s")
            time.sleep(0.05)
        startup = time.perf_counter() - t0
        time.sleep(1.0)  # their job processes start
        cpu0 = cpu_of([p.pid for p in procs[:pools]])
        idle0 = cpu_of([p.pid for p in procs[pools:]])
        pg0 = postgres_cpu() if pg else {}
        lead = 0.5 + jobs / 4000  # due just after the insert ends
        due = utcnow() + timedelta(seconds=lead)
        e0 = time.perf_counter()
        tasks = outlast.submit_many(
            bench_jobs.noop.options(at=due), [[i] for i in range(jobs)], store=store
        )
        enqueue = time.perf_counter() - e0
        late_insert = utcnow() > due
        ids = [t.id for t in tasks]
        count_sql = (
            f"SELECT count(*) FROM {target.table('jobs')} WHERE status = 'succeeded'"
            f" AND id >= {target.ph}"
        )
        first_id = min(ids)
        while True:
            done = int(counter.execute(count_sql, (first_id,)).fetchone()[0])
            if done >= jobs:
                break
            if time.perf_counter() - e0 > DRAIN_TIMEOUT:
                raise RuntimeError(f"{done} of {jobs} done after {DRAIN_TIMEOUT} s")
            for proc in procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"a worker exited ({proc.returncode})\n" + logs_tail(target.folder)
                    )
            time.sleep(0.02)
        cpu1 = cpu_of([p.pid for p in procs[:pools]])
        idle1 = cpu_of([p.pid for p in procs[pools:]])
        pg1 = postgres_cpu() if pg else {}
        conns = max(pg_conns(cpu0), pg_conns(cpu1)) if pg else 0
        wal = os.path.join(target.folder, "s.db-wal")
        wal_mb = os.path.getsize(wal) / 1e6 if os.path.exists(wal) else 0.0
    finally:
        stop(procs)
        counter.close()
    states = store.get_many(ids)
    bad = [s for s in states.values() if s.status != "succeeded" or s.attempts != 1]
    with contextlib.closing(target.raw()) as conn:
        events = int(
            conn.execute(
                f"SELECT count(*) FROM {target.table('events')} WHERE job_id >= {target.ph}",
                (first_id,),
            ).fetchone()[0]
        )
    starts = sorted(stamp(s.started_at) for s in states.values())
    ends = sorted(stamp(s.finished_at) for s in states.values())
    span = ends[-1] - starts[0]
    low, high = ends[int(0.1 * len(ends))], ends[int(0.9 * len(ends)) - 1]
    problems = scan_logs(target.folder)
    return {
        "jobs/s": jobs / span,
        "steady": (int(0.9 * len(ends)) - int(0.1 * len(ends))) / max(high - low, 1e-9),
        "startup": startup,
        "first_late": starts[0] - due.timestamp(),
        "enqueue": enqueue,
        "late_insert": late_insert,
        "cpu_workers": spent(cpu0, cpu1),
        "cpu_pg": spent(pg0, pg1),
        "cpu_idle": spent(idle0, idle1),
        "load1": os.getloadavg()[0],
        "wal_mb": wal_mb,
        "span": span,
        "conns": conns,
        "missing": jobs - len(states),
        "bad": len(bad),
        "events_per_job": events / jobs,
        **problems,
    }


# ---------------------------------------------------------------------- the size curve


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_store(target: Target, drain_jobs: int, concurrency: int, tag: str) -> dict[str, Any]:
    """One repetition on a filled store; deletes what it made afterwards."""
    store = target.store
    assert store is not None
    marker = f"{int(time.time() * 1000) - 1:012x}"
    out: dict[str, Any] = {}
    picks = random.choices(target.sample, k=GET_SAMPLE)
    store.get(picks[0])
    gets = [timed(lambda i=i: store.get(i)) for i in picks]  # type: ignore[misc]
    out["get p50"], out["get p95"] = pct(gets, 50), pct(gets, 95)

    outlast.submit_many(
        bench_jobs.noop, [[i] for i in range(CLAIM_ONE + CLAIM_BATCHES * BATCH)], store=store
    )
    claims, succeeds = [], []
    for _ in range(CLAIM_ONE):
        t0 = time.perf_counter()
        [task] = store.claim(limit=1)
        t1 = time.perf_counter()
        task.succeed(0)
        task.release_worker_lock()
        claims.append(t1 - t0)
        succeeds.append(time.perf_counter() - t1)
    batch_claims, batch_outcomes = [], []
    for _ in range(CLAIM_BATCHES):
        t0 = time.perf_counter()
        tasks = store.claim(limit=BATCH)
        t1 = time.perf_counter()
        assert len(tasks) == BATCH, len(tasks)
        items = []
        for task in tasks:
            assert task.attempt is not None
            fn = transition(Outcome("succeed", 0), task.attempt)
            assert fn is not None
            items.append((task.id, fn))
        store.apply_many(items)
        store.release_worker_locks(tasks)
        batch_claims.append((t1 - t0) / BATCH)
        batch_outcomes.append((time.perf_counter() - t1) / BATCH)
    out["claim1 p50"], out["succeed p50"] = pct(claims, 50), pct(succeeds, 50)
    out["claim16/job"], out["outcome16/job"] = med(batch_claims), med(batch_outcomes)
    out["list50 p50"] = med([timed(lambda: store.list(limit=50)) for _ in range(20)])
    out["stats p50"] = med([timed(lambda: store.stats()) for _ in range(3)])
    out["timeline p50"] = med([timed(lambda: store.timeline()) for _ in range(3)])
    out.update(drain(target, drain_jobs, 1, concurrency, tag))
    trim(target, marker)
    return out


SIZE_ROWS: list[tuple[str, str, Callable[[float], str], bool]] = [
    # (figure, key, format, lower is better)
    ("get p50, µs", "get p50", lambda v: f"{v * 1e6:,.0f}", True),
    ("get p95, µs", "get p95", lambda v: f"{v * 1e6:,.0f}", True),
    ("claim(limit=1) p50, ms", "claim1 p50", lambda v: f"{v * 1e3:.2f}", True),
    ("succeed p50, ms", "succeed p50", lambda v: f"{v * 1e3:.2f}", True),
    ("claim(limit=16), ms per job", "claim16/job", lambda v: f"{v * 1e3:.3f}", True),
    ("apply_many(16 outcomes), ms per job", "outcome16/job", lambda v: f"{v * 1e3:.3f}", True),
    ("list(limit=50) p50, ms", "list50 p50", lambda v: f"{v * 1e3:.2f}", True),
    ("stats() p50, ms", "stats p50", lambda v: f"{v * 1e3:,.1f}", True),
    ("timeline() p50, ms", "timeline p50", lambda v: f"{v * 1e3:,.1f}", True),
    ("drain 1 x -c 2, jobs/s", "jobs/s", lambda v: f"{v:,.0f}", False),
    ("drain 10%→90%, jobs/s", "steady", lambda v: f"{v:,.0f}", False),
    ("pool start → registered, s", "startup", lambda v: f"{v:.2f}", True),
    ("SQLite WAL after the drain, MB", "wal_mb", lambda v: f"{v:.1f}", True),
    ("load average (1 min) after the drain", "load1", lambda v: f"{v:.1f}", True),
]


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(med(values))} ({fmt(min(values))}-{fmt(max(values))})"


def md(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def size_curve(kind: str, sizes: list[int], args: argparse.Namespace) -> str:
    targets: list[Target] = []
    fills: list[list[str]] = [["store", "jobs in it", "fill, s", "rows/s", "after, s", "size"]]
    try:
        for n in sizes:
            target = new_target(kind, f"size{n}", args.pg)
            targets.append(target)
            target.open()
            say(f"[{kind}] filling {n:,} jobs ... (load {os.getloadavg()[0]:.2f})")
            stored, seconds, after = fill(target, n, args.pg_budget)
            mb = db_bytes(target) / 1e6
            label = f"{n:,}" + (f" → {target.size:,}" if target.size != n else "")
            fills.append(
                [
                    label,
                    f"{target.size:,}",
                    f"{seconds:.1f}",
                    f"{stored / seconds:,.0f}",
                    f"{after:.1f}",
                    f"{mb:,.0f} MB",
                ]
            )
            say(
                f"[{kind}]   {stored:,} rows in {seconds:.1f} s (+{after:.1f} s), {mb:,.0f} MB"
                + (f"; {target.note}" if target.note else "")
            )
        results: dict[int, list[dict[str, Any]]] = {t.size: [] for t in targets}
        for rep in range(args.runs):
            order = targets if rep % 2 == 0 else targets[::-1]
            for target in order:
                r = measure_store(target, args.drain_jobs, args.concurrency, f"r{rep}")
                results[target.size].append(r)
                say(
                    f"[{kind}] rep {rep + 1}/{args.runs} N={target.size:,}: get "
                    f"{r['get p50'] * 1e6:.0f} µs, claim {r['claim1 p50'] * 1e3:.2f} ms, "
                    f"stats {r['stats p50'] * 1e3:.0f} ms, drain {r['jobs/s']:,.0f} jobs/s, "
                    f"bad {r['bad']}, locked {r['locked']}, tracebacks {r['traceback']} "
                    f"(load {os.getloadavg()[0]:.2f})"
                )
    finally:
        for target in targets:
            target.destroy()
    sizes_done = [t.size for t in targets]
    base = sizes_done[0]
    head = ["figure", *(f"N={s:,}" for s in sizes_done)]
    head += [f"{s // 1000:,}k ÷ {base // 1000:,}k" for s in sizes_done[1:]]
    rows = [head]
    for title, key, fmt, _ in SIZE_ROWS:
        if kind == "postgresql" and key == "wal_mb":
            continue
        cells = [title]
        for s in sizes_done:
            cells.append(spread([r[key] for r in results[s]], fmt))
        for s in sizes_done[1:]:
            if key == "load1":
                cells.append("")
                continue
            ratios = [div(a[key], b[key]) for a, b in zip(results[s], results[base], strict=True)]
            cells.append(
                f"{med(ratios):.2f}"
                + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")
            )
        rows.append(cells)
    checks = []
    for s in sizes_done:
        rs = results[s]
        checks.append(
            f"N={s:,}: jobs not succeeded once {sum(r['bad'] + r['missing'] for r in rs)}, "
            f"events/job {med([r['events_per_job'] for r in rs]):.2f}, "
            f"'database is locked' {sum(r['locked'] for r in rs)}, "
            f"tracebacks {sum(r['traceback'] for r in rs)}"
        )
    notes = [t.note for t in targets if t.note]
    return "\n".join(
        [
            f"### Store size, {kind}: {args.runs} rep(s), drains of {args.drain_jobs:,} jobs",
            "",
            md(fills),
            "",
            md(rows),
            "",
            "Checks: " + "; ".join(checks) + ".",
            *(f"Note: {n}." for n in notes),
        ]
    )


# ---------------------------------------------------------------------- the pools curve


POOL_ROWS: list[tuple[str, str, Callable[[float], str]]] = [
    ("jobs/s (first start → last end)", "jobs/s", lambda v: f"{v:,.0f}"),
    ("jobs/s (10% → 90% of finishes)", "steady", lambda v: f"{v:,.0f}"),
    ("first start after due, ms", "first_late", lambda v: f"{v * 1e3:,.0f}"),
    ("pools' CPU, s per 1,000 jobs", "cpu_workers/k", lambda v: f"{v:.2f}"),
    ("PostgreSQL CPU, s per 1,000 jobs", "cpu_pg/k", lambda v: f"{v:.2f}"),
    ("cores busy (pools + PostgreSQL)", "cores", lambda v: f"{v:.2f}"),
    ("PostgreSQL connections (peak)", "conns", lambda v: f"{v:.0f}"),
    ("start → all pools registered, s", "startup", lambda v: f"{v:.2f}"),
    ("SQLite WAL after the drain, MB", "wal_mb", lambda v: f"{v:.1f}"),
    ("load average (1 min) after the drain", "load1", lambda v: f"{v:.1f}"),
]


def one_drain(
    kind: str, pools: int, idle: int, args: argparse.Namespace, rep: int
) -> dict[str, Any]:
    """One drain on a fresh store, with the derived figures; a progress line."""
    target = new_target(kind, f"pools{pools}i{idle}", args.pg)
    try:
        target.open()
        r = drain(target, args.pool_jobs, pools, args.concurrency, f"p{pools}", idle)
    finally:
        target.destroy()
    k = args.pool_jobs / 1000
    r["cpu_workers/k"] = r["cpu_workers"] / k
    r["cpu_idle/k"] = r["cpu_idle"] / k
    r["cpu_pg/k"] = r["cpu_pg"] / k
    r["cores"] = (r["cpu_workers"] + r["cpu_idle"] + r["cpu_pg"]) / r["span"]
    shape = f"{pools} pool(s)" + (f" + {idle} idle on another queue" if idle else "")
    say(
        f"[{kind}] rep {rep + 1}/{args.runs} {shape}: {r['jobs/s']:,.0f} jobs/s"
        f" (steady {r['steady']:,.0f}), cores {r['cores']:.2f}, conns {r['conns']},"
        f" bad {r['bad'] + r['missing']}, locked {r['locked']},"
        f" tracebacks {r['traceback']} (load {os.getloadavg()[0]:.2f})"
    )
    return r


def ratio_cells(
    runs: list[list[dict[str, Any]]], base: list[dict[str, Any]], key: str
) -> list[str]:
    cells = []
    for results in runs:
        ratios = [div(a[key], b[key]) for a, b in zip(results, base, strict=True)]
        cells.append(
            f"{med(ratios):.2f}"
            + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")
        )
    return cells


CHECKS: list[tuple[str, Callable[[dict[str, Any]], int]]] = [
    (
        "jobs not succeeded exactly once",
        lambda r: int(r["bad"] + r["missing"] + (r["events_per_job"] != 2.0)),
    ),
    ("'database is locked' in worker output", lambda r: int(r["locked"])),
    ("tracebacks in worker output", lambda r: int(r["traceback"])),
    ("inserts that ended after the due time", lambda r: int(r["late_insert"])),
]


def figure_rows(
    kind: str,
    columns: list[list[dict[str, Any]]],
    table: list[tuple[str, str, Callable[[float], str]]],
) -> list[list[str]]:
    rows = []
    for title, key, fmt in table:
        if kind == "sqlite" and key in ("cpu_pg/k", "conns"):
            continue
        if kind == "postgresql" and key == "wal_mb":
            continue
        rows.append([title, *(spread([r[key] for r in results], fmt) for results in columns)])
    return rows


def check_rows(columns: list[list[dict[str, Any]]]) -> list[list[str]]:
    return [
        [title, *(f"{sum(get(r) for r in results):.0f}" for results in columns)]
        for title, get in CHECKS
    ]


IDLE_ROWS: list[tuple[str, str, Callable[[float], str]]] = [
    ("jobs/s (first start → last end)", "jobs/s", lambda v: f"{v:,.0f}"),
    ("working pool's CPU, s per 1,000 jobs", "cpu_workers/k", lambda v: f"{v:.2f}"),
    ("idle pools' CPU (all), s per 1,000 jobs", "cpu_idle/k", lambda v: f"{v:.2f}"),
    ("PostgreSQL CPU, s per 1,000 jobs", "cpu_pg/k", lambda v: f"{v:.2f}"),
    ("cores busy (all)", "cores", lambda v: f"{v:.2f}"),
    ("load average (1 min) after the drain", "load1", lambda v: f"{v:.1f}"),
]


def pools_curve(kinds: list[str], pools: list[int], args: argparse.Namespace) -> list[str]:
    results: dict[tuple[str, int], list[dict[str, Any]]] = {
        (k, p): [] for k in kinds for p in pools
    }
    idle: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rep in range(args.runs):
        order = pools if rep % 2 == 0 else pools[::-1]
        for kind in kinds:
            for p in order:
                results[(kind, p)].append(one_drain(kind, p, 0, args, rep))
            if args.idle:
                idle[kind].append(one_drain(kind, 1, args.idle, args, rep))
    out = []
    for kind in kinds:
        columns = [results[(kind, p)] for p in pools]
        rows = [["figure", *(f"{p} pool{'s' if p > 1 else ''}" for p in pools)]]
        rows += figure_rows(kind, columns, POOL_ROWS)
        base = columns[0]
        rows.append(["jobs/s ÷ 1 pool", *ratio_cells(columns, base, "jobs/s")])
        rows.append(["10→90% ÷ 1 pool", *ratio_cells(columns, base, "steady")])
        rows += check_rows(columns)
        out.append(
            "\n".join(
                [
                    f"### Pools on one {kind} store: {args.pool_jobs:,} no-op jobs, "
                    f"each pool `outlast worker -c {args.concurrency}`, {args.runs} rep(s)",
                    "",
                    md(rows),
                ]
            )
        )
        if not args.idle or 1 not in pools:
            continue
        alone = results[(kind, 1)]
        columns = [alone, idle[kind]]
        rows = [["figure", "1 pool alone", f"1 pool + {args.idle} idle pools"]]
        rows += figure_rows(kind, columns, IDLE_ROWS)
        rows.append(["jobs/s ÷ alone", *ratio_cells(columns, alone, "jobs/s")])
        rows += check_rows(columns)
        out.append(
            "\n".join(
                [
                    f"### Bystanders on {kind}: one pool drains {args.pool_jobs:,} jobs while "
                    f"{args.idle} pools of another queue (`--queue elsewhere`) have nothing "
                    "to do",
                    "",
                    md(rows),
                ]
            )
        )
    return out


# ---------------------------------------------------------------------- main


def commit() -> str:
    head = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    src = os.path.dirname(os.path.dirname(os.path.abspath(outlast.__file__)))
    if src != os.path.join(ROOT, "src"):
        return f"outlast from {src} (repository HEAD {head})"
    dirty = subprocess.run(
        ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "src"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"outlast at {head}" + (" (src/ modified)" if dirty else "")


def pg_problem(url: str) -> str | None:
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            row = conn.execute("SHOW max_connections").fetchone()
            say(f"PostgreSQL at {url}: max_connections {row[0] if row else '?'}")
    except Exception as exc:  # psycopg missing, or no server: PostgreSQL is skipped
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument("--quick", action="store_true", help="a smoke run: small, 1 rep")
    parser.add_argument("--runs", type=int, help="repetitions (default 3; --quick 1)")
    parser.add_argument("--only", choices=["sizes", "pools"], help="one of the two curves")
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--sizes", help="jobs in the store (default 1000,100000,1000000)")
    parser.add_argument("--pools", help="pool counts (default 1,2,4,8)")
    parser.add_argument("--concurrency", type=int, default=2, help="-c of each pool")
    parser.add_argument("--drain-jobs", type=int, help="jobs per drain, size curve (2,000)")
    parser.add_argument("--pool-jobs", type=int, help="jobs per drain, pools curve (4,000)")
    parser.add_argument(
        "--idle", type=int, help="idle pools beside one working pool (default 7; --quick 3; 0: no)"
    )
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--pg-budget",
        type=float,
        default=180.0,
        help="seconds a PostgreSQL fill of 1M may take (else 300k)",
    )
    args = parser.parse_args()
    q = args.quick
    args.runs = args.runs or (1 if q else 3)
    sizes = [
        int(s) for s in (args.sizes or ("1000,20000" if q else "1000,100000,1000000")).split(",")
    ]
    pools = [int(p) for p in (args.pools or ("1,2,4" if q else "1,2,4,8")).split(",")]
    args.drain_jobs = args.drain_jobs or (500 if q else 2000)
    args.pool_jobs = args.pool_jobs or (1000 if q else 4000)
    args.idle = (3 if q else 7) if args.idle is None else args.idle
    kinds = args.stores.split(",")
    global PG_PORT
    PG_PORT = urlsplit(args.pg).port or 5432
    if "postgresql" in kinds:
        problem = pg_problem(args.pg)
        if problem:
            print(f"skipped postgresql: {problem}")
            kinds.remove("postgresql")

    state = tempfile.mkdtemp(prefix="outlast-scale-state-")
    os.environ["XDG_STATE_HOME"] = state  # what the stores keep outside (PostgreSQL's logs)
    os.environ.pop("OUTLAST_STORE", None)
    # compiled once: under PYTHONDONTWRITEBYTECODE every worker would compile outlast again
    src = os.path.dirname(os.path.dirname(os.path.abspath(outlast.__file__)))
    subprocess.run([sys.executable, "-m", "compileall", "-q", src, HERE], check=True)
    started = time.monotonic()
    print(
        f"# bench/scale_bench.py: {args.runs} rep(s); {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM; {commit()}; "
        f"load average at start {load()}",
        flush=True,
    )
    sections: list[str] = []
    try:
        if args.only in (None, "sizes"):
            for kind in kinds:
                sections.append(size_curve(kind, sizes, args))
                print("\n" + sections[-1] + "\n", flush=True)
        if args.only in (None, "pools"):
            for section in pools_curve(kinds, pools, args):
                sections.append(section)
                print("\n" + section + "\n", flush=True)
    finally:
        stop(list(_procs))
        shutil.rmtree(state, ignore_errors=True)
    print(
        f"# load average at end {load()}; {time.monotonic() - started:.0f} s in all. Cells: "
        "median (min-max) of the repetitions; ratios: the median of each repetition's ratio "
        "(min-max)."
    )


if __name__ == "__main__":
    main()
