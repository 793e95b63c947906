"""The four actions by hand, as the seed describes them (no outlast involved)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from examples.async_job_watcher import actions

from tests.pipeline.conftest import TIMEOUT, export_alive, status_files, wait_until


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


def seed_workflow(payload: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The seed's workflow exactly as written: spawn, then poll and verify inside a ``try:``
    whose ``finally:`` calls cleanup. Returns the payload and the poll messages."""
    ticks: list[str] = []
    # Stage 1: spawn; store its output under outputs.spawn_background_job.
    out, msg = actions.spawn_background_job(payload)
    payload.setdefault("outputs", {})["spawn_background_job"] = out
    try:
        # Stage 2: poll every 1.0 s, up to 30.0 s, until READY; keep the last tick's output.
        deadline = time.monotonic() + 30.0
        while True:
            out, msg = actions.check_job_status_file(payload)
            payload["outputs"]["await_job_completion"] = out
            ticks.append(msg)
            if out["job_status"] == "READY":
                break
            if time.monotonic() + 1.0 > deadline:
                raise TimeoutError("the background job was not READY after 30.0 s")
            time.sleep(1.0)
        # Stage 3: verify.
        out, msg = actions.verify_exported_artifact(payload)
        payload["outputs"]["verify_exported_artifact"] = out
    finally:
        # Stage 4: ALL_DONE: always.
        out, msg = actions.cleanup_job_status_file(payload)
        payload["outputs"]["cleanup_job_status_file"] = out
    return payload, ticks


def test_seed_workflow_by_hand(work: Path) -> None:
    status = work / "export.status.json"
    payload, ticks = seed_workflow({"delay_seconds": 1.0, "status_file": str(status)})
    outputs = payload["outputs"]

    spawned = outputs["spawn_background_job"]
    assert set(spawned) == {"status_file", "target_delay_seconds", "worker_pid"}
    assert spawned["status_file"] == str(status)
    assert spawned["target_delay_seconds"] == 1.0
    assert isinstance(spawned["worker_pid"], int)

    ready = outputs["await_job_completion"]
    assert set(ready) == {"job_status", "progress_pct", "artifact_rows", "artifact_sha256"}
    assert ready["job_status"] == "READY" and ready["progress_pct"] == 100
    assert ready["artifact_rows"] == 100
    assert len(ticks) >= 2 and ticks[-1] == "READY 100%"  # it was not ready at once

    artifact = Path(f"{status}.csv")
    assert outputs["verify_exported_artifact"] == {
        "verified": True,
        "artifact_rows": 100,
        "artifact_sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(),
    }
    assert ready["artifact_sha256"] == outputs["verify_exported_artifact"]["artifact_sha256"]
    assert len(artifact.read_text().splitlines()) == 101  # header + rows

    assert status_files(status) == []
    assert artifact.exists()  # verified: the deliverable stays
    assert outputs["cleanup_job_status_file"]["artifact_kept"] is True
    wait_until(lambda: not export_alive(spawned["worker_pid"]), what="the export to exit")


def test_seed_workflow_cleans_up_when_verify_fails(work: Path) -> None:
    status = work / "empty.status.json"
    payload: dict[str, Any] = {"delay_seconds": 0.2, "status_file": str(status), "rows": 0}
    with pytest.raises(RuntimeError, match="artifact_rows=0"):
        seed_workflow(payload)
    assert payload["outputs"]["await_job_completion"]["job_status"] == "READY"
    assert "verify_exported_artifact" not in payload["outputs"]
    assert status_files(status) == []
    assert not Path(f"{status}.csv").exists()  # an unverified artifact is not left behind


def _ready(status: Path, **extra: Any) -> dict[str, Any]:
    """Spawn an export and poll it (quickly) until READY; returns the payload."""
    payload = {"delay_seconds": 0.1, "status_file": str(status), **extra}
    out, _ = actions.spawn_background_job(payload)
    payload["outputs"] = {"spawn_background_job": out}

    def ready() -> dict[str, Any] | None:
        tick, _ = actions.check_job_status_file(payload)
        return tick if tick["job_status"] == "READY" else None

    payload["outputs"]["await_job_completion"] = wait_until(ready, TIMEOUT, what="READY")
    return payload


def test_check_before_the_status_file_exists_is_pending(work: Path) -> None:
    out, msg = actions.check_job_status_file({"status_file": str(work / "none.json")})
    assert out == {
        "job_status": "PENDING",
        "progress_pct": 0,
        "artifact_rows": 0,
        "artifact_sha256": "",
    }
    assert "PENDING" in msg


def test_progress_advances_and_status_writes_are_atomic(work: Path) -> None:
    status = work / "p.status.json"
    payload = {"delay_seconds": 1.0, "status_file": str(status)}
    out, _ = actions.spawn_background_job(payload)
    payload["outputs"] = {"spawn_background_job": out}
    seen: list[tuple[str, int]] = []
    try:
        while not seen or seen[-1][0] != "READY":
            tick, _ = actions.check_job_status_file(payload)  # never a torn read: it parses
            seen.append((tick["job_status"], tick["progress_pct"]))
            time.sleep(0.02)
    finally:
        actions.cleanup_job_status_file(payload)
    progress = [p for s, p in seen if s == "RUNNING"]
    assert progress == sorted(progress) and len(set(progress)) >= 3, seen
    assert seen[-1] == ("READY", 100)


@pytest.mark.parametrize(
    ("knob", "match"),
    [
        ({"rows": 0}, "artifact_rows=0"),
        ({"empty_sha": True}, "artifact_sha256 is empty"),
        ({"corrupt_sha": True}, "checksum mismatch"),
        ({"tamper_artifact": True}, "checksum mismatch"),
    ],
)
def test_verify_rejects(work: Path, knob: dict[str, Any], match: str) -> None:
    status = work / "v.status.json"
    payload = _ready(status, **knob)
    try:
        with pytest.raises(RuntimeError, match=match):
            actions.verify_exported_artifact(payload)
    finally:
        actions.cleanup_job_status_file(payload)
    assert status_files(status) == []


def test_verify_rejects_an_artifact_changed_after_ready(work: Path) -> None:
    status = work / "t.status.json"
    payload = _ready(status)
    artifact = Path(f"{status}.csv")
    try:
        out, _ = actions.verify_exported_artifact(payload)  # good as produced
        assert out["verified"] is True
        with artifact.open("a") as f:
            f.write("101,intruder,1\n")
        with pytest.raises(RuntimeError, match="checksum mismatch"):
            actions.verify_exported_artifact(payload)
        artifact.unlink()
        with pytest.raises(RuntimeError, match="cannot read the artifact"):
            actions.verify_exported_artifact(payload)
    finally:
        actions.cleanup_job_status_file(payload)


def test_verify_checks_the_seed_rules_on_the_report_alone(work: Path) -> None:
    def report(**fields: Any) -> dict[str, Any]:
        tick = {"job_status": "READY", "progress_pct": 100, **fields}
        return {"status_file": str(work / "r.json"), "outputs": {"await_job_completion": tick}}

    with pytest.raises(RuntimeError, match="artifact_rows=-1"):
        actions.verify_exported_artifact(report(artifact_rows=-1, artifact_sha256="ab"))
    with pytest.raises(RuntimeError, match="artifact_sha256 is empty"):
        actions.verify_exported_artifact(report(artifact_rows=3, artifact_sha256=""))
    with pytest.raises(ValueError, match="await_job_completion"):
        actions.verify_exported_artifact({"status_file": str(work / "r.json"), "outputs": {}})


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"delay_seconds": 1.0}, r"status_file'\] is missing"),
        ({"delay_seconds": -1, "status_file": "{work}/a.json"}, "delay_seconds.*>= 0"),
        ({"delay_seconds": "soon", "status_file": "{work}/a.json"}, "delay_seconds.*number"),
        ({"delay_seconds": True, "status_file": "{work}/a.json"}, "delay_seconds.*number"),
        ({"delay_seconds": float("nan"), "status_file": "{work}/a.json"}, "delay_seconds"),
        ({"status_file": "{work}/missing/dir/a.json"}, "directory .*does not exist"),
        ({"status_file": "relative/a.json"}, "absolute path"),
        ({"status_file": "{work}"}, "is a directory"),
        ({"status_file": 42}, "path string"),
        ({"status_file": "{work}/a.json", "rows": -5}, "rows"),
        ({"status_file": "{work}/a.json", "never_ready": "yes"}, "never_ready"),
    ],
)
def test_spawn_rejects_bad_payloads(work: Path, payload: dict[str, Any], match: str) -> None:
    payload = {
        k: v.replace("{work}", str(work)) if isinstance(v, str) else v for k, v in payload.items()
    }
    with pytest.raises(ValueError, match=match):
        actions.spawn_background_job(payload)
    assert os.listdir(work) == []  # nothing was started or written
    out, msg = actions.cleanup_job_status_file(payload)  # and cleanup stays safe
    assert out["removed"] == [] and msg.startswith(("nothing to clean", "no files left"))


def test_spawn_refuses_a_status_file_in_use(work: Path) -> None:
    status = work / "busy.json"
    status.write_text("{}")
    with pytest.raises(ValueError, match="already exists"):
        actions.spawn_background_job({"status_file": str(status)})
    # A pipeline run whose spawn failed leaves someone else's file alone.
    out, msg = actions.cleanup_job_status_file({"status_file": str(status), "outputs": {}})
    assert status.exists() and out["removed"] == [] and "did not run" in msg


def test_cleanup_is_idempotent_and_safe(work: Path) -> None:
    assert "nothing to clean" in actions.cleanup_job_status_file({})[1]
    assert "nothing to clean" in actions.cleanup_job_status_file({"status_file": None})[1]
    assert "nothing to clean" in actions.cleanup_job_status_file("not a dict")[1]  # type: ignore[arg-type]
    status = work / "c.json"
    for path in (status, Path(f"{status}.tmp")):
        path.write_text("x")
    out, _ = actions.cleanup_job_status_file({"status_file": str(status)})
    assert sorted(out["removed"]) == sorted([str(status), f"{status}.tmp"])
    again, msg = actions.cleanup_job_status_file({"status_file": str(status)})
    assert again["removed"] == [] and "no files left" in msg
    missing_dir = {"status_file": str(work / "nope" / "c.json")}
    assert actions.cleanup_job_status_file(missing_dir)[0]["removed"] == []


def test_cleanup_stops_an_export_that_still_runs(work: Path) -> None:
    status = work / "forever.json"
    payload = {"delay_seconds": 0.2, "status_file": str(status), "never_ready": True}
    out, _ = actions.spawn_background_job(payload)
    payload["outputs"] = {"spawn_background_job": out}
    wait_until(lambda: status.exists(), what="the first status write")
    cleaned, msg = actions.cleanup_job_status_file(payload)
    assert cleaned["stopped_pid"] == out["worker_pid"] and "stopped" in msg
    assert not export_alive(out["worker_pid"])
    time.sleep(0.3)  # it would have rewritten the file by now if it still ran
    assert status_files(status) == []


def test_check_fails_fast_when_the_export_fails_or_dies(work: Path) -> None:
    status = work / "f.json"
    payload = {"delay_seconds": 0.1, "status_file": str(status), "fail_export": True}
    out, _ = actions.spawn_background_job(payload)
    payload["outputs"] = {"spawn_background_job": out}
    try:

        def failed() -> str | None:
            try:
                actions.check_job_status_file(payload)
            except RuntimeError as exc:
                return str(exc)
            return None

        assert "export failed" in wait_until(failed, what="FAILED")
    finally:
        actions.cleanup_job_status_file(payload)

    status = work / "k.json"
    payload = {"delay_seconds": 0.2, "status_file": str(status), "never_ready": True}
    out, _ = actions.spawn_background_job(payload)
    payload["outputs"] = {"spawn_background_job": out}
    try:
        wait_until(lambda: status.exists(), what="the first status write")
        os.kill(out["worker_pid"], 9)
        wait_until(lambda: not export_alive(out["worker_pid"]), what="the export to die")
        with pytest.raises(RuntimeError, match="exited before READY"):
            actions.check_job_status_file(payload)
    finally:
        actions.cleanup_job_status_file(payload)
    assert status_files(status) == []


SKILL = Path(actions.__file__).with_name("SKILL.md")


def test_skill_md_front_matter_and_by_hand_recipe(work: Path) -> None:
    """SKILL.md has its front matter, and its by-hand recipe runs as written."""
    text = SKILL.read_text()
    front, _, body = text.removeprefix("---\n").partition("\n---\n")
    fields = dict(line.split(": ", 1) for line in front.splitlines())
    assert fields["name"] == "async-job-watcher"
    assert "status file" in fields["description"] and "clean up" in fields["description"]
    blocks = body.split("```python\n")
    assert len(blocks) == 2, "one Python recipe"
    code = blocks[1].split("```")[0]
    assert "finally:" in code and "cleanup_job_status_file" in code
    status = work / "skill.status.json"
    scope: dict[str, Any] = {}
    exec(
        compile(code.replace("/tmp/export-42.status.json", str(status)), "SKILL.md", "exec"), scope
    )
    outputs = scope["payload"]["outputs"]
    assert outputs["verify_exported_artifact"]["verified"] is True
    assert status_files(status) == []
    for command in ("outlast submit async_job_watcher", "--payload", "outlast status", "--json"):
        assert command in body
