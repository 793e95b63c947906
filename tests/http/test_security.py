"""The doors: a cross-site request changes nothing, a foreign ``Host`` reads nothing
(DNS rebinding), the dashboard's session is a cookie (never a token in a URL), bodies are
JSON, and the token never reaches the access log."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from outlast.http.guard import SESSION_COOKIE, session_value
from outlast.store import Store, open_store
from tests.http.conftest import TOKEN
from tests.http.harness import ROOT, Server

LOOPBACK = "localhost,127.0.0.1,::1"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    tmp_path.chmod(0o700)
    return f"sqlite://{tmp_path}/s.db"


@pytest.fixture
def local(store_url: str, tmp_path: Path) -> Iterator[tuple[Server, Store]]:
    """A server for this machine only: no token, the loopback names as its hosts."""
    store = open_store(store_url)
    server = Server(store_url, tmp_path, env={"OUTLAST_TEST_HOSTS": LOOPBACK})
    try:
        yield server, store
    finally:
        server.close()
        store.close()


@pytest.fixture
def secured_logged(store_url: str, tmp_path: Path) -> Iterator[tuple[Server, Store]]:
    store = open_store(store_url)
    server = Server(store_url, tmp_path, token=TOKEN, env={"OUTLAST_TEST_ACCESS_LOG": "1"})
    try:
        yield server, store
    finally:
        server.close()
        store.close()


def test_a_cross_site_post_changes_nothing(local: tuple[Server, Store]) -> None:
    server, store = local
    job = store.create(kind="function", name="victim")
    url = f"{server.url}/jobs/{job.id}/cancel"
    # what a page on another site sends: a "simple" request, no preflight
    for headers in (
        {"Origin": "https://evil.example", "Content-Type": "text/plain"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
        {"Origin": "null"},
    ):
        refused = httpx.post(
            url, headers=headers, content=b"x" if "Content-Type" in headers else b""
        )
        assert refused.status_code == 403, (headers, refused.text)
        assert refused.json()["error"] == "cross-site request"
    assert store.get(job.id).status == "pending"
    # a body that is not JSON is refused even from this site
    plain = httpx.post(
        f"{server.url}/jobs", headers={"Content-Type": "text/plain"}, content=b'{"name": "x"}'
    )
    assert plain.status_code == 415 and "application/json" in plain.json()["detail"]
    # the dashboard itself (same origin) and clients that are not browsers go through
    same = httpx.post(url, headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 200 and store.get(job.id).status == "canceled"
    assert httpx.delete(f"{server.url}/jobs/{job.id}").status_code == 204


def test_a_foreign_host_header_is_refused(local: tuple[Server, Store]) -> None:
    server, store = local
    store.create(kind="function", name="secret-ish")
    rebinding = httpx.get(f"{server.url}/jobs", headers={"Host": f"evil.example:{server.port}"})
    assert rebinding.status_code == 403
    assert "DNS rebinding" in rebinding.json()["detail"]
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "localhost"):
        assert httpx.get(f"{server.url}/jobs", headers={"Host": host}).status_code == 200


def test_the_dashboard_signs_in_with_a_cookie(secured_logged: tuple[Server, Store]) -> None:
    server, _ = secured_logged
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/jobs").status_code == 401
        wrong = client.post("/session", json={"token": "nope"})
        assert wrong.status_code == 401 and wrong.json()["detail"] == "wrong token"
        signed = client.post("/session", json={"token": TOKEN})
        assert signed.status_code == 204
        cookie = signed.headers["set-cookie"]
        assert cookie.startswith(f"{SESSION_COOKIE}=") and TOKEN not in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=43200" in cookie
        assert client.get("/jobs").status_code == 200  # the cookie goes along
        with client.stream("GET", "/events") as stream:  # and with the streams
            assert stream.status_code == 200
        assert client.delete("/session").status_code == 204
        assert client.get("/jobs").status_code == 401
    forged = {SESSION_COOKIE: session_value("another token")}
    old = {SESSION_COOKIE: session_value(TOKEN, issued=1)}  # long expired
    for jar in (forged, old, {SESSION_COOKIE: "garbage"}):
        answer = httpx.get(f"{server.url}/jobs", cookies=jar)
        assert answer.status_code == 401, jar


def test_the_token_never_reaches_the_access_log(secured_logged: tuple[Server, Store]) -> None:
    server, _ = secured_logged
    with httpx.Client(base_url=server.url, timeout=10) as client:
        with client.stream("GET", f"/events?token={TOKEN}") as stream:
            assert stream.status_code == 200
        assert client.get(f"/events?token={TOKEN}x").status_code == 401  # refused ones too
        assert client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    log = server.output()
    assert "GET /events?token=*** HTTP/1.1" in log
    assert TOKEN not in log


def test_serve_on_a_busy_port_says_so(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "outlast",
                "serve",
                "--port",
                str(port),
                "--store",
                f"sqlite://{tmp_path}/s.db",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    finally:
        busy.close()
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"outlast: error: cannot serve on 127.0.0.1:{port}: it is in use"
    )
