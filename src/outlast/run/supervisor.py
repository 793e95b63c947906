"""The supervisor: the small detached process that runs one command job.

Started by ``outlast run`` in a new session (no terminal), it holds the job's worker lock for
its whole life, runs the command in its own process group with ``OUTLAST_JOB_ID`` and
``OUTLAST_STORE`` set, copies its output into the job's log, records the exit status, and
retries while attempts are left (the job stays bound to this supervisor meanwhile, so the
supervisor's death is seen as abandonment).

It watches its own job through the store's notification: when the job is canceled (or deleted,
or taken from it), the command's group gets SIGTERM and, after the grace period, SIGKILL.

Run as ``python -m outlast.run.supervisor STORE_URL JOB_ID``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

from outlast.errors import JobNotFound, OutlastError, WorkerLockHeld
from outlast.model import ErrorInfo, JobState, Status
from outlast.run import procs
from outlast.run.logs import LogWriter
from outlast.run.spawn import load_context
from outlast.store import Store, Task, open_store, wait_until_due

#: Seconds between SIGTERM and SIGKILL for a job that does not say (``JobState.grace``).
DEFAULT_GRACE = 10.0


class _Stop(Exception):
    """The supervisor itself was asked to stop (SIGTERM/SIGINT/SIGHUP)."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


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

    def __init__(self, store: Store, task: Task, state: JobState, log: LogWriter) -> None:
        self.store, self.task, self.state, self.log = store, task, state, log
        self.grace = grace_of(state)
        cwd, saved = load_context(store, state.id)
        env = dict(saved if saved is not None else os.environ)
        env.update(OUTLAST_JOB_ID=state.id, OUTLAST_STORE=store.url)
        # `outlast report` works inside the job even when the venv is not activated
        bindir = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", os.defpath)])
        read_end, write_end = os.pipe()
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
        finally:
            os.close(write_end)
        self.pipe: int | None = read_end
        self.pidfd: int | None = os.pidfd_open(self.proc.pid)
        task.set_pid(self.proc.pid, procs.start_time(self.proc.pid))
        self.kill_at: float | None = None  # set once the group got SIGTERM
        self.stopped = False

    def stop(self) -> None:
        """SIGTERM the group now, SIGKILL it once the grace period is over."""
        if not self.stopped:
            self.stopped = True
            procs.signal_group(self.proc.pid, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace

    def _still_ours(self) -> bool:
        try:
            now = self.store.get(self.state.id)
        except JobNotFound:
            return False
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
                lock_fd = self.store.lock_fileno()
                fds = [
                    fd
                    for fd in (self.pipe, self.pidfd, listener.fileno(), lock_fd)
                    if fd is not None
                ]
                timeout = (
                    None if self.kill_at is None else max(0.0, self.kill_at - time.monotonic())
                )
                if self.pidfd is None:  # leader gone: give its group a moment, then end it
                    timeout = 0.2 if timeout is None else min(timeout, 0.2)
                ready, _, _ = select.select(fds, [], [], timeout)
                if self.pipe is not None and self.pipe in ready:
                    self._read_pipe()
                if self.pidfd is not None and self.pidfd in ready:
                    self.proc.wait()
                    os.close(self.pidfd)
                    self.pidfd = None
                if listener.fileno() in ready:
                    listener.drain()
                    if not self.stopped and not self._still_ours():
                        self.stop()
                if lock_fd is not None and lock_fd in ready:
                    self.store.check_locks()
                    if not self.task.lock_alive():
                        self.stop()  # the lock was taken away: someone may run the job now
                if not ready and self.pidfd is None and self.kill_at is None:
                    self.stop()  # leftovers of a finished command: the job is over
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    procs.signal_group(self.proc.pid, signal.SIGKILL)
                    self.kill_at = time.monotonic() + 1.0
        return self.proc.returncode if self.proc.returncode is not None else -signal.SIGKILL

    def cleanup(self) -> None:
        """On an unexpected exit of the supervisor: leave nothing of the group running."""
        if procs.group_alive(self.proc.pid):
            procs.terminate_group(self.proc.pid, min(self.grace, 2.0))


def supervise(store: Store, job_id: str) -> int:
    """Run the command job ``job_id`` to its end; returns the supervisor's exit code."""
    task = store.open(job_id)
    try:
        task.hold_worker_lock()
    except WorkerLockHeld:
        return 0  # another supervisor already runs it
    try:
        log = LogWriter(store.log_path(job_id))
    except (OutlastError, OSError) as exc:
        if task.start():
            task.fail(ErrorInfo("error", f"cannot open the job's log: {exc}"), retry=False)
        return 1
    while True:
        state = wait_until_due(store, job_id)
        if state is None or not task.start():
            return 0
        run = None
        try:
            run = Run(store, task, state, log)
            code = run.wait()
        except OSError as exc:  # the command could not be started
            task.fail(ErrorInfo("error", f"cannot start the command: {exc}", type="OSError"))
            return 0
        except BaseException:
            if run is not None:
                run.cleanup()
            raise
        if run.stopped and code != 0 and task.state().terminal:
            return 0  # canceled: the state already says so
        if code == 0:
            task.succeed({"exit_code": 0})
            return 0
        error = ErrorInfo(
            "error", describe_exit(code), hint=f"see `outlast logs {job_id}`", type="ExitStatus"
        )
        after = task.fail(error, keep_worker=True)
        if after.status != Status.PENDING:
            return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m outlast.run.supervisor STORE_URL JOB_ID", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    try:
        with open_store(args[0]) as store:
            return supervise(store, args[1])
    except _Stop as exc:
        print(f"outlast supervisor: stopped by {exc}", file=sys.stderr)
        return 1
    except OutlastError as exc:
        print(f"outlast supervisor: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
