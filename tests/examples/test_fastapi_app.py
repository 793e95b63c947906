"""examples/fastapi_app: a real uvicorn server running the example app and a real async pool;
a job submitted from a route is followed over the mounted API's SSE stream to its end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    os.chmod(tmp_path, 0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTLAST_", "WORKER_"))}
    env.update(OUTLAST_STORE=f"sqlite://{tmp_path}/s.db", PYTHONPATH=str(ROOT))
    return env


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    log = tmp_path / "uvicorn.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.fastapi_app.app:app", "--port", "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.search(r"http://127\.0\.0\.1:(\d+)", log.read_text())
            if found:
                yield f"http://127.0.0.1:{found.group(1)}"
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        else:
            raise AssertionError(f"uvicorn did not start:\n{log.read_text()}")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outlast",
            "worker",
            "--async",
            "--import",
            "examples.fastapi_app.jobs",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    yield proc
    proc.terminate()
    proc.wait(30)


def test_a_route_submits_and_the_mounted_api_streams_its_progress(
    server: str, worker: subprocess.Popen[bytes]
) -> None:
    with httpx.Client(base_url=server, timeout=30) as client:
        made = client.post("/fingerprints", json={"text": "hello", "rounds": 4})
        assert made.status_code == 202, made.text
        links = made.json()
        events = []
        with client.stream("GET", links["events"]) as stream:
            data = None
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    data = json.loads(line[5:])
                elif not line and data is not None:
                    events.append(data)
                    if data.get("step") == "job" and data.get("status") in ("completed", "failed"):
                        break
                    data = None
        hashes = [e for e in events if e.get("step") == "hash"]
        assert [e["message"]["round"] for e in hashes] == [1, 2, 3, 4]
        assert events[-1]["step"] == "job" and events[-1]["status"] == "completed"
        done = client.get(f"/fingerprints/{links['id']}", params={"wait": 10}).json()
        assert done["status"] == "succeeded" and done["result"]["rounds"] == 4
        assert len(done["result"]["sha256"]) == 64
        doc = client.get(links["job"]).json()
        assert doc["labels"] == {"via": "fastapi"}
        log = client.get(f"/outlast/jobs/{links['id']}/log").text
        assert log == "fingerprinted 5 characters in 4 rounds\n"
        assert client.post("/fingerprints", json={"text": ""}).status_code == 422
        assert client.get("/fingerprints/nosuchjob").status_code == 404
        assert client.get("/fingerprints/bad id!").status_code == 400
        assert client.get("/outlast/").status_code == 200  # the dashboard rides along
