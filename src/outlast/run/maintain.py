"""The store's maintenance, done by one elected process per store.

Every pool and every ``outlast serve`` runs a :class:`Maintainer`: a thread that waits for the
store's maintenance lock (a flock on the local stores, a session advisory lock on PostgreSQL;
either way freed by the kernel or the server the moment its holder dies, so another process
takes over at once). The holder:

- reconciles the jobs of dead workers: kills what a dead command left running, retries or
  fails the job, restarts dedicated workers;
- fires the due schedules (:mod:`outlast.run.schedules`), waking at the next fire time, so a
  schedule fires within milliseconds of its time whatever process holds the lock;
- starts the store's timer (:mod:`outlast.run.timer`) when jobs wait for their time and no
  timer runs (it was killed), and restarts the worker of a command or spawned job that nobody
  took (its worker died before taking it, a reboot), once it is ``reap.STRANDED_AFTER``
  seconds late,
  and starts the workers of parked jobs whose key has a free slot (a hand-off lost with a
  killed worker or pool), at most ``RESTART_BATCH`` a pass;
- removes finished jobs past their retention (``keep=``, ``$OUTLAST_KEEP``) in batches of
  ``PRUNE_BATCH``, each job in its own short transaction, every ``PRUNE_EVERY`` seconds.

Cost while nothing dies: on the local stores, a listing of the lock folder and a non-blocking
flock per live holder each sweep (no query), and one query a minute as a safety net (a lock
file deleted by hand); on PostgreSQL one query per sweep (a dead worker's lock simply
disappears: nothing is written that could wake anyone). Schedules and jobs nobody took are
looked at again only when the store's change watch (the database files' times; PostgreSQL's
notifications) says something was written, at the time noted for them, or once a minute.
Every process that is not the maintainer only waits for the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from outlast import config
from outlast.model import JobState, utcnow
from outlast.run import reap, schedules, timer
from outlast.store import ChangeWatch, MaintenanceLock, Store

log = logging.getLogger("outlast.maintain")

#: Seconds between sweeps for jobs of dead workers.
SWEEP_EVERY = 1.0
#: Seconds between thorough sweeps (a query even when no lock file says anybody died).
THOROUGH_EVERY = 60.0
#: Seconds before looking again for command and spawned jobs nobody took, after a failure.
STRAYS_EVERY = 5.0
#: Seconds between retention passes, and jobs removed at most per pass (another pass follows
#: at once while there are more).
PRUNE_EVERY = 60.0
PRUNE_BATCH = 500
#: Workers of jobs nobody took started at most per pass: the rest wait a sweep.
RESTART_BATCH = 16


class Maintainer:
    """Waits to become the store's maintainer, then maintains it until stopped (or the lock
    is lost, say with the database connection: then it waits again)."""

    def __init__(
        self, store: Store, every: float = SWEEP_EVERY, thorough_every: float = THOROUGH_EVERY
    ) -> None:
        self.store, self.every, self.thorough_every = store, every, thorough_every
        #: Set once the first attempt is over: this process swept once, or another holds
        #: the lock (a burst pool waits for it, so that it finds retried jobs).
        self.ready = threading.Event()
        #: True while this process is the maintainer.
        self.active = False
        #: Sweeps done, jobs reconciled, jobs made by schedules, stray jobs restarted and
        #: jobs removed by retention (for tests and ``outlast workers``).
        self.sweeps = 0
        self.reconciled = 0
        self.fired = 0
        self.strays = 0
        self.pruned = 0
        self._strays_at: float | None = None  # when a job nobody took may be overdue
        self._prune_at = 0.0
        self._next_fire: float | None = None  # monotonic time of the next schedule's fire
        self._watch: ChangeWatch | None = None
        self._stop = threading.Event()
        self._lock: MaintenanceLock | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Maintainer:
        self._lock = self.store.maintenance_lock()
        self._thread = threading.Thread(target=self._run, name="outlast-maintainer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop maintaining and let the lock go. The interrupt is sent again until the thread
        is gone: one sent just before a blocking wait for the lock began finds nothing to
        interrupt."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive():
            if self._lock is not None:
                self._lock.interrupt()
            self._thread.join(0.1)
            if time.monotonic() >= deadline:
                log.warning("the store's maintainer did not stop within %.0f s", timeout)
                return

    def _run(self) -> None:
        assert self._lock is not None
        lock = self._lock
        try:
            if lock.try_acquire():
                self._maintain(lock)
            self.ready.set()
            while not self._stop.is_set() and lock.acquire():
                self._maintain(lock)
        except Exception:  # a bug: say so, and let the process go on without maintaining
            log.exception("the store's maintainer stopped")
        finally:
            self.ready.set()
            self.active = False
            lock.release()

    def _maintain(self, lock: MaintenanceLock) -> None:
        log.info("this process maintains the store %s", self.store.url)
        self.active = True
        thorough_at = 0.0  # the first sweep is thorough: the last maintainer may have died
        while not self._stop.is_set() and lock.held():
            now = time.monotonic()
            thorough = now >= thorough_at
            if thorough:
                thorough_at = now + self.thorough_every
            if not self.sweep(thorough):
                thorough_at = 0.0  # what said a worker died may be spent: look at every job
            self.ready.set()
            pause = self.every
            if self._next_fire is not None:
                pause = min(pause, max(0.0, self._next_fire - time.monotonic()))
            self._stop.wait(pause)
        self.active = False
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if not self._stop.is_set():
            log.warning("lost the store's maintenance lock; waiting to take it again")

    def sweep(self, thorough: bool = False) -> bool:
        """One round of maintenance (see the module docstring); False when something failed
        (the next sweep then looks at every live job). One job that cannot be reconciled
        (the store failed, its worker could not be restarted) never stops the others, nor
        the thread. Schedules and jobs nobody took are looked at when the store's change
        watch says something changed, when the time noted for them comes, and on thorough
        sweeps: while nothing happens, no query."""
        ok = self._reconcile(thorough)
        now = time.monotonic()
        try:
            changed = self._watch_changed()
        except Exception as exc:
            log.warning("maintenance: cannot watch the store for changes: %s", exc)
            changed = True
        if changed or thorough or (self._next_fire is not None and now >= self._next_fire):
            ok = self._fire() and ok
        if changed or thorough or (self._strays_at is not None and now >= self._strays_at):
            ok = self._restart_strays() and ok
        if now >= self._prune_at:
            self._prune_at = now + PRUNE_EVERY
            ok = self._prune() and ok
        return ok

    def _watch_changed(self) -> bool:
        if self._watch is None:
            self._watch = self.store.change_watch()
        return self._watch.changed()

    def _fire(self) -> bool:
        """Fire the due schedules; note when the next one is due."""
        try:
            due = self.store.next_fire()
            if due is not None and due <= utcnow():
                self.fired += len(schedules.fire_due(self.store))
                due = self.store.next_fire()
        except Exception as exc:
            log.warning("maintenance: cannot fire schedules: %s", exc)
            self._next_fire = time.monotonic() + self.every  # look again soon
            return False
        self._next_fire = None
        if due is not None:
            self._next_fire = time.monotonic() + max(0.0, (due - utcnow()).total_seconds())
        return True

    def _restart_strays(self) -> bool:
        """Start the worker of each command or spawned job that nobody took a while after
        its time (:data:`reap.STRANDED_AFTER`), and of the parked jobs of each key with a
        free slot (the hand-off of a worker or pool killed after its job ended), at most
        :data:`RESTART_BATCH` per pass: the rest a sweep later, so a store restored with
        thousands of queued commands is not thousands of processes started at once. Note
        when to look again."""
        try:
            now = utcnow()
            waiting = self.store.unclaimed(now)
            usage = self.store.slots()
            keys = [key for key in self.store.parked_keys() if _may_have_room(usage.get(key))]
            ahead = self.store.timed((now, ""), 1)
        except Exception as exc:
            log.warning("maintenance: cannot look for jobs nobody took: %s", exc)
            self._strays_at = time.monotonic() + STRAYS_EVERY
            return False
        later = list[float]()
        if ahead:  # jobs parked for their time: the timer starts them; this looks after
            timer.ensure(self.store)
            later.append(max(0.0, _stray_in(ahead[0], now)))
        started = self._restart_unkeyed(waiting, now, later)
        for key in keys:
            if started >= RESTART_BATCH:
                later.append(self.every)
                break
            started += self._start_parked(key, now, later, RESTART_BATCH - started)
        self.strays += started
        self._strays_at = time.monotonic() + min(later) + 0.05 if later else None
        return True

    def _restart_unkeyed(self, waiting: list[JobState], now: datetime, later: list[float]) -> int:
        """Restart the workers of the strays of ``waiting``; returns how many were started,
        and adds to ``later`` when to look again at the others."""
        started = 0
        for state in waiting:
            wait = _stray_in(state, now)
            if wait >= 0:
                later.append(wait)
            elif started >= RESTART_BATCH:
                later.append(self.every)
            elif self.store.worker_holds(state.id):  # a dedicated worker waiting its time
                later.append(STRAYS_EVERY)
            else:
                try:
                    started += reap.start_worker(self.store, state)
                except Exception as exc:
                    log.warning("maintenance: cannot restart job %s: %s", state.id, exc)
                    later.append(STRAYS_EVERY)
        return started

    def _start_parked(self, key: str, now: datetime, later: list[float], most: int) -> int:
        """Start the workers of up to ``most`` of the parked jobs of ``key`` that may start
        now (none while it is full); returns how many."""
        try:
            parked = self.store.parked(key)
        except Exception as exc:
            log.warning("maintenance: cannot look for the parked jobs of %s: %s", key, exc)
            later.append(STRAYS_EVERY)
            return 0
        started = 0
        for state in parked:
            wait = _stray_in(state, now)
            if wait >= 0:  # its worker was started a moment ago, and is on its way
                later.append(wait)
            elif started >= most:
                later.append(self.every)
            elif reap.start_worker(self.store, state):
                started += 1
        return started

    def _prune(self) -> bool:
        """Remove what retention says is due, a batch at a time."""
        try:
            keep = config.keep()
            removed = self.store.prune(keep=keep, limit=PRUNE_BATCH)
        except Exception as exc:
            log.warning("maintenance: cannot remove expired jobs: %s", exc)
            return False
        self.pruned += len(removed)
        if len(removed) >= PRUNE_BATCH:
            self._prune_at = 0.0  # more are due: the next sweep goes on
        return True

    def _reconcile(self, thorough: bool) -> bool:
        """Reconcile the jobs of dead workers; a sweep counts once they could be listed."""
        try:
            states = self.store.abandoned_jobs(thorough)
        except Exception as exc:
            log.warning("maintenance: cannot look for abandoned jobs: %s", exc)
            return False
        ok = True
        for state in states:
            try:
                after = reap.reconcile(self.store, state)
            except Exception as exc:
                log.warning("maintenance: cannot reconcile job %s: %s", state.id, exc)
                ok = False
                continue
            if after.status != state.status:
                self.reconciled += 1
        self.sweeps += 1
        return ok


def _may_have_room(usage: tuple[int | None, int] | None) -> bool:
    """Whether a key of ``usage`` (its slots set, its jobs running) may have a free slot:
    one whose slots are set and all taken has none (one without slots set goes by its
    jobs' own limits: :meth:`Store.parked` tells)."""
    if usage is None or usage[0] is None:
        return True
    return usage[1] < usage[0]


def _stray_in(state: JobState, now: datetime) -> float:
    """Seconds until a job nobody took counts as a stray (:data:`reap.STRANDED_AFTER` after
    its last change or its time: before that, a worker started for it may be on its way);
    below zero once it does."""
    since = max(state.updated_at, state.run_after or state.updated_at)
    return reap.STRANDED_AFTER - float((now - since).total_seconds())


def run_maintainer(url: str | None, imports: list[str]) -> None:
    """``outlast scheduler``: store the schedules the ``imports`` declare, then maintain the
    store until SIGTERM or SIGINT."""
    import signal

    from outlast.run.registry import import_modules
    from outlast.store import open_store

    import_modules(imports)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with open_store(url) as store:
        schedules.sync_declared(store)
        maintainer = Maintainer(store).start()
        log.warning("outlast scheduler: maintaining %s (SIGTERM to stop)", store.url)
        from outlast.run.presence import present

        try:
            with present(store, "scheduler"):
                while not stop.wait(1.0):
                    pass
        finally:
            maintainer.stop()
