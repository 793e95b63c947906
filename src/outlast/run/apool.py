"""``outlast worker --async``: a pool that runs many jobs at once on one event loop.

For I/O-bound ``async def`` jobs (HTTP calls, database queries, waiting on other services),
where a process per job would spend memory and context switches on waiting. One process,
one event loop, up to ``concurrency`` jobs at a time, with the same guarantees as the
process pool (:mod:`outlast.run.pool`):

- **Claims** are the store's (atomic, priority and due time, limits); the jobs stay alive
  while this process lives (its liveness lock; PostgreSQL advisory locks), and a SIGKILLed
  async pool's jobs are reconciled like any other's: retried while attempts are left.
- **Fencing**: each job's writes carry its attempt token; an outcome for a job that was
  canceled, deleted or taken away meanwhile is refused.
- **The attempt journal** (:mod:`outlast.store.journal`): the jobs of a claim all start at
  once, so the claim's own transaction records them as started (``attempts`` counts starts,
  with no statement of its own per job); an outcome is written as soon as the function
  returns (those that end together, in one transaction), and journaled only if that write
  fails, so a pool killed at any moment does not run again a function whose outcome it
  wrote or journaled.
- **Cancel** cancels the job's asyncio task (``CancelledError`` at its current ``await``;
  ``outlast.current().check_cancel()`` raises ``outlast.Canceled``). **Timeout** cancels it
  at its deadline (code ``timeout``, retried while attempts are left).
- **SIGTERM/SIGINT**: stop claiming; running jobs get ``grace`` seconds, then their tasks are
  cancelled and the jobs go back to ``pending`` without counting the attempt.

What differs: a job that blocks the loop (a sync call inside ``async def``) holds up every
job of the pool. A registered job that is not ``async def`` runs in a thread (its cancel is
cooperative only, and its timeout is not enforced: give such jobs a process pool). A job's
``print()`` and ``logging`` to ``sys.stdout``/``sys.stderr`` go to its log; what its C
extensions or child processes write to the file descriptors goes to the pool's output (the
descriptors are the process's, shared by its jobs).

All store calls run in one thread of their own (in order, off the loop); outcomes that end
while a write is under way wait for the next one, so under load they are written in batches
without a delay of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import queue
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from outlast import config
from outlast.errors import Fail, InvalidInput, OutlastError, StoreError
from outlast.ids import check_queue
from outlast.machine import Outcome, error_info
from outlast.model import JobState, Kind, Status, utcnow
from outlast.run import context, procs, reap, registry
from outlast.run.execute import arun_attempt, transition
from outlast.run.maintain import Maintainer
from outlast.run.slots import Outage, pool_store
from outlast.store import Journal, Store, Task, worker_name
from outlast.store.aio import AsyncListener
from outlast.store.joblog import LogSink
from outlast.store.journal import Key

log = logging.getLogger("outlast.worker")
KINDS = [Kind.FUNCTION, Kind.PIPELINE]
IDLE_RECHECK = 60.0  # seconds an idle pool sleeps at most (a lost wake-up's net)
CHECK_EVERY = 0.1  # at most this often, after a wake-up, the running jobs are checked
LOCK_CHECK = 1.0  # seconds between checks that the jobs' worker locks are still held
CANCEL_GRACE_MAX = 10.0

T = TypeVar("T")


@dataclass
class Running:
    """One job being run: its task (the claim), its asyncio task and its context."""

    task: Task
    job: context.JobContext
    atask: asyncio.Task[None] | None = None
    #: Why it is being stopped: None, "cancel" (canceled, deleted), "lost" (its lock),
    #: "stop" (the pool's grace is over: given back).
    stopping: str | None = None
    #: The function returned: its outcome is recorded even when the pool stops meanwhile.
    returned: bool = False
    started: float = field(default_factory=time.monotonic)


class AsyncPool:
    """Runs up to ``concurrency`` jobs of ``queues`` at once on this process's event loop."""

    def __init__(
        self,
        store: Store,
        concurrency: int = 100,
        queues: list[str] | None = None,
        burst: bool = False,
        grace: float = 30.0,
        maintain: bool = True,
    ) -> None:
        if not isinstance(concurrency, int) or not 1 <= concurrency <= 100_000:
            raise InvalidInput(f"concurrency must be a whole number >= 1, not {concurrency!r}")
        for name in queues or []:
            check_queue(name)
        self.store, self.concurrency = store, concurrency
        self.queues = list(queues or ["default"])
        self.burst, self.grace = burst, grace
        self.maintainer = Maintainer(store) if maintain else None
        self.running: dict[str, Running] = {}
        self.processed = 0
        #: Claims made, and the most jobs seen running at once (for tests and benchmarks).
        self.claims = self.peak = 0
        self.stopping = False
        self.token = secrets.token_hex(4)
        self.journal = store.journal(worker_name(), f"{self.token}+async")
        self._starting = _StartAtClaim(self.journal)
        # every store call, in order, on one thread: the loop never waits for the store
        self._io = ThreadPoolExecutor(1, thread_name_prefix="outlast-store")
        self._wake: asyncio.Event | None = None
        self._claim_due = True
        self._due_at: float | None = None
        self._check_at: float | None = None
        self._locks_at = 0.0
        self._stop_at = float("inf")
        self._unwritten: list[tuple[Task, Outcome]] = []
        self._retry_at = 0.0  # a failed write of outcomes is tried again then
        self._logs = _LogRouter(store)
        self.hand_offs = reap.HandOffs(store)  # slots of ended jobs' keys (on the store thread)

    async def _store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    # ------------------------------------------------------------ the loop
    async def run(self) -> int:
        """Run until stopped (:meth:`stop`), or in burst mode until nothing is pending.
        Returns the number of attempts processed."""
        self._wake = asyncio.Event()
        await self._store(self._register)  # before the maintainer's first look
        if self.maintainer is not None:
            self.maintainer.start()
            if self.burst:
                await asyncio.to_thread(self.maintainer.ready.wait, 10.0)
        self._logs.install()
        listener = AsyncListener(await self._store(self.store.listen, [], True, True))
        watcher = asyncio.create_task(self._listen(listener), name="outlast-listen")
        procs.sd_notify("READY=1")  # under systemd (Type=notify): it works now
        outage = Outage()
        try:
            while True:
                try:
                    if await self._turn():
                        break
                    outage.over()
                except StoreError as exc:
                    self._claim_due = True
                    await self._sleep(outage.pause(exc))
        finally:
            watcher.cancel()
            listener.close()
            await self._shutdown()
            self._logs.uninstall()
            if self.maintainer is not None:
                self.maintainer.stop()
            with contextlib.suppress(OutlastError):
                self.store.unregister_worker()
            self._io.shutdown(wait=True)
        return self.processed

    def _register(self) -> None:
        try:
            self.store.register_worker(
                "async-pool", queues=self.queues, concurrency=self.concurrency
            )
        except OutlastError as exc:
            log.warning("cannot enter the registry of workers: %s", exc)

    async def _turn(self) -> bool:
        """One turn: claim for the free places, write what is due, check what is due; True
        when the pool is done."""
        claimed = await self._fill()
        now = time.monotonic()
        if self._unwritten and now >= self._retry_at:
            await self._flush()
        if self.running and now >= self._locks_at:
            self._locks_at = now + LOCK_CHECK
            await self._check_locks()
        if self._check_at is not None and now >= self._check_at:
            self._check_at = None
            await self._check_running()
        hand_off_at = self.hand_offs.due_at()
        if hand_off_at is not None and now >= hand_off_at:
            await self._store(self.hand_offs.run)
        if self.stopping and now >= self._stop_at:
            self._stop_running("stop")
        if self.stopping and all(r.atask is None or r.atask.done() for r in self.running.values()):
            return True  # what was stopped is given back by _shutdown
        if (
            self.burst
            and not claimed
            and not self.running
            and not self._unwritten
            and await self._store(self.store.next_due, self.queues, KINDS) is None
        ):
            return True
        await self._sleep(self._timeout())
        return False

    def _timeout(self) -> float:
        now = time.monotonic()
        waits = [IDLE_RECHECK]
        if self._unwritten:
            waits.append(self._retry_at - now)
        for at in (self._due_at, self._check_at, self.hand_offs.due_at()):
            if at is not None:
                waits.append(at - now)
        if self.running:
            waits.append(self._locks_at - now)
        if self.stopping:
            waits.append(self._stop_at - now)
        if self.burst and not self.running:
            waits.append(config.poll_bounds()[0])
        return max(0.0, min(waits))

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        if not self._wake.is_set() and seconds > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._wake.wait()
        self._wake.clear()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _listen(self, listener: AsyncListener) -> None:
        """Wake the loop when the store says a job may be claimable (or a running one was
        canceled or deleted: a cancel is looked for soon after)."""
        while True:
            await listener.wait(IDLE_RECHECK)
            self._claim_due = True
            if self.running and self._check_at is None:
                self._check_at = time.monotonic() + CHECK_EVERY
            self._poke()

    # ------------------------------------------------------------ claims
    async def _fill(self) -> int:
        free = self.concurrency - len(self.running)
        now = time.monotonic()
        if self._due_at is not None and now >= self._due_at:
            self._due_at, self._claim_due = None, True
        if self.stopping or free <= 0 or not self._claim_due:
            return 0
        tasks = await self._store(self.store.claim, None, free, self.queues, KINDS, self._starting)
        self.claims += 1
        self._claim_due = len(tasks) == free  # a full claim: there may be more
        if not tasks:
            due = await self._store(self.store.next_due, self.queues, KINDS)
            if due is not None:
                wait = max((due - utcnow()).total_seconds() + 0.001, 0.0)
                self._due_at = now + (wait or config.poll_bounds()[0])
        for task in tasks:
            self._start(task)
        self.peak = max(self.peak, len(self.running))
        return len(tasks)

    def _start(self, task: Task) -> None:
        state = task.snapshot
        assert state is not None and task.attempt is not None
        job = context.JobContext(task, state)
        job.watched = True  # the pool looks for cancels; the job need not read the store
        running = self.running[task.id] = Running(task, job)
        running.atask = asyncio.create_task(self._run(running, state), name=f"job-{task.id}")

    async def _run(self, running: Running, state: JobState) -> None:
        task, job = running.task, running.job
        assert task.attempt is not None
        context.enter_task(job)  # this task's (and its children's) outlast.current()
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        job.on_cancel(lambda: loop.call_soon_threadsafe(me.cancel))
        outcome: Outcome | None = None
        try:
            try:
                spec = registry.resolve(state)
            except Exception as exc:  # an unknown name, or a module that fails to import
                error = error_info(Fail(f"cannot load job: {exc}"))
                outcome = Outcome("fail", error=error, retry=False)
            else:
                with self._logs.job(task.id):
                    outcome = await arun_attempt(spec, task, state)
                # from here on a stop does not give it back (unless the stop ended it)
                running.returned = running.stopping != "stop"
                await self._logs.drained(task.id)
        except asyncio.CancelledError:
            outcome = Outcome("cancel")
        finally:
            job.on_cancel(None)
        if running.stopping == "stop":  # the pool's grace is over: given back, uncounted
            self._poke()  # (by _shutdown, once every task has ended)
            return
        if running.stopping == "lost":
            outcome = Outcome("gone")
        self._finish(running, outcome)

    def _finish(self, running: Running, outcome: Outcome) -> None:
        self.running.pop(running.task.id, None)
        self._unwritten.append((running.task, outcome))
        self._claim_due = True  # a place is free
        self._poke()

    async def _flush(self) -> None:
        """Write the outcomes waiting, in one go, then drop their jobs' locks (if the store
        fails they wait for the next try; each is fenced by its attempt)."""
        done, self._unwritten = self._unwritten, []
        try:
            await self._store(self._write, done)
        except StoreError:
            self._unwritten = done + self._unwritten
            self._retry_at = time.monotonic() + 1.0
            # kept in the journal meanwhile (a file beside a local store: it may still work)
            await self._store(self._journal_outcomes, done)
            raise
        self.processed += len(done)

    def _journal_outcomes(self, done: list[tuple[Task, Outcome]]) -> None:
        for task, outcome in done:
            try:
                self.journal.returned((task.id, task.attempt or 0), outcome)
            except OutlastError:
                return

    def _write(self, done: list[tuple[Task, Outcome]]) -> None:
        items = []
        for task, outcome in done:
            assert task.attempt is not None
            fn = transition(outcome, task.attempt)
            if fn is not None:
                items.append((task.id, fn))
        if items:
            self.store.apply_many(items)
        self.store.release_worker_locks([task for task, _ in done])
        self.journal.written({(task.id, task.attempt or 0) for task, _ in done})
        self.hand_offs.ended([task for task, _ in done])  # a key's slot, to a parked command
        self.hand_offs.run()

    # ------------------------------------------------------------ cancels and locks
    async def _check_running(self) -> None:
        """Cancel the tasks of jobs that were canceled, deleted or taken away."""
        tasks = [r.task for r in self.running.values() if r.stopping is None]
        try:
            states = await self._store(self.store.get_many, [t.id for t in tasks])
        except StoreError as exc:  # as if running: looked at again at the next wake-up
            log.warning("cannot check the running jobs: %s", exc)
            return
        for task in tasks:
            state = states.get(task.id)  # None: deleted, stop it
            running = self.running.get(task.id)
            if running is None or running.stopping is not None:
                continue
            if (
                state is not None
                and state.status == Status.RUNNING
                and state.attempts == task.attempt
                and not state.cancel_requested
            ):
                continue
            running.stopping = "cancel"
            running.job.request_cancel()

    async def _check_locks(self) -> None:
        lost = await self._store(self._lost_locks)
        for job_id in lost:
            running = self.running.get(job_id)
            if running is not None and running.stopping is None:
                log.warning("lost the worker lock of job %s: stopping it", job_id)
                running.stopping = "lost"
                running.job.request_cancel()

    def _lost_locks(self) -> list[str]:
        if self.store.lock_fileno() is None:
            return []
        self.store.check_locks()
        return [r.task.id for r in list(self.running.values()) if not r.task.lock_alive()]

    # ------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period (safe from a signal handler
        installed with ``loop.add_signal_handler``)."""
        if not self.stopping:
            procs.sd_notify("STOPPING=1")
            self.stopping = True
            self._stop_at = time.monotonic() + self.grace
            self._poke()

    def _stop_running(self, why: str) -> None:
        for running in self.running.values():
            if running.stopping != why and not running.returned:
                running.stopping = why
                if running.atask is not None:
                    running.atask.cancel()

    async def _shutdown(self) -> None:
        """Give back what still runs (uncounted), write what is unwritten, and go."""
        self._stop_running("stop")
        tasks = [r.atask for r in self.running.values() if r.atask is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        left = [r.task for r in self.running.values() if not r.returned]
        if left:
            await self._store(_give_back, left)
            await self._store(self.hand_offs.ended, left)  # their slots free too
        self.running.clear()
        with contextlib.suppress(StoreError):
            if self._unwritten:
                await self._flush()
        await self._store(self.hand_offs.run, True)  # the last ended jobs' slots
        if not self._unwritten:
            await self._store(self.journal.discard)
        await self._store(self.journal.close)  # (kept, when not all is written)


class _StartAtClaim(Journal):
    """The pool's journal, recording the attempts it claims as started: an async pool starts
    every job of a claim at once (see the module)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def claimed(self, keys: Sequence[Key], started: bool = False) -> None:
        self.journal.claimed(keys, started=True)


def _give_back(tasks: list[Task]) -> None:
    for task in tasks:
        try:
            task.release()
        except OutlastError as exc:
            log.warning("cannot give back job %s: %s", task.id, exc)
        task.release_worker_lock()


# ------------------------------------------------------------------ the jobs' output
class _LogRouter:
    """``sys.stdout`` and ``sys.stderr`` of an async pool: what a job writes there goes to
    its log (by the running task's job), the rest to the pool's own output. The logs are
    written on a thread of their own (a log in PostgreSQL is a database write)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[tuple[str, bytes | None, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._wrote: set[str] = set()
        self._saved: tuple[Any, Any] | None = None
        self._active: set[str] = set()

    def install(self) -> None:
        self._thread = threading.Thread(target=self._pump, name="outlast-logs", daemon=True)
        self._thread.start()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _JobStream(self, sys.stdout)
        sys.stderr = _JobStream(self, sys.stderr)

    def uninstall(self) -> None:
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    @contextlib.contextmanager
    def job(self, job_id: str) -> Any:
        self._active.add(job_id)
        try:
            yield
        finally:
            self._active.discard(job_id)

    def write(self, job_id: str, data: bytes) -> None:
        self._wrote.add(job_id)
        self._queue.put((job_id, data, None))

    async def drained(self, job_id: str) -> None:
        """Once the job's output is in its log (if it wrote any)."""
        if job_id not in self._wrote:
            return
        self._wrote.discard(job_id)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.put((job_id, None, (loop, done)))
        await done

    def _pump(self) -> None:
        sinks: dict[str, LogSink] = {}
        timeout: float | None = None
        while True:
            try:
                job_id, data, waiter = self._queue.get(timeout=timeout)
            except queue.Empty:
                job_id, data, waiter = "", b"", None
            if job_id:
                sink = sinks.get(job_id)
                if sink is None and data:
                    sink = sinks[job_id] = self.store.log_writer(job_id)
                try:
                    if data and sink is not None:
                        sink.write(data)
                    elif data is None and sink is not None:
                        sink.close()
                        del sinks[job_id]
                except Exception as exc:
                    log.warning("cannot write the log of job %s: %s", job_id, exc)
                if waiter is not None:
                    loop, future = waiter
                    loop.call_soon_threadsafe(_resolve, future)
            timeout = None
            for sink in sinks.values():
                with contextlib.suppress(Exception):
                    due = sink.tick()
                    if due is not None:
                        timeout = due if timeout is None else min(timeout, due)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _JobStream(io.TextIOBase):
    """A text stream that writes to the running job's log, else to ``fallback``."""

    def __init__(self, router: _LogRouter, fallback: Any) -> None:
        self._router, self._fallback = router, fallback

    def write(self, text: str) -> int:
        job = context.current_or_none()
        if job is not None and job.job_id in self._router._active:
            self._router.write(job.job_id, text.encode("utf-8", "replace"))
            return len(text)
        result: int = self._fallback.write(text)
        return result

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self._fallback.flush()

    def fileno(self) -> int:
        result: int = self._fallback.fileno()
        return result

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def serve_async(
    url: str | None,
    concurrency: int,
    queues: list[str] | None,
    imports: list[str],
    burst: bool,
    grace: float,
) -> int:
    """Run an async pool with signal handling; returns the number of attempts processed."""
    with pool_store(url, imports) as store:
        pool = AsyncPool(store, concurrency, queues, burst, grace)

        async def main() -> int:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, pool.stop)
            return await pool.run()

        return asyncio.run(main())
