"""The server process of the HTTP tests: ``create_app`` under uvicorn, on an inherited socket.

Run as ``python -m tests.http.serve_app FD``. The store URL and token come from
``OUTLAST_STORE`` and ``OUTLAST_TEST_TOKEN``; ``OUTLAST_TEST_PING`` shortens the SSE keep-alive
interval, ``OUTLAST_TEST_HOSTS`` (comma-separated) is the ``Host`` allowlist, and
``OUTLAST_TEST_ACCESS_LOG`` turns uvicorn's access log on. On SIGUSR1 the process writes
how many asyncio tasks it has to ``OUTLAST_TEST_PROBE`` (the harness counts its file
descriptors itself, with psutil): the leak test needs that number and the app must not
expose it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import uvicorn

import tests.http.jobs  # noqa: F401 - registers the job names POST /jobs accepts
from outlast.http import create_app
from outlast.http.server import prepare_loop
from outlast.store import open_store


def _probe(path: str) -> None:
    count = len(asyncio.all_tasks())
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{count}\n")
    os.replace(tmp, path)


async def main(fd: int) -> None:
    store = open_store(os.environ["OUTLAST_STORE"])
    hosts = os.environ.get("OUTLAST_TEST_HOSTS")
    app = create_app(
        store,
        token=os.environ.get("OUTLAST_TEST_TOKEN") or None,
        heartbeat=float(os.environ.get("OUTLAST_TEST_PING") or 15),
        hosts=hosts.split(",") if hosts else None,
    )
    await prepare_loop()  # as `outlast serve` does
    probe = os.environ.get("OUTLAST_TEST_PROBE")
    if probe:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _probe, probe)
    level = "info" if os.environ.get("OUTLAST_TEST_ACCESS_LOG") else "warning"
    config = uvicorn.Config(app, log_level=level, timeout_graceful_shutdown=1)
    # socket(fileno=…) reads the family back (uvicorn's own fd= assumes AF_UNIX, which would
    # leave Nagle's algorithm on for TCP and add 40 ms to every keep-alive request).
    await uvicorn.Server(config).serve(sockets=[socket.socket(fileno=fd)])
    store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
