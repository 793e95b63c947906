"""``outlast worker``: a pool that claims pending jobs and runs them, N at a time.

The pool process claims jobs (atomically, with their worker locks) and hands each, with its
claimed document, to one of N pre-started job processes (:mod:`outlast.run.jobproc`), reused
from job to job so a job pays neither an interpreter start nor a read of the store. A job
process runs the job and sends back its outcome; the pool gives that process its next job at
once, then writes outcomes in batches (one transaction once ``FLUSH_BATCH`` wait, or one per
process if there are more processes; at most ``FLUSH_DELAY`` late while busy, at once when
idle) and drops those jobs' locks. If the pool
dies, every job it held is seen as abandoned at once, and its job processes die with it
(parent-death signal).

- Idle: on a store that pushes notifications (all three do), it sleeps until a job becomes
  claimable (the queue's wake-up) or the earliest delayed job of its queues is due, and costs
  no query while nothing changes. Of the jobs' own changes it listens to interrupts only (a
  running job canceled or deleted): the claims and outcomes it writes, and other pools' jobs,
  never wake it (a re-check every ``IDLE_RECHECK`` seconds is the safety net
  for a lost wake-up). On a store without them it polls, with backoff doubling from
  ``WORKER_POLL_MIN`` to ``WORKER_POLL_MAX``.
- Prefetch: while its jobs are short (a moving mean under ``PREFETCH_BELOW``), it claims in
  batches and holds up to ``PREFETCH`` claimed jobs per process beyond those running, so a
  finished job is followed by the next without a round trip to the store (8 per process
  measured ~15% faster than 4 on the no-op benchmark). Until it has seen a job finish, and
  while jobs are long, it claims only for idle processes, so a queue of long jobs is shared
  with other pools instead of waiting behind one. A prefetched job shows as ``running`` with
  its attempt counted; SIGTERM gives it back uncounted, and if the pool is killed it is
  retried like the others (or fails ``abandoned`` when it had no attempts left).
- Sent ahead: while jobs are short, each busy job process is also sent its next job, which it
  starts as soon as it has sent the outcome of the one before, without waiting for a turn of
  the pool's loop (what that saves: BENCHMARKS.md, issue #18). Never a job with a timeout
  (its deadline counts from a start the pool sees), nor to a process whose job is being
  stopped or has run long (``AHEAD_BEHIND_MAX``). The pool takes such a job back when the
  job it waits behind runs long, when another process idles, when it is canceled or
  deleted, and when the pool stops (:class:`outlast.boot.Words`: the process is told to
  skip it; it has not started it while the outcome before is not on the channel); one whose
  process dies goes to the fresh process. The cancel signal names its job, so one meant for
  a job that just ended never lands on the next.
- A job process that dies (segfault, ``os._exit``) fails only its job, which is retried while
  attempts are left; a fresh process takes its place.
- Timeout: at the job's deadline (``outlast.current().deadline``) its process and everything
  it started are killed and the attempt fails with code ``timeout`` (retried while attempts
  are left).
- Cancel: the job process gets SIGUSR1 (``current().cancel_requested``) and is killed after
  the grace period (at most 10 s) if the job is still running there.
- SIGTERM/SIGINT: stop claiming; running jobs get ``grace`` seconds to finish, then their
  processes (and what their jobs started) are killed and the jobs go back to ``pending``
  without counting the attempt.
- Reconciling the jobs of dead workers is the store's maintenance, done by whichever pool
  (or server) holds the store's maintenance lock (:mod:`outlast.run.maintain`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import time
from typing import Any

from outlast import boot, codec, config
from outlast.errors import InvalidInput, JobNotFound, OutlastError, StoreError
from outlast.ids import check_queue
from outlast.machine import Outcome
from outlast.model import ErrorCode, ErrorInfo, JobState, Kind, Status, utcnow
from outlast.run import procs, reap, registry
from outlast.run.execute import transition
from outlast.run.maintain import Maintainer
from outlast.run.presence import present
from outlast.run.slots import JobProcess, Outage, Slot, pool_store
from outlast.store import Journal, Listener, Store, Task, worker_name
from outlast.store.journal import NOT_STARTED, Fate

log = logging.getLogger("outlast.worker")
IDLE_RECHECK = 60.0  # seconds an idle pool sleeps at most on a store with notifications
CHECK_EVERY = 0.05  # at most this often, the running jobs are checked for a cancel
CANCEL_GRACE_MAX = 10.0
FLUSH_DELAY = 0.005  # seconds an outcome may wait to be written with others (when busy)
FLUSH_BATCH = 16  # outcomes written at once without waiting out FLUSH_DELAY
PREFETCH = 8  # jobs claimed ahead per process: claims are batched, at the cost of holding them
PREFETCH_BELOW = 0.05  # seconds: only jobs shorter than this (on average) are claimed ahead
#: Seconds: a job sent ahead is taken back once the job it waits behind has run this long
#: (and none is sent ahead behind one), so that it does not wait behind a long job while
#: the other processes go on with the jobs claimed after it.
AHEAD_BEHIND_MAX = 0.05
#: Seconds: once every process has run its job this long, the jobs claimed ahead go back to
#: the queue (another pool may be idle: they would wait here until one of those ends), and
#: none is claimed ahead until a process is free again.
BACKLOG_BEHIND_MAX = 1.0
ASYNC_TIMEOUT_SLACK = 1.0  # seconds past an async job's deadline before its process is killed
KINDS = [Kind.FUNCTION, Kind.PIPELINE]  # what pools run (commands have their supervisors)
#: A job process being started: its process, the pool's end of its channel, their words.
Started = tuple[JobProcess, boot.Channel, boot.Words | None]


class Pool:
    """A pool of ``concurrency`` job processes fed from ``store``'s pending jobs."""

    def __init__(
        self,
        store: Store,
        concurrency: int = 1,
        queues: list[str] | None = None,
        imports: list[str] | None = None,
        burst: bool = False,
        grace: float = 30.0,
        maintain: bool = True,
        booted: list[boot.Booting] | None = None,
    ) -> None:
        """``maintain``: take part in the election of the store's maintainer (a pool that
        wins reconciles the jobs of dead workers for everyone). ``booted``: job processes
        started for this pool before it (:func:`fork_job_processes`), used first."""
        if not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput(f"concurrency must be a whole number >= 1, not {concurrency!r}")
        for queue in queues or []:
            check_queue(queue)
        self.store, self.concurrency = store, concurrency
        self.queues = list(queues or ["default"])
        self.imports, self.burst, self.grace = list(imports or []), burst, grace
        self.maintainer = Maintainer(store) if maintain else None
        self.poll_min, self.poll_max = config.poll_bounds()
        self.slots: list[Slot] = []
        self.booted = booted if booted is not None else []  # the caller's: leftovers killed
        self.backlog: collections.deque[Task] = collections.deque()
        self.stopping = False
        self.processed = 0
        #: Claims made, times the pool found nothing to claim, and turns of its loop (for
        #: tests and benchmarks: an idle or busy pool must not spin).
        self.claims = self.empty_claims = self.loops = 0
        self._due_at: float | None = None  # when the earliest delayed job is due (monotonic)
        self._claim_due = True  # there may be a job to claim (see _fill)
        self._progress = False  # the last turn claimed or was woken for a job
        # stop() (a signal handler) writes here, so the loop never sleeps through a stop
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop_at = float("inf")
        self._check_at: float | None = None
        self._unwritten: list[tuple[Task, Outcome]] = []  # outcomes not written yet
        self._mean_run: float | None = None  # a moving mean of job run times, seconds
        self._flush_at: float | None = None
        self.hand_offs = reap.HandOffs(self.store)  # slots of ended jobs' keys, to parked jobs
        # The attempt journal (see outlast.store.journal): this process's, and its job
        # processes' (one each, named by the pool's token and the process's PID).
        self.token = os.urandom(4).hex()
        self.journal = store.journal(worker_name(), f"{self.token}+pool")
        self._retired: list[Journal] = []  # journals of job processes that were replaced

    # ------------------------------------------------------------ job processes
    def _start_process(self) -> Slot:
        return self._start_processes(1)[0]

    def _start_processes(self, n: int) -> list[Slot]:
        """Start ``n`` job processes side by side, then wait until each is ready."""
        return self._await_ready(self._spawn_many(n))

    def _spawn_many(self, n: int) -> list[Started]:
        """Start ``n`` job processes without waiting for them (see :meth:`_await_ready`);
        those booted before the pool (:attr:`booted`) first."""
        started: list[Started] = []
        try:
            while self.booted and len(started) < n:
                started.append(self._adopt(self.booted.pop(0)))
            while len(started) < n:
                started.append(self._spawn())
        except BaseException:
            self._abandon(started)
            raise
        return started

    def _await_ready(self, started: list[Started]) -> list[Slot]:
        """Wait until each started job process says it is ready; kill them all if one
        does not."""
        try:
            for _process, conn, _words in started:
                try:
                    said = conn.recv() if conn.poll(60) else None
                except (EOFError, OSError):
                    said = None
                if said != "ready":
                    why = said[1] if isinstance(said, tuple) and len(said) == 2 else None
                    raise OutlastError(
                        f"a job process did not start: {why}"
                        if why
                        else "a job process did not start (see the messages above)"
                    )
        except BaseException:
            self._abandon(started)
            raise
        return [Slot(process, conn, words) for process, conn, words in started]

    @staticmethod
    def _abandon(started: list[Started]) -> None:
        for process, conn, words in started:
            process.kill()
            process.reap(5)
            conn.close()
            if words is not None:
                words.close()

    def _spawn(self) -> Started:
        return self._adopt(boot.spawn(self.store.url, self.imports))

    def _adopt(self, booting: boot.Booting) -> Started:
        """Introduce a started job process to this pool: its journal's names, the pool's
        liveness, shared (its jobs look abandoned only once this process is dead too, so its
        journal is complete when they are reconciled), and the words they share (none where
        the platform has no memory files: then no job is sent ahead to it)."""
        try:
            process = JobProcess(booting.popen)  # a pidfd: can fail when out of descriptors
        except BaseException:
            booting.kill()
            raise
        words, passed = None, None
        with contextlib.suppress(OSError, AttributeError):
            words, passed = boot.Words.create()
        try:
            with contextlib.suppress(OSError):  # it died booting: _await_ready says so
                boot.introduce(
                    booting.sock, worker_name(), self.token, self.store.liveness_fd(), passed
                )
        finally:
            if passed is not None:
                os.close(passed)
        return process, boot.Channel(booting.sock.detach()), words

    def _slot_journal(self, slot: Slot) -> Journal:
        return self.store.journal(worker_name(), f"{self.token}+{slot.process.pid}")

    @staticmethod
    def _kill(slot: Slot) -> None:
        """Kill the slot's process with whatever its job started, and reap it."""
        if slot.process.popen.poll() is None:  # not reaped: its PID is still its own
            procs.kill_tree(slot.process.pid)
        slot.process.kill()
        slot.process.reap(5)

    def _restart(self, slot: Slot) -> None:
        """Kill the slot's process (if alive) with whatever its job started, and put a fresh
        one in its place (its journal is kept until the outcomes it holds are written). A
        job sent ahead to it goes back to the pool's hand: it never started (its process
        starts it only after it has sent the outcome of the one before, which the pool has
        not read; see :meth:`_handle_deadlines`)."""
        self._kill(slot)
        slot.conn.close()
        if slot.words is not None:
            slot.words.close()
        if slot.ahead is not None:
            self.backlog.appendleft(slot.ahead)
        self._retired.append(self._slot_journal(slot))
        fresh = self._start_process()
        slot.process, slot.conn, slot.words = fresh.process, fresh.conn, fresh.words
        slot.task = slot.ahead = slot.deadline = slot.kill_at = None
        slot.number = slot.sent = slot.unanswered = 0
        slot.lost = slot.canceling = False
        slot.unacked, slot.acked = [], []

    # ------------------------------------------------------------ jobs
    def _assign(self, slot: Slot, task: Task) -> None:
        """Send ``task`` to the idle ``slot``'s process, to start now."""
        state = task.snapshot or task.state()
        self._send(slot, task, state)
        self._began(slot, task, state.timeout, state.name)

    def _hand(self, slot: Slot) -> None:
        """Send the first job at hand to the idle ``slot``'s process. One found dead as the
        job is sent (killed while idle, after the pool last looked) is replaced, and the job
        goes to its successor; it never reached the dead one, so its attempt is untouched."""
        if self._sent_first(slot):
            return
        slot.process.reap(1)
        log.warning(
            "job process %s died while idle (exit code %s): replaced",
            slot.process.pid,
            slot.process.exitcode,
        )
        self._restart(slot)
        self._sent_first(slot)  # the fresh one dead too: the job waits in hand, the loop sees why

    def _sent_first(self, slot: Slot) -> bool:
        """Assign the first job at hand to ``slot``; False (the job back in hand, first) when
        its process cannot be reached."""
        task = self.backlog.popleft()
        try:
            self._assign(slot, task)
        except OSError:
            self.backlog.appendleft(task)
            return False
        return True

    def _began(self, slot: Slot, task: Task, timeout: float | None, name: str) -> None:
        """``task`` (the last job sent to ``slot``) is the one its process runs now."""
        now = time.monotonic()
        slot.task, slot.number, slot.kill_at, slot.lost = task, slot.sent, None, False
        slot.started, slot.canceling = now, False
        slot.deadline = None
        if timeout is not None:  # an async job is canceled at its deadline, in its
            # process; killing the process is the backstop, a little later
            slack = ASYNC_TIMEOUT_SLACK if registry.known_async(name) else 0.0
            slot.deadline = now + timeout + slack

    @staticmethod
    def _send(slot: Slot, task: Task, state: JobState) -> None:
        # the claimed state goes along, so the job process need not read it back; which of
        # its outcomes are written since (their journal records may go); and the job's
        # number on the channel (see outlast.boot.Words)
        slot.sent += 1
        slot.conn.send((task.id, task.attempt, codec.encode(state), slot.acked, slot.sent))
        slot.acked = []

    def _send_ahead(self, slot: Slot, now: float) -> bool:
        """Send the next job at hand to ``slot``'s busy process, to start as soon as its job
        ends (no turn of the pool's loop between them: BENCHMARKS.md, issue #18), when that
        is safe: only while jobs are short, to a process that shares :class:`boot.Words`
        with the pool and whose job is neither being stopped nor running long (over
        ``AHEAD_BEHIND_MAX``), and never a job with a timeout or behind one (a deadline is
        counted from a start the pool sees). True when sent."""
        task = self.backlog[0]
        state = task.snapshot
        if (
            slot.words is None
            or slot.task is None
            or slot.ahead is not None
            or slot.unanswered
            or slot.deadline is not None
            or slot.kill_at is not None
            or now - slot.started > AHEAD_BEHIND_MAX
            or state is None
            or state.timeout is not None
        ):
            return False
        try:
            self._send(slot, task, state)
        except OSError:  # its process died with its job: the pool reads that next
            return False
        self.backlog.popleft()
        slot.ahead = task
        return True

    @staticmethod
    def _take_back(slot: Slot) -> Task | None:
        """Take back the job sent ahead to ``slot``, if it cannot have started: its process
        is told to skip it, and it has not started it when the outcome of the job before
        is not on the channel yet (the process looks at :attr:`boot.Words.skip` only after
        it has sent that). Otherwise None: it starts, or comes back ``held``."""
        task = slot.ahead
        if task is None or slot.words is None:
            return None
        slot.words.skip = slot.sent
        if slot.conn.poll(0):
            return None
        slot.ahead = None
        slot.unanswered = slot.sent  # skip must stay until the process has read it
        return task

    def _next_job(self, slot: Slot) -> None:
        """The slot's job ended: the job sent ahead, if any, is the one running now."""
        ahead, slot.ahead = slot.ahead, None
        slot.task = slot.deadline = slot.kill_at = None
        slot.lost = slot.canceling = False
        if ahead is not None:
            self._began(slot, ahead, None, "")  # sent ahead: it has no timeout
            if slot.words is not None and slot.words.skip == slot.number:
                # it was to be taken back (canceled? deleted?), too late: looked at soon
                self._check_soon()

    def _check_soon(self) -> None:
        if self._check_at is None:
            self._check_at = time.monotonic() + CHECK_EVERY

    def _held(self, slot: Slot, number: int) -> bool:
        """The slot's process did not start job ``number`` (taken back): if it is the one
        the pool counts as running (the take-back came too late to know), it goes back to
        the pool's hand, or is dropped when it is no longer the pool's to start. True when
        the slot's job changed."""
        if number == slot.unanswered:
            slot.unanswered = 0  # read: skip may name another job now
        task = slot.task
        if task is None or number != slot.number:
            return False  # taken back in time: already back in the pool's hand
        self._next_job(slot)
        if self._still_ours(task):
            self.backlog.appendleft(task)
        else:
            self._drop([task])
        return True

    def _journaled(self, task: Task, outcome: Outcome) -> tuple[Task, Outcome]:
        """An outcome the pool itself decided (a timeout, a dead process), made durable
        first like those of its job processes."""
        assert task.attempt is not None
        self.journal.returned((task.id, task.attempt), outcome)
        return task, outcome

    def _record(self, done: list[tuple[Task, Outcome]]) -> None:
        """Queue outcomes to be written together (see :meth:`_flush_if_full`)."""
        if done and not self._unwritten:
            self._flush_at = time.monotonic() + FLUSH_DELAY
        self._unwritten.extend(done)

    def _flush_if_full(self) -> None:
        """Write the queued outcomes once ``max(FLUSH_BATCH, concurrency)`` wait; fewer wait
        at most ``FLUSH_DELAY`` (the loop writes them at once when no job is running)."""
        if len(self._unwritten) >= max(FLUSH_BATCH, self.concurrency):
            self._flush()

    def _flush(self) -> None:
        """Write the queued outcomes in one go, then drop their jobs' locks. If the store
        fails, they stay queued for the next try (each is fenced by its attempt: one whose
        job was reclaimed meanwhile is refused then)."""
        done, self._unwritten, self._flush_at = self._unwritten, [], None
        items = []
        for task, outcome in done:
            assert task.attempt is not None
            fn = transition(outcome, task.attempt)
            if fn is not None:
                items.append((task.id, fn))
        try:
            if items:
                self.store.apply_many(items)
        except StoreError:
            self._unwritten = done + self._unwritten
            self._flush_at = time.monotonic() + 1.0  # and tried again then
            raise
        self.store.release_worker_locks([task for task, _ in done])
        self.processed += len(done)
        written = {(task.id, task.attempt or 0) for task, _ in done}
        self.journal.written(written)
        self.hand_offs.ended([task for task, _ in done])  # a key's slot, to a parked command
        self.hand_offs.run()
        for slot in self.slots:  # told with their next job
            if slot.unacked:
                slot.acked += [k for k in slot.unacked if k in written]
                slot.unacked = [k for k in slot.unacked if k not in written]
        if self._retired and not self._unwritten:
            for journal in self._retired:
                journal.discard()
                journal.close()
            self._retired = []

    def _fill(self) -> int:
        """Start what can start from the jobs at hand; claim when fewer are at hand than idle
        processes (plus one each while jobs are short: then up to ``PREFETCH`` per process
        ahead, one transaction for many claims), and start those too."""
        self._start_idle()
        idle = sum(1 for s in self.slots if s.task is None)
        # claim ahead only while jobs are short: a long job's queue is left to other pools
        short = self._mean_run is not None and self._mean_run < PREFETCH_BELOW
        if self._all_run_long(time.monotonic()):
            short = False
            self._give_back_backlog()
        ahead = PREFETCH if short else 0
        claimed = 0
        low = idle + (self.concurrency if ahead else 0)
        # Claim only when there may be something to claim: at the start, after a wake-up of
        # the queue, once a delayed job is due, when a job finished or the last claim found
        # some (an idle pool on a store that pushes notifications costs no query).
        due = self._claim_due or not self.store.capabilities.pushes_notifications
        if due and not self.stopping and len(self.backlog) < low:
            want = idle + ahead * self.concurrency - len(self.backlog)
            tasks = self.store.claim(None, want, self.queues, KINDS, self.journal)
            self.backlog.extend(tasks)
            claimed = len(tasks)
            self.claims += 1
            # a full claim: there may be more. A short one took all there was: a new job
            # (or a slot freed) wakes the pool, and the time of a delayed one is noted now
            # (once the jobs are handed out: not on their way to start), rather than by an
            # empty claim later, which would hold up the outcomes of the jobs just started
            # (the latency finish->seen, BENCHMARKS.md issue #18)
            self._claim_due = len(tasks) >= want
            if not tasks:
                self.empty_claims += 1
            self._start_idle()
            if len(tasks) < want:
                self._note_next_due()
        return claimed

    def _all_run_long(self, now: float) -> bool:
        """Whether every process runs a job that has run over ``BACKLOG_BEHIND_MAX``: the
        jobs at hand have no process to go to soon (the measure of short jobs says nothing
        of the jobs running now, which end when they end)."""
        return bool(self.slots) and all(
            s.task is not None and now - s.started > BACKLOG_BEHIND_MAX for s in self.slots
        )

    def _give_back_backlog(self) -> None:
        """The jobs claimed ahead, back to the queue as they were (attempt uncounted), for
        any pool to take: the first process of this one free may be far off. One at a time:
        if the store fails, the rest stay at hand."""
        if not self.backlog:
            return
        log.debug("every process runs long: %d jobs claimed ahead go back", len(self.backlog))
        while self.backlog:
            task = self.backlog[0]
            task.release()
            self.backlog.popleft()
            task.release_worker_lock()
            self.journal.written([(task.id, task.attempt or 0)])
            self.hand_offs.ended([task])
        self.hand_offs.run()

    def _note_next_due(self) -> None:
        """After a claim took all there was: when the earliest delayed job is due, so that
        the pool wakes then (and not before)."""
        self._due_at = None
        if not self.store.capabilities.pushes_notifications:
            return
        due = self.store.next_due(self.queues, KINDS)
        if due is not None:
            # Due already, yet not claimed: another claimer holds it (its transaction, or
            # a lock key it shares); look again after WORKER_POLL_MIN rather than spin.
            wait = max((due - utcnow()).total_seconds() + 0.001, 0.0) or self.poll_min
            self._due_at = time.monotonic() + wait

    def _note_run(self, seconds: float) -> None:
        mean = self._mean_run
        self._mean_run = seconds if mean is None else mean + 0.2 * (seconds - mean)

    def _start_idle(self) -> None:
        """Hand the jobs at hand to idle processes; while jobs are short, send one ahead to
        each busy process (:meth:`_send_ahead`), once those that should not wait where they
        are were taken back (:meth:`_take_back_waiting`)."""
        if self.stopping:
            return
        now = time.monotonic()
        self._take_back_waiting(now)
        for slot in self.slots:
            if not self.backlog:
                return
            if slot.task is None:
                self._hand(slot)
        if self._mean_run is not None and self._mean_run < PREFETCH_BELOW:
            for slot in self.slots:
                if not self.backlog:
                    return
                self._send_ahead(slot, now)

    def _take_back_waiting(self, now: float) -> None:
        """Take back a job sent ahead when the job it waits behind has run long (it goes
        first to the next process free, in the claim's order, instead of waiting while the
        jobs claimed after it run), and while more processes idle than there are jobs at
        hand."""
        for slot in self.slots:
            if slot.ahead is not None and now - slot.started > AHEAD_BEHIND_MAX:
                self._give_back_ahead(slot)
        idle = sum(1 for slot in self.slots if slot.task is None)
        for slot in self.slots:
            if idle <= len(self.backlog):
                return
            self._give_back_ahead(slot)

    def _give_back_ahead(self, slot: Slot) -> None:
        """The job sent ahead to ``slot`` back to the front of the pool's hand, if it can
        be taken back (:meth:`_take_back`)."""
        taken = self._take_back(slot)
        if taken is not None:
            self.backlog.appendleft(taken)

    def _retries_pending(self) -> bool:
        """Whether a job of our queues is claimable, now or after its backoff (a burst run
        waits for it)."""
        return self.store.next_due(self.queues, KINDS) is not None

    def _check_running(self) -> None:
        """React to cancels (or lost jobs) of the jobs being run: the job's process is told
        (SIGUSR1), and killed after the job's grace period (else the pool's, at most 10 s).
        A job claimed ahead (or sent ahead) that was canceled or deleted before it started is
        not started."""
        self._drop_stale_backlog()
        for slot in self.slots:
            if slot.ahead is not None and not self._still_ours(slot.ahead):
                taken = self._take_back(slot)
                if taken is not None:
                    self._drop([taken])
            if slot.task is None or slot.kill_at is not None:
                continue
            try:
                state = slot.task.state()
            except JobNotFound:
                state = None  # deleted: stop it
            except OutlastError as exc:  # the store failed: look again at the next check
                log.warning("cannot check job %s: %s", slot.task.id, exc)
                continue
            if state is not None and state.status == Status.RUNNING:
                if state.attempts == slot.task.attempt and not state.cancel_requested:
                    continue
                slot.canceling = state.cancel_requested  # it runs its cleanup, then ends
            self._stop_job(slot)
            grace = min(self.grace, CANCEL_GRACE_MAX)
            if state is not None and state.grace is not None:
                grace = state.grace
            slot.kill_at = time.monotonic() + grace

    def _stop_job(self, slot: Slot) -> None:
        """Tell the slot's process that its job is to stop (SIGUSR1, named by the words:
        see :class:`boot.Words`); a job sent ahead to it is taken back."""
        if slot.words is not None:
            slot.words.cancel = slot.number
            self._give_back_ahead(slot)
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.process.pid, signal.SIGUSR1)

    def _drop_stale_backlog(self) -> None:
        """Drop the jobs claimed ahead that are no longer this pool's to start."""
        keep: collections.deque[Task] = collections.deque()
        dropped: list[Task] = []
        for task in self.backlog:
            (keep if self._still_ours(task) else dropped).append(task)
        if dropped:
            self.backlog = keep
            self._drop(dropped)

    def _still_ours(self, task: Task) -> bool:
        """Whether a job claimed and not started is still this pool's to start: not
        canceled, deleted, or taken by another attempt (a canceled pipeline with cleanup
        left stays ``running``: it starts, and runs its cleanup). True when the store
        cannot say (looked at again at the next check)."""
        try:
            state = task.state()
        except JobNotFound:
            return False
        except OutlastError as exc:
            log.warning("cannot check job %s: %s", task.id, exc)
            return True
        return state.status == Status.RUNNING and state.attempts == task.attempt

    def _drop(self, tasks: list[Task]) -> None:
        """Let go of jobs claimed and never started that are no longer the pool's."""
        self.store.release_worker_locks(tasks)
        self.journal.written((task.id, task.attempt or 0) for task in tasks)

    def _check_locks(self) -> None:
        """Stop the jobs whose worker lock the store took away (a killed PostgreSQL lock
        connection): another worker may run them now, and their outcomes would be refused."""
        for slot in self.slots:
            task = slot.task
            if task is not None and slot.kill_at is None and not task.lock_alive():
                log.warning("lost the worker lock of job %s: stopping it", task.id)
                slot.lost = True
                self._stop_job(slot)
                slot.kill_at = time.monotonic() + min(self.grace, CANCEL_GRACE_MAX)

    # ------------------------------------------------------------ events of the loop
    def _handle_ready(self, ready: list[int]) -> None:
        done: list[tuple[Task, Outcome]] = []
        died: list[tuple[Slot, str | None]] = []  # and why, when it did not die by itself
        freed = False
        for slot in self.slots:
            readable = slot.conn.fileno() in ready
            if not readable and slot.process.sentinel >= 0 and slot.process.sentinel in ready:
                # Dead. What it sent before it died is read first: one select can see the
                # death and not the outcome sent just before it, and then the job it had
                # started next (sent ahead) would go back in hand and start twice.
                if not slot.conn.poll(0):
                    died.append((slot, None))
                    continue
                readable = True
            if readable:
                try:
                    said = slot.conn.recv()
                except (EOFError, OSError):
                    died.append((slot, None))
                    continue
                number, outcome = said if isinstance(said, tuple) and len(said) == 2 else (0, None)
                if outcome == "held":  # taken back: not started
                    freed = self._held(slot, number) or freed
                    continue
                if slot.task is None and self.stopping:
                    continue  # its process was killed as the grace ended: it goes anyway
                if slot.task is None or number != slot.number or not isinstance(outcome, Outcome):
                    # never: the pool and its process disagree on which job ran (the guard
                    # behind Slot.unanswered); the process goes, and its answer with it
                    self._confused(slot, said)
                    died.append((slot, "answered for another job, and was stopped"))
                    continue
                # a job stopped for a lost lock is not canceled: it is abandoned, and
                # whoever reconciles it fails it over
                if slot.lost:
                    outcome = Outcome("gone")
                elif outcome.verb != "gone":
                    slot.unacked.append((slot.task.id, slot.task.attempt or 0))
                done.append((slot.task, outcome))
                self._note_run(time.monotonic() - slot.started)
                self._next_job(slot)
        for slot, why in died:
            done += self._died(slot, why)
        if done or freed:
            self._claim_due = True  # a process is free: look for its next job
        self._record(done)  # queued first: written even if handing out the next job fails
        self._start_idle()  # the freed processes go on at once; the outcomes are written next
        self._flush_if_full()

    def _died(self, slot: Slot, why: str | None) -> list[tuple[Task, Outcome]]:
        """The outcomes of the jobs of ``slot``, whose process died (``why`` None) or is
        stopped for ``why``, then a fresh process in its place. A process stopped for
        answering for another job may have started the one sent ahead too: that one fails
        with the job it ran (started twice, never), instead of going back in hand.

        A process that died by itself is asked after in the attempt journal: a job it never
        started goes to another process, uncounted; one whose function returned, its outcome
        journaled but not yet sent, has that outcome written (not run again)."""
        tasks = [slot.task] if slot.task is not None else []
        if why is not None and slot.ahead is not None:
            tasks.append(slot.ahead)
            slot.ahead = None
        back = None
        done: list[tuple[Task, Outcome]] = []
        if tasks and why is None:
            slot.process.reap(1)
            code = slot.process.exitcode
            what = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            why = f"died ({what})"
            fate = self._fate(slot)
            if fate == NOT_STARTED:
                back, tasks = tasks[0], []
                log.warning(
                    "job process %s %s before starting job %s: it goes to another",
                    slot.process.pid,
                    why,
                    back.id,
                )
            elif isinstance(fate, Outcome):
                task, tasks = tasks[0], []
                log.warning(
                    "job process %s %s after job %s returned: its journaled outcome is written",
                    slot.process.pid,
                    why,
                    task.id,
                )
                done.append((task, fate))
        for task in tasks:
            error = ErrorInfo(ErrorCode.ERROR, f"the job's process {why}", type="WorkerDied")
            done.append(
                self._journaled(task, Outcome("gone" if slot.lost else "fail", error=error))
            )
        self._restart(slot)
        if back is not None:  # before the job sent ahead (put back by _restart): claim order
            self.backlog.appendleft(back)
        return done

    def _fate(self, slot: Slot) -> Fate:
        """What the attempt journal says of the job of ``slot``, whose process died by
        itself (see :meth:`Store.fate`). Not asked for a job stopped for a lost lock (it is
        abandoned whatever it did) or without a snapshot; a store failing to answer: None
        (nothing known), and the attempt counts as died, as it would without a journal."""
        task = slot.task
        if task is None or task.snapshot is None or slot.lost:
            return None
        try:
            fate = self.store.fate(task.snapshot)
        except OutlastError as exc:
            log.warning("cannot read the attempt journal of job %s: %s", task.id, exc)
            return None
        if isinstance(fate, Outcome) and fate.verb in ("cancel", "abort") and not slot.canceling:
            # A stop the pool did not ask for: a pipeline reads a cancel from the store
            # itself and may do so before its pool's next look (50 ms at most), run its
            # cleanup, and die before sending. The store says whether the cancel is real; a
            # stop nobody asked for (a stray signal) counts as the death.
            try:
                state = task.state()
            except OutlastError as exc:
                log.warning("cannot check job %s: %s", task.id, exc)
                return None
            if not (state.cancel_requested and state.attempts == task.attempt):
                return None
        return fate

    @staticmethod
    def _confused(slot: Slot, said: object) -> None:
        task, ahead = slot.task, slot.ahead
        log.error(
            "job process %s answered %.60r while %s ran there (job sent ahead: %s): it is "
            "stopped, and its jobs fail as if it had died",
            slot.process.pid,
            said,
            f"job #{slot.number} ({task.id})" if task is not None else "no job",
            f"#{slot.sent} ({ahead.id})" if ahead is not None else "none",
        )

    def _handle_deadlines(self) -> None:
        now = time.monotonic()
        done: list[tuple[Task, Outcome]] = []
        for slot in self.slots:
            task = slot.task
            if task is None:
                continue
            if slot.kill_at is not None and now >= slot.kill_at:
                if slot.ahead is not None and slot.conn.poll(0):
                    continue  # its job ended meanwhile: read first (the next may run now)
                if slot.canceling and not slot.lost:  # its cleanup outlived the grace
                    error = ErrorInfo(
                        ErrorCode.CANCELED,
                        "the job was canceled; its cleanup did not finish within the grace "
                        "period and was stopped",
                    )
                    done.append(self._journaled(task, Outcome("abort", error=error)))
                else:
                    done.append((task, Outcome("gone")))  # canceled or lost: nothing to write
            elif slot.deadline is not None and now >= slot.deadline:
                error = ErrorInfo(ErrorCode.TIMEOUT, "the job ran past its timeout")
                done.append(self._journaled(task, Outcome("fail", error=error)))
            else:
                continue
            self._restart(slot)
        if done:
            self._claim_due = True
        self._record(done)
        self._flush_if_full()

    def _timeout(self, idle_wait: float) -> float:
        now = time.monotonic()
        deadlines = [s.deadline for s in self.slots if s.deadline is not None]
        deadlines += [s.kill_at for s in self.slots if s.kill_at is not None]
        if self._due_at is not None:
            deadlines.append(self._due_at)
        if self._flush_at is not None:
            deadlines.append(self._flush_at)
        if self._check_at is not None:
            deadlines.append(self._check_at)
        hand_off_at = self.hand_offs.due_at()
        if hand_off_at is not None:
            deadlines.append(hand_off_at)
        if self.backlog and self.slots and all(s.task is not None for s in self.slots):
            long_at = max(s.started for s in self.slots) + BACKLOG_BEHIND_MAX + 0.001
            if long_at > now:  # the jobs at hand go back then (see _fill)
                deadlines.append(long_at)
        deadlines.append(self._stop_at if self.stopping else now + idle_wait)
        return max(0.0, min(deadlines) - now)

    # ------------------------------------------------------------ the loop
    def run(self) -> int:
        """Run until stopped (SIGTERM/SIGINT), or in burst mode until nothing is pending.

        Returns the number of attempts processed.
        """
        # The job processes boot (import, open the store) while this process registers,
        # starts its maintainer and opens its listener: start-up costs the longer of the
        # two, not their sum (BENCHMARKS.md, issue #18).
        booting = self._spawn_many(self.concurrency)
        try:
            # in the registry before the maintainer starts (whose first look sees it)
            with present(self.store, "pool", queues=self.queues, concurrency=self.concurrency):
                if self.maintainer is not None:
                    self.maintainer.start()
                try:
                    listener = procs.patiently(
                        lambda: self.store.listen([], queue=True, interrupts=True)
                    )
                    with listener:
                        self.slots, booting = self._await_ready(booting), []
                        if self.maintainer is not None and self.burst:
                            # jobs of dead workers first: a burst run may end before a sweep
                            self.maintainer.ready.wait(10.0)
                        procs.sd_notify("READY=1")  # under systemd (Type=notify): it works now
                        self._loop(listener)
                finally:
                    if self.maintainer is not None:
                        self.maintainer.stop()
                    self._shutdown()
        finally:
            self._abandon(booting)  # a failure before they were ready
        return self.processed

    def _loop(self, listener: Listener) -> None:
        """Turn until stopped. A store that fails (a database restarting, a network cut) is
        waited out with backoff and jitter, the pool and its jobs going on; what was lost
        meanwhile is fenced (a lost worker lock stops its job; late writes are refused)."""
        backoff = self.poll_min
        outage = Outage()
        while True:
            self.loops += 1
            try:
                if self._turn(listener, backoff):
                    return
                backoff = self.poll_min if self._progress else min(backoff * 2, self.poll_max)
                outage.over()
            except StoreError as exc:
                self._claim_due = True  # look again once the store answers
                self._handle_outage(listener, outage.pause(exc))

    def _turn(self, listener: Listener, backoff: float) -> bool:
        """One turn of the loop; True when the pool is done."""
        if self.stopping:  # what was sent ahead and has not started is given back
            for slot in self.slots:
                self._give_back_ahead(slot)
        if self._unwritten and not self.backlog and all(s.task is None for s in self.slots):
            # idle: the outcomes first (their waiters see them a claim sooner), then look
            # for more work; a busy pool hands out the next job first and writes later
            self._flush()
        claimed = self._fill()
        busy = any(s.task is not None for s in self.slots)
        if not busy and self._unwritten:
            self._flush()  # nothing else to wait for
        if not busy and (
            self.stopping or (self.burst and not claimed and not self._retries_pending())
        ):
            return True
        self._progress = bool(claimed)
        pushes = self.store.capabilities.pushes_notifications and listener.fileno() is not None
        if self._wait(listener, busy, IDLE_RECHECK if pushes and not busy else backoff):
            self._progress = True
        return False

    def _handle_outage(self, listener: Listener, seconds: float) -> None:
        """The store failed: keep the jobs running (their outcomes wait their turn), stop
        those whose lock is gone, and try again after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            with contextlib.suppress(StoreError):  # the outage goes on: tried again at the end
                self._wait(listener, True, max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline or self.stopping:
                return

    def _wait(self, listener: Listener, busy: bool, idle_wait: float) -> bool:
        """Wait for the next thing to do and do it; True when a job became claimable."""
        fds = [s.conn.fileno() for s in self.slots]
        fds += [s.process.sentinel for s in self.slots if s.process.sentinel >= 0]
        if listener.fileno() is not None:
            fds.append(listener.fileno())  # type: ignore[arg-type]
        lock_fd = self.store.lock_fileno()
        if lock_fd is not None:
            fds.append(lock_fd)
        fds.append(self._wake_r)
        ready, _, _ = select.select(fds, [], [], self._timeout(idle_wait))
        if self._wake_r in ready:
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 64)
        if lock_fd is not None and (lock_fd in ready or not ready):
            self.store.check_locks()
            self._check_locks()
        claimable = False
        # no fd: the listener polls, or is reconnecting; either way it cannot tell, so look
        if listener.fileno() is None or listener.fileno() in ready:
            claimable = listener.drain()
            # a running job was canceled or deleted (one of ours?): look soon
            if busy and self._check_at is None and listener.interrupted:
                self._check_at = time.monotonic() + CHECK_EVERY
        self._handle_ready(ready)
        self._handle_deadlines()
        now = time.monotonic()
        if self._due_at is not None and now >= self._due_at:
            self._due_at = None  # spent: the next empty claim sets the next one
            self._claim_due = True  # a delayed job's time
        if claimable or not ready:
            self._claim_due = True  # woken for a job, or the idle re-check
        if self._flush_at is not None and now >= self._flush_at:
            self._flush()
        self.hand_offs.run()  # when it is time
        if self._check_at is not None and now >= self._check_at:
            self._check_at = None
            self._check_running()
        if self.stopping and now >= self._stop_at:
            self._requeue_running()
        return claimable

    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period (safe in a signal handler)."""
        if not self.stopping:
            procs.sd_notify("STOPPING=1")
            self.stopping = True
            self._stop_at = time.monotonic() + self.grace
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _requeue_running(self) -> None:
        """Grace is over: kill what still runs (with what its job started) and give those
        jobs back, attempt uncounted."""
        for slot in self.slots:
            if slot.task is not None:
                tasks = [slot.task] if slot.ahead is None else [slot.task, slot.ahead]
                slot.task = slot.ahead = None
                self._kill(slot)
                for task in tasks:
                    task.release()
                    task.release_worker_lock()
                self.hand_offs.ended(tasks)  # their slots free too

    def _shutdown(self) -> None:
        self._flush()
        self._requeue_running()
        while self.backlog:  # claimed but never started: back to the queue as they were
            task = self.backlog.popleft()
            task.release()
            task.release_worker_lock()
            self.hand_offs.ended([task])
        self.hand_offs.run(force=True)  # the last ended jobs' slots, before this pool goes
        for slot in self.slots:
            with contextlib.suppress(OSError, ValueError):
                slot.conn.send(None)
        for slot in self.slots:
            slot.process.reap(2)
            slot.process.kill()
            slot.process.reap(2)
            slot.conn.close()
            if slot.words is not None:
                slot.words.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        journals = [self.journal, *self._retired, *map(self._slot_journal, self.slots)]
        for journal in journals:
            if not self._unwritten:  # everything is written: the journals have done their part
                journal.discard()
            journal.close()  # (else they stay, for whoever reconciles the jobs)


def fork_job_processes(n: int, url: str | None, imports: list[str]) -> list[boot.Booting]:
    """The pool's first ``n`` job processes, forked from this process before it opens its
    store (see :mod:`outlast.boot`): what they need is imported here first, once (the
    store's driver, the job process's modules). Spawned instead when this process already
    has threads."""
    if not boot.can_fork():
        return boot.spawn_many(n, url, imports)
    from outlast.run import jobproc
    from outlast.store import store_class

    store_class(url)
    jobproc.preload()
    started: list[boot.Booting] = []
    try:
        for _ in range(n):
            started.append(boot.fork(jobproc.main, url, imports, started))
    except BaseException:
        for booting in started:
            booting.kill()
        raise
    return started


def serve_forever(
    url: str | None,
    concurrency: int,
    queues: list[str] | None,
    imports: list[str],
    burst: bool,
    grace: float,
    booted: list[boot.Booting] | None = None,
) -> int:
    """Run a pool with signal handling; returns the number of attempts processed.
    ``booted``: job processes started for it already (killed if it does not use them)."""
    booted = booted if booted is not None else fork_job_processes(concurrency, url, imports)
    try:
        with pool_store(url, imports) as store:
            pool = Pool(store, concurrency, queues, imports, burst, grace, booted=booted)

            def on_signal(signum: int, frame: Any) -> None:
                pool.stop()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
            return pool.run()
    finally:
        for unused in booted:
            unused.kill()
