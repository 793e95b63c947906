"""outlast side by side with the queues a user would otherwise pick (issue #18), one workload.

Pairings (C = jobs at once per worker):

- ``sqlite``: outlast on SQLite, one ``outlast worker -c 2``, against Huey on SQLite, one
  ``huey_consumer -w 2 -k process`` (two worker processes each: the same two job processes
  beside one coordinating process). 5,000 jobs.
- ``postgresql``: outlast on PostgreSQL, two ``outlast worker -c 2``, against Procrastinate,
  two ``procrastinate worker --concurrency 2``. 2,000 jobs.
- ``redis``: RQ (two ``rq worker``: one job at a time each) and Celery (one ``celery worker
  -c 2``) on the local Redis, against outlast on SQLite and on PostgreSQL, one ``outlast
  worker -c 2`` each: everyone runs two jobs at once. 2,000 jobs. Skipped, with a note,
  when no Redis answers at 127.0.0.1:6379.

The workload (``_drive.py`` says it exactly): no-op jobs enqueued one call at a time, then
the workers started and the durable record polled every 10 ms until every job is done.
Figures: end to end = jobs / (enqueue + worker start + drain); steady = jobs/s between the
polls that see 10% and 90% done; first job = worker start → first poll that sees a job done;
latency over ``--latency`` jobs one after another to an idle worker (one worker of the
pairing's kind): submit→start (before the enqueue call → the job's first line) and
finish→seen (the job's return → a poll of the queue's status API, every 1 ms, seeing it
done), p50; enqueue: jobs/s and the p50 of one call.

Each system runs from its own virtual environment: outlast from this interpreter (the
project's ``.venv``), each peer from ``bench/.peers/NAME`` (made on first use, pinned versions
below), each run in a fresh store (a SQLite file in a new folder, a new PostgreSQL database,
flushed Redis databases 12-14). Every peer runs with its documented defaults (its module's
docstring says which); durability is stated per system. In each repetition the systems of a
pairing alternate (peer, outlast; the next repetition outlast, peer). The table gives
medians with min-max over the repetitions, and per peer the ratio to outlast: the ratio of
the medians with the min-max of the repetitions' paired ratios, > 1 when outlast is ahead
(a rate: outlast ÷ peer; a time: peer ÷ outlast).

    .venv/bin/python bench/peers/run.py [--reps 5] [--jobs N] [--latency 200]
        [--only sqlite|postgresql|redis ...] [--quick] [--pg URL] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VENVS = os.path.join(ROOT, "bench", ".peers")

#: Each peer's virtual environment and what is installed in it.
PINS = {
    "huey": ["huey==3.5.4"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary]==3.3.9", "psycopg-pool==3.3.3"],
    "rq": ["rq==3.0.0", "redis==8.1.0"],
    "celery": ["celery[redis]==5.7.0", "kombu==5.7.0", "redis==8.1.0"],
}


@dataclass(frozen=True)
class System:
    key: str  # the column
    module: str  # bench/peers/<module>_jobs.py
    venv: str | None  # bench/.peers/<venv>; None: outlast's own interpreter
    workers: int
    concurrency: int
    shape: str  # how it runs, for the table
    store: str = ""  # outlast: sqlite | postgresql
    pg: bool = False  # needs a fresh PostgreSQL database


@dataclass
class Group:
    name: str
    title: str
    jobs: int
    refs: list[System]  # outlast
    peers: list[System]
    needs: str = ""  # "postgresql" | "redis"
    results: dict[str, list[dict[str, Any] | None]] = field(default_factory=dict)


def outlast(store: str, workers: int) -> System:
    label = "SQLite" if store == "sqlite" else "PostgreSQL"
    shape = f"{workers} x `outlast worker -c 2`"
    pg = store == "postgresql"
    return System(f"outlast {label}", "outlast", None, workers, 2, shape, store, pg)


def groups(only: list[str] | None) -> list[Group]:
    everything = [
        Group(
            "sqlite",
            "SQLite: outlast vs Huey",
            5000,
            [outlast("sqlite", 1)],
            [System("Huey", "huey", "huey", 1, 2, "1 x `huey_consumer -w 2 -k process`")],
        ),
        Group(
            "postgresql",
            "PostgreSQL: outlast vs Procrastinate, two workers each",
            2000,
            [outlast("postgresql", 2)],
            [
                System(
                    "Procrastinate",
                    "procrastinate",
                    "procrastinate",
                    2,
                    2,
                    "2 x `procrastinate worker --concurrency 2`",
                    pg=True,
                )
            ],
            needs="postgresql",
        ),
        Group(
            "redis",
            "Redis peers (not durable here): RQ and Celery vs outlast, two jobs at once each",
            2000,
            [outlast("sqlite", 1), outlast("postgresql", 1)],
            [
                System("RQ", "rq", "rq", 1, 2, "2 x `rq worker`"),
                System("Celery", "celery", "celery", 1, 2, "1 x `celery worker -c 2` (prefork)"),
            ],
            needs="redis",
        ),
    ]
    return [g for g in everything if not only or g.name in only]


def peer_python(name: str) -> str:
    """The peer's interpreter, its environment made (or brought to the pins) first."""
    venv = os.path.join(VENVS, name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, "pins.txt")
    wanted = "\n".join(PINS[name]) + "\n"
    with contextlib.suppress(OSError), open(marker) as f:
        if f.read() == wanted and os.path.exists(python):
            return python
    print(f"installing {' '.join(PINS[name])} into {os.path.relpath(venv, ROOT)}", flush=True)
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS[name]],
        check=True,
    )
    with open(marker, "w") as f:
        f.write(wanted)
    return python


def redis_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def pg_error(base: str) -> str | None:
    try:
        import psycopg

        psycopg.connect(base, connect_timeout=3).close()
    except Exception as exc:  # psycopg missing, or no server: the pairing is skipped
        return f"{type(exc).__name__}: {exc}".strip()
    return None


_databases = 0


@contextlib.contextmanager
def fresh_database(base: str) -> Iterator[str]:
    """A new PostgreSQL database for one run (the URL of it), dropped afterwards."""
    import psycopg

    global _databases
    _databases += 1
    name = f"peers_{os.getpid()}_{_databases}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(base)
    try:
        yield urlunsplit((parts.scheme, parts.netloc, f"/{name}", "", ""))
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def drive(system: System, python: str, pg_base: str, *args: str) -> dict[str, Any]:
    """One run of ``_drive.py`` for ``system`` in a fresh store; its JSON line."""
    folder = tempfile.mkdtemp(prefix=f"peers-{system.module}-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTLAST_", "WORKER_"))}
    env.update(PEERS_DIR=folder, PEERS_STORE=system.store, PYTHONPATH=HERE)
    argv = [python, os.path.join(HERE, "_drive.py"), system.module, *args]
    try:
        with contextlib.ExitStack() as stack:
            if system.pg:
                env["PEERS_PG"] = stack.enter_context(fresh_database(pg_base))
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-4000:])
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_once(
    system: System, python: str, pg_base: str, jobs: int, latency: int
) -> dict[str, Any] | None:
    try:
        w, c = str(system.workers), str(system.concurrency)
        thr = drive(system, python, pg_base, "throughput", str(jobs), w, c)
        lat = drive(system, python, pg_base, "latency", str(latency), c)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"  {system.key}: FAILED\n{exc}", flush=True)
        return None
    thr.update(lat)
    thr["figures"] = {
        "end to end, jobs/s": thr["jobs"] / (thr["enqueue_s"] + thr["drain_s"]),
        "steady state, jobs/s": thr["steady"],
        "first job done after the workers start, ms": thr["first_s"] * 1000,
        "latency p50 submit→start, ms": thr["start_p50_s"] * 1000,
        "latency p50 finish→seen, ms": thr["seen_p50_s"] * 1000,
        "enqueue, jobs/s (one call at a time)": thr["jobs"] / thr["enqueue_s"],
        "enqueue p50, ms per call": thr["enqueue_p50_s"] * 1000,
    }
    f = thr["figures"]
    print(
        f"  {system.key:18} e2e {f['end to end, jobs/s']:7,.0f}/s"
        f"  steady {f['steady state, jobs/s']:7,.0f}/s"
        f"  first {f['first job done after the workers start, ms']:6,.0f} ms"
        f"  lat {f['latency p50 submit→start, ms']:6.1f} / {f['latency p50 finish→seen, ms']:5.1f}"
        f" ms  enqueue {f['enqueue, jobs/s (one call at a time)']:6,.0f}/s"
        f" p50 {f['enqueue p50, ms per call']:.2f} ms  (load {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    return thr


def is_time(figure: str) -> bool:
    return figure.endswith(", ms") or figure.endswith("ms per call")


def fmt(value: float, figure: str) -> str:
    if figure.startswith("enqueue p50"):
        return f"{value:.2f}"
    if figure.startswith("latency"):
        return f"{value:.1f}"
    return f"{value:,.0f}"


def spread(values: list[float], figure: str) -> str:
    if not values:
        return "-"
    mid = fmt(statistics.median(values), figure)
    if len(values) == 1:
        return mid
    return f"{mid} ({fmt(min(values), figure)}-{fmt(max(values), figure)})"


def advantage(ref: float, peer: float, figure: str) -> float:
    """How many times outlast is ahead: > 1 when it is."""
    return peer / ref if is_time(figure) else ref / peer


def table(group: Group) -> str:
    figures = next(
        (r["figures"].keys() for runs in group.results.values() for r in runs if r), None
    )
    if figures is None:
        return "(no run succeeded)"
    systems = group.refs + group.peers
    pairs = [(p, r) for p in group.peers for r in group.refs]
    head = ["figure", *(s.key for s in systems)]
    head += [f"{r.key} vs {p.key}" if len(group.refs) > 1 else f"vs {p.key}" for p, r in pairs]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for figure in figures:
        cells = [figure]
        for s in systems:
            cells.append(spread([r["figures"][figure] for r in group.results[s.key] if r], figure))
        for p, ref in pairs:
            both = [
                (a["figures"][figure], b["figures"][figure])
                for a, b in zip(group.results[ref.key], group.results[p.key], strict=True)
                if a and b
            ]
            if not both:
                cells.append("-")
                continue
            ours = statistics.median(a for a, _ in both)
            theirs = statistics.median(b for _, b in both)
            paired = [advantage(a, b, figure) for a, b in both]
            cell = f"**{advantage(ours, theirs, figure):.2f}x**"
            if len(paired) > 1:
                cell += f" ({min(paired):.2f}-{max(paired):.2f})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(group: Group) -> list[str]:
    out = []
    for s in group.refs + group.peers:
        done = next((r for r in group.results[s.key] if r), None)
        if done:
            out.append(f"- **{s.key}** ({done['version']}; {s.shape}): {done['settings']}.")
            out.append(f"  Durability: {done['durability']}.")
    return out


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def commit() -> str:
    out = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no", "src"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() + (" (src/ modified)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.add_argument("--reps", type=int, help="repetitions (default 5; --quick: 1)")
    parser.add_argument(
        "--jobs",
        type=int,
        help="jobs per throughput run, every pairing (default 5,000 on "
        "SQLite, 2,000 on PostgreSQL and Redis; --quick: 300)",
    )
    parser.add_argument("--latency", type=int, help="sequential jobs (default 200; --quick: 50)")
    parser.add_argument(
        "--only",
        action="append",
        choices=["sqlite", "postgresql", "redis"],
        help="run this pairing only (repeatable)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, 1 rep")
    parser.add_argument(
        "--pg",
        default="postgresql://127.0.0.1:5432/test",
        help="a PostgreSQL database to connect to for CREATE/DROP DATABASE (default: %(default)s)",
    )
    parser.add_argument("--json", help="also write every run's raw figures to this file")
    opts = parser.parse_args()
    reps = opts.reps or (1 if opts.quick else 5)
    latency = opts.latency or (50 if opts.quick else 200)
    jobs_override = opts.jobs or (300 if opts.quick else None)

    print(
        f"# bench/peers/run.py: {reps} rep(s), latency {latency} jobs; {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, outlast at {commit()}; "
        f"load average before {load()}",
        flush=True,
    )
    # Compiled like an installed package: pip compiles a peer's modules when it installs it,
    # an editable install of outlast is compiled on first import, unless the environment says
    # PYTHONDONTWRITEBYTECODE (then every process would compile outlast from source: 60 ms
    # more per start seen here). Python reads the bytecode whatever that variable says.
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "src", "outlast"), HERE],
        check=True,
    )
    chosen, pythons = [], {}
    pg_problem = pg_error(opts.pg)
    for group in groups(opts.only):
        if group.needs == "postgresql" and pg_problem:
            print(f"skipped {group.name}: no PostgreSQL at {opts.pg} ({pg_problem})")
            continue
        if group.needs == "redis" and not redis_up():
            print(f"skipped {group.name}: no Redis answers at 127.0.0.1:6379")
            continue
        if group.needs == "redis" and pg_problem:
            group.refs = [r for r in group.refs if not r.pg]
        try:
            for peer in group.peers:
                assert peer.venv is not None
                pythons[peer.key] = peer_python(peer.venv)
        except (subprocess.CalledProcessError, OSError) as exc:
            print(f"skipped {group.name}: cannot install its peers ({exc})")
            continue
        for ref in group.refs:
            pythons[ref.key] = sys.executable
        group.jobs = jobs_override or group.jobs
        group.results = {s.key: [] for s in group.refs + group.peers}
        chosen.append(group)

    for rep in range(reps):
        for group in chosen:
            # peer, outlast (, peer, outlast); the next repetition the other way round
            pairs = zip_longest(group.peers, group.refs)
            order = [s for pair in pairs for s in pair if s is not None]
            order = order if rep % 2 == 0 else order[::-1]
            print(f"rep {rep + 1}/{reps} {group.name} ({group.jobs:,} jobs)", flush=True)
            for system in order:
                group.results[system.key].append(
                    run_once(system, pythons[system.key], opts.pg, group.jobs, latency)
                )

    print(f"\n# load average after {load()}\n")
    print(
        "Medians over the repetitions (min-max); ratios > 1: outlast ahead (rates outlast ÷ "
        "peer, times peer ÷ outlast), the ratio of the medians (min-max of the paired reps).\n"
    )
    for group in chosen:
        print(f"### {group.title}: {group.jobs:,} jobs, latency {latency}, {reps} rep(s)\n")
        print(table(group))
        print()
        print("\n".join(describe(group)))
        print()
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({g.name: g.results for g in chosen}, f, indent=1)


if __name__ == "__main__":
    main()
