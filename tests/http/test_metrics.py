"""``GET /metrics`` (parsed by ``prometheus_client``'s own parser) and ``outlast stats``
against a known set of jobs, on every store."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from outlast import cron
from outlast.model import Kind, utcnow
from outlast.store import Store, open_store
from tests.http.conftest import TOKEN
from tests.http.harness import ROOT, Server
from tests.store.adapters import ADAPTERS, Adapter


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outlast", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _known_jobs(store: Store) -> None:
    """3 pending in "default" (one delayed an hour), 1 pending in "mail", 1 running,
    2 succeeded, 1 failed; and two schedules, one paused."""
    for _ in range(2):
        store.create(kind=Kind.FUNCTION, name="a")
    store.create(kind=Kind.FUNCTION, name="a", run_after=utcnow() + timedelta(hours=1))
    store.create(kind=Kind.FUNCTION, name="m", queue="mail")
    running = store.create(kind=Kind.FUNCTION, name="r")
    running.start()
    for ok in (True, True, False):
        task = store.create(kind=Kind.COMMAND, command=["true"])
        task.start()
        if ok:
            task.succeed({"exit_code": 0})
        else:
            task.fail("exit 1", retry=False)
    template = cron.template(Kind.FUNCTION, "a")
    for name in ("s1", "s2"):
        store.add_schedule(cron.new_schedule(name, template, every=3600.0))
    store.pause_schedule("s2")


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_metrics_and_stats_count_what_the_store_holds(adapter: Adapter, tmp_path: Path) -> None:
    url = adapter.make_url(tmp_path / "store")
    if url is None:
        pytest.skip(f"no {adapter.name} store here")
    store = open_store(url)
    _known_jobs(store)
    tmp_path.chmod(0o700)
    server = Server(url, tmp_path, token=TOKEN)
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        response = httpx.get(f"{server.url}/metrics", headers=server.headers())
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(response.text)}
        jobs = {
            (s.labels["queue"], s.labels["status"], s.labels["kind"]): s.value
            for s in families["outlast_jobs"].samples
        }
        assert jobs == {
            ("default", "pending", "function"): 3,
            ("mail", "pending", "function"): 1,
            ("default", "running", "function"): 1,
            ("default", "succeeded", "command"): 2,
            ("default", "failed", "command"): 1,
        }
        finished = {
            (s.labels["kind"], s.labels["status"]): s.value
            for s in families["outlast_recent_jobs_finished"].samples
        }
        assert finished == {("command", "succeeded"): 2, ("command", "failed"): 1}
        waits = {s.name: s for s in families["outlast_recent_wait_seconds"].samples}
        assert waits["outlast_recent_wait_seconds_count"].value == 3
        buckets = [
            s for s in families["outlast_recent_run_seconds"].samples if s.name.endswith("bucket")
        ]
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 3
        oldest = {
            s.labels["queue"]: s.value for s in families["outlast_queue_oldest_due_seconds"].samples
        }
        assert oldest["default"] > 0 and oldest["mail"] > 0
        schedules = {s.labels["state"]: s.value for s in families["outlast_schedules"].samples}
        assert schedules == {"total": 2, "paused": 1, "due": 0}
        [busy] = families["outlast_workers_busy"].samples
        assert busy.value == 1
        me = store.register_worker("pool", queues=["default"], concurrency=3)
        listed = httpx.get(f"{server.url}/workers", headers=server.headers()).json()["workers"]
        assert [(w["name"], w["kind"], w["concurrency"]) for w in listed] == [
            (me["name"], "pool", 3)
        ]
        again = httpx.get(f"{server.url}/metrics", headers=server.headers()).text
        assert 'outlast_workers{kind="pool"} 1.0' in again
        store.unregister_worker()
        assert httpx.get(f"{server.url}/workers", headers=server.headers()).json() == {
            "workers": []
        }
        page = httpx.get(f"{server.url}/queues", headers=server.headers()).json()
        by_name = {q["name"]: q for q in page["queues"]}
        assert (by_name["default"]["pending"], by_name["default"]["running"]) == (2 + 1, 1)
        assert by_name["mail"]["pending"] == 1 and by_name["mail"]["oldest_due_seconds"] > 0
    finally:
        server.close()
        store.close()
    shown = _cli("stats", "--store", url, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["jobs"] == {
        "pending": 4,
        "running": 1,
        "paused": 0,
        "succeeded": 2,
        "failed": 1,
        "canceled": 0,
    }
    assert doc["queues"]["mail"]["pending"] == 1
    assert doc["recent"]["finished"] == {"failed": 1, "succeeded": 2}
    assert doc["schedules"] == {"total": 2, "paused": 1, "due": 0}
    queues = _cli("queues", "--store", url, "--json")
    assert {q["name"]: q["pending"] for q in json.loads(queues.stdout)} == {"default": 3, "mail": 1}
    table = _cli("queues", "--store", url).stdout.splitlines()
    assert table[0].split()[:4] == ["QUEUE", "PENDING", "RUNNING", "PAUSED"]
    assert table[1].split()[:4] == ["default", "3", "1", "0"]
    text = _cli("stats", "--store", url).stdout
    assert text.startswith("jobs:      4 pending  1 running")
    assert "last 1h: 3 finished (1 failed, 2 succeeded)" in text
    bad = _cli("stats", "--store", url, "--window", "soon")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
