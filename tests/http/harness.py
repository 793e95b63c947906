"""Real processes for the HTTP tests: a uvicorn server, workers, and an SSE parser.

The server runs ``create_app`` in its own process (``tests.http.serve_app``) on a listening
socket the test made and handed down, so there is no port race; workers are separate Python
processes that open the store by URL, as a real worker on the same machine would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


class Server:
    """``create_app(open_store(url), token)`` served by uvicorn in a child process."""

    def __init__(
        self,
        store_url: str,
        tmp: Path,
        token: str | None = None,
        ping: float | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.store_url, self.token = store_url, token
        self.probe_path = tmp / f"probe-{id(self)}"
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = _env(OUTLAST_STORE=store_url, OUTLAST_TEST_PROBE=str(self.probe_path), **(env or {}))
        if token:
            env["OUTLAST_TEST_TOKEN"] = token
        if ping:
            env["OUTLAST_TEST_PING"] = str(ping)
        self.log = open(tmp / f"server-{self.port}.log", "w+b")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.http.serve_app", str(sock.fileno())],
            pass_fds=[sock.fileno()],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        sock.close()
        self.pid = self.proc.pid
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.output()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not start: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(), timeout=30, **kwargs)

    def aclient(self, **kwargs: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers(), timeout=30, **kwargs)

    # ----------------------------------------------------------- what the leak test counts
    def fds(self) -> tuple[int, int]:
        """``(open descriptors, of which the store's database files)`` of the server."""
        process = psutil.Process(self.pid)
        database = self.store_url.partition("://")[2]
        names = {database, f"{database}-wal", f"{database}-shm"}
        store = sum(1 for f in process.open_files() if f.path in names)
        return process.num_fds(), store

    def tasks(self) -> int:
        """The server's asyncio task count (it writes it on SIGUSR1)."""
        self.probe_path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                return int(self.probe_path.read_text())
            except (FileNotFoundError, ValueError):
                time.sleep(0.01)
        raise RuntimeError("the server did not report its tasks")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_worker(store_url: str, job_id: str, *args: str) -> subprocess.Popen[bytes]:
    """Run ``tests.http.worker`` on the job in a new process."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.http.worker", store_url, job_id, *args],
        cwd=ROOT,
        env=_env(),
        stderr=subprocess.PIPE,
    )


def finish(worker: subprocess.Popen[bytes], timeout: float = 60) -> int:
    try:
        _, err = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise
    assert worker.returncode in (0, 3), err.decode(errors="replace")
    return worker.returncode


# ------------------------------------------------------------------------------- SSE
@dataclass
class Message:
    """One Server-Sent Event as a client sees it."""

    event: str = "message"
    data: list[str] = field(default_factory=list)
    id: str | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def json(self) -> Any:
        import json

        return json.loads("\n".join(self.data))


class Parser:
    """The text/event-stream framing (WHATWG HTML, "Server-sent events"), line by line."""

    def __init__(self) -> None:
        self._current = Message()
        self._dirty = False
        self.comments: list[str] = []

    def feed(self, line: str) -> Message | None:
        if line == "":
            done, self._current, self._dirty = self._current, Message(), False
            return done if done.data or done.id is not None or done.event != "message" else None
        if line.startswith(":"):
            self.comments.append(line[1:].strip())
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._current.data.append(value)
        elif name == "event":
            self._current.event = value
        elif name == "id":
            self._current.id = value
        self._dirty = True
        return None


def parse(lines: Iterable[str]) -> Iterator[Message]:
    parser = Parser()
    for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message


async def aparse(lines: AsyncIterator[str]) -> AsyncIterator[Message]:
    parser = Parser()
    async for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message


def check_sequence(messages: list[Message], first: int = 1) -> list[dict[str, Any]]:
    """Assert the SSE framing of progress events and that seqs run on with no gap."""
    events = [m.json for m in messages]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(first, first + len(seqs))), seqs
    for message, event in zip(messages, events, strict=True):
        assert message.id == str(event["seq"])
        assert message.event == event["status"]
    return events
