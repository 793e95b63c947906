"""The store's maintenance, done by one elected process per store.

Every pool and every ``outlast serve`` runs a :class:`Maintainer`: a thread that waits for the
store's maintenance lock (a flock on the local stores, a session advisory lock on PostgreSQL;
either way freed by the kernel or the server the moment its holder dies, so another process
takes over at once). The holder reconciles the jobs of dead workers: kills what a dead command
left running, retries or fails the job, restarts dedicated workers. (Schedules and retention
will be fired from here too.)

Cost while nothing dies: on the local stores, a listing of the lock folder and a non-blocking
flock per live holder each sweep (no query), and one query a minute as a safety net (a lock
file deleted by hand); on PostgreSQL one query per sweep (a dead worker's lock simply
disappears: nothing is written that could wake anyone). Every process that is not the
maintainer only waits for the lock.
"""

from __future__ import annotations

import logging
import threading
import time

from outlast.run import reap
from outlast.store import MaintenanceLock, Store

log = logging.getLogger("outlast.maintain")

#: Seconds between sweeps for jobs of dead workers.
SWEEP_EVERY = 1.0
#: Seconds between thorough sweeps (a query even when no lock file says anybody died).
THOROUGH_EVERY = 60.0


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
        #: Sweeps done, and jobs reconciled (for tests and ``outlast workers``).
        self.sweeps = 0
        self.reconciled = 0
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
            self._stop.wait(self.every)
        self.active = False
        if not self._stop.is_set():
            log.warning("lost the store's maintenance lock; waiting to take it again")

    def sweep(self, thorough: bool = False) -> bool:
        """Reconcile the jobs whose worker died; False when something failed (the next
        sweep then looks at every live job). One job that cannot be reconciled (the store
        failed, its worker could not be restarted) never stops the others, nor the thread."""
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
