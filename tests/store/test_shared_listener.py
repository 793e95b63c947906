"""One listener shared by many waiters of a loop (``outlast.store.aio.Shared``), on every
store: wake-ups reach every share, nothing is lost between a join and a wait, the listener
goes with its last share, and a listener that cannot go on says so instead of going quiet."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from outlast.http.sse import _on_loop, _once
from outlast.store import Store
from outlast.store.aio import AsyncListener, Shared


def test_every_share_is_woken_and_a_change_before_the_wait_is_not_lost(store: Store) -> None:
    job = store.create(kind="function", name="watched")

    async def run() -> list[bool]:
        shared = Shared(store, [job.id])
        shares = [await shared.join() for _ in range(5)]
        job.relabel("k", "1")  # between the joins and the waits
        woken = [await share.wait(10) for share in shares]
        quiet = [await share.wait(0.2) for share in shares]  # nothing new since
        for share in shares:
            share.close()
        return woken + quiet

    said = asyncio.run(run())
    assert said == [True] * 5 + [False] * 5


def test_the_listener_goes_with_its_last_share_and_comes_back_with_the_next(store: Store) -> None:
    job = store.create(kind="function", name="watched")

    async def run() -> tuple[bool, bool, bool]:
        shared = Shared(store, [job.id])
        first, second = await shared.join(), await shared.join()
        armed = shared._watch
        first.close()
        first.close()  # idempotent: counted once
        still = shared._watch is armed and armed is not None
        second.close()
        gone = shared._watch is None
        again = await shared.join()
        job.relabel("k", "2")
        woken = await again.wait(10)
        again.close()
        return still, gone, woken

    assert asyncio.run(run()) == (True, True, True)


def test_a_listener_with_no_thread_to_drain_it_says_so(store: Store) -> None:
    """Before, the listener stopped waking for good when its drain could not be handed to a
    thread, and its waiters only ever timed out; a shared one kept every stream of its
    shard on their rechecks."""
    job = store.create(kind="function", name="watched")

    async def run() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(1)
        loop.set_default_executor(pool)
        listener = AsyncListener(store.listen([job.id]), loop)
        shared = Shared(store, [job.id])
        share = await shared.join()
        pool.shutdown()  # no thread will take a drain any more
        job.relabel("k", "3")
        try:
            await listener.wait(10)
            own = "no error"
        except RuntimeError as exc:
            own = str(exc)
        try:
            await share.wait(10)
            theirs = "no error"
        except RuntimeError as exc:
            theirs = str(exc)
        listener._listener.close()
        share.close()
        return own, theirs

    own, theirs = asyncio.run(run())
    assert "shutdown" in own, own
    assert "shutdown" in theirs, theirs


def test_a_release_made_in_another_thread_runs_on_the_loop() -> None:
    """A stream's release may be found by the collector in any thread; the count and the
    listener it lets go are the loop's."""
    ran_in: list[int] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        _on_loop(loop, lambda: ran_in.append(threading.get_ident()))
        done = threading.Event()
        loop.call_soon_threadsafe(done.set)
        assert done.wait(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert ran_in == [thread.ident]
    _on_loop(loop, lambda: ran_in.append(-1))  # the loop gone: at once, here
    assert ran_in[-1] == -1


def test_a_release_whose_first_part_fails_still_makes_the_rest() -> None:
    made: list[str] = []

    def fails() -> None:
        made.append("close")
        raise RuntimeError("the loop is closed")

    release = _once(fails, lambda: made.append("count"))
    with pytest.raises(RuntimeError):
        release()
    release()
    assert made == ["close", "count"]
