"""A pool's job process: runs the jobs its pool sends, one at a time, until told to stop.

Forked by the pool once it has imported what this needs (:func:`outlast.boot.fork`, which
calls :func:`main`), or spawned as ``python -m outlast.run.jobproc FD STORE_URL [MODULE…]``
(a replacement; not through multiprocessing, which would re-import the user's ``__main__``);
either way before the pool has opened its store. ``FD`` is its end of a socket pair: once
booted it reads the pool's introduction there (the pool's name and token, and the descriptor
of its liveness lock, see :meth:`outlast.store.Store.liveness_fd`, held so that the pool's jobs
stay alive while this process lives, and the memory file of the :class:`outlast.boot.Words`
they share), says ``"ready"``, then takes ``(job_id, attempt, document, acked, number)`` in
and sends ``(number, outcome)`` back, in order. The document is the job as claimed, so a job
starts without reading the store. ``number`` counts the jobs sent (1, 2, …): the pool may send
the next job before the current one ends; a job whose number the pool set as the words'
``skip`` is not started (the answer is ``(number, "held")``), and a cancel signal counts only
while the job the words' ``cancel`` names runs. Every answer names its job's number, so the
pool never writes an outcome to a job other than the one it came from.

Around the call the process journals the attempt's start and its outcome (``JOURNAL`` names the
pool and its token; see :mod:`outlast.store.journal`), so a pool killed at any moment neither
counts an attempt that never started nor runs again a function that returned; ``acked`` lists
the attempts whose outcomes the pool wrote since (their records may go). The outcome's record
may still be on its way to a database when the pool is handed the outcome: the process waits
for it before it takes the next job or dies with its pool.

It dies with its pool (parent-death signal) and ignores SIGINT/SIGTERM, which are the pool's to
handle; SIGUSR1 tells the running job that it was canceled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from outlast import boot

if TYPE_CHECKING:
    from outlast.store import Journal


def main(argv: list[str]) -> int:
    from outlast.run import procs

    procs.set_parent_death_signal()
    pool_pid = int(os.environ.pop("OUTLAST_POOL_PID", "0")) or os.getppid()
    if os.getppid() != pool_pid:  # the pool died before we could ask to die with it
        return 1
    # From the function's return until its outcome is journaled, the pool's death does not
    # kill this process: the outcome is journaled first (the pool's jobs stay alive as long
    # as this process does), then it dies.
    shield = partial(procs.set_parent_death_signal, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from outlast import codec
    from outlast.errors import CorruptJob, OutlastError
    from outlast.run import context, registry
    from outlast.run.capture import Capture
    from outlast.run.execute import run_attempt
    from outlast.run.procs import patiently
    from outlast.store import open_store

    conn = boot.Channel(int(argv[0]))
    running = _Running()
    context.install_cancel_handler(running.meant)
    registry.inherit_sys_path()
    try:
        registry.import_modules(argv[2:])
        store = patiently(lambda: open_store(argv[1] or None))
        pool, token, alive, shared = boot.introduced(conn.fileno())
        running.share(shared)
    except (OutlastError, EOFError, OSError, ValueError, KeyError) as exc:
        with contextlib.suppress(OSError):  # the pool says it, once
            conn.send(("error", str(exc)))
        return 1
    if alive is not None:  # the pool's liveness lock: ours, not our children's
        os.set_inheritable(alive, False)
        os.register_at_fork(after_in_child=partial(_close, alive))
    journal = store.journal(pool, f"{token}+{os.getpid()}")
    capture = Capture()  # each job's output goes to its log
    try:
        conn.send("ready")
    except OSError:
        return 1  # the pool died while this process started
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return 0
        if message is None:
            return 0
        job_id, attempt, doc, acked, number = message
        journal.written(acked)
        if running.skipped(number):  # taken back before it started
            outcome: object = "held"
        else:
            try:
                state = codec.decode(job_id, doc)
            except CorruptJob:
                state = None  # read it from the store instead, which says what is wrong
            # the attempt counts from just before the function is called
            on_start = partial(_start, journal, (job_id, attempt), pool_pid)
            with running.job(number), capture.job(partial(store.log_writer, job_id)):
                outcome = run_attempt(store, job_id, attempt, state, on_start, shield)
            journal.send_returned((job_id, attempt), outcome)
        # The outcome's record is sent, and the outcome handed to the pool while it is on
        # its way; this process lives on (shielded from its pool's death) until the record
        # is in, so the job looks alive until then and whoever reconciles it reads it.
        try:
            if os.getppid() != pool_pid:
                raise BrokenPipeError
            conn.send((number, outcome))
        except OSError:
            journal.settle()
            return 1  # the pool died meanwhile: its jobs are for whoever reconciles them
        journal.settle()
        procs.set_parent_death_signal()


class _Running:
    """The number of the job running now (0: none) and the words shared with the pool
    (:class:`outlast.boot.Words`; None: the pool gave none, and sends nothing ahead)."""

    def __init__(self) -> None:
        self.number = 0
        self.words: boot.Words | None = None

    def share(self, fd: int | None) -> None:
        if fd is not None:
            self.words = boot.Words(fd)

    def meant(self) -> bool:
        """Whether the pool's cancel signal is for the job running now."""
        words = self.words
        return words is None or (self.number != 0 and words.cancel == self.number)

    def skipped(self, number: int) -> bool:
        return self.words is not None and self.words.skip == number

    @contextlib.contextmanager
    def job(self, number: int) -> Iterator[None]:
        self.number = number
        try:
            yield
        finally:
            self.number = 0


def preload() -> None:
    """Import what :func:`main` imports as it starts (a pool that forks its job processes
    does this once, before the fork)."""
    import outlast.codec
    import outlast.run.capture
    import outlast.run.context
    import outlast.run.execute
    import outlast.run.procs
    import outlast.store  # noqa: F401


def _start(journal: Journal, key: tuple[str, int], pool_pid: int) -> bool:
    """Journal the start; False (the function is not called, the attempt is given back) if
    that failed, or if the pool died meanwhile: not killed with it while the record was on
    its way (a database round trip), this process then tells the journal it did not start."""
    from outlast.run import procs

    procs.set_parent_death_signal(0)
    recorded = journal.started(key)
    procs.set_parent_death_signal()
    return recorded and os.getppid() == pool_pid


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
