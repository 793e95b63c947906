"""A dedicated worker: the detached process ``outlast.spawn`` starts for one function job.

It holds the job's worker lock for its whole life, runs each attempt in-process, and waits out
a near time and a short retry backoff itself (the job stays bound to it meanwhile, so its death
is seen as abandonment); a time more than ``machine.PARK_AFTER`` seconds ahead is waited for
parked, with no process: the store's timer starts a worker then (:mod:`outlast.run.timer`).
A job whose concurrency key is full is parked: this process lets it go and exits, and whoever
frees a slot of the key starts a worker for the next parked job
(``outlast.run.reap.start_parked``); each attempt's end here is such a place. Run as
``python -m outlast.run.dedicated STORE_URL JOB_ID [--wait]`` (as the supervisor's ``--wait``).

A job with a ``timeout``: at its deadline the attempt fails with code ``timeout``, what the
job started gets SIGTERM and, after the grace period, SIGKILL (this process is their child
subreaper, so a double fork does not escape), and this process exits, having started a fresh
dedicated worker for the retry if attempts are left (the function cannot be stopped inside
this process: its thread is left to die with it).

A canceled job is stopped the same way, whatever its code does: while an attempt runs, a
thread watches the job; once it is canceled, the job is asked to stop (``check_cancel``
raises, an async job's task is canceled) and what it started gets SIGTERM; after the grace
period what is left gets SIGKILL and, if the function still has not returned, this process
ends. Its worker lock goes with it, which is what ``outlast wait`` on a canceled job waits for.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

from outlast.errors import OutlastError, WorkerLockHeld
from outlast.model import ErrorCode, ErrorInfo, JobState, Status
from outlast.run import context, procs, reap, timer
from outlast.run.capture import Capture
from outlast.run.execute import execute
from outlast.run.presence import present
from outlast.store import Store, Task, open_store

#: Seconds between SIGTERM and SIGKILL of what a timed-out job started, unless it says.
DEFAULT_GRACE = 10.0
#: Seconds between looks at a running job for a cancel, besides its change notifications.
CANCEL_CHECK = 1.0


def run_dedicated(store: Store, job_id: str, wait: bool = False) -> None:
    """Run the spawned job ``job_id`` to its end (``wait``: the first wait for its time is
    this process's, however far ahead: spawn.WAIT)."""
    task = store.open(job_id)
    try:
        task.hold_worker_lock()
    except WorkerLockHeld:
        return
    context.install_cancel_handler()
    procs.become_subreaper()
    with present(store, "dedicated", job_id=job_id):
        _run(store, task, job_id, wait)


def _run(store: Store, task: Task, job_id: str, wait: bool) -> None:
    # On a local store this process's output is the job's log file already; on PostgreSQL
    # the job's output goes to the database, where any host reads it.
    capture = None if store.capabilities.local_logs else Capture()
    while True:
        state = timer.wait_or_park(store, task, job_id, park=not wait)
        wait = False
        if state is None or not reap.start_or_park(store, task, state):
            return  # not pending any more, or parked: for its time, for its key
        assert task.attempt is not None
        done = threading.Event()
        watcher = threading.Thread(
            target=_stop_if_canceled,
            args=(store, state, done),
            name="outlast-cancel",
            daemon=True,
        )
        watcher.start()
        if state.timeout is not None:
            threading.Thread(
                target=_deadline,
                args=(store, state, task.attempt, done),
                name="outlast-deadline",
                daemon=True,
            ).start()
        try:
            if capture is None:
                execute(store, job_id, task.attempt, dedicated=True)
            else:
                with capture.job(partial(store.log_writer, job_id)):
                    execute(store, job_id, task.attempt, dedicated=True)
        finally:
            done.set()
        watcher.join()  # a canceled job's leftovers are stopped before this process ends
        _hand_off(store, state)  # the slot this attempt held
        if store.get(job_id).status != Status.PENDING:
            return


def _stop_if_canceled(store: Store, state: JobState, done: threading.Event) -> None:
    """Until the attempt ends (``done``): when the job is canceled, ask it to stop and
    SIGTERM what it started; after the grace period SIGKILL what is left, and end this
    process if the function has not returned by then."""
    try:
        with store.listen([state.id]) as listener:
            look_at = 0.0  # at once, then on each change and every CANCEL_CHECK seconds
            while not done.is_set():
                if listener.wait(0.05) or time.monotonic() >= look_at:
                    listener.drain()
                    look_at = time.monotonic() + CANCEL_CHECK
                    try:
                        now = store.get(state.id)
                    except OutlastError:  # gone, or the store failed: look again
                        now = None
                    if now is not None and now.status == Status.CANCELED:
                        break
            else:
                return
    except OutlastError as exc:
        print(f"outlast worker: cannot watch job {state.id} for a cancel: {exc}", flush=True)
        return
    grace = _stop(state, lambda: done.is_set() and not procs.descendants())
    if not done.is_set():
        print(f"outlast worker: job {state.id} ignored its cancel for {grace:g} s: stopped")
        sys.stdout.flush()
        _hand_off(store, state)
        os._exit(0)


def _deadline(store: Store, state: JobState, attempt: int, done: threading.Event) -> None:
    """At the attempt's deadline: fail it with ``timeout``, stop what it started, start a
    worker for the retry (if any) and end this process."""
    assert state.timeout is not None
    if done.wait(state.timeout):
        return
    from outlast.when import format_duration

    error = ErrorInfo(
        ErrorCode.TIMEOUT,
        f"the job ran past its timeout of {format_duration(state.timeout)}",
        hint="raise the job's timeout, or watch outlast.current().deadline inside it",
        type="Timeout",
    )
    try:
        after = Task(store, state.id, attempt=attempt).fail(error)
    except OutlastError as exc:
        print(f"outlast worker: cannot record the timeout of {state.id}: {exc}", flush=True)
        os._exit(1)
    # then (what it records now is fenced out) the job is stopped as far as it can be
    _stop(state, lambda: not procs.descendants())
    if after.status == Status.PENDING and after.worker is None:
        from outlast.run.spawn import spawn_dedicated

        try:  # it takes the job's lock once this process is gone
            spawn_dedicated(store, state.id)
        except OSError as exc:  # the maintainer restarts it (a stray)
            print(f"outlast worker: cannot start the retry of {state.id}: {exc}", flush=True)
    _hand_off(store, state)
    os._exit(0)


def _hand_off(store: Store, state: JobState) -> None:
    """The attempt is over: start the worker of the next parked job of the job's key."""
    if state.limit_key is not None:
        reap.start_parked(store, state.limit_key)


def _stop(state: JobState, stopped: Callable[[], bool]) -> float:
    """Ask the attempt to stop (``check_cancel`` raises, an async job's task is canceled)
    and SIGTERM what it started; after the job's grace period, or once ``stopped()``,
    SIGKILL what is left. Returns the grace period."""
    current = context.current_or_none()
    if current is not None:
        current.request_cancel()
    procs.signal_descendants(signal.SIGTERM)
    grace = DEFAULT_GRACE if state.grace is None else state.grace
    end = time.monotonic() + grace
    while time.monotonic() < end and not stopped():
        procs.reap_adopted(skip=None)
        time.sleep(0.02)
    procs.signal_descendants(signal.SIGKILL)
    procs.reap_adopted(skip=None, wait=1.0)
    return grace


def main(argv: list[str] | None = None) -> int:
    from outlast.run.spawn import WAIT

    args = sys.argv[1:] if argv is None else argv
    wait = args[2:] == [WAIT]
    if len(args) != 2 and not wait:
        print(f"usage: python -m outlast.run.dedicated STORE_URL JOB_ID [{WAIT}]", file=sys.stderr)
        return 2
    from outlast.run.registry import inherit_sys_path

    inherit_sys_path()
    try:
        with open_store(args[0]) as store:
            run_dedicated(store, args[1], wait)
    except OutlastError as exc:
        print(f"outlast worker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
