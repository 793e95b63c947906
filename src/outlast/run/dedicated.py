"""A dedicated worker: the detached process ``outlast.spawn`` starts for one function job.

It holds the job's worker lock for its whole life, runs each attempt in-process, and waits out
the retry backoff itself (the job stays bound to it meanwhile, so its death is seen as
abandonment). Run as ``python -m outlast.run.dedicated STORE_URL JOB_ID``.
"""

from __future__ import annotations

import sys

from outlast.errors import OutlastError, WorkerLockHeld
from outlast.model import Status
from outlast.run import context
from outlast.run.execute import execute
from outlast.store import Store, open_store, wait_until_due


def run_dedicated(store: Store, job_id: str) -> None:
    task = store.open(job_id)
    try:
        task.hold_worker_lock()
    except WorkerLockHeld:
        return
    context.install_cancel_handler()
    while True:
        if wait_until_due(store, job_id) is None or not task.start():
            return
        assert task.attempt is not None
        execute(store, job_id, task.attempt, dedicated=True)
        if store.get(job_id).status != Status.PENDING:
            return


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m outlast.run.dedicated STORE_URL JOB_ID", file=sys.stderr)
        return 2
    try:
        with open_store(args[0]) as store:
            run_dedicated(store, args[1])
    except OutlastError as exc:
        print(f"outlast worker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
