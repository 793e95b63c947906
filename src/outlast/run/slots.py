"""The parts of a pool: its job processes and their slots, and how it rides out a store
that fails for a while."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from outlast.boot import Channel, Process, Words
from outlast.store import Store, Task

log = logging.getLogger("outlast.worker")


class Outage:
    """Backoff with jitter while the store fails, and one log line for the outage and one
    for its end, not one per try."""

    MIN, MAX = 0.1, 5.0

    def __init__(self) -> None:
        self.delay = 0.0
        self.since: float | None = None

    def pause(self, exc: BaseException) -> float:
        if self.since is None:
            self.since = time.monotonic()
            log.warning("the store failed (%s); going on, and retrying with backoff", exc)
        self.delay = min(self.MAX, max(self.MIN, self.delay * 2))
        return self.delay * (0.5 + random.random())

    def over(self) -> None:
        if self.since is not None:
            log.warning("the store answers again after %.1f s", time.monotonic() - self.since)
            self.since, self.delay = None, 0.0


class JobProcess:
    """A job process and a pidfd that becomes readable when it exits."""

    def __init__(self, popen: Process) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.sentinel = os.pidfd_open(popen.pid)

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def reap(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        if self.sentinel >= 0 and self.popen.returncode is not None:
            os.close(self.sentinel)
            self.sentinel = -1


@dataclass
class Slot:
    """One job process, the job it runs, if any, and the job sent ahead to it, if any."""

    process: JobProcess
    conn: Channel
    #: What the pool and the process share (None: nothing is sent ahead to this one).
    words: Words | None = None
    task: Task | None = None
    #: The job sent to the process to start once ``task`` ends (see outlast.run.pool).
    ahead: Task | None = None
    #: The channel numbers of ``task`` and of the last job sent (see outlast.boot.Words).
    number: int = 0
    sent: int = 0
    #: The number of a job taken back whose ``(n, "held")`` has not come yet (0: none).
    #: Until it comes, nothing more is sent ahead: the process looks at ``skip`` only when
    #: it reads that job, so a second take-back's ``skip`` would start the first job there
    #: too (it ran twice, at once, in 19 of 1,000 kill cycles: RELIABILITY.md).
    unanswered: int = 0
    deadline: float | None = None
    kill_at: float | None = None
    #: The job's worker lock was lost: whatever its process says, nothing is written.
    lost: bool = False
    #: The job is being canceled and runs its cleanup (until ``kill_at``).
    canceling: bool = False
    #: When the job was handed to the process (monotonic), for the pool's mean job time.
    started: float = 0.0
    #: Attempts whose outcome the process journaled and the pool has not written yet, and
    #: those written since its last job (it is told with the next one).
    unacked: list[tuple[str, int]] = field(default_factory=list)
    acked: list[tuple[str, int]] = field(default_factory=list)


@contextlib.contextmanager
def pool_store(url: str | None, imports: list[str]) -> Iterator[Store]:
    """What a pool does before it starts: import the modules that register its jobs, open
    the store (a database restarting meanwhile is waited out, as the job processes do), and
    store the schedules its modules declare (``@outlast.job(cron=…)``)."""
    from outlast.run import procs
    from outlast.run.registry import import_modules
    from outlast.run.schedules import sync_declared
    from outlast.store import open_store

    import_modules(imports)
    with procs.patiently(lambda: open_store(url)) as store:
        sync_declared(store)
        yield store
