"""How fast progress travels: ``report()`` in a worker process → SSE client of a server process.

Three processes, as in production: a worker (``report()`` with the wall-clock time in the
message), the HTTP server (``create_app`` under uvicorn) and this one, whose asyncio clients
stream ``GET /jobs/{id}/events`` and note when each event arrives. Figures:

- latency p50/p95 with 1 and with 100 clients (one job, events every few milliseconds);
- events/s into one job: ``report()`` calls a second from one worker, and how fast they reach
  one SSE client.

Each figure is the median over ``--runs`` runs. SQLite in a temporary folder by default;
``--store URL`` runs the same on another store (e.g. ``postgresql://…``)::

    .venv/bin/python bench/events_bench.py [--runs 5] [--events 200] [--store URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from _common import percentile

HERE = Path(__file__).resolve()


# ------------------------------------------------------------------- the other processes
def serve(fd: int, url: str) -> None:
    """The server process: ``create_app`` over the store, on an inherited socket."""
    import uvicorn

    from outlast.http import create_app
    from outlast.store import open_store

    app = create_app(open_store(url))
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    asyncio.run(uvicorn.Server(config).serve(sockets=[socket.socket(fileno=fd)]))


def work(url: str, job_id: str, count: int, interval: float) -> None:
    """The worker process: start the job, report ``count`` events, succeed; prints the
    rate of ``report()`` calls."""
    from outlast.store import open_store

    store = open_store(url)
    task = store.open(job_id)
    task.hold_worker_lock()
    task.start()
    started = time.perf_counter()
    for i in range(count):
        task.report("bench", "progress", {"i": i, "t": time.time()})
        if interval:
            time.sleep(interval)
    elapsed = time.perf_counter() - started
    task.succeed(None)
    print(json.dumps({"reports_per_s": count / elapsed}), flush=True)


def _python(*args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parents[1] / "src"))
    return subprocess.Popen([sys.executable, str(HERE), *args], env=env, **kwargs)


class Server:
    def __init__(self, url: str) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.proc = _python("--serve", str(sock.fileno()), url, pass_fds=[sock.fileno()])
        sock.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the server did not start") from None
            time.sleep(0.05)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ------------------------------------------------------------------- measuring
async def _follow(base: str, job_id: str, ready: asyncio.Barrier) -> list[Any]:
    """Stream the job's events; ``(seq, sent at, received at)`` for each progress report.

    A bare HTTP/1.1 client on asyncio streams: a hundred httpx streams in one Python process
    would measure httpx more than the server (each real client is its own browser)."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower(), head
    await ready.wait()
    seen: list[Any] = []
    buffer = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        if size == 0:
            break
        buffer += await reader.readexactly(size)
        await reader.readexactly(2)
        now = time.time()
        *messages, buffer = buffer.split(b"\n\n")
        for message in messages:
            for line in message.split(b"\n"):
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if isinstance(event["message"], dict) and "t" in event["message"]:
                        seen.append((event["seq"], event["message"]["t"], now))
    writer.close()
    return seen


async def _one_run(server: Server, store_url: str, clients: int, count: int, gap: float) -> Any:
    from outlast.store import open_store

    with open_store(store_url) as store:
        job_id = store.create(kind="function", name="bench").id
    ready = asyncio.Barrier(clients + 1)
    followers = [asyncio.create_task(_follow(server.url, job_id, ready)) for _ in range(clients)]
    await ready.wait()
    await asyncio.sleep(0.2)  # every stream is subscribed before the first report
    started = time.time()
    worker = _python("--work", store_url, job_id, str(count), str(gap), stdout=subprocess.PIPE)
    results = await asyncio.gather(*followers)
    received_all = time.time()
    out, _ = await asyncio.to_thread(worker.communicate)
    for seen in results:
        assert [s[0] for s in seen] == list(range(2, count + 2)), "a client missed events"
    latencies = [(got - sent) * 1000 for seen in results for _, sent, got in seen]
    first_sent = min(s[1] for s in results[0])
    return {
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "reports_per_s": json.loads(out)["reports_per_s"],
        "delivered_per_s": count / (received_all - max(first_sent, started)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", help="store URL (default: SQLite in a temporary folder)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=200, help="events per latency run")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between reports")
    parser.add_argument("--burst", type=int, default=2000, help="events of the rate runs")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="outlast-bench-")
    os.chmod(tmp.name, 0o700)
    store_url = args.store or f"sqlite://{tmp.name}/bench.db"
    server = Server(store_url)
    try:
        print(f"store: {store_url.split('@')[-1]}   runs: {args.runs} (medians shown)")
        print(f"cpus: {os.cpu_count()}   load average: {os.getloadavg()[0]:.2f}\n")
        for clients in (1, 100):
            runs = [
                asyncio.run(_one_run(server, store_url, clients, args.events, args.gap))
                for _ in range(args.runs)
            ]
            p50 = statistics.median(r["p50"] for r in runs)
            p95 = statistics.median(r["p95"] for r in runs)
            print(
                f"latency report() -> SSE client, {clients:>3} client(s), {args.events} events "
                f"{args.gap * 1000:.0f} ms apart:  p50 {p50:6.2f} ms   p95 {p95:6.2f} ms"
            )
        rates = [
            asyncio.run(_one_run(server, store_url, 1, args.burst, 0.0)) for _ in range(args.runs)
        ]
        print(
            f"events/s into one job ({args.burst} reports, one worker, no pause):  "
            f"{statistics.median(r['reports_per_s'] for r in rates):8.0f} report() calls/s,  "
            f"{statistics.median(r['delivered_per_s'] for r in rates):8.0f} delivered/s to a client"
        )
    finally:
        server.close()
        tmp.cleanup()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--work":
        work(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        main()
