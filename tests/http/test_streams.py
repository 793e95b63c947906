"""Server-Sent Events across real processes: a worker publishes, a separate server streams.

This is the seed's known limitation turned into a test: its in-memory bus could not carry
events from a worker process to the API process; ours goes through the store.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import psutil
import pytest

from outlast.store import Store, Task, open_store
from tests.http.harness import (
    Message,
    Server,
    aparse,
    check_sequence,
    finish,
    parse,
    start_worker,
)
from tests.waiting import until

T = TypeVar("T")


def _job(store: Store) -> str:
    return store.create(kind="function", name="streamed").id


def test_worker_and_server_are_separate_processes(store_url: str, tmp_path: Path) -> None:
    """Every event a worker process publishes reaches an SSE client of a server process, in
    order, ending with the terminal one — on every local store adapter."""
    store = open_store(store_url)
    job_id = _job(store)
    server = Server(store_url, tmp_path)
    try:
        with (
            server.client() as client,
            client.stream("GET", f"/jobs/{job_id}/events") as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["cache-control"] == "no-cache"
            worker = start_worker(store_url, job_id, "--events", "50")
            messages = list(parse(response.iter_lines()))  # ends when the server ends it
        finish(worker)
    finally:
        server.close()
        store.close()
    assert len({os.getpid(), server.pid, worker.pid}) == 3
    events = check_sequence(messages)
    assert len(events) == 52  # started, 50 reports, completed
    assert (events[0]["step"], events[0]["status"]) == ("job", "started")
    assert [e["message"] for e in events[1:-1]] == [{"i": i} for i in range(50)]
    assert (events[-1]["step"], events[-1]["status"]) == ("job", "completed")
    assert all(e["job_id"] == job_id for e in events)


def test_a_hundred_clients_of_one_job_all_get_every_event(
    server: Server, http_store: Store, http_store_url: str
) -> None:
    job_id = _job(http_store)
    clients = 100

    async def run() -> list[list[Message]]:
        limits = httpx.Limits(max_connections=clients + 10)
        async with server.aclient(limits=limits) as client:
            connected = asyncio.Barrier(clients + 1)

            async def follow() -> list[Message]:
                async with client.stream("GET", f"/jobs/{job_id}/events") as response:
                    assert response.status_code == 200
                    await connected.wait()
                    return [m async for m in aparse(response.aiter_lines())]

            tasks = [asyncio.create_task(follow()) for _ in range(clients)]
            await connected.wait()  # every client is connected before the worker starts
            worker = start_worker(http_store_url, job_id, "--events", "30", "--interval", "0.01")
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            await asyncio.to_thread(finish, worker)
            return results

    results = asyncio.run(run())
    expected = [e.to_dict() for e in http_store.events(job_id)]
    assert len(expected) == 32
    for messages in results:
        assert check_sequence(messages) == expected


def test_reconnect_with_last_event_id_gives_no_duplicate_and_no_gap(
    server: Server, http_store: Store, http_store_url: str
) -> None:
    job_id = _job(http_store)
    worker = start_worker(http_store_url, job_id, "--events", "60", "--interval", "0.01")
    seen: list[Message] = []
    with server.client() as client:
        # First connection: leave after ten events, mid-job.
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            for message in parse(response.iter_lines()):
                seen.append(message)
                if len(seen) == 10:
                    break
        # Reconnect as a browser does: the URL's ?after unchanged, Last-Event-ID newer.
        headers = {"Last-Event-ID": seen[-1].id or ""}
        with client.stream("GET", f"/jobs/{job_id}/events?after=3", headers=headers) as response:
            seen.extend(parse(response.iter_lines()))
    finish(worker)
    events = check_sequence(seen)
    assert len(events) == 62
    assert events[-1]["status"] == "completed"


def test_replay_of_a_finished_job_and_after(
    server: Server, http_store: Store, http_store_url: str
) -> None:
    job_id = _job(http_store)
    finish(start_worker(http_store_url, job_id, "--events", "5"))
    with server.client() as client:
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            assert len(check_sequence(list(parse(response.iter_lines())))) == 7
        with client.stream("GET", f"/jobs/{job_id}/events?after=4") as response:
            assert len(check_sequence(list(parse(response.iter_lines())), first=5)) == 3
        with client.stream("GET", f"/jobs/{job_id}/events?after=7") as response:
            assert list(parse(response.iter_lines())) == []


def test_stream_errors_are_json(server: Server, http_store: Store) -> None:
    job_id = _job(http_store)
    with server.client() as client:
        response = client.get("/jobs/no-such-job/events")
        assert response.status_code == 404
        assert response.json()["error"] == "not found"
        response = client.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "x1"})
        assert response.status_code == 400
        assert "Last-Event-ID" in response.json()["detail"]
        response = client.get(f"/jobs/{job_id}/events?after=-1")
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["query", "after"]
        response = client.get("/jobs/bad..id!/events")
        assert response.status_code == 400


def test_a_quiet_stream_sends_heartbeats(server: Server, http_store: Store) -> None:
    """The server under test pings every 0.5 s instead of 15 s (FastAPI's keep-alive)."""
    job_id = _job(http_store)
    started = time.monotonic()
    with server.client() as client, client.stream("GET", f"/jobs/{job_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith(":"):
                assert line == ": ping"
                break
    assert time.monotonic() - started < 5


def test_the_stream_of_a_job_whose_worker_died_ends_with_its_true_state(
    server: Server, http_store: Store, http_store_url: str
) -> None:
    job_id = _job(http_store)
    with server.client() as client, client.stream("GET", f"/jobs/{job_id}/events") as response:
        worker = start_worker(http_store_url, job_id, "--events", "3", "--die")
        messages = list(parse(response.iter_lines()))
    assert finish(worker) == 3
    events = check_sequence(messages)
    assert [e["status"] for e in events] == [
        "started",
        "progress",
        "progress",
        "progress",
        "failed",
    ]
    assert events[-1]["message"]["error"]["code"] == "abandoned"
    assert http_store.get(job_id).status == "failed"


def test_the_job_list_stream_reports_changes(server: Server, http_store: Store) -> None:
    with server.client() as client, client.stream("GET", "/events") as response:
        lines = response.iter_lines()
        messages = parse(lines)
        ready = next(messages)
        assert ready.event == "ready"
        job_id = _job(http_store)
        seen: list[dict[str, object]] = []
        for message in messages:
            if message.event == "job" and message.json["id"] == job_id:
                seen.append(message.json)
                if len(seen) == 1:
                    assert client.post(f"/jobs/{job_id}/cancel").status_code == 200
                else:
                    break
    assert [doc["status"] for doc in seen] == ["pending", "canceled"]


@pytest.mark.timeout(120)
def test_clients_that_go_away_leave_no_task_and_no_descriptor_behind(
    server: Server, http_store: Store
) -> None:
    """500 connect/disconnect cycles on a live job's stream (and on the list stream) leave the
    server's asyncio task count and open file descriptors where they started.

    Descriptors of the database files are left out of the count: the SQLite store keeps a
    connection per thread that read it, and the thread pools start and end threads on their
    own timers (an idle pool thread exits after 10 s), so those follow the pools, not the
    clients."""
    task = http_store.create(kind="function", name="leak-check")
    task.hold_worker_lock()  # this process plays the live worker
    task.start()
    for i in range(3):
        task.report("work", "progress", {"i": i})

    async def cycles(count: int, concurrency: int = 8) -> None:
        async with server.aclient() as client:
            gate = asyncio.Semaphore(concurrency)

            async def once(n: int) -> None:
                path = "/events" if n % 10 == 9 else f"/jobs/{task.id}/events"
                async with gate, client.stream("GET", path) as response:
                    async for message in aparse(response.aiter_lines()):
                        assert message.event in ("started", "ready")
                        break  # hang up mid-stream

            await asyncio.gather(*(once(n) for n in range(count)))

    def counts() -> tuple[int, int]:
        total, store_files = server.fds()
        return total - store_files, server.tasks()

    try:
        asyncio.run(cycles(60))  # warm up: thread pools and their connections
        # the baseline once the warm-up's streams are torn down (a loaded server may take
        # longer than a fixed pause): the same counts twice, 0.5 s apart
        before, deadline = counts(), time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.5)
            settled, before = before, counts()
            if settled == before:
                break
        asyncio.run(cycles(500))
        deadline = time.monotonic() + 10
        after = counts()
        while after != before and time.monotonic() < deadline:
            time.sleep(0.2)
            after = counts()
    finally:
        task.cancel()
        task.release_worker_lock()
    assert after == before, f"(descriptors, tasks) before {before}, after {after}"


def test_streams_past_a_clients_cap_get_a_503_with_retry_after(
    http_store_url: str, tmp_path: Path
) -> None:
    """Issue 12, item 4: any client could open streams until the server (and every process
    of its user) ran out of inotify instances."""
    server = Server(http_store_url, tmp_path, env={"OUTLAST_MAX_STREAMS_PER_CLIENT": "3"})
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            opened = []
            for _ in range(3):
                response = client.send(client.build_request("GET", "/events"), stream=True)
                assert response.status_code == 200
                opened.append(response)
            refused = client.get("/events")
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "5"
            assert "streams open" in refused.json()["detail"]
            opened.pop().close()

            def accepted() -> bool | None:
                response = client.send(client.build_request("GET", "/events"), stream=True)
                ok = response.status_code == 200
                response.close()
                return ok or None

            until(accepted, 10, "a slot to free when a client leaves")
            for response in opened:
                response.close()
    finally:
        server.close()


def _while_streams_are_open(server: Server, paths: list[str], measure: Callable[[], T]) -> T:
    """``measure()`` (run in a thread) while a stream of each of ``paths`` is open, each
    read up to its first message."""

    async def run() -> T:
        limits = httpx.Limits(max_connections=len(paths) + 5)
        async with server.aclient(limits=limits) as client:
            ready, done = asyncio.Barrier(len(paths) + 1), asyncio.Event()

            async def one(path: str) -> None:
                async with client.stream("GET", path) as response:
                    assert response.status_code == 200, await response.aread()
                    # held, not left to the collector: closing it hangs up the stream
                    messages = aparse(response.aiter_lines())
                    await anext(messages)
                    await ready.wait()
                    await done.wait()
                    await messages.aclose()

            tasks = [asyncio.create_task(one(path)) for path in paths]
            await asyncio.wait_for(ready.wait(), 60)
            try:
                return await asyncio.get_running_loop().run_in_executor(None, measure)
            finally:
                done.set()
                await asyncio.gather(*tasks)

    return asyncio.run(run())


def _while_list_streams_are_open(server: Server, count: int, measure: Callable[[], T]) -> T:
    return _while_streams_are_open(server, ["/events"] * count, measure)


def _running_jobs(store: Store, count: int) -> list[Task]:
    """``count`` running jobs, this process their worker, each with one event."""
    tasks = []
    for _ in range(count):
        task = store.create(kind="function", name="watched")
        task.hold_worker_lock()
        task.start()
        task.report("work", "progress", {"i": 0})
        tasks.append(task)
    return tasks


def _end(tasks: list[Task]) -> None:
    for task in tasks:
        task.cancel()
        task.release_worker_lock()


def _descriptors(server: Server) -> int:
    """The server's descriptors, but for its database files: the SQLite store keeps a
    connection per thread that read it, and those follow the thread pools, not the
    clients (as in the leak test above)."""
    total, store_files = server.fds()
    return total - store_files


def _pg_connections(server: Server) -> int:
    process = psutil.Process(server.pid)
    return sum(1 for c in process.net_connections("tcp") if c.raddr and c.raddr[1] == 5432)


def test_the_list_streams_of_a_server_share_one_listener(
    http_store_url: str, tmp_path: Path
) -> None:
    """Every ``GET /events`` of a server shares one listener of the store: a stream costs
    its socket, not a listener (an eventfd here) as well. With a listener each, a crowd
    that took the descriptors left new streams unable to arm, and each dashboard on
    PostgreSQL held a connection of its own."""
    server = Server(http_store_url, tmp_path)
    try:
        _while_list_streams_are_open(server, 40, lambda: None)  # warm: the thread pools
        one = _while_list_streams_are_open(server, 1, lambda: _descriptors(server))
        many = _while_list_streams_are_open(server, 41, lambda: _descriptors(server))
    finally:
        server.close()
    # 40 more sockets, and a little room
    assert many - one <= 45, f"{one} descriptors with one list stream, {many} with 41"


def test_the_list_streams_of_a_postgresql_server_hold_one_connection(tmp_path: Path) -> None:
    from tests.pg.support import drop_schema, make_url

    url = make_url()
    if url is None:
        pytest.skip("no PostgreSQL server")
    open_store(url).close()  # the schema made
    server = Server(url, tmp_path)

    def connections() -> int:
        return _pg_connections(server)

    try:
        _while_list_streams_are_open(server, 20, lambda: None)
        one = _while_list_streams_are_open(server, 1, connections)
        many = _while_list_streams_are_open(server, 21, connections)
    finally:
        server.close()
        drop_schema(url)
    assert many - one <= 2, f"{one} connections with one list stream, {many} with 21"


@pytest.mark.parametrize("what", ["list", "job"])
def test_a_stream_that_cannot_be_armed_is_a_503_not_a_200_cut_short(
    http_store_url: str, http_store: Store, tmp_path: Path, what: str
) -> None:
    """A server whose descriptors are all taken but the one its next connection gets: the
    stream (the job list's, or a job's, whose shard no stream listens to yet) cannot arm
    its listener, and the client is told 503 with ``Retry-After``, before any 200; once
    descriptors are free again, a stream opens as before."""
    tasks = _running_jobs(http_store, 1)
    tasks[0].release()  # pending again, with its events: reading it opens no lock file
    tasks[0].release_worker_lock()
    path = "/events" if what == "list" else f"/jobs/{tasks[0].id}/events"
    server = Server(http_store_url, tmp_path)
    try:
        soft, hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
        with server.client() as client:
            assert client.get("/healthz").status_code == 200  # its connection is open now
            taken = {int(fd) for fd in os.listdir(f"/proc/{server.pid}/fd")}
            free = [n for n in range(max(taken) + 3) if n not in taken]
            # one free slot (for the next connection's socket), and none after it
            resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (free[1], hard))
            try:
                with httpx.Client(base_url=server.url, timeout=10) as other:
                    refused = other.get(path)
            finally:
                resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
            assert refused.status_code == 503, refused.text
            assert refused.headers.get("retry-after") == "5", refused.text
            assert "file descriptors" in refused.json()["detail"]
            with client.stream("GET", path) as response:
                assert response.status_code == 200
                first = next(parse(response.iter_lines())).event
                assert first == ("ready" if what == "list" else "started")
        said = server.output()
        assert "Traceback" not in said, said
        assert "out of file descriptors" in said, said
    finally:
        server.close()
        tasks[0].cancel()


def test_the_streams_of_many_jobs_share_a_listener_per_shard(
    http_store_url: str, http_store: Store, tmp_path: Path
) -> None:
    """The streams of 40 jobs hold the 16 listeners of the store's shards at most, not 40:
    a stream costs its socket and a share (before, each job watched held a listener of its
    own: an eventfd here, a connection on PostgreSQL)."""
    tasks = _running_jobs(http_store, 41)
    paths = [f"/jobs/{t.id}/events" for t in tasks]
    server = Server(http_store_url, tmp_path)
    try:
        _while_streams_are_open(server, paths, lambda: None)  # warm: the thread pools
        one = _while_streams_are_open(server, paths[:1], lambda: _descriptors(server))
        many = _while_streams_are_open(server, paths, lambda: _descriptors(server))
    finally:
        server.close()
        _end(tasks)
    # 40 more sockets and 15 more shards at most, and a little room
    assert many - one <= 40 + 15 + 5, f"{one} descriptors with one job's stream, {many} with 41"


def test_the_streams_of_many_jobs_on_postgresql_hold_a_connection_per_shard(
    tmp_path: Path,
) -> None:
    from tests.pg.support import drop_schema, make_url

    url = make_url()
    if url is None:
        pytest.skip("no PostgreSQL server")
    store = open_store(url)
    tasks = _running_jobs(store, 60)
    paths = [f"/jobs/{t.id}/events" for t in tasks]
    server = Server(url, tmp_path)
    try:
        _while_streams_are_open(server, paths, lambda: None)
        one = _while_streams_are_open(server, paths[:1], lambda: _pg_connections(server))
        many = _while_streams_are_open(server, paths, lambda: _pg_connections(server))
    finally:
        server.close()
        _end(tasks)
        store.close()
        drop_schema(url)
    assert many - one <= 15 + 2, f"{one} connections with one job's stream, {many} with 60"
