"""Helpers shared by the benchmarks: medians, tables, temporary stores, bulk population."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outlast.ids import new_id
from outlast.model import JobState, Kind, utcnow
from outlast.store import Store, open_store


def median_rate(fn: Callable[[], int], runs: int) -> float:
    """Median of ``runs`` measurements of ``fn`` (returns how many ops it did) in ops/s."""
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def temp_store(kind: str, pg_url: str | None = None) -> Store:
    if kind == "postgresql":
        assert pg_url, "--pg URL needed"
        sep = "&" if "?" in pg_url else "?"
        return open_store(f"{pg_url}{sep}schema=bench_{os.getpid()}")
    root = tempfile.mkdtemp(prefix="outlast-bench-")
    return open_store(f"sqlite://{root}/s.db" if kind == "sqlite" else f"files://{root}/jobs")


def populate(
    store: Store,
    n: int,
    status: str = "succeeded",
    priorities: list[int] | None = None,
    limit_keys: list[str | None] | None = None,
) -> None:
    """Put ``n`` jobs in the store quickly (bulk, bypassing per-job fsyncs): a fixture only.
    ``priorities``, ``limit_keys``: each job's, chosen at random from the list (a job with
    a key gets 2 slots)."""
    import random

    now = utcnow()
    states = [
        JobState(
            id=new_id(),
            kind=Kind.FUNCTION,
            name="bench.filler",
            status=status,  # type: ignore[arg-type]
            priority=random.choice(priorities) if priorities else 0,
            created_at=now,
            updated_at=now,
        )
        for _ in range(n)
    ]
    if limit_keys:
        states = [
            s.evolve(limit_key=key, limit=None if key is None else 2)
            for s, key in ((s, random.choice(limit_keys)) for s in states)
        ]
    url = store.url
    if url.startswith("sqlite://"):
        from outlast import codec

        with store._tx("populate") as tx:  # type: ignore[attr-defined]
            tx.write_many(
                "INSERT INTO jobs (status, kind, queue, worker, run_after, created_at,"
                " finished_at, expires_at, priority, retry_of, unique_key, limit_key,"
                " limit_slots, doc, id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(*store._columns(s), codec.encode(s), s.id) for s in states],  # type: ignore[attr-defined]
            )
        return
    if url.startswith("files://"):
        root = url[len("files://") :]
        for s in states:
            fd = os.open(os.path.join(root, f"{s.id}.json"), os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, json.dumps(s.to_dict()).encode())
            os.close(fd)
        return
    for s in states:  # postgresql: through the adapter
        store._insert(s)


def table(rows: list[list[Any]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows
    )


def run_in_tree(src: str, script: str, kind: str, pg: str, *args: str) -> dict[str, Any]:
    """Run ``script`` (Python text) in a fresh process with the ``outlast`` of ``src`` first
    on ``PYTHONPATH``, on a fresh store of ``kind`` (its URL is the script's first argument,
    ``args`` follow); returns the JSON object its last line prints. A PostgreSQL store's
    schema is dropped after. For the before/after benchmarks (``git worktree add``)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        if kind == "sqlite":
            url = f"sqlite://{Path(tmp)}/s.db"
        else:
            url = f"{pg}?schema=bench_{uuid.uuid4().hex[:10]}"
        env = dict(os.environ, PYTHONPATH=src, XDG_STATE_HOME=f"{tmp}/state")
        try:
            out = subprocess.run(
                [sys.executable, "-c", script, url, *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
                check=False,
            )
        finally:
            _drop_schema(url)
        if out.returncode != 0:
            raise SystemExit(f"a run failed:\n{out.stderr[-3000:]}")
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _drop_schema(url: str) -> None:
    if "schema=" not in url:
        return
    import psycopg

    base, schema = url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def alternate(reps: int, run: Callable[[str], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``run("before")`` and ``run("after")`` ``reps`` times each, alternating which goes
    first; each result is printed as it comes. Returns the results by side."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for rep in range(reps):
        for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
            runs[side].append(run(side))
            print(side, json.dumps(runs[side][-1]), flush=True)
    return runs
