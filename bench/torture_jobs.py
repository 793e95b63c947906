"""The job the torture harness runs (imported by its pools with ``--import torture_jobs``).

Each call appends ``S id attempt pid time`` to a record file before its work and
``E id attempt pid time`` after it, one ``write`` each (``O_APPEND``: lines from concurrent
processes never mix), so the harness can tell from the file alone how often each job's
function started and returned, in which attempt and process, and whether two attempts of one
job ever ran at the same time.
"""

from __future__ import annotations

import os
import time

import outlast


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@outlast.job(name="torture.work", attempts=50)
def work(path: str, seconds: float) -> str:
    ctx = outlast.current()
    _append(path, f"S {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    time.sleep(seconds)
    _append(path, f"E {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    return ctx.job_id
