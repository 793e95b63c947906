"""The JSON routes against a real server process: documents, paging, actions, and bad input
that must always get a 4xx JSON answer saying what is wrong — never a 500."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from outlast.store import Store, Task
from tests.http.harness import Server, finish, start_worker


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


def test_healthz(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_a_job_reads_as_the_store_document(client: httpx.Client, http_store: Store) -> None:
    task = http_store.create(kind="function", name="doc", labels={"team": "a"})
    task.start()
    task.report("load", "progress", {"rows": 3}, progress=40)
    doc = client.get(f"/jobs/{task.id}").json()
    assert doc == http_store.get(task.id).to_dict()
    assert (doc["status"], doc["step"], doc["progress"]) == ("running", "load", 40.0)


def test_listing_pages_newest_first_and_filters(client: httpx.Client, http_store: Store) -> None:
    ids = [
        http_store.create(name="paged", labels={"batch": "p1", "n": str(i)}).id for i in range(5)
    ]
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"label": "batch=p1", "limit": 2}
        if cursor:
            params["before"] = cursor
        page = client.get("/jobs", params=params).json()
        pages.append([doc["id"] for doc in page["jobs"]])
        cursor = page["next"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [job for page in pages for job in page] == ids[::-1]
    both = client.get("/jobs", params=[("label", "batch=p1"), ("label", "n=3")]).json()
    assert [d["id"] for d in both["jobs"]] == [ids[3]]
    http_store.open(ids[0]).cancel()
    canceled = client.get("/jobs", params={"label": "batch=p1", "status": "canceled"}).json()
    assert [d["id"] for d in canceled["jobs"]] == [ids[0]]


def test_listing_refuses_bad_filters(client: httpx.Client) -> None:
    assert _error(client.get("/jobs?status=done"), 422)[0]["loc"] == ["query", "status"]
    assert "key=value" in _error(client.get("/jobs?label=nokey"), 400)
    assert "cursor" in _error(client.get("/jobs?before=0000nosuchjob"), 400)
    _error(client.get("/jobs?before=../etc"), 400)
    _error(client.get("/jobs?limit=0"), 422)
    _error(client.get("/jobs?limit=many"), 422)


def test_post_queues_registered_jobs_only(client: httpx.Client, http_store: Store) -> None:
    body = {"name": "tests.add", "args": [1, 2], "labels": {"via": "http"}}
    response = client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    doc = response.json()
    assert response.headers["location"] == f"/jobs/{doc['id']}"
    assert (doc["kind"], doc["name"], doc["status"]) == ("function", "tests.add", "pending")
    assert (doc["call"]["args"], doc["labels"], doc["command"]) == (
        [1, 2],
        {"via": "http"},
        None,
    )
    assert http_store.get(doc["id"]).to_dict() == doc
    echo = client.post("/jobs", json={"name": "tests.echo", "kwargs": {"k": [1]}}).json()
    assert echo["queue"] == "http-tests"
    assert client.post("/jobs", json={"name": "tests.echo", "queue": "q2"}).json()["queue"] == "q2"

    assert "unknown job name 'rm'" in _error(client.post("/jobs", json={"name": "rm"}), 400)
    # arguments the function cannot take: a 400 that says why, and nothing stored
    count = len(http_store.list(limit=None))
    detail = _error(client.post("/jobs", json={"name": "tests.add", "args": [1]}), 400)
    assert detail == "job 'tests.add' takes tests.add(a, b): missing a required argument: 'b'"
    assert len(http_store.list(limit=None)) == count
    # Never a command: there is no field for one.
    detail = _error(client.post("/jobs", json={"name": "tests.add", "command": ["rm"]}), 422)
    assert detail[0]["loc"] == ["body", "command"] and detail[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"name": "tests.add"', 400),  # malformed JSON
        (b"[1, 2]", 422),  # not an object
        (b'{"args": []}', 422),  # no name
        (b'{"name": 5}', 422),
        (b'{"name": "tests.add", "args": {"a": 1}}', 422),
        (b'{"name": "tests.add", "kwargs": []}', 422),
        (b'{"name": "tests.add", "labels": {"k": 1}}', 422),
        (b'{"name": "tests.add", "labels": {"": "v"}}', 400),
        (b'{"name": "tests.add", "queue": ""}', 422),
        (b'{"name": "tests.add", "args": [NaN]}', 400),
        (b'{"name": "tests.add", "args": [1e999]}', 400),
        (b'"\xff\xfe"', 400),
        (b"", 422),
    ],
)
def test_bad_bodies_get_a_4xx_json_answer(client: httpx.Client, body: bytes, status: int) -> None:
    response = client.post("/jobs", content=body, headers={"Content-Type": "application/json"})
    _error(response, status)


def test_bodies_over_one_megabyte_are_refused(client: httpx.Client) -> None:
    big = json.dumps({"name": "tests.add", "args": ["x" * (1024 * 1024)]}).encode()
    headers = {"Content-Type": "application/json"}
    assert "at most" in _error(client.post("/jobs", content=big, headers=headers), 413)

    def chunks() -> Any:  # no Content-Length: the limit holds on the bytes read
        yield big[: len(big) // 2]
        yield big[len(big) // 2 :]

    _error(client.post("/jobs", content=chunks(), headers=headers), 413)


def test_unknown_and_malformed_ids(client: httpx.Client) -> None:
    assert "no job" in _error(client.get("/jobs/nosuchjob"), 404)
    _error(client.get("/jobs/bad%20id"), 400)
    _error(client.get("/jobs/" + "a" * 200), 422)
    _error(client.post("/jobs/nosuchjob/cancel"), 404)
    _error(client.post("/jobs/nosuchjob/resume", json={"answer": 1}), 404)
    _error(client.delete("/jobs/nosuchjob"), 404)
    _error(client.get("/jobs/nosuchjob/log"), 404)
    _error(client.get("/nowhere"), 404)
    _error(client.put("/jobs"), 405)


def test_cancel(client: httpx.Client, http_store: Store) -> None:
    task = http_store.create(name="to-cancel")
    doc = client.post(f"/jobs/{task.id}/cancel").json()
    assert (doc["status"], doc["error"]["code"]) == ("canceled", "canceled")
    assert client.post(f"/jobs/{task.id}/cancel").json()["status"] == "canceled"
    done = http_store.create(name="done")
    done.start()
    done.succeed(7)
    assert client.post(f"/jobs/{done.id}/cancel").json()["status"] == "succeeded"


def test_resume_only_a_paused_job(client: httpx.Client, http_store: Store) -> None:
    task = http_store.create(name="asks")
    assert "not paused" in _error(client.post(f"/jobs/{task.id}/resume", json={}), 409)
    task.start()
    task.pause({"q": "ship it?"})
    _error(client.post(f"/jobs/{task.id}/resume", json={"answer": 1, "x": 2}), 422)
    doc = client.post(f"/jobs/{task.id}/resume", json={"answer": {"ship": True}}).json()
    assert (doc["status"], doc["answer"]) == ("pending", {"ship": True})
    assert client.post(f"/jobs/{task.id}/resume").status_code == 409  # no body, not paused


def test_delete(client: httpx.Client, http_store: Store) -> None:
    live = http_store.create(name="live")
    assert "cancel it first" in _error(client.delete(f"/jobs/{live.id}"), 409)
    response = client.delete(f"/jobs/{live.id}", params={"force": "true"})
    assert (response.status_code, response.content) == (204, b"")
    _error(client.get(f"/jobs/{live.id}"), 404)
    _error(client.delete(f"/jobs/{live.id}?force=maybe"), 422)
    done = http_store.create(name="old")
    done.cancel()
    assert client.delete(f"/jobs/{done.id}").status_code == 204


def test_log_tail(client: httpx.Client, http_store: Store) -> None:
    task = http_store.create(name="chatty")
    _error(client.get(f"/jobs/{task.id}/log"), 404)
    lines = [f"line {i} ✓" for i in range(500)]
    http_store.log_path(task.id).write_text("\n".join(lines) + "\n")
    response = client.get(f"/jobs/{task.id}/log", params={"tail": 3})
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "line 497 ✓\nline 498 ✓\nline 499 ✓\n"
    assert len(client.get(f"/jobs/{task.id}/log").text.splitlines()) == 200
    _error(client.get(f"/jobs/{task.id}/log", params={"tail": 0}), 422)


def test_a_job_whose_worker_died_reads_as_failed(
    client: httpx.Client, http_store: Store, http_store_url: str
) -> None:
    task: Task = http_store.create(name="doomed")
    finish(start_worker(http_store_url, task.id, "--events", "1", "--die"))
    doc = client.get(f"/jobs/{task.id}").json()
    assert (doc["status"], doc["error"]["code"]) == ("failed", "abandoned")


def test_the_dashboard_is_served(client: httpx.Client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="static/app.js"' in page.text
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200
    assert "/jobs/{job_id}/events" in client.get("/openapi.json").json()["paths"]


def test_a_corrupt_job_is_a_409_that_says_so_never_a_500(
    client: httpx.Client, http_store: Store, http_store_url: str
) -> None:
    """Issue 12, item 10: a corrupt document answered 500."""
    import sqlite3

    task = http_store.create(kind="function", name="will-rot")
    path = http_store_url[len("sqlite://") :]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET doc = ? WHERE id = ?", (b'{"id": "x"', task.id))
    for call in (
        lambda: client.get(f"/jobs/{task.id}"),
        lambda: client.post(f"/jobs/{task.id}/cancel"),
        lambda: client.get(f"/jobs/{task.id}/events"),
    ):
        detail = _error(call(), 409)
        assert task.id in detail and "corrupt" in detail
    assert client.delete(f"/jobs/{task.id}", params={"force": "true"}).status_code == 204
