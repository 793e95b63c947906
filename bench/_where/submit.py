"""The submit side of ``bench/where_bench.py``: ``submit.py COUNT`` queues COUNT no-op jobs
(``bench_jobs.noop.submit(i)``, one call each) in ``$OUTLAST_STORE``, the first
:data:`WARM` untimed; snapshots (see ``_where_probe``) before and after the timed calls."""

from __future__ import annotations

import sys

import _where_probe
import bench_jobs

import outlast

WARM = 20


def main(count: int) -> None:
    outlast.use_store(None)
    for i in range(WARM):
        bench_jobs.noop.submit(i)
    _where_probe.snapshot("A")
    for i in range(WARM, count):
        bench_jobs.noop.submit(i)
    _where_probe.snapshot("B")


if __name__ == "__main__":
    main(int(sys.argv[1]))
