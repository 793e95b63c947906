"""``outlast mcp`` driven by the official SDK's own client over stdio: a real server
subprocess, real command jobs and a real pool for function jobs, on every store."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from outlast.model import Status
from tests.pool.conftest import JOBS, Harness
from tests.waiting import alive, until

pytestmark = pytest.mark.timeout(90)

Session = Callable[[Client], Awaitable[None]]


def _params(harness: Harness, *args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "outlast", "mcp", "--store", harness.url, *args],
        env={k: v for k, v in harness.env.items() if k != "OUTLAST_STORE"},
        cwd=str(harness.tmp),
    )


def _drive(harness: Harness, session: Session, *args: str) -> None:
    """Start ``outlast mcp ARGS`` and run ``session`` against it with the SDK's client."""

    async def main() -> None:
        async with Client(_params(harness, *args), read_timeout_seconds=60) as client:
            await session(client)

    try:
        asyncio.run(main())
    except BaseExceptionGroup as group:  # the client's task groups wrap the test's failure
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None


async def call(client: Client, tool: str, **arguments: Any) -> Any:
    """The tool's structured output; fails the test on an error result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, arguments, result.content)
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The text of the error result the tool gives (it must give one)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, arguments, result.structured_content)
    return " ".join(getattr(part, "text", "") for part in result.content)


@pytest.fixture
def harness(store_url: str, tmp_path: Path) -> Any:
    made = Harness(tmp_path, store_url)
    try:
        yield made
    finally:
        made.close()


def test_a_command_job_run_waited_for_with_progress_and_paged_through(harness: Harness) -> None:
    report = f"{sys.executable} -m outlast report --step half --progress 50"
    script = f"for i in $(seq 1 200); do echo line-$i; done; {report}; sleep 0.2"

    async def session(client: Client) -> None:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {
            "run_command", "submit", "status", "list_jobs", "wait", "logs", "events",
            "cancel", "resume", "retry",
        }  # fmt: skip
        assert listed["wait"].input_schema["properties"]["timeout"]["maximum"] == 3600
        document = (listed["status"].output_schema or {}).get("properties", {})
        assert {"id", "status", "progress", "question", "error"} <= set(document)

        doc = await call(
            client, "run_command", argv=["sh", "-c", script], name="lines", labels={"t": "mcp"}
        )
        assert doc["kind"] == "command" and doc["name"] == "lines" and doc["labels"] == {"t": "mcp"}
        notes: list[tuple[float, float | None, str]] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            notes.append((done, total, message or ""))

        waited = await client.call_tool(
            "wait", {"job_id": doc["id"], "timeout": 60}, progress_callback=progress
        )
        assert not waited.is_error, waited.content
        out = waited.structured_content
        assert out is not None
        assert out["reason"] == "succeeded" and out["job"]["status"] == "succeeded"
        assert notes, "no progress notification during the wait"
        done = [n for n, _, _ in notes]
        assert done == sorted(done), f"progress went down: {notes}"
        # before the job reports a percent: a counter, no total; once it does: out of 100,
        # the percent its message shows too
        totals = [t for _, t, _ in notes]
        assert totals == sorted(totals, key=lambda t: t is not None), notes
        assert all(t in (None, 100) for t in totals), notes
        for n, t, m in notes:
            assert t is None or f"{n:g}%" in m, (n, t, m)
        [half] = [(n, t) for n, t, m in notes if "half" in m]  # the job's own event
        assert half[1] == 100 and half[0] >= 50, notes
        assert notes[-1][:2] == (100, 100) and notes[-1][2].startswith("succeeded"), notes

        # the log, paged by offset with a small limit: every line once, in order
        text, offset, pages = "", 0, 0
        while True:
            piece = await call(client, "logs", job_id=doc["id"], offset=offset, limit=500)
            assert piece["offset"] == offset
            text += piece["text"]
            offset = piece["next_offset"]
            pages += 1
            if piece["done"]:
                break
        assert text.splitlines() == [f"line-{i}" for i in range(1, 201)]
        assert pages > 3 and offset == piece["size"]
        tail = await call(client, "logs", job_id=doc["id"], tail=2)
        assert tail["text"].splitlines() == ["line-199", "line-200"]

        events = await call(client, "events", job_id=doc["id"])
        assert [e["seq"] for e in events["events"]] == list(range(1, len(events["events"]) + 1))
        assert events["done"] is True
        later = await call(client, "events", job_id=doc["id"], after=events["next_after"])
        assert later["events"] == [] and later["done"] is True

        page = await call(client, "list_jobs", labels={"t": "mcp"}, limit=5)
        assert [j["id"] for j in page["jobs"]] == [doc["id"]] and page["next"] is None
        named = await call(client, "list_jobs", name="LIN", id_prefix=doc["id"][:12])
        assert [j["id"] for j in named["jobs"]] == [doc["id"]]
        assert (await call(client, "list_jobs", name="nosuchname"))["jobs"] == []

        read = await client.read_resource(f"outlast://jobs/{doc['id']}")
        assert json.loads(read.contents[0].text)["status"] == "succeeded"  # type: ignore[union-attr]
        log = await client.read_resource(f"outlast://jobs/{doc['id']}/log")
        assert log.contents[0].text.endswith("line-200\n")  # type: ignore[union-attr]

        again = await call(client, "retry", job_ids=[doc["id"]])
        [retried] = again["jobs"]
        assert retried["retry_of"] == doc["id"]
        assert (await call(client, "wait", job_id=retried["id"], timeout=60))["reason"] == (
            "succeeded"
        )

    _drive(harness, session, "--allow-commands")


def test_cancel_through_mcp_and_wait_returns_once_the_processes_are_gone(
    harness: Harness,
) -> None:
    pid_file = harness.tmp / "pid"
    script = f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.05; done"

    async def session(client: Client) -> None:
        doc = await call(client, "run_command", argv=["sh", "-c", script], grace=1)
        assert doc["grace"] == 1.0  # SIGKILL a second after the SIGTERM it ignores
        await asyncio.to_thread(until, pid_file.exists, 30, "the command to start")
        pid = int(pid_file.read_text())
        gone = await call(client, "wait", job_id=doc["id"], timeout=0.3)
        assert gone["reason"] == "timeout" and gone["job"]["status"] == "running"

        canceled = await call(client, "cancel", job_id=doc["id"])
        assert canceled["status"] == "canceled"
        waited = await call(client, "wait", job_id=doc["id"], timeout=60)
        assert waited["reason"] == "canceled"
        assert not alive(pid), "wait returned while the canceled command (ignoring TERM) lived"

    _drive(harness, session, "--allow-commands")


def test_a_paused_function_job_is_answered_through_mcp(harness: Harness) -> None:
    harness.worker()

    async def session(client: Client) -> None:
        doc = await call(client, "submit", name="pt.ask", args=["ship it?"], labels={"a": "b"})
        # the document as it is once stored: the pool may have taken it already
        assert doc["kind"] == "function" and doc["status"] in ("pending", "running", "paused")
        waited = await call(client, "wait", job_id=doc["id"], timeout=60)
        assert waited["reason"] == "paused" and waited["question"] == "ship it?"
        assert waited["job"]["status"] == "paused"
        resumed = await call(client, "resume", job_id=doc["id"], answer={"go": True})
        assert resumed["status"] == "pending"
        done = await call(client, "wait", job_id=doc["id"], timeout=60)
        assert done["reason"] == "succeeded"
        assert done["job"]["result"] == {"answer": {"go": True}}
        assert "not paused" in (await refused(client, "resume", job_id=doc["id"], answer=1))

    _drive(harness, session, "--import", JOBS)
    assert harness.get(harness.store.list(limit=1)[0].id).status == Status.SUCCEEDED


def test_bad_input_gets_error_results_and_the_server_goes_on(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:

        async def session(client: Client) -> None:
            off = await refused(client, "run_command", argv=["true"])
            assert "--allow-commands" in off
            assert "invalid job id" in await refused(client, "status", job_id="../../etc/passwd")
            assert "no job" in (await refused(client, "status", job_id="nosuchjob")).lower()
            assert "nosuch" in await refused(client, "submit", name="nosuch.job")
            assert await refused(client, "list_jobs", limit=0)  # the schema's bound
            assert await refused(client, "list_jobs", status="bogus")
            assert await refused(client, "list_jobs", before="nosuchjob")
            assert await refused(client, "wait", job_id="x", timeout=-1)
            assert await refused(client, "logs", job_id="nosuchjob")
            assert await refused(client, "retry", job_ids=[])
            assert await refused(client, "submit", name="pt.noop", args=[1, 2, 3, 4])
            with pytest.raises(Exception, match=r"(?i)job"):
                await client.read_resource("outlast://jobs/nosuchjob")
            page = await call(client, "list_jobs")  # still serving
            assert page == {"jobs": [], "next": None}

        _drive(harness, session, "--import", JOBS)
        assert harness.store.list(limit=None) == [], "a refused call left a job behind"
    finally:
        harness.close()


def test_retrying_a_command_job_needs_allow_commands(tmp_path: Path) -> None:
    """A retried command job runs its command again: a server that may not run commands
    refuses it (the CLI made the job), one that may runs it once more."""
    harness = Harness(tmp_path)
    marker = tmp_path / "marker"
    try:
        made = harness.cli("run", "--", "sh", "-c", f"echo ran >> {marker}")
        assert made.returncode == 0, made
        job_id = made.stdout.strip()
        assert harness.cli("wait", job_id).returncode == 0
        assert marker.read_text() == "ran\n"

        async def refusing(client: Client) -> None:
            why = await refused(client, "retry", job_ids=[job_id])
            assert "--allow-commands" in why and "command" in why and job_id in why, why
            listed = await call(client, "list_jobs")
            assert [j["id"] for j in listed["jobs"]] == [job_id], "a refused retry made a job"

        _drive(harness, refusing)
        assert marker.read_text() == "ran\n", "the command ran again"
        assert [s.id for s in harness.store.list(limit=None)] == [job_id]

        async def allowing(client: Client) -> None:
            [again] = (await call(client, "retry", job_ids=[job_id]))["jobs"]
            assert again["retry_of"] == job_id and again["kind"] == "command"
            waited = await call(client, "wait", job_id=again["id"], timeout=60)
            assert waited["reason"] == "succeeded", waited

        _drive(harness, allowing, "--allow-commands")
        assert marker.read_text() == "ran\nran\n"
    finally:
        harness.close()


def test_submit_takes_the_options_of_job_options(tmp_path: Path) -> None:
    """attempts, keep, at, limit_key/limit and on_conflict, as `outlast submit` and
    job.options(...) take them: attempts end to end (a job declared with 2 attempts that fails
    twice succeeds with attempts=3), the others as stored; their mistakes are error results."""
    harness = Harness(tmp_path)
    try:
        _submit_with_options(harness)
    finally:
        harness.close()


def _submit_with_options(harness: Harness) -> None:
    harness.worker()
    calls = harness.tmp / "calls"
    later = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)

    async def session(client: Client) -> None:
        flaky = await call(
            client, "submit", name="pt.flaky2", args=[str(calls), 2], attempts=3, keep="1d"
        )
        assert flaky["max_attempts"] == 3
        done = await call(client, "wait", job_id=flaky["id"], timeout=60)
        assert done["reason"] == "succeeded", done
        assert done["job"]["attempts"] == 3 and done["job"]["result"] == 3

        doc = await call(
            client, "submit", name="pt.noop", at=later.isoformat(), limit_key="t:7", limit=2,
            unique_key="u1",
        )  # fmt: skip
        assert doc["status"] == "pending"
        assert datetime.fromisoformat(doc["run_after"]) == later
        same = await call(client, "submit", name="pt.noop", unique_key="u1")
        assert same["id"] == doc["id"]
        assert "u1" in await refused(
            client, "submit", name="pt.noop", unique_key="u1", on_conflict="raise"
        )
        assert "not both" in await refused(
            client, "submit", name="pt.noop", delay="1h", at=later.isoformat()
        )
        assert "limit key" in await refused(client, "submit", name="pt.noop", limit=2)
        assert await refused(client, "submit", name="pt.noop", at="tomorrow")
        assert await refused(client, "submit", name="pt.noop", keep="soon")
        assert await refused(client, "submit", name="pt.noop", attempts=0)
        await call(client, "cancel", job_id=doc["id"])

    _drive(harness, session, "--import", JOBS)
    states = {s.name: s for s in harness.store.list(limit=None)}
    assert states["pt.flaky2"].keep == 86400
    assert states["pt.noop"].limit_key == "t:7" and states["pt.noop"].limit == 2
    assert len(harness.store.list(limit=None)) == 2, "a refused submit left a job behind"


def test_run_command_takes_the_options_of_outlast_run(tmp_path: Path) -> None:
    """group, priority, at, keep, unique_key and on_conflict, as `outlast run` takes them:
    a group of one slot runs a later, higher-priority command second; the others as stored;
    their mistakes are error results that leave no job behind."""
    harness = Harness(tmp_path)
    marks, gate = tmp_path / "marks", tmp_path / "go"
    later = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    try:

        async def session(client: Client) -> None:
            first = await call(
                client, "run_command", argv=["sh", "-c", f"{wait}; echo first >> {marks}"],
                group="g",
            )  # fmt: skip
            await asyncio.to_thread(
                until, lambda: harness.get(first["id"]).status == Status.RUNNING, 30, "first"
            )
            low, high = [
                await call(client, "run_command", argv=["sh", "-c", f"echo {name} >> {marks}"],
                           group="g", priority=priority)
                for name, priority in (("low", 0), ("high", 5))
            ]  # fmt: skip
            assert (low["limit_key"], high["priority"]) == ("g", 5)
            gate.touch()
            for doc in (first, low, high):
                done = await call(client, "wait", job_id=doc["id"], timeout=60)
                assert done["reason"] == "succeeded", done
            assert marks.read_text().split() == ["first", "high", "low"]

            held = await call(
                client, "run_command", argv=["true"], at=later.isoformat(), keep="1d",
                unique_key="nightly",
            )  # fmt: skip
            assert datetime.fromisoformat(held["run_after"]) == later and held["keep"] == 86400
            same = await call(client, "run_command", argv=["true"], unique_key="nightly")
            assert same["id"] == held["id"]
            assert "nightly" in await refused(
                client, "run_command", argv=["true"], unique_key="nightly", on_conflict="raise"
            )
            assert "not both" in await refused(
                client, "run_command", argv=["true"], delay="1h", at=later.isoformat()
            )
            assert await refused(client, "run_command", argv=["true"], grace=-1)
            assert await refused(client, "run_command", argv=["true"], keep="soon")
            assert await refused(client, "run_command", argv=["true"], at="tomorrow")
            await call(client, "cancel", job_id=held["id"])

        _drive(harness, session, "--allow-commands")
        assert len(harness.store.list(limit=None)) == 4, "a refused call left a job behind"
    finally:
        harness.close()
