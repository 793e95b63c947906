"""Flow control: what a claim costs with priorities and concurrency keys in the claim's
path, at 1,000 and at 100,000 pending jobs (the ratio; target <= 2x). Priorities -5..5 at
random; a fifth of the jobs carry one of 100 concurrency keys with 2 slots each.

    python bench/flow_bench.py [--runs 3] [--claims 200] [--stores sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import populate  # noqa: E402
from time_bench import drop, fresh  # noqa: E402

from outlast import codec  # noqa: E402
from outlast.ids import new_id  # noqa: E402
from outlast.model import JobState, Kind, utcnow  # noqa: E402
from outlast.store import Store, open_store  # noqa: E402

PRIORITIES = list(range(-5, 6))
KEYS: list[str | None] = [*(f"tenant:{i}" for i in range(100)), *([None] * 400)]


def fill(store: Store, n: int) -> None:
    if store.url.startswith("sqlite://"):
        populate(store, n, status="pending", priorities=PRIORITIES, limit_keys=KEYS)
        return
    import random

    import psycopg

    from outlast.store._pglocks import lock_key

    schema = store.schema  # type: ignore[attr-defined]
    now = utcnow()
    rows = []
    for _ in range(n):
        state = JobState(
            id=new_id(),
            kind=Kind.FUNCTION,
            name="bench.filler",
            priority=random.choice(PRIORITIES),
            created_at=now,
            updated_at=now,
        )
        rows.append(
            (
                "pending",
                "function",
                "default",
                now,
                0,
                state.priority,
                codec.encode(state),
                state.id,
                lock_key(schema, state.id),
            )
        )
    with psycopg.connect(store.url.partition("?")[0], autocommit=False) as conn:
        with conn.cursor().copy(
            f'COPY "{schema}".jobs (status, kind, queue, created_at, seq, priority, doc, id,'
            " lock_key) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute(f'ANALYZE "{schema}".jobs')


def claim_cost(kind: str, pending: int, claims: int) -> float:
    url = fresh(kind, f"claim{pending}")
    store = open_store(url)
    try:
        fill(store, pending)
        store.claim(limit=1, queues=["default"], kinds=[Kind.FUNCTION])  # warm-up
        t0 = time.perf_counter()
        for _ in range(claims):
            [task] = store.claim(limit=1, queues=["default"], kinds=[Kind.FUNCTION])
            store.release_worker_locks([task])
        return (time.perf_counter() - t0) / claims
    finally:
        store.close()
        drop(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--stores", default="sqlite,postgresql")
    args = parser.parse_args()
    print(f"# cores={os.cpu_count()} load={os.getloadavg()[0]:.2f}")
    for kind in args.stores.split(","):
        small, large = [], []
        for _ in range(args.runs):  # alternating
            small.append(claim_cost(kind, 1_000, args.claims))
            large.append(claim_cost(kind, 100_000, args.claims))
        ratios = [b / a for a, b in zip(small, large, strict=True)]
        print(
            f"  claim (priorities, 100 keys)  {kind:10}"
            f" 1,000 pending {statistics.median(small) * 1000:6.2f} ms"
            f"   100,000 pending {statistics.median(large) * 1000:6.2f} ms"
            f"   ratio {statistics.median(ratios):.2f} (target <= 2)"
        )
    print(f"# load after={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
