"""Waiting on real processes in tests: poll a condition with a deadline, and tell a live
process from a dead (or zombie) one. Shared by the CLI and pool suites."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psutil


def until(check: Callable[[], Any], timeout: float = 30.0, what: str = "a condition") -> Any:
    """Poll ``check()`` until it returns something truthy (returned); fail the test with an
    ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_tree(procs: list[psutil.Process]) -> None:
    """Kill each process and everything it started (after a test: what its jobs left)."""
    for proc in procs:
        try:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.Error:
            continue


def until_abandoned(store: Any, job_id: str, timeout: float = 10.0) -> None:
    """Wait until the job looks abandoned to ``store`` (its worker's locks free), after its
    worker was killed. The kernel lets go of a dead process's flocks a moment after it is
    reaped (the last close of a file of an exiting task is deferred), and the job processes
    of a killed pool die of its death a moment after it (they share its liveness lock): a
    look at once can still find the job held, rightly."""
    until(lambda: store.abandoned(store.get(job_id)), timeout, f"job {job_id} to look abandoned")
