"""Job functions for the pool tests, imported by workers as ``tests.pool.jobs_for_tests``.

Workers find this module because the tests put the repository root on ``PYTHONPATH`` (see
``conftest.py``); the stored job records the module, so a job process imports it on demand too.

Jobs that write files take the path as an argument and append one line per write with
``O_APPEND`` (a single ``write`` call per line, so lines from concurrent processes never mix).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any

import outlast
from outlast.pipeline import ALL_DONE, Pipeline, Stage, poll

MODULE = __name__


def append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@outlast.job(name="pt.record")
def record(path: str, sleep: float = 0.0) -> str:
    """Append this job's id to ``path`` (one line per call) and return it."""
    if sleep:
        time.sleep(sleep)
    job_id = outlast.current().job_id
    append(path, job_id)
    return job_id


@outlast.job(name="pt.stop_pool")
def stop_pool(path: str) -> str:
    """Append this job's id to ``path``, SIGSTOP the pool that runs it, and return: the pool
    cannot write the outcome, which only the job's process and its journal know."""
    job_id = outlast.current().job_id
    append(path, job_id)
    os.kill(os.getppid(), signal.SIGSTOP)
    return f"stopped by {job_id}"


@outlast.job(name="pt.timed", attempts=10)
def timed(path: str, sleep: float) -> None:
    """Append ``S id attempt pid start`` when it starts and ``E id attempt pid end`` when done."""
    ctx = outlast.current()
    append(path, f"S {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    time.sleep(sleep)
    append(path, f"E {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")


def _flaky(path: str, failures: int) -> int:
    """Fail with RuntimeError the first ``failures`` calls (counted in ``path``), then succeed."""
    append(path, "call")
    with open(path) as f:
        calls = sum(1 for _ in f)
    if calls <= failures:
        raise RuntimeError(f"flaky failure #{calls}")
    return calls


@outlast.job(name="pt.flaky3", attempts=3)
def flaky3(path: str, failures: int) -> int:
    return _flaky(path, failures)


@outlast.job(name="pt.flaky2", attempts=2)
def flaky2(path: str, failures: int) -> int:
    return _flaky(path, failures)


@outlast.job(name="pt.fail_fast", attempts=3)
def fail_fast(path: str) -> None:
    """Fail at once with ``outlast.Fail``: no retry, whatever the attempts left."""
    append(path, "call")
    raise outlast.Fail("no point retrying")


@outlast.job(name="pt.ask", attempts=1)
def ask(question: str, path: str | None = None) -> Any:
    """Pause with ``question`` until a person answers; then return the answer."""
    ctx = outlast.current()
    if path:
        append(path, f"run {ctx.attempt}")
    if ctx.answer is None:
        raise outlast.Pause(question)
    return {"answer": ctx.answer}


@outlast.job(name="pt.mark_start")
def mark_start(path: str) -> None:
    """Append ``id start-time`` to ``path`` as soon as the job starts."""
    append(path, f"{outlast.current().job_id} {time.time():.6f}")


@outlast.job(name="pt.cooperative", attempts=1)
def cooperative(path: str, limit: float = 60.0) -> str:
    """Loop until canceled, checking ``current().check_cancel()``; notes start and stop."""
    append(path, "started")
    deadline = time.monotonic() + limit
    try:
        while time.monotonic() < deadline:
            outlast.current().check_cancel()
            time.sleep(0.02)
    except outlast.Canceled:
        append(path, "stopped")
        raise
    return "not canceled"


@outlast.job(name="pt.stubborn", attempts=1)
def stubborn(path: str, sleep: float = 120.0) -> str:
    """Ignore cancel: write our pid, then sleep."""
    append(path, str(os.getpid()))
    time.sleep(sleep)
    append(path, "woke up")
    return "slept"


@outlast.job(name="pt.poison", attempts=3)
def poison(path: str) -> None:
    """Die at once, every time, without a word to the pool."""
    append(path, str(os.getpid()))
    os._exit(1)


@outlast.job(name="pt.segfault", attempts=1)
def segfault(path: str) -> None:
    append(path, str(os.getpid()))
    ctypes.string_at(0)


@outlast.job(name="pt.slow", timeout=0.5, attempts=1)
def slow(path: str, sleep: float = 5.0) -> str:
    append(path, "started")
    time.sleep(sleep)
    append(path, "finished")
    return "too late"


@outlast.job(name="pt.wait_for", attempts=1)
def wait_for(path: str, limit: float = 60.0) -> str:
    """Return once ``path`` exists (or after ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return "there"


def _first_death(path: str) -> bool:
    """True the first time only: ``path.died`` then holds this process's pid (the one about
    to die)."""
    if os.path.exists(path + ".died"):
        return False
    append(path + ".died", str(os.getpid()))
    return True


@outlast.job(name="pt.die_once", attempts=3)
def die_once(path: str) -> str:
    """Append ``S id attempt pid`` as it starts; the first time, SIGKILL its own process
    (``path.died`` notes that it did); after that, return."""
    ctx = outlast.current()
    append(path, f"S {ctx.job_id} {ctx.attempt} {os.getpid()}")
    if _first_death(path):
        os.kill(os.getpid(), signal.SIGKILL)
    return "lived"


def _die_once_journaled(path: str) -> bool:
    """The first time (``path.died`` notes it), SIGKILL this job process just after the
    outcome of its job is journaled, before it can send it to the pool (the journal's
    classes are wrapped in this process: the OOM killer, a stray ``kill``)."""
    from outlast.store.journal import Journal

    if not _first_death(path):
        return False
    classes, todo = [], [Journal]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo += cls.__subclasses__()
    for cls in classes:
        if "send_returned" in vars(cls):
            real = vars(cls)["send_returned"]

            def send_returned(self: Any, key: Any, outcome: Any, real: Any = real) -> None:
                real(self, key, outcome)
                self.settle()  # the record is in: then the process dies
                os.kill(os.getpid(), signal.SIGKILL)

            cls.send_returned = send_returned  # type: ignore[method-assign]
    return True


@outlast.job(name="pt.die_after_return", attempts=3)
def die_after_return(path: str) -> str:
    """Append ``S id attempt pid`` as it starts, and return; the first time, its process is
    killed once the outcome is journaled (:func:`_die_once_journaled`)."""
    ctx = outlast.current()
    append(path, f"S {ctx.job_id} {ctx.attempt} {os.getpid()}")
    _die_once_journaled(path)
    return "returned"


@outlast.job(name="pt.noop")
def noop(value: Any = None) -> Any:
    return value


@outlast.job(name="pt.modules")
def modules(names: list[str]) -> list[str]:
    """Which of ``names`` this job process has imported."""
    return [name for name in names if name in sys.modules]


@outlast.job(name="pt.sleep")
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


_STUBBORN_CHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
)


@outlast.job(name="pt.tree", attempts=1)
def tree(path: str, sleep: float = 60.0) -> None:
    """Start a child that ignores SIGTERM (its PID, then ours, go to ``path``), then sleep:
    a timeout must end both."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", _STUBBORN_CHILD])
    append(path, str(child.pid))
    append(path, str(os.getpid()))
    time.sleep(sleep)


@outlast.job(name="pt.time_left", attempts=1)
def time_left() -> Any:
    """What the job sees of its deadline."""
    ctx = outlast.current()
    return {
        "left": ctx.time_left(),
        "deadline": None if ctx.deadline is None else str(ctx.deadline),
    }


@outlast.job(name="pt.limited", limit=2, limit_key="tenant:{tenant}", attempts=3)
def limited(path: str, tenant: str, sleep: float = 0.05) -> None:
    """Mark its start and end in ``path`` (``+ id`` / ``- id``): at most 2 of one tenant run
    at once, whichever pools run them."""
    job_id = outlast.current().job_id
    append(path, f"+ {job_id}")
    time.sleep(sleep)
    append(path, f"- {job_id}")


@outlast.job(name="pt.slow_stop", attempts=1)
def slow_stop(path: str, cleanup: float = 1.0) -> str:
    """Loop until canceled; then take ``cleanup`` seconds before it stops, and say so."""
    append(path, "started")
    try:
        while True:
            outlast.current().check_cancel()
            time.sleep(0.02)
    except outlast.Canceled:
        time.sleep(cleanup)
        append(path, "stopped")
        raise


@outlast.job(name="pt.stubborn_parent", attempts=1)
def stubborn_parent(path: str) -> str:
    """Ignore cancel, with a child that ignores SIGTERM too: write both pids, then sleep."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(15, signal.SIG_IGN); time.sleep(300)",
        ]
    )
    append(path, f"{os.getpid()} {child.pid}")
    time.sleep(300)
    return "slept"


def _never_ready(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    append(payload["path"], f"S {outlast.current().attempt} {os.getpid()}")
    return {}, "not yet"


def _cleanup_then_die(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The cleanup: a line, then (the first time) this process is killed once the job's
    outcome is journaled, before it is sent (:func:`_die_once_journaled`)."""
    append(payload["path"], f"C {outlast.current().attempt} {os.getpid()}")
    _die_once_journaled(payload["path"])
    return {}, "cleaned"


#: A poll stage that waits until it reads its cancel from the store, then a cleanup whose
#: process dies as its outcome is journaled.
CANCEL_THEN_DIE = Pipeline(
    "pt.cancel_then_die",
    [
        poll("wait", _never_ready, until=lambda out: False, interval=0.1, timeout=60.0),
        Stage("cleanup", _cleanup_then_die, trigger=ALL_DONE),
    ],
    attempts=2,
)


def _fail_finally(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    raise outlast.Fail("the export was refused")


def _cleanup_dies_once(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The cleanup: a line; the first time, its process dies (``os._exit``) right after."""
    path = payload["path"]
    append(path, f"C {outlast.current().attempt} {os.getpid()}")
    if _first_death(path):
        os._exit(3)
    return {}, "cleaned"


#: A stage fails for good, then the cleanup's process dies the first time: the job, retried,
#: runs the cleanup again and ends failed.
FAIL_THEN_DIE = Pipeline(
    "pt.fail_then_die",
    [
        Stage("export", _fail_finally),
        Stage("publish", lambda payload: ({}, "published")),
        Stage("cleanup", _cleanup_dies_once, trigger=ALL_DONE),
    ],
    attempts=2,
)


def _wait_for_cancel(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    append(payload["path"], f"W {outlast.current().attempt} {os.getpid()}")
    for _ in range(1200):
        outlast.current().check_cancel()
        time.sleep(0.05)
    return {}, "no cancel came"


#: A stage that runs until canceled, then a cleanup whose process dies the first time.
CANCEL_CLEANUP_DIES = Pipeline(
    "pt.cancel_cleanup_dies",
    [
        Stage("work", _wait_for_cancel),
        Stage("cleanup", _cleanup_dies_once, trigger=ALL_DONE),
    ],
    attempts=3,
)


def _begin_export(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """What a cleanup must undo (the seed's export): a line ``B attempt``."""
    append(payload["path"], f"B {outlast.current().attempt} {os.getpid()}")
    if payload.get("flaky") and outlast.current().attempt == 1:
        raise RuntimeError("the export's status could not be read (transient)")
    return {}, "export begun"


def _approve(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if outlast.current().answer is None:
        raise outlast.Pause({"question": "publish the export?"})
    return {}, "approved"


def _undo_export(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    append(payload["path"], f"C {outlast.current().attempt} {os.getpid()}")
    return {}, "cleaned"


#: Begins an export, then asks a person (or, with ``flaky``, fails its first attempt and
#: waits for its retry); the cleanup undoes the export. Canceled while it waits, the
#: cleanup must still run.
EXPORT_THEN_WAIT = Pipeline(
    "pt.export_then_wait",
    [
        Stage("export", _begin_export),
        Stage("approve", _approve),
        Stage("cleanup", _undo_export, trigger=ALL_DONE),
    ],
    attempts=2,
)
