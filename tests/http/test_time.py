"""Time over HTTP: ``POST /jobs`` with ``delay``/``run_after``/``timeout``/``keep``, and the
``/schedules`` routes, against a real server process."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from outlast import cron
from outlast.model import Kind
from outlast.store import Store
from tests.http.harness import Server
from tests.http.test_api import _error

#: A call of the test app's job that fits its signature.
ADD: dict[str, object] = {"name": "tests.add", "args": [1, 2]}


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    with server.client() as c:
        yield c


def test_post_jobs_takes_a_delay_or_a_time(client: httpx.Client, http_store: Store) -> None:
    before = datetime.now(UTC)
    response = client.post("/jobs", json={**ADD, "delay": "15m", "keep": "1d"})
    assert response.status_code == 201, response.text  # once in a CI run: not a job here
    doc = response.json()
    run_after = datetime.fromisoformat(doc["run_after"])
    assert before + timedelta(minutes=15) <= run_after < before + timedelta(minutes=16)
    assert doc["keep"] == 86400 and http_store.get(doc["id"]).run_after == run_after
    at = client.post(
        "/jobs", json={**ADD, "run_after": "2030-01-01T03:00+01:00", "timeout": 90}
    ).json()
    assert at["run_after"].startswith("2030-01-01T02:00:00") and at["timeout"] == 90
    past = client.post("/jobs", json={**ADD, "run_after": "2020-01-01T00:00Z"})
    assert past.status_code == 201 and past.json()["run_after"] is None  # runs now
    seconds = client.post("/jobs", json={**ADD, "delay": 30, "timeout": "10m"})
    assert seconds.json()["timeout"] == 600


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"delay": "10 parsecs"}, "'10 parsecs'"),
        ({"delay": -1}, ">= 0"),
        ({"run_after": "2030-01-01T03:00"}, "no time zone"),
        ({"run_after": "whenever"}, "'whenever'"),
        ({"delay": 5, "run_after": "2030-01-01T03:00Z"}, "not both"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": "soon"}, "'soon'"),
        ({"keep": "-1d"}, ">= 0"),
    ],
)
def test_bad_times_are_a_400_that_says_why(
    client: httpx.Client, http_store: Store, body: dict[str, Any], says: str
) -> None:
    count = len(http_store.list(limit=None))
    detail = _error(client.post("/jobs", json={**ADD, **body}), 400)
    assert says in detail
    assert len(http_store.list(limit=None)) == count


def test_schedule_routes(client: httpx.Client, http_store: Store) -> None:
    template = cron.template(Kind.FUNCTION, "tests.add", labels={"via": "schedule"})
    http_store.add_schedule(
        cron.new_schedule("http-nightly", template, cron="0 3 * * *", tz="Europe/Berlin"),
        replace=True,
    )
    page = client.get("/schedules").json()
    [doc] = [s for s in page["schedules"] if s["id"] == "http-nightly"]
    assert doc["cron"] == "0 3 * * *" and doc["tz"] == "Europe/Berlin"
    assert doc["last_status"] is None and doc["next_at"]
    assert client.get("/schedules/http-nightly").json() == doc
    paused = client.post("/schedules/http-nightly/pause").json()
    assert paused["paused"] and http_store.get_schedule("http-nightly").paused
    assert not client.post("/schedules/http-nightly/resume").json()["paused"]
    ran = client.post("/schedules/http-nightly/run")
    assert ran.status_code == 201, ran.text
    job = ran.json()
    assert job["fired"]["reason"] == "manual" and job["labels"] == {"via": "schedule"}
    assert ran.headers["location"] == f"/jobs/{job['id']}"
    after = client.get("/schedules/http-nightly").json()
    assert after["last_job"] == job["id"] and after["last_status"] == "pending"
    assert client.delete("/schedules/http-nightly").status_code == 204
    assert "no schedule http-nightly" in _error(client.get("/schedules/http-nightly"), 404)
    for verb in ("pause", "resume", "run"):
        _error(client.post(f"/schedules/http-nightly/{verb}"), 404)
    _error(client.delete("/schedules/http-nightly"), 404)
    assert "invalid job id" in _error(client.get("/schedules/..x"), 400)


def test_schedules_need_the_token(secured: Server) -> None:
    with httpx.Client(base_url=secured.url, timeout=30) as c:  # no token
        assert c.get("/schedules").status_code == 401
        assert c.post("/schedules/x/run").status_code == 401
        assert c.get("/healthz").status_code == 200
    with secured.client() as c:
        assert c.get("/schedules").status_code == 200
