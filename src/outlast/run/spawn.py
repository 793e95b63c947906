"""Starting detached workers (supervisors of commands, dedicated workers of spawned jobs): a
process in a new session, stdio to the job's log; and the run context of a command."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading

from outlast.store import Store


def start_detached(store: Store, job_id: str, argv: list[str]) -> int:
    """Start ``python argv…`` detached from this terminal and session; returns its PID.

    The process gets a new session (no controlling terminal, so a hangup of the starting shell
    never reaches it), ``/dev/null`` as stdin, and the job's log as stdout and stderr (on
    PostgreSQL a file of its own: the job's output goes to the database). It is not waited
    for; a thread reaps it so a long-lived caller collects no zombies.
    """
    log = os.open(
        store.worker_output_path(job_id),
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
        0o600,
    )
    try:
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            # and the folders this process imports jobs from (--import jobs/tasks.py)
            env=dict(os.environ, OUTLAST_STORE=store.url, OUTLAST_SYS_PATH=json.dumps(sys.path)),
        )
    finally:
        os.close(log)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc.pid


def context_path(store: Store, job_id: str) -> str:
    return str(store.log_path(job_id).with_suffix(".ctx"))


def write_context(store: Store, cwd: str, env: dict[str, str]) -> str:
    """Write where and with what environment a command is started, under a name of its own
    (the job does not exist yet: a full disk fails here, before anything is recorded); give
    it to the job with :func:`adopt_context`. 0600: the environment can hold secrets, so it
    is kept out of the job document."""
    path = context_path(store, f"new-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"cwd": cwd, "env": env}, handle)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return path


def adopt_context(store: Store, written: str, job_id: str) -> None:
    """Make a context from :func:`write_context` the job's, for every attempt (a retry may
    be started by whichever process reconciled the job). A rename: no space needed."""
    os.replace(written, context_path(store, job_id))


def load_context(store: Store, job_id: str) -> tuple[str | None, dict[str, str] | None]:
    """The saved ``(cwd, env)`` of a command job, or ``(None, None)``."""
    return read_context(context_path(store, job_id))


def read_context(path: str) -> tuple[str | None, dict[str, str] | None]:
    """The ``(cwd, env)`` saved at ``path`` (by :func:`write_context`), each None when
    missing or malformed."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None, None
    cwd, env = data.get("cwd"), data.get("env")
    ok_env = isinstance(env, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    )
    return (cwd if isinstance(cwd, str) else None), (env if ok_env else None)


def forget_context(store: Store, job_id: str) -> None:
    """Remove a finished command's saved environment (it may hold secrets)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(context_path(store, job_id))


#: The flag that tells a worker started ahead of its job's time to wait for it, however far
#: ahead (the store's timer starts a crowd of one time early: outlast.run.timer).
WAIT = "--wait"


def spawn_supervisor(store: Store, job_id: str, wait: bool = False) -> int:
    """Start the supervisor of command job ``job_id`` (``wait``: see :data:`WAIT`)."""
    argv = ["-m", "outlast.run.supervisor", store.url, job_id]
    return start_detached(store, job_id, [*argv, WAIT] if wait else argv)


def spawn_dedicated(store: Store, job_id: str, wait: bool = False) -> int:
    """Start the dedicated worker of a spawned function or pipeline job (also to restart it
    for a retry or after a resume; ``wait``: see :data:`WAIT`)."""
    argv = ["-m", "outlast.run.dedicated", store.url, job_id]
    return start_detached(store, job_id, [*argv, WAIT] if wait else argv)


#: The name of the timer's own log, beside the jobs' logs (what it prints about itself).
TIMER_LOG = "@timer"


def spawn_timer(store: Store) -> int:
    """Start the store's timer (:mod:`outlast.run.timer`); one already running makes this
    one exit at once."""
    return start_detached(store, TIMER_LOG, ["-m", "outlast.run.timer", store.url])
