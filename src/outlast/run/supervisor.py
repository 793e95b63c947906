"""The supervisor: the small detached process that runs one command job.

Started by ``outlast run`` in a new session (no terminal), it holds the job's worker lock for
its whole life, runs the command in its own process group with ``OUTLAST_JOB_ID`` and
``OUTLAST_STORE`` set, copies its output into the job's log, records the exit status, and
retries with backoff while attempts are left (the job stays bound to this supervisor
meanwhile, so the supervisor's death is seen as abandonment).

It watches its own job through the store's notification: when the job is canceled (or deleted,
or taken from it), the command gets SIGTERM and, after the grace period, SIGKILL. A job with a
``timeout`` gets the same at its deadline (``$OUTLAST_DEADLINE`` tells the command when, as
ISO 8601 UTC), and the attempt fails with code ``timeout`` (retried while attempts are left).
A job with a near time (up to ``machine.PARK_AFTER``, 5 s, ahead) is waited for here, holding
the job's lock, so a cancel wakes the supervisor and its death is seen; one further ahead (a
delay, a retry's long backoff) waits parked with no process, and the store's timer starts its
supervisor a moment before its time (:mod:`outlast.run.timer`). A job of a
full group is *parked*: the supervisor lets the job go and exits. A supervisor whose job of a
group ended runs the group's next parked command itself, in claim order, and whoever else
frees a slot (a dead worker's job reconciled, ``outlast group set``, the store's maintainer)
starts a supervisor for it (``outlast.run.reap.start_parked``): a thousand commands queued in
a group of two hold two supervisors, not a thousand. The
supervisor is the *child subreaper* of everything the command starts, so a descendant that
leaves the process group (``setsid``, a double fork) comes back to it when orphaned: the
signals go to the group and to every descendant, and when the command ends whatever it left
running is stopped too. A command that cannot run (not found, not executable) fails at once,
not retried; one that could not be started for a passing reason (no processes or memory left)
is retried like a failure.

Run as ``python -m outlast.run.supervisor STORE_URL JOB_ID [--wait]`` (``--wait``: started by the
store's timer ahead of the job's time, it waits for it however far ahead).
"""

from __future__ import annotations

import errno
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from outlast.errors import JobNotFound, OutlastError, StoreError, WorkerLockHeld
from outlast.model import ErrorCode, ErrorInfo, JobState, Status, format_time, utcnow
from outlast.run import procs, reap, timer
from outlast.run.presence import present
from outlast.run.spawn import WAIT, load_context
from outlast.store import Store, Task, open_store
from outlast.store.joblog import LogSink, max_bytes

#: Seconds between SIGTERM and SIGKILL for a job that does not say (``JobState.grace``).
DEFAULT_GRACE = 10.0
#: Seconds what a finished command left running gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE = 2.0
#: ``exec`` errors that no retry can cure: the command is not there or cannot be run.
FINAL_ERRNOS = {errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    """The supervisor itself was asked to stop (SIGTERM/SIGINT/SIGHUP)."""


class _Signals:
    """Turns a stop signal into :class:`_Stop`, except while the command is being started:
    then it is held until the command's PID is known, so nothing is left unobserved."""

    def __init__(self) -> None:
        self.held = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if self.held:
            self.pending = signum
            return
        raise _Stop(signal.Signals(signum).name)

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise _Stop(signal.Signals(signum).name)


SIGNALS = _Signals()


class CannotStart(Exception):
    """The command could not be started; ``final`` when no retry can help."""

    def __init__(self, exc: OSError, command: list[str]) -> None:
        self.final = exc.errno in FINAL_ERRNOS
        what = exc.filename if isinstance(exc.filename, str) else (command or ["?"])[0]
        reason = exc.strerror or str(exc)
        super().__init__(f"cannot start the command: {what}: {reason}")


def grace_of(state: JobState) -> float:
    return DEFAULT_GRACE if state.grace is None else state.grace


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the command was killed by {name}"
    return f"the command exited with code {code}"


class Run:
    """One attempt: the command's process, its output pipe, and the cancel watch."""

    def __init__(self, store: Store, task: Task, state: JobState, log: LogSink) -> None:
        self.store, self.task, self.state, self.log = store, task, state, log
        self.grace = grace_of(state)
        cwd, saved = load_context(store, state.id)
        env = dict(saved if saved is not None else os.environ)
        env.update(OUTLAST_JOB_ID=state.id, OUTLAST_STORE=store.url)
        if state.trace:  # the command joins the trace it was started in (OpenTelemetry)
            env["TRACEPARENT"] = state.trace
        #: When the attempt must end (monotonic), or None; set once it was stopped for it.
        self.deadline: float | None = None
        self.timed_out = False
        env.pop("OUTLAST_DEADLINE", None)
        if state.timeout is not None:
            self.deadline = time.monotonic() + state.timeout
            env["OUTLAST_DEADLINE"] = str(format_time(utcnow() + timedelta(seconds=state.timeout)))
        # `outlast report` works inside the job even when the venv is not activated
        bindir = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", os.defpath)])
        read_end, write_end = os.pipe()
        SIGNALS.hold()  # a stop now is acted on once the command's PID is recorded
        try:
            try:
                self.proc = subprocess.Popen(
                    state.command or [],
                    stdin=subprocess.DEVNULL,
                    stdout=write_end,
                    stderr=write_end,
                    env=env,
                    cwd=cwd,
                    process_group=0,
                    close_fds=True,
                )
            except OSError as exc:
                os.close(read_end)
                raise CannotStart(exc, list(state.command or [])) from exc
            finally:
                os.close(write_end)
            self.pipe: int | None = read_end
            self.pidfd: int | None = None
            self.kill_at: float | None = None  # set once the command got SIGTERM
            self.stopped = False
            #: The worker lock was lost (the database restarted, the network was cut): the
            #: attempt is another's to judge; nothing is written.
            self.lost = False
            try:
                self.pidfd = os.pidfd_open(self.proc.pid)
                task.set_pid(self.proc.pid, procs.start_time(self.proc.pid))
            except BaseException:
                self.cleanup()
                raise
        finally:
            SIGNALS.release()

    def _signal_all(self, sig: int) -> None:
        """``sig`` to the command's group and to every other descendant of this process."""
        procs.signal_group(self.proc.pid, sig)
        procs.signal_descendants(sig, skip_group=self.proc.pid)

    def stop(self) -> None:
        """SIGTERM the command (and all it started) now, SIGKILL once the grace is over."""
        if not self.stopped:
            self.stopped = True
            self._signal_all(signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace

    def _still_ours(self) -> bool:
        """Whether the job is still this attempt's; while the store cannot say (it is
        restarting), yes: the worker lock decides (a lost one stops the command)."""
        try:
            now = self.store.get(self.state.id)
        except JobNotFound:
            return False
        except StoreError:
            return True
        return now.status == Status.RUNNING and now.attempts == self.task.attempt

    def _read_pipe(self) -> None:
        assert self.pipe is not None
        data = os.read(self.pipe, 65536)
        if data:
            self.log.write(data)
        else:
            os.close(self.pipe)
            self.pipe = None

    def wait(self) -> int:
        """Run to the end; returns the exit status (negative: killed by that signal)."""
        with self.store.listen([self.state.id]) as listener:
            if not self._still_ours():
                self.stop()
            while self.pidfd is not None or self.pipe is not None:
                self._step(listener)
        self._end_leftovers()
        return self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL

    def _timeout(self, listener: Any) -> float | None:
        """How long the next wait may last (None: until something happens)."""
        now = time.monotonic()
        waits = [] if self.kill_at is None else [max(0.0, self.kill_at - now)]
        if self.deadline is not None and not self.stopped:
            waits.append(max(0.0, self.deadline - now))
        if self.pidfd is None:  # the command is gone: give what it left a moment, then end it
            waits.append(0.2)
        if listener.fileno() is None:  # reconnecting to the store: look now and then
            waits.append(1.0)
        flush = self.log.tick()  # a log in a database: send what waits, at its time
        if flush is not None:
            waits.append(flush)
        return min(waits) if waits else None

    def _step(self, listener: Any) -> None:
        lock_fd = self.store.lock_fileno()
        fds = [fd for fd in (self.pipe, self.pidfd, listener.fileno(), lock_fd) if fd is not None]
        ready, _, _ = select.select(fds, [], [], self._timeout(listener))
        if self.pipe is not None and self.pipe in ready:
            self._read_pipe()
        if self.pidfd is not None and self.pidfd in ready:
            self.proc.wait()
            os.close(self.pidfd)
            self.pidfd = None
        procs.reap_adopted(skip=self.proc.pid)
        if listener.fileno() is None or listener.fileno() in ready:
            listener.drain()
            if not self.stopped and not self._still_ours():
                self.stop()
        if lock_fd is not None and lock_fd in ready:
            self.store.check_locks()
            if not self.task.lock_alive():
                self.lost = True  # the lock was taken away: someone may run the job now
                self.stop()
        if not ready and self.pidfd is None and self.kill_at is None:
            self.stop()  # leftovers of a finished command still hold its output: end them
        if (
            self.deadline is not None
            and not self.stopped
            and self.pidfd is not None
            and time.monotonic() >= self.deadline
        ):
            self.timed_out = True
            self.stop()
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self._signal_all(signal.SIGKILL)
            self.kill_at = time.monotonic() + 1.0

    def _end_leftovers(self) -> None:
        """The command is over: stop whatever it left running (its group, and descendants
        that left the group and came back to this subreaper), and reap them."""
        if procs.group_alive(self.proc.pid) or procs.descendants(skip_group=self.proc.pid):
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + min(self.grace, LEFTOVER_GRACE)
            while time.monotonic() < deadline and (
                procs.group_alive(self.proc.pid) or procs.descendants(skip_group=self.proc.pid)
            ):
                procs.reap_adopted(skip=self.proc.pid)
                time.sleep(0.02)
            self._signal_all(signal.SIGKILL)
        procs.reap_adopted(skip=self.proc.pid, wait=1.0)

    def cleanup(self) -> None:
        """On an unexpected exit of the supervisor: leave nothing of the command running."""
        if procs.group_alive(self.proc.pid):
            procs.terminate_group(self.proc.pid, min(self.grace, 2.0))
        procs.signal_descendants(signal.SIGKILL, skip_group=None)
        procs.reap_adopted(skip=None, wait=1.0)


def _attempt(store: Store, task: Task, state: JobState, log: LogSink) -> Status | None:
    """Run one attempt and record it; returns the job's status after, None to stop here."""
    job_id = state.id
    run = None
    try:
        run = Run(store, task, state, log)
        code = run.wait()
    except CannotStart as exc:
        error = ErrorInfo("error", str(exc), type="CannotStart")
        if exc.final:
            error = ErrorInfo(
                "error", str(exc), hint="check the command and its PATH", type="CannotStart"
            )
        return task.fail(error, retry=not exc.final, keep_worker=True).status
    except BaseException:
        if run is not None:
            run.cleanup()
        raise
    log.close()  # the whole output is in the log before the job's end is recorded
    if run.lost:
        return None  # fenced: whoever reconciles the job (its lock is free) retries it
    if run.timed_out:
        from outlast.when import format_duration

        error = ErrorInfo(
            ErrorCode.TIMEOUT,
            f"the command ran past its timeout of {format_duration(state.timeout or 0)}",
            hint="raise --timeout, or make the command faster",
            type="Timeout",
        )
        return _persist(lambda: task.fail(error, keep_worker=True)).status
    if run.stopped and code != 0 and _persist(task.state).terminal:
        return None  # canceled: the state already says so
    if code == 0:
        return _persist(lambda: task.succeed({"exit_code": 0})).status
    error = ErrorInfo(
        "error", describe_exit(code), hint=f"see `outlast logs {job_id}`", type="ExitStatus"
    )
    return _persist(lambda: task.fail(error, keep_worker=True)).status


def _persist(write: Callable[[], JobState], patience: float = 600.0) -> JobState:
    """``write()``, tried again with backoff while the store fails (a database restarting),
    for up to ``patience`` seconds: how the command ended is not lost to a short outage. (A
    write after the worker lock was lost is refused by its attempt token, as it must be.)"""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return write()
        except StoreError as exc:
            if time.monotonic() + delay > deadline:
                raise
            print(f"outlast supervisor: {exc}; retrying", file=sys.stderr, flush=True)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)


def supervise(store: Store, job_id: str, wait: bool = False) -> int:
    """Run the command job ``job_id`` to its end; returns the supervisor's exit code. A job of
    a group hands its slot on: this process then runs the group's next parked command job
    itself (its output to that job's log), and so on while the group has parked jobs, so a
    group's queue is drained by as many processes as it has slots."""
    procs.become_subreaper()
    code = 0
    next_id: str | None = job_id
    while next_id is not None:
        code, next_id = _supervise_job(store, next_id, next_id != job_id, wait)
        wait = False
    return code


def _supervise_job(
    store: Store, job_id: str, handed_on: bool, wait: bool = False
) -> tuple[int, str | None]:
    """Run one job; returns the exit code and the job to run next in this process (None:
    exit)."""
    task = store.open(job_id)
    try:
        task.hold_worker_lock()
        if handed_on:
            _output_to(store, job_id)
    except WorkerLockHeld:
        return 0, None  # another supervisor already runs it
    except OutlastError as exc:
        if not handed_on:
            raise
        print(f"outlast supervisor: cannot take job {job_id}: {exc}", file=sys.stderr)
        return 0, None
    with present(store, "supervisor", job_id=job_id):
        code, key = _supervise(store, task, job_id, wait)
    if key is None:
        return code, None
    task.release_worker_lock()  # the job is over: nothing of it needs the lock now
    return code, reap.take_parked(store, key)


def _output_to(store: Store, job_id: str) -> None:
    """This process's own messages go to the log of the job it runs now (if that cannot be
    opened, they go on where they went)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        fd = os.open(
            store.worker_output_path(job_id),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )
    except OSError as exc:
        print(f"outlast supervisor: cannot write to job {job_id}'s log: {exc}", file=sys.stderr)
        return
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def _supervise(store: Store, task: Task, job_id: str, wait: bool = False) -> tuple[int, str | None]:
    """Run the job's attempts; returns the exit code and, once an attempt of a job of a
    concurrency key ended the job, the key, whose slot is to be handed on. ``wait``: the
    first wait for the job's time is this process's, however far ahead (spawn.WAIT)."""
    try:
        max_bytes()  # a bad $OUTLAST_LOG_MAX_BYTES fails the job now
        log = store.log_writer(job_id)
    except (OutlastError, OSError) as exc:
        if task.start():
            task.fail(ErrorInfo("error", f"cannot open the job's log: {exc}"), retry=False)
        return 1, None
    try:
        while True:
            state = timer.wait_or_park(store, task, job_id, park=not wait)
            wait = False
            if state is None or not reap.start_or_park(store, task, state):
                return 0, None  # not pending any more, or parked: for its time, for its key
            status = _attempt(store, task, state, log)
            if status != Status.PENDING:
                return 0, state.limit_key
            if state.limit_key is not None:  # a retry: its backoff is waited out here
                reap.start_parked(store, state.limit_key)
    finally:
        log.close()
        _forget_context(store, job_id)


def _forget_context(store: Store, job_id: str) -> None:
    """Once the job is over, its saved environment (which may hold secrets) is not kept; a
    job that is not over keeps it for the supervisor that retries it."""
    try:
        if not store.get(job_id).terminal:
            return
    except JobNotFound:
        pass
    except OutlastError:
        return
    from outlast.run.spawn import forget_context

    forget_context(store, job_id)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    wait = args[2:] == [WAIT]
    if len(args) != 2 and not wait:
        print(f"usage: python -m outlast.run.supervisor STORE_URL JOB_ID [{WAIT}]", file=sys.stderr)
        return 2
    for sig in STOP_SIGNALS:
        signal.signal(sig, SIGNALS.handler)
    try:
        with open_store(args[0]) as store:
            return supervise(store, args[1], wait)
    except _Stop as exc:
        print(f"outlast supervisor: stopped by {exc}", file=sys.stderr)
        return 1
    except OutlastError as exc:
        print(f"outlast supervisor: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
