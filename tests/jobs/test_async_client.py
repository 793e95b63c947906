"""The async client (``asubmit``, ``Task.astate``, ``await_done``, ``aevents``) never
blocks the event loop: asyncio's debug mode reports every callback that holds the loop
longer than ``slow_callback_duration``, and none may (in a second run, when the first
reported one: see the test)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

import outlast
from outlast.model import Status
from outlast.run import api
from tests.jobs import pyjobs
from tests.pool.conftest import Harness
from tests.store.adapters import ADAPTERS, Adapter

SLOW = 0.05  # seconds: a callback that holds the loop this long is reported


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_the_async_client_waits_without_blocking_the_loop(
    adapter: Adapter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = adapter.make_url(tmp_path / "store")
    if url is None:
        pytest.skip(f"no {adapter.name} store here")
    pool = Harness(tmp_path, url)
    saved = api._default
    try:
        pool.worker("--import", pyjobs.MODULE, "--async", "-c", "50")
        outlast.use_store(pool.store)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            loop.slow_callback_duration = SLOW
            task = await outlast.asubmit(pyjobs.aprint, "hello")
            steps = [event.step async for event in task.aevents(timeout=30)]
            assert steps[-1] == "job" and "said" in steps, steps
            state = await task.await_done(timeout=30)
            assert (state.status, state.result) == (Status.SUCCEEDED, "hello")
            assert (await task.astate()).status == Status.SUCCEEDED
            # many waits at once, in one loop, each woken by the store
            many = [await outlast.asubmit(pyjobs.anap, 0.05) for _ in range(30)]
            states = await asyncio.gather(*(t.await_done(timeout=30) for t in many))
            assert all(s.status == Status.SUCCEEDED for s in states)
            # a wait that times out returns the job as it is, not terminal
            slow = await outlast.asubmit(pyjobs.anap.options(priority=1), 30)
            assert not (await slow.await_done(timeout=0.3)).terminal
            # a wait cancelled by its caller leaves nothing behind
            waiter = asyncio.create_task(slow.await_done())
            await asyncio.sleep(0.2)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter

        # A call that blocks the loop (a sync wait, a sleep) holds it in every run; a callback
        # that was slow once because this shared 2-core machine took the CPU away (or a
        # collection of the test process's garbage ran) does not come back in a second run.
        runs = []
        for _ in range(2):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="asyncio"):
                asyncio.run(main(), debug=True)
            runs.append([r.getMessage() for r in caplog.records if "took" in r.getMessage()])
            if not runs[-1]:
                break
        assert runs[-1] == [], runs
    finally:
        api._default = saved
        pool.close()
