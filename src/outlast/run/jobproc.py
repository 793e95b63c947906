"""A pool's job process: runs the jobs its pool sends, one at a time, until told to stop.

Started by the pool as ``python -m outlast.run.jobproc FD STORE_URL JOURNAL [MODULE…]`` (not
through multiprocessing, which would re-import the user's ``__main__``). ``FD`` is its end of a
socket pair carrying ``(job_id, attempt, document, acked)`` in and the attempt's outcome back
out; the pool writes it. The document is the job as claimed, so a job starts without reading
the store.

Around the call the process journals the attempt's start and its outcome (``JOURNAL`` names the
pool and its token; see :mod:`outlast.store.journal`), so a pool killed at any moment neither
counts an attempt that never started nor runs again a function that returned; ``acked`` lists
the attempts whose outcomes the pool wrote since (their records may go).

It dies with its pool (parent-death signal) and ignores SIGINT/SIGTERM, which are the pool's to
handle; SIGUSR1 tells the running job that it was canceled.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> int:
    from outlast.run import procs

    procs.set_parent_death_signal()
    if os.getppid() == 1:  # the pool died before we could ask to die with it
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    extra = os.environ.get("OUTLAST_SYS_PATH")
    if extra:
        sys.path[:0] = [p for p in json.loads(extra) if p not in sys.path]
    conn = Connection(int(argv[0]))
    from outlast import codec
    from outlast.errors import CorruptJob
    from outlast.run import context, registry
    from outlast.run.execute import run_attempt
    from outlast.store import open_store

    context.install_cancel_handler()
    registry.import_modules(argv[3:])
    store = open_store(argv[1])
    pool, token = json.loads(argv[2])
    journal = store.journal(pool, f"{token}+{os.getpid()}")
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return 0
        if message is None:
            return 0
        job_id, attempt, doc, acked = message
        journal.written(acked)
        try:
            state = codec.decode(job_id, doc)
        except CorruptJob:
            state = None  # read it from the store instead, which says what is wrong
        journal.started((job_id, attempt))  # from here on, the attempt counts
        outcome = run_attempt(store, job_id, attempt, state)
        journal.returned((job_id, attempt), outcome)  # durable before the pool has it
        conn.send(outcome)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
