"""``GET /jobs?name=&id_prefix=`` and ``GET /stats/timeline`` against a real server: the
same filters as the store's, pages of a search, the timeline's columns, and bad input that
gets a 4xx JSON answer saying what is wrong (never a 500)."""

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


def _error(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] and body["detail"]
    return body["detail"]


def _ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [doc["id"] for doc in response.json()["jobs"]]


def test_jobs_by_name_id_prefix_and_label(client: httpx.Client, http_store: Store) -> None:
    tag = http_store.create(name="tag").id[-8:]  # names of this test only
    resize = [
        http_store.create(kind="function", name=f"Images.Resize{tag}", labels={"t": tag}).id
        for _ in range(3)
    ]
    mail = http_store.create(kind="function", name=f"mail.send{tag}", labels={"t": tag}).id
    assert _ids(client.get("/jobs", params={"name": f"resize{tag.upper()}"})) == resize[::-1]
    assert _ids(client.get("/jobs", params={"name": f"send{tag}"})) == [mail]
    assert _ids(client.get("/jobs", params={"name": tag, "label": f"t={tag}"})) == [
        mail,
        *resize[::-1],
    ]
    assert _ids(client.get("/jobs", params={"id_prefix": resize[1]})) == [resize[1]]
    both = {"name": f"resize{tag}", "id_prefix": resize[1]}
    assert _ids(client.get("/jobs", params=both)) == [resize[1]]
    assert _ids(client.get("/jobs", params={"name": f"send{tag}", "id_prefix": resize[1]})) == []
    assert _ids(client.get("/jobs", params={"name": "nosuchname-at-all"})) == []
    http_store.open(resize[0]).cancel()
    canceled = {"name": f"resize{tag}", "status": "canceled"}
    assert _ids(client.get("/jobs", params=canceled)) == [resize[0]]


def test_a_search_pages_with_the_cursor(client: httpx.Client, http_store: Store) -> None:
    tag = http_store.create(name="tag").id[-8:]
    made = [http_store.create(kind="function", name=f"paged{tag}.{i}").id for i in range(5)]
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"name": f"PAGED{tag}", "limit": 2}
        if cursor:
            params["before"] = cursor
        page = client.get("/jobs", params=params).json()
        pages.append([doc["id"] for doc in page["jobs"]])
        cursor = page["next"]
        if cursor is None:
            break
    assert [job for page in pages for job in page] == made[::-1]


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"id_prefix": "a/b"}, 400, "no job id starts with 'a/b'"),
        ({"id_prefix": "../etc"}, 400, "no job id starts with"),
        ({"id_prefix": "a b"}, 400, "only letters, digits"),
        ({"id_prefix": "é"}, 400, "only letters, digits"),
        ({"id_prefix": ""}, 400, "empty"),
        ({"id_prefix": "a" * 129}, 422, "at most 128"),
        ({"name": ""}, 400, "empty"),
        ({"name": "a\x00b"}, 400, "control character"),
        ({"name": "x" * 201}, 422, "at most 200"),
    ],
)
def test_bad_search_input_is_a_4xx_saying_so(
    client: httpx.Client, params: dict[str, str], status: int, says: str
) -> None:
    detail = _error(client.get("/jobs", params=params), status)
    assert says in str(detail), detail


def test_the_timeline(client: httpx.Client, http_store: Store) -> None:
    for ok in (True, False):
        task = http_store.create(kind="function", name="timeline")
        task.start()
        if ok:
            task.succeed(1)
        else:
            task.fail("boom", retry=False)
    doc = client.get("/stats/timeline").json()
    assert set(doc) == {
        "at",
        "window_seconds",
        "step_seconds",
        "start",
        "times",
        "finished",
        "wait_seconds",
    }
    assert (doc["window_seconds"], doc["step_seconds"], len(doc["times"])) == (3600, 60, 60)
    assert set(doc["finished"]) == {"succeeded", "failed", "canceled"}
    assert all(len(v) == 60 for v in (*doc["finished"].values(), *doc["wait_seconds"].values()))
    assert doc["finished"]["succeeded"][-1] + doc["finished"]["succeeded"][-2] >= 1
    assert doc["finished"]["failed"][-1] + doc["finished"]["failed"][-2] >= 1
    assert any(w is not None for w in doc["wait_seconds"]["p50"][-2:])
    other = client.get("/stats/timeline", params={"window": "10m", "step": "30s"}).json()
    assert (other["window_seconds"], other["step_seconds"], len(other["times"])) == (600, 30, 20)
    assert client.get("/stats/timeline", params={"window": 900, "step": 1.5}).status_code == 200


@pytest.mark.parametrize(
    ("params", "status", "says"),
    [
        ({"window": "0"}, 400, "> 0"),
        ({"window": "-1h"}, 400, ">= 0"),
        ({"window": "soon"}, 400, "window is like 90s"),
        ({"window": "30d"}, 400, "a week"),
        ({"step": "0"}, 400, "> 0"),
        ({"step": "0.5"}, 400, "at least 1 second"),
        ({"step": "2h"}, 400, "longer than the window"),
        ({"window": "7d", "step": "1m"}, 400, "at most 1440"),
        ({"step": "nan"}, 400, "step"),
        ({"window": "1" * 40}, 422, "at most 32"),
    ],
)
def test_bad_timeline_windows_are_a_4xx_saying_so(
    client: httpx.Client, params: dict[str, str], status: int, says: str
) -> None:
    detail = _error(client.get("/stats/timeline", params=params), status)
    assert says in str(detail), detail
