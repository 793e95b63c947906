"""Flow control over HTTP: priority, unique keys, retry and bulk actions, against a real
server process."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from outlast.store import Store
from tests.http.harness import Server
from tests.http.test_api import _error

#: A call of the test app's job that fits its signature.
ADD: dict[str, object] = {"name": "tests.add", "args": [1, 2]}


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    with server.client() as c:
        yield c


def _finished(store: Store, job_id: str, ok: bool = False) -> None:
    task = store.open(job_id)
    task.start()
    if ok:
        task.succeed(1)
    else:
        task.fail(RuntimeError("boom"), retry=False)


def test_priority_and_unique_keys(client: httpx.Client, http_store: Store) -> None:
    doc = client.post("/jobs", json={**ADD, "priority": 9}).json()
    assert doc["priority"] == 9 and http_store.get(doc["id"]).priority == 9
    assert "priority" in str(_error(client.post("/jobs", json={**ADD, "priority": 1.5}), 422))
    _error(client.post("/jobs", json={**ADD, "priority": 10**9}), 422)
    first = client.post("/jobs", json={**ADD, "unique_key": "http-u1"})
    assert first.status_code == 201
    again = client.post("/jobs", json={**ADD, "unique_key": "http-u1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    raised = client.post("/jobs", json={**ADD, "unique_key": "http-u1", "on_conflict": "raise"})
    assert "holds the unique key 'http-u1'" in _error(raised, 409)
    assert "unique key" in _error(client.post("/jobs", json={**ADD, "unique_key": " "}), 400)


def test_retry_a_finished_job(client: httpx.Client, http_store: Store) -> None:
    doc = client.post("/jobs", json={**ADD, "labels": {"r": "1"}}).json()
    assert "only a finished job" in _error(client.post(f"/jobs/{doc['id']}/retry"), 409)
    _finished(http_store, doc["id"])
    made = client.post(f"/jobs/{doc['id']}/retry")
    assert made.status_code == 201, made.text
    new = made.json()
    assert (
        new["retry_of"] == doc["id"]
        and new["call"]["args"] == [1, 2]
        and new["status"] == "pending"
    )
    assert made.headers["location"] == f"/jobs/{new['id']}"
    assert client.get(f"/jobs/{doc['id']}/retries").json() == {"jobs": [new["id"]]}
    assert client.get(f"/jobs/{doc['id']}").json()["status"] == "failed"  # unchanged
    _error(client.post("/jobs/nosuchjob/retry"), 404)


def test_bulk_actions_count_first_then_act(client: httpx.Client, http_store: Store) -> None:
    ids = [
        client.post("/jobs", json={**ADD, "labels": {"bulk": "yes"}}).json()["id"] for _ in range(3)
    ]
    for job_id in ids[:2]:
        _finished(http_store, job_id)
    body = {"status": "failed", "label": "bulk=yes"}
    counted = client.post("/jobs/bulk/retry", json={**body, "dry_run": True}).json()
    assert counted == {"count": 2, "jobs": sorted(ids[:2], reverse=True), "dry_run": True}
    assert http_store.retries_of(ids[0]) == []  # a dry run changes nothing
    done = client.post("/jobs/bulk/retry", json=body).json()
    assert done["count"] == 2 and not done["dry_run"]
    assert {http_store.get(j).retry_of for j in done["jobs"]} == set(ids[:2])
    canceled = client.post("/jobs/bulk/cancel", json={"ids": [ids[2], *done["jobs"]]}).json()
    assert canceled["count"] == 3
    assert http_store.get(ids[2]).status == "canceled"
    deleted = client.post("/jobs/bulk/delete", json={"status": "canceled", "label": "bulk=yes"})
    assert deleted.json()["count"] == 3
    assert "say which jobs" in _error(client.post("/jobs/bulk/delete", json={}), 400)
    assert "not both" in _error(
        client.post("/jobs/bulk/cancel", json={"ids": ["a"], "status": "failed"}), 400
    )
    _error(client.post("/jobs/bulk/explode", json={"status": "failed"}), 422)
    _error(client.post("/jobs/bulk/retry", json={"since": "10 parsecs"}), 400)


def test_groups(client: httpx.Client, http_store: Store) -> None:
    put = client.put("/groups/http-gpu", json={"slots": 2})
    assert put.status_code == 200, put.text
    assert put.json() == {"name": "http-gpu", "slots": 2, "running": 0, "waiting": 0}
    gpu = {"name": "http-gpu", "slots": 2, "running": 0, "waiting": 0}
    assert gpu in client.get("/groups").json()["groups"]
    assert http_store.slots()["http-gpu"] == (2, 0)
    _error(client.put("/groups/http-gpu", json={"slots": 0}), 422)
    _error(client.put("/groups/http-gpu", json={}), 422)
    assert client.put("/groups/http-gpu", json={"slots": None}).json()["slots"] is None
    assert "http-gpu" not in {g["name"] for g in client.get("/groups").json()["groups"]}


def test_bulk_delete_is_all_or_nothing(client: httpx.Client, http_store: Store) -> None:
    """A selection with a job that is not finished deletes nothing (409, naming it); the
    CLI's rm does the same."""
    done = [client.post("/jobs", json=ADD).json()["id"] for _ in range(2)]
    for job_id in done:
        _finished(http_store, job_id)
    live = client.post("/jobs", json=ADD).json()["id"]
    refused = client.post("/jobs/bulk/delete", json={"ids": [*done, live]})
    assert live in _error(refused, 409) and "nothing was removed" in _error(refused, 409)
    assert all(client.get(f"/jobs/{j}").status_code == 200 for j in [*done, live])
    removed = client.post("/jobs/bulk/delete", json={"ids": done})
    assert removed.status_code == 200 and sorted(removed.json()["jobs"]) == sorted(done)
    assert all(client.get(f"/jobs/{j}").status_code == 404 for j in done)
    client.post(f"/jobs/{live}/cancel")
