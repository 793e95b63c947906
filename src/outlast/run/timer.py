"""The store's timer: one detached process per store that starts the workers of the command
and spawned jobs waiting for their time, so that a job delayed for a day holds no process.

A command or spawned job due more than :data:`~outlast.machine.PARK_AFTER` seconds ahead
(``outlast run --in 1h``, ``spawn(delay=…)``, a retry whose backoff is that long) waits
*parked*: no worker is bound to it and no process runs for it; it is a row of the store
(:meth:`Store.timed <outlast.store.Store.timed>`). Whoever parks one makes sure the store's
timer runs (:func:`ensure`): ``python -m outlast.run.timer STORE_URL``, a detached process
that holds the store's timer lock (a flock beside the store, or a session advisory lock on
PostgreSQL, freed when it dies), so at most one runs per store. It reads the parked jobs in
time order, sleeps until the next one's time less :data:`LEAD` (looking at the store's change
watch every second, so a new earlier job is seen), starts that job's worker, and exits once
no job waits for its time. The worker waits out the last moment holding the job's lock, as a
worker always did for a near time: the job starts at its time, a cancel reaches it, and its
death is seen. A nearer time is waited for by the job's own worker, as before.

A job of a concurrency key gets its worker at its time the same way; if the key is full then,
the worker parks it for the key and a freed slot hands it on (:mod:`outlast.run.reap`).

Nothing rests on the timer being alive. If it dies (SIGKILL, a reboot), the next parked job's
submission starts another, the store's maintainer (a pool, ``outlast serve``, ``outlast
scheduler``) starts one when it sees jobs waiting and no timer, and a job
:data:`~outlast.run.reap.STRANDED_AFTER` seconds past its time with no worker is started by
the maintainer or by whoever reads it (``status``, ``ls``, ``wait``). A worker started twice
for a job finds it taken and exits: the job's lock decides, not the timer.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from datetime import datetime

from outlast.errors import JobNotFound, OutlastError
from outlast.ids import DEDICATED
from outlast.machine import parks_at
from outlast.model import JobState, Kind, Status, utcnow
from outlast.run import procs, reap
from outlast.run.presence import present
from outlast.store import ChangeWatch, MaintenanceLock, Store, Task, open_store, wait_until_due

log = logging.getLogger("outlast.timer")

#: Seconds before a parked job's time that the timer starts its worker (which takes the
#: job's lock and waits out the rest): a worker's start-up is never the job's delay. A
#: supervisor on PostgreSQL, with its connections, took over a second under load.
LEAD = 3.0
#: Seconds a worker's start takes, about, on a busy machine (a Python process importing
#: the supervisor and opening the store: 0.1 s on SQLite, more on PostgreSQL, with a
#: hundred at once on 2 cores, BENCHMARKS.md). Jobs of the same time are started this far
#: apart, the first ones earlier, so that the last one still has :data:`LEAD` before it.
START_COST = 0.2
#: Seconds between looks at the store's change watch while the timer sleeps.
LOOK_EVERY = 1.0
#: Jobs read at a time: how far ahead the timer plans (a larger crowd of the same time
#: than this starts late, by :data:`START_COST` a job); and workers started at most per
#: pass: a store restored with thousands of jobs past their time starts :data:`BATCH`
#: every :data:`BATCH_PAUSE` seconds, not all at once.
PAGE = 256
BATCH = 16
BATCH_PAUSE = 0.1
#: Seconds a timer whose store keeps failing goes on trying before it exits (the jobs are
#: then started by the next timer, the maintainer, or whoever reads them).
PATIENCE = 600.0


def parks(state: JobState, now: datetime | None = None) -> bool:
    """Whether the job waits for its time parked, with no process: a pending command or
    spawned job that nobody is bound to, due more than
    :data:`~outlast.machine.PARK_AFTER` seconds ahead."""
    return (
        state.status == Status.PENDING
        and state.worker is None
        and (state.kind == Kind.COMMAND or state.queue == DEDICATED)
        and parks_at(state.run_after, now or utcnow())
    )


def parked_at_start(store: Store, state: JobState) -> bool:
    """Whether a new command or spawned job waits parked, so that no worker is started for
    it now: for its time (the store's timer is then made sure of) or for a slot of its
    concurrency key (:func:`outlast.run.reap.parked_at_start`)."""
    if parks(state):
        ensure(store)
        return True
    return reap.parked_at_start(store, state)


#: Seconds a process waits at most for the timer it started to take the timer lock.
STARTING = 5.0
#: The timer this process started last, by store: its PID.
_started: dict[str, int] = {}


def ensure(store: Store) -> bool:
    """Start the store's timer unless one runs; True when one was started. Call it after
    the job that needs the timer is written. Never raises: a failure is logged, and the
    maintainer, or whoever reads the job once it is overdue, starts its worker.

    A timer this process started a moment ago that has not taken the lock yet is waited
    for (until it holds the lock, or exits), not started again: a program that delays a
    thousand jobs in a row starts one timer, not one per job until the first is up. The
    wait also closes the race with a timer on its way out: having let the lock go, it reads
    the store once more, and either takes the lock back (it saw the new job) or exits, and
    then another is started here."""
    from outlast.run import spawn

    try:
        if _running(store):
            return False
        _started[store.url] = spawn.spawn_timer(store)
    except (OutlastError, OSError) as exc:
        log.warning("cannot start the store's timer: %s", exc)
        return False
    return True


def _running(store: Store) -> bool:
    """Whether the store's timer runs, or will in a moment (see :func:`ensure`)."""
    if store.timer_running():
        return True
    pid = _started.get(store.url)
    deadline = time.monotonic() + STARTING
    while pid is not None and procs.start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
        if store.timer_running():
            return True
    return False


def wait_or_park(store: Store, task: Task, job_id: str, park: bool = True) -> JobState | None:
    """For a job's own worker, which holds its lock: wait until the pending job is due and
    return its state. None when it is not pending any more, or when its time is more than
    :data:`~outlast.machine.PARK_AFTER` seconds ahead (a retry's long backoff): then the
    job is let go, parked, the timer is made sure of, and the worker should exit. Not so
    with ``park`` false (a worker the timer started ahead of a crowd of one time)."""
    try:
        state = wait_until_due(store, job_id, unless=parks if park else None)
    except JobNotFound:
        return None
    if state is None or not parks(state):
        return state
    task.release_worker_lock()
    log.info("job %s: due at %s; parked for the store's timer", job_id, state.run_after)
    ensure(store)
    return None


class Timer:
    """What the timer process does, one pass at a time (:meth:`step`), so that tests and
    the process share it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: The jobs this timer has dealt with (their workers started, or found waiting with
        #: their own worker, or handed to their key), by id, with their ``(run_after, id)``:
        #: they stay in :meth:`Store.timed` until their worker takes them at their time, and
        #: are passed over until then (the same job back for another time is not). Not a
        #: cursor: a job parked later for an earlier time than some of these (a crowd's
        #: workers start early) is read all the same.
        self.handled: dict[str, tuple[datetime, str]] = {}
        #: Workers started, and jobs of a key handed to :func:`reap.start_parked`.
        self.started = 0

    def step(self) -> float | None:
        """Start the workers of the parked jobs whose start is due (at most :data:`BATCH`):
        each job's worker starts :data:`LEAD` before its time, and a crowd of jobs of the
        same time :data:`START_COST` apart, ending :data:`LEAD` before it. Returns the
        seconds until the next pass is due, or None when no job waits that this timer has
        not dealt with."""
        now = utcnow()
        page, more = self.waiting()
        keys: set[str] = set()  # each key's parked jobs are looked at once a pass
        done = 0
        for state, start_in in zip(page, _start_times(page, now), strict=True):
            if start_in > 0:
                return start_in
            if done >= BATCH:
                return BATCH_PAUSE
            assert state.run_after is not None
            done += self._start(state, now, keys)
            self.handled[state.id] = (state.run_after, state.id)
        return 0.0 if more else None

    def waiting(self) -> tuple[list[JobState], bool]:
        """The first :data:`PAGE` jobs waiting for their time that this timer has not dealt
        with, in time order, and whether more may follow. Reads past the handled ones a
        page at a time (a crowd's, while they wait for their time), and forgets those that
        are gone from :meth:`Store.timed` (their workers took them, or they were canceled)."""
        fresh: list[JobState] = []
        seen: set[str] = set()
        after: tuple[datetime, str] | None = None
        while True:
            page = self.store.timed(after, PAGE)
            for state in page:
                if self.handled.get(state.id) == (state.run_after, state.id):
                    seen.add(state.id)
                else:  # new, or back for another time (a retry's backoff)
                    fresh.append(state)
            if len(page) < PAGE or len(fresh) >= PAGE:
                break
            assert page[-1].run_after is not None
            after = (page[-1].run_after, page[-1].id)
        end = None if len(page) < PAGE else (page[-1].run_after, page[-1].id)
        for job_id, at in list(self.handled.items()):
            if job_id not in seen and (end is None or at <= end):
                del self.handled[job_id]  # read past, and not there: no longer waiting
        return fresh[:PAGE], len(fresh) >= PAGE

    def _start(self, state: JobState, now: datetime, keys: set[str]) -> int:
        """Start the worker of one parked job whose time is near; 1 if something started."""
        assert state.run_after is not None
        if self.store.worker_holds(state.id):
            return 0  # its worker waits for it already (a near time)
        key = state.limit_key
        if key is not None and state.run_after <= now:
            # due, and parked for a slot of its key: the key's turn decides
            if key in keys:
                return 0
            keys.add(key)
            started = reap.start_parked(self.store, key)
            self.started += started
            return min(started, 1)
        try:
            started = reap.start_worker(self.store, state, wait=True)
        except OutlastError as exc:
            log.warning("job %s: cannot start its worker: %s", state.id, exc)
            return 0
        self.started += started
        return int(started)


def _start_times(page: list[JobState], now: datetime) -> list[float]:
    """Seconds from ``now`` until each job of ``page`` (in time order) should get its
    worker: :data:`LEAD` before its time, and no later than :data:`START_COST` before the
    next one's start (the latest schedule that starts one worker at a time)."""
    starts: list[float] = []
    latest = float("inf")
    for state in reversed(page):
        assert state.run_after is not None
        latest = min((state.run_after - now).total_seconds() - LEAD, latest - START_COST)
        starts.append(latest)
    return starts[::-1]


def serve(store: Store, stop: threading.Event | None = None) -> int:
    """Be the store's timer until no job waits for its time (or ``stop`` is set); returns
    how many workers it started. Returns 0 at once if another process is the timer."""
    stop = stop or threading.Event()
    lock = store.timer_lock()
    timer = Timer(store)
    try:
        if not _take(lock):
            return 0
        with present(store, "timer"):
            _serve(store, timer, lock, stop)
    finally:
        lock.release()
    return timer.started


#: Seconds the timer tries for its lock before it takes it as another timer's: on a local
#: store, :meth:`Store.timer_running` probes the flock with a shared lock for a moment,
#: and a timer that gave up at such a probe exited, and another was started (two timers
#: seen at once in a test, one at a time).
TAKE_FOR = 0.2


def _take(lock: MaintenanceLock) -> bool:
    deadline = time.monotonic() + TAKE_FOR
    while not lock.try_acquire():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _serve(store: Store, timer: Timer, lock: MaintenanceLock, stop: threading.Event) -> None:
    watch = store.change_watch()
    failing: float | None = None  # since when the store fails
    delay = 0.1
    try:
        watch.changed()  # the first look is always "changed"
        while not stop.is_set():
            if not lock.held() and not _take(lock):
                return  # lost with the database connection, and taken by another timer
            try:
                wait = timer.step()
                if wait is None:
                    lock.release()
                    # a job parked since the last read finds the lock free, and starts a
                    # timer; one parked before it was let go is read here
                    if not timer.waiting()[0] or not _take(lock):
                        return
                    continue
                failing, delay = None, 0.1
            except OutlastError as exc:
                now = time.monotonic()
                failing = failing or now
                if now - failing > PATIENCE:
                    log.warning("the store has failed for %.0f s (%s): exiting", now - failing, exc)
                    return
                log.warning("the store failed (%s); retrying", exc)
                wait, delay = delay, min(delay * 2, 5.0)
            _sleep(wait, watch, stop)
    finally:
        watch.close()


def _sleep(seconds: float, watch: ChangeWatch, stop: threading.Event) -> None:
    """Sleep ``seconds``, or until the store's change watch says something was written (a
    job parked with an earlier time than the one waited for)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if stop.wait(min(left, LOOK_EVERY)):
            return
        try:
            if watch.changed():
                return
        except OutlastError:
            return


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m outlast.run.timer STORE_URL", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.basicConfig(format="%(asctime)s outlast timer: %(message)s", level=logging.INFO)
    try:
        with open_store(args[0]) as store:
            started = serve(store, stop)
    except OutlastError as exc:
        print(f"outlast timer: {exc}", file=sys.stderr)
        return 1
    log.info("no job waits for its time: exiting (%d workers started)", started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
