"""The jobs the torture harness runs (imported by its pools with ``--import torture_jobs``):
``torture.work`` for the kill sections, the pipeline ``torture.pipe`` for ``pipelines``.

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
from outlast.pipeline import ALL_DONE, Pipeline, Stage


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


def _work(payload: dict) -> tuple[dict, str]:
    """Begins what the cleanup must undo (``W``), works ``seconds`` while looking for a
    cancel, then fails for good (``F``) if the payload says so."""
    ctx = outlast.current()
    _append(payload["path"], f"W {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    end = time.monotonic() + payload["seconds"]
    while time.monotonic() < end:
        ctx.check_cancel()
        time.sleep(0.005)
    if payload["fail"]:
        _append(payload["path"], f"F {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
        raise outlast.Fail("refused")
    return {}, "worked"


def _publish(payload: dict) -> tuple[dict, str]:
    ctx = outlast.current()
    _append(payload["path"], f"P {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    return {}, "published"


def _cleanup(payload: dict) -> tuple[dict, str]:
    """``C0`` as it begins and ``C1`` once done, a few milliseconds apart."""
    ctx = outlast.current()
    _append(payload["path"], f"C0 {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    time.sleep(payload["seconds"] / 5)
    _append(payload["path"], f"C1 {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}")
    return {}, "cleaned"


#: The pipelines section's job: work (that may fail for good), publish, and a cleanup that
#: must run to its end whatever is killed or canceled on the way.
PIPE = Pipeline(
    "torture.pipe",
    [
        Stage("work", _work),
        Stage("publish", _publish),
        Stage("cleanup", _cleanup, trigger=ALL_DONE),
    ],
    attempts=50,
)
