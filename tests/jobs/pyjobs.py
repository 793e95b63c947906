"""Job functions of tests/jobs, imported by workers as ``tests.jobs.pyjobs``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import outlast

MODULE = __name__


@outlast.job(name="py.one")
def one(x: int) -> int:
    return x


@outlast.job(name="py.kw")
def kw(x: int, *, queue: str = "fn-default", labels: dict[str, str] | None = None) -> list[object]:
    """A function whose own keyword arguments share names with the job's options."""
    return [x, queue, labels]


def _deep(message: str) -> None:
    raise ValueError(message)


@outlast.job(name="py.boom", attempts=2)
def boom(message: str = "bad input") -> None:
    _deep(message)


@outlast.job(name="py.secret", attempts=1)
def secret() -> None:
    raise RuntimeError(f"cannot log in with {os.environ['PYTEST_SECRET_TOKEN']}")


@outlast.job(name="py.huge_error", attempts=1)
def huge_error() -> None:
    def recurse(n: int) -> None:
        if n == 0:
            raise RecursionError("deep " + "x" * 50_000)
        recurse(n - 1)

    recurse(200)


@outlast.job(name="py.noisy")
def noisy(lines: int) -> int:
    """Print ``lines`` numbered lines, alternating stdout (Python), stderr (the descriptor),
    then one line from a child process and one through libc."""
    for i in range(lines):
        if i % 2 == 0:
            print(f"line {i} out", flush=True)
        else:
            os.write(2, b"line %d err\n" % i)
    subprocess.run([sys.executable, "-c", "print('from a child')"], check=True)
    import ctypes

    libc = ctypes.CDLL(None)
    libc.write(1, b"from libc\n", 10)
    return lines


@outlast.job(name="py.flood")
def flood(megabytes: int) -> int:
    """Write ``megabytes`` MB of numbered lines, alternating stdout and stderr, each line one
    ``write`` to its descriptor."""
    line_size = 100
    count = megabytes * 1_000_000 // line_size
    for i in range(count):
        text = f"{i:09d} {'o' if i % 2 == 0 else 'e'} ".ljust(line_size - 1, ".") + "\n"
        os.write(1 if i % 2 == 0 else 2, text.encode())
    return count


@outlast.job(name="py.anap")
async def anap(seconds: float, marker: str | None = None) -> float:
    """Sleep ``seconds`` on the event loop; ``marker``: a file where it writes how it ended
    (``done``, or ``cancelled`` when its task was cancelled)."""
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        if marker:
            Path(marker).write_text("cancelled")
        raise
    if marker:
        Path(marker).write_text("done")
    return seconds


@outlast.job(name="py.anap_once", attempts=3)
async def anap_once(first: float, then: float, path: str) -> int:
    """Sleep ``first`` seconds on its first attempt, ``then`` on later ones; append
    ``attempt`` to ``path`` when it starts."""
    attempt = outlast.current().attempt
    with open(path, "a") as f:
        f.write(f"{attempt}\n")
    await asyncio.sleep(first if attempt == 1 else then)
    return attempt


@outlast.job(name="py.ato", attempts=2, timeout=0.5)
async def ato() -> None:
    await asyncio.sleep(30)


@outlast.job(name="py.aprint")
async def aprint(text: str) -> str:
    await asyncio.sleep(0.01)
    print(text)
    await outlast.current().areport("said", message=text)
    return text


@outlast.job(name="py.acheck")
async def acheck(path: str) -> str:
    """Swallows the cancel of its task, and stops at its own ``check_cancel()`` instead."""
    for _ in range(300):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.1)
        try:
            outlast.current().check_cancel()
        except outlast.Canceled:
            Path(path).write_text("Canceled")
            raise
    return "never canceled"


def _count(payload: dict[str, object]) -> tuple[dict[str, int], str]:
    return {"keys": len(payload)}, "counted"


PIPE = outlast.Pipeline(
    "py.pipe",
    [outlast.Stage("count", _count), outlast.Stage("again", _count)],
    attempts=1,
)
