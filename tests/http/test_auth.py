"""Bearer-token auth on every ``/jobs`` route and ``/events``: no, wrong, malformed and right
tokens, against a real server process; and ``serve`` refusing to expose itself without one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from outlast.errors import InvalidInput
from outlast.http import serve
from outlast.http.server import check_exposure, is_loopback
from outlast.store import Store
from tests.http.conftest import TOKEN
from tests.http.harness import Server

STREAMS = {"/events", "/jobs/{id}/events"}
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/jobs", {}),
    ("POST", "/jobs", {"json": {"name": "tests.add", "args": [1, 2]}}),
    ("GET", "/jobs/{id}", {}),
    ("POST", "/jobs/{id}/cancel", {}),
    ("POST", "/jobs/{id}/resume", {"json": {"answer": 1}}),
    ("DELETE", "/jobs/{id}", {}),
    ("GET", "/jobs/{id}/log", {}),
    ("GET", "/jobs/{id}/events", {}),
    ("GET", "/events", {}),
    ("GET", "/stats/timeline", {}),
    ("GET", "/jobs?name=x&id_prefix=y", {}),
]
WRONG: dict[str, dict[str, str | bytes]] = {
    "none": {},
    "wrong": {"Authorization": "Bearer not-the-token"},
    "prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "longer": {"Authorization": f"Bearer {TOKEN}x"},
    "scheme only": {"Authorization": "Bearer"},
    "blank": {"Authorization": "Bearer \t x"},
    "basic": {"Authorization": f"Basic {TOKEN}"},
    "no scheme": {"Authorization": TOKEN},
    "non-ascii": {"Authorization": "Bearer caf\u00e9".encode()},
}


def _call(
    client: httpx.Client, method: str, path: str, headers: dict[str, Any], **kwargs: Any
) -> int:
    with client.stream(method, path, headers=headers, **kwargs) as response:
        if response.status_code == 401:
            body = httpx.Response(401, content=response.read()).json()
            assert body["error"] == "unauthorized" and body["detail"], body
            assert response.headers["www-authenticate"].startswith("Bearer")
        return response.status_code  # a stream is left at once


@pytest.fixture
def job_id(http_store: Store) -> str:
    task = http_store.create(name="guarded")
    task.cancel()  # finished: its stream ends, and delete may succeed
    return task.id


@pytest.mark.parametrize("route", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_refuses_a_missing_wrong_or_malformed_token(
    secured: Server, job_id: str, route: tuple[str, str, dict[str, Any]]
) -> None:
    method, path, kwargs = route
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        for case, headers in WRONG.items():
            status = _call(client, method, path.format(id=job_id), headers, **kwargs)
            assert status == 401, case


@pytest.mark.parametrize("route", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_takes_the_right_token(
    secured: Server, job_id: str, route: tuple[str, str, dict[str, Any]]
) -> None:
    method, path, kwargs = route
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        status = _call(client, method, path.format(id=job_id), headers, **kwargs)
        # past the guard: 404 is the log of a job with none, 409 resuming a finished job
        assert status in (200, 201, 204, 404, 409), status
        if path in STREAMS:  # EventSource cannot set headers: the streams take ?token=
            query = {"token": TOKEN}
            assert _call(client, method, path.format(id=job_id), {}, params=query) == 200
            wrong = {"token": "nope"}
            assert _call(client, method, path.format(id=job_id), {}, params=wrong) == 401
        else:
            assert _call(client, method, path.format(id=job_id), {}, params={"token": TOKEN}) == 401


def test_only_health_and_signing_in_stay_open(secured: Server) -> None:
    """With a token, the dashboard's files and the API's description want it too; ``/``
    answers a browser with the sign-in page (a form, no script, no file of the dashboard's)."""
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        for path in ("/static/app.js", "/static/style.css", "/openapi.json", "/docs"):
            assert client.get(path).status_code == 401, path
        page = client.get("/")
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
        assert '<form method="post" action="/session">' in page.text
        assert "<script" not in page.text and "/static/" not in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert TOKEN not in page.text
        schema = client.get("/openapi.json", headers=secured.headers()).json()
        assert schema["paths"]["/jobs"]["get"]["security"] == [{"HTTPBearer": []}]
        assert client.get("/static/app.js", headers=secured.headers()).status_code == 200


def test_the_sign_in_form_and_a_link_trade_the_token_for_the_cookie(secured: Server) -> None:
    same_origin = {"Origin": secured.url, "Sec-Fetch-Site": "same-origin"}
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        wrong = client.post("/session", data={"token": "nope"}, headers=same_origin)
        assert wrong.status_code == 401 and "Wrong token" in wrong.text
        assert "outlast_session" not in wrong.headers.get("set-cookie", "")
        foreign = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        assert client.post("/session", data={"token": TOKEN}, headers=foreign).status_code == 403
        right = client.post("/session", data={"token": TOKEN}, headers=same_origin)
        assert right.status_code == 303 and right.headers["location"] == "/"
        cookie = right.headers["set-cookie"]
        assert "outlast_session=" in cookie and "HttpOnly" in cookie
        assert "samesite=strict" in cookie.lower()
        assert client.get("/static/app.js").status_code == 200  # the cookie opens the rest
        assert client.get("/").status_code == 200
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        link = client.get("/", params={"token": TOKEN})
        assert link.status_code == 303 and link.headers["location"] == "/"  # token dropped
        assert client.get("/jobs").status_code == 200
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        assert "Wrong token" in client.get("/", params={"token": "x"}).text
        assert client.get("/jobs").status_code == 401


def test_a_proxy_that_rewrites_host_does_not_refuse_the_dashboard(secured: Server) -> None:
    """Behind nginx's default (``Host`` rewritten to the upstream's), the browser's own
    ``Sec-Fetch-Site: same-origin`` is believed; a cross-site write is still refused."""
    job = {"name": "tests.add", "args": [1, 2]}
    with httpx.Client(base_url=secured.url, timeout=10, headers=secured.headers()) as client:
        proxied = {"Origin": "https://ops.example.com", "Sec-Fetch-Site": "same-origin"}
        assert client.post("/jobs", json=job, headers=proxied).status_code == 201
        foreign = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        assert client.post("/jobs", json=job, headers=foreign).status_code == 403
        no_fetch_metadata = {"Origin": "https://evil.example"}
        assert client.post("/jobs", json=job, headers=no_fetch_metadata).status_code == 403


def test_every_route_of_the_schema_wants_the_token(secured: Server) -> None:
    """Whatever routes the app has (this list is not kept by hand): each one but the
    public ones answers 401 without the token."""
    public = {"/healthz", "/session"}
    with httpx.Client(base_url=secured.url, timeout=10) as client:
        schema = client.get("/openapi.json", headers=secured.headers()).json()
        asked = 0
        for path, methods in schema["paths"].items():
            if path in public:
                continue
            for method in methods:
                url = path.replace("{job_id}", "x1").replace("{name}", "x1")
                url = url.replace("{action}", "retry")
                status = _call(client, method.upper(), url, {}, json={})
                assert status == 401, (method, path, status)
                asked += 1
        assert asked >= 20 and "/stats/timeline" in schema["paths"]
        # the dashboard's files want it too: the chart library as well
        for path in ("/static/chart.js", "/static/vendor/uplot/uPlot.iife.min.js"):
            assert client.get(path).status_code == 401, path


def test_serve_refuses_a_public_address_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTLAST_TOKEN", raising=False)
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.invalid"):
        with pytest.raises(InvalidInput, match="without a token"):
            serve("sqlite:///nonexistent/never-opened.db", host, 8765, None)
    check_exposure("0.0.0.0", "a-token")  # with a token it may
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
        check_exposure(host, None)


def test_serve_runs_the_app_until_terminated(http_dir: Path, http_store_url: str) -> None:
    """``serve`` as the CLI will call it: loopback, no token; SIGTERM ends it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import sys; from outlast.http import serve; "
        "serve(sys.argv[1], '127.0.0.1', int(sys.argv[2]), None)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OUTLAST_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, http_store_url, str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.05)
        assert response.status_code == 200 and "jobs" in response.json()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode in (0, -signal.SIGTERM), err.decode()
