"""The example's job: an ``async def`` function, run by an async pool
(``outlast worker --async --import examples.fastapi_app.jobs``)."""

from __future__ import annotations

import asyncio
import hashlib

import outlast


@outlast.job(name="example.fingerprint", attempts=3, timeout="2m")
async def fingerprint(text: str, rounds: int = 5) -> dict[str, object]:
    """Hash ``text`` in ``rounds`` steps, waiting a little on each (standing in for calls to
    other services), and report progress after each step."""
    job = outlast.current()
    digest = text.encode()
    for i in range(rounds):
        await asyncio.sleep(0.05)  # an HTTP call, a query: the loop runs other jobs meanwhile
        digest = hashlib.sha256(digest).digest()
        await job.areport("hash", progress=(i + 1) / rounds, message={"round": i + 1})
    print(f"fingerprinted {len(text)} characters in {rounds} rounds")  # goes to the job's log
    return {"sha256": digest.hex(), "rounds": rounds}
