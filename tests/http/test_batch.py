"""``POST /jobs:batch``: many jobs of one registered function, checked together (a bad one
is a 400 naming it, and nothing is written), inserted in batches."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from outlast.store import Store
from tests.http.harness import Server


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    with server.client() as c:
        yield c


def test_a_batch_is_queued_in_order(client: httpx.Client, http_store: Store) -> None:
    jobs = [{"args": [i, 1], "labels": {"batch": "b1"}} for i in range(1500)]
    jobs.append({"kwargs": {"a": 1, "b": 2}, "labels": {"batch": "b1"}, "priority": 5})
    response = client.post("/jobs:batch", json={"name": "tests.add", "jobs": jobs})
    assert response.status_code == 201, response.text
    made = response.json()
    assert made["count"] == 1501 and len(set(made["ids"])) == 1501
    last = http_store.get(made["ids"][-1])
    assert (last.name, last.priority, last.labels) == ("tests.add", 5, {"batch": "b1"})
    assert last.call is not None and dict(last.call.kwargs) == {"a": 1, "b": 2}
    assert len(http_store.list(label="batch=b1", limit=None)) == 1501


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"name": "tests.add", "jobs": [{"args": [1, 2]}, {"args": [1]}]}, 400, "job 2: "),
        ({"name": "rm", "jobs": [{"args": []}]}, 400, "unknown job name 'rm'"),
        ({"name": "tests.add", "jobs": []}, 422, None),
        ({"name": "tests.add", "jobs": [{"argz": [1]}]}, 422, None),
        ({"name": "tests.add", "jobs": [{"args": [1, 2], "delay": "10 parsecs"}]}, 400, "job 1"),
    ],
)
def test_bad_batches_write_nothing(
    client: httpx.Client, http_store: Store, body: dict[str, Any], status: int, says: str | None
) -> None:
    before = len(http_store.list(limit=None))
    response = client.post("/jobs:batch", json=body)
    assert response.status_code == status, response.text
    if says:
        assert says in response.json()["detail"]
    assert len(http_store.list(limit=None)) == before
