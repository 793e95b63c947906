"""The bus port and its two adapters: order, no gap, no duplicate, the end after the terminal
event, the async twin, and the shared reader of StoreBus (one per job and event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast import bus as bus_module
from outlast.bus import Progress, StoreBus
from outlast.errors import InvalidInput, InvalidJobId, JobNotFound
from outlast.model import ProgressEvent
from outlast.store import Store, open_store
from tests.http.harness import finish, start_worker
from tests.http.memory_bus import MemoryBus


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[Store]:
    os.chmod(tmp_path, 0o700)
    store = open_store(f"sqlite://{tmp_path}/bus.db")
    try:
        yield store
    finally:
        store.close()


def _seqs(events: list[ProgressEvent]) -> list[int]:
    return [e.seq for e in events]


def test_progress_is_checked() -> None:
    assert Progress("j1", "load", "completed").status == "completed"
    with pytest.raises(InvalidInput, match="unknown event status"):
        Progress("j1", "load", "done")
    with pytest.raises(InvalidInput, match="step"):
        Progress("j1", "")
    with pytest.raises(InvalidJobId):
        Progress("../j1", "load")


def test_memory_bus_orders_and_ends() -> None:
    bus = MemoryBus()
    stored = [bus.publish(Progress("j1", "s", message=i)) for i in range(5)]
    assert [e.seq for e in stored if e] == [1, 2, 3, 4, 5]
    assert _seqs(list(bus.subscribe("j1", after=2, timeout=0.05))) == [3, 4, 5]
    bus.finish("j1")
    assert bus.publish(Progress("j1", "s")) is None
    assert _seqs(list(bus.subscribe("j1"))) == [1, 2, 3, 4, 5]  # ends: finished


def test_memory_bus_follows_live_in_both_worlds() -> None:
    bus = MemoryBus()

    def publish() -> None:
        for i in range(20):
            bus.publish(Progress("j2", "s", message=i))
            time.sleep(0.001)
        bus.finish("j2")

    async def follow() -> list[int]:
        return [e.seq async for e in bus.asubscribe("j2")]

    threading.Thread(target=publish).start()
    synced = list(bus.subscribe("j2"))
    assert _seqs(synced) == list(range(1, 21))
    assert asyncio.run(follow()) == list(range(1, 21))


def test_store_bus_publishes_and_subscribes_through_the_store(local_store: Store) -> None:
    task = local_store.create(name="bussed")
    bus = StoreBus(local_store)
    task.start()

    def work() -> None:
        for i in range(10):
            bus.publish(Progress(task.id, "s", message=i, progress=10 * (i + 1)))
        task.succeed("ok")

    threading.Thread(target=work).start()
    events = list(bus.subscribe(task.id))
    assert _seqs(events) == list(range(1, 13))
    assert events[-1].status == "completed"
    assert local_store.get(task.id).progress == 100.0
    assert bus.publish(Progress(task.id, "late")) is None  # terminal: ignored


def test_unknown_jobs(local_store: Store) -> None:
    bus = StoreBus(local_store)
    with pytest.raises(JobNotFound):
        list(bus.subscribe("nosuchjob"))

    async def follow() -> None:
        async for _ in bus.asubscribe("nosuchjob"):
            pass

    with pytest.raises(JobNotFound):
        asyncio.run(follow())
    with pytest.raises(InvalidInput):
        list(bus.subscribe("j", after=-1))


def test_async_subscribers_of_a_job_share_one_reader(local_store: Store) -> None:
    task = local_store.create(name="shared")
    task.hold_worker_lock()
    task.start()
    bus = StoreBus(local_store)

    async def run() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        baseline = len(asyncio.all_tasks())

        async def follow(after: int) -> list[int]:
            return [e.seq async for e in bus.asubscribe(task.id, after)]

        followers = [asyncio.create_task(follow(i % 3)) for i in range(50)]
        await asyncio.sleep(0.1)
        assert len(bus._hubs[loop]) == 1  # fifty subscribers, one listener and one reader

        def work() -> None:
            for i in range(30):
                task.report("s", "progress", i)
            task.succeed(None)

        await asyncio.to_thread(work)
        results = await asyncio.wait_for(asyncio.gather(*followers), 10)
        await asyncio.sleep(0)
        assert bus._hubs[loop] == {}
        assert len(asyncio.all_tasks()) == baseline
        return results

    for i, seqs in enumerate(asyncio.run(run())):
        assert seqs == list(range(i % 3 + 1, 33))
    task.release_worker_lock()


def test_a_subscriber_behind_the_window_catches_up_from_the_store(
    local_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bus_module, "BATCH", 4)
    task = local_store.create(name="long")
    task.start()
    for i in range(40):
        task.report("s", "progress", i)
    task.succeed(None)
    bus = StoreBus(local_store)

    async def run() -> tuple[list[int], list[int]]:
        async def follow(after: int, pause: float) -> list[int]:
            seqs = []
            async for event in bus.asubscribe(task.id, after):
                seqs.append(event.seq)
                await asyncio.sleep(pause)
            return seqs

        late = asyncio.create_task(follow(30, 0))
        await asyncio.sleep(0.05)  # the shared reader starts at 30
        slow = asyncio.create_task(follow(0, 0.001))
        return await late, await slow

    late, slow = asyncio.run(run())
    assert late == list(range(31, 43))
    assert slow == list(range(1, 43))


def test_a_stream_of_a_dead_worker_ends_after_the_recheck(local_store: Store) -> None:
    task = local_store.create(name="orphan")
    finish(start_worker(local_store.url, task.id, "--events", "1", "--die"))
    bus = StoreBus(local_store, recheck=local_store.reconcile, recheck_every=0.1)

    async def follow() -> list[ProgressEvent]:
        return [e async for e in bus.asubscribe(task.id)]

    events = asyncio.run(asyncio.wait_for(follow(), 10))
    assert [e.status for e in events] == ["started", "progress", "failed"]
    assert [e.status for e in bus.subscribe(task.id)][-1] == "failed"


@pytest.mark.parametrize("kind", ["memory", "store"])
def test_astream_sends_empty_batches_while_quiet(kind: str, local_store: Store) -> None:
    if kind == "memory":
        bus: MemoryBus | StoreBus = MemoryBus()
        job_id = "quiet"
        bus.publish(Progress(job_id, "s"))
    else:
        bus = StoreBus(local_store)
        job_id = local_store.create(name="quiet").id

    async def run() -> list[int]:
        sizes = []
        async with contextlib.aclosing(bus.astream(job_id, 0, heartbeat=0.05)) as stream:
            async for batch in stream:
                sizes.append(len(batch))
                if len(sizes) == 3:
                    break
        return sizes

    assert asyncio.run(asyncio.wait_for(run(), 5))[-2:] == [0, 0]


def test_a_first_subscriber_past_the_end_does_not_strand_the_others(local_store: Store) -> None:
    task = local_store.create(name="ahead")
    task.hold_worker_lock()
    task.start()
    task.report("s", "progress", 0)
    bus = StoreBus(local_store)

    async def run() -> tuple[list[int], list[int]]:
        async def follow(after: int) -> list[int]:
            return [e.seq async for e in bus.asubscribe(task.id, after)]

        ahead = asyncio.create_task(follow(5))  # a bogus Last-Event-ID: seq 5 does not exist
        await asyncio.sleep(0.05)
        behind = asyncio.create_task(follow(0))
        await asyncio.sleep(0.05)

        def work() -> None:
            for i in range(1, 8):
                task.report("s", "progress", i)
            task.succeed(None)

        await asyncio.to_thread(work)
        return await asyncio.wait_for(ahead, 5), await asyncio.wait_for(behind, 5)

    ahead, behind = asyncio.run(run())
    task.release_worker_lock()
    assert ahead == list(range(6, 11))
    assert behind == list(range(1, 11))
