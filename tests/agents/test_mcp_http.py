"""``outlast mcp --http``: the same tools over streamable HTTP, behind the bearer token, and
the refusals (no token, a foreign Host, a public address without a token)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.pool.conftest import Harness
from tests.waiting import until

pytestmark = pytest.mark.timeout(60)
TOKEN = "mcp-test-token-7f3a"


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


@pytest.fixture
def served(tmp_path: Path, free_tcp_port: int) -> Iterator[tuple[Harness, str]]:
    """``outlast mcp --http`` with a token on a free port; its URL."""
    harness = Harness(tmp_path)
    argv = [sys.executable, "-m", "outlast", "mcp", "--http", "--port", str(free_tcp_port)]
    with open(tmp_path / "mcp.err", "wb") as err:
        proc = subprocess.Popen(
            [*argv, "--token", TOKEN, "--allow-commands"],
            env=harness.env,
            stdin=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
        )
    try:
        until(lambda: _listening(free_tcp_port) or proc.poll() is not None, 30, "the server")
        assert proc.poll() is None, (tmp_path / "mcp.err").read_text()
        yield harness, f"http://127.0.0.1:{free_tcp_port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
        harness.close()
        assert TOKEN not in (tmp_path / "mcp.err").read_text(), "the token reached the log"


def test_tools_over_http_with_the_token(served: tuple[Harness, str]) -> None:
    harness, url = served

    async def main() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            started = await client.call_tool("run_command", {"argv": ["echo", "over http"]})
            assert not started.is_error, started.content
            job = started.structured_content
            assert job is not None
            waited = await client.call_tool("wait", {"job_id": job["id"], "timeout": 30})
            assert waited.structured_content is not None
            assert waited.structured_content["reason"] == "succeeded"
            log = await client.call_tool("logs", {"job_id": job["id"]})
            assert log.structured_content is not None
            assert log.structured_content["text"] == "over http\n"

    asyncio.run(main())
    assert [s.status for s in harness.store.list()] == ["succeeded"]


def test_refusals_over_http(served: tuple[Harness, str]) -> None:
    harness, url = served
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    with httpx2.Client(timeout=10) as http:
        bare = http.post(url, json=ping, headers=accept)
        assert bare.status_code == 401 and "Bearer" in bare.text
        wrong = http.post(url, json=ping, headers={**accept, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        rebinding = {**accept, "Authorization": f"Bearer {TOKEN}", "Host": "evil.example"}
        assert http.post(url, json=ping, headers=rebinding).status_code in {403, 421}
    assert harness.store.list() == []


def test_a_public_address_without_a_token_is_refused(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        started = time.monotonic()
        ran = harness.cli("mcp", "--http", "--host", "0.0.0.0", "--port", "0", timeout=30)
        assert ran.returncode == 2, ran
        assert ran.stderr.startswith("outlast: error: refusing to serve on 0.0.0.0"), ran.stderr
        assert time.monotonic() - started < 30
    finally:
        harness.close()
