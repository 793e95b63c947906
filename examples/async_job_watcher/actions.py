"""The four actions of the async job watcher (see SKILL.md), each ``fn(payload) -> (out, msg)``.

1. :func:`spawn_background_job` starts the export (``export_job.py``) as a detached process.
2. :func:`check_job_status_file` reads its status file once (poll it until ``READY``).
3. :func:`verify_exported_artifact` checks the READY report and the artifact's real checksum.
4. :func:`cleanup_job_status_file` stops the export if it still runs and removes its files;
   run it whatever happened to 2-3 (``finally:``, or the pipeline's ``ALL_DONE`` rule).

Files, for a payload ``{"status_file": S}`` (``S`` an absolute path in an existing directory):

- ``S``: the JSON status file the export rewrites atomically (via ``S.tmp`` + rename);
- ``S.tmp``: its temporary file, present only during a write;
- ``S.log``: the export's stderr;
- the artifact, ``payload["artifact_path"]`` or ``S + ".csv"`` (and its ``.tmp`` while written).

Cleanup removes ``S``, ``S.tmp`` and ``S.log`` always, and the artifact only when this run
produced it and it was not verified (a rejected or unchecked export is never left behind; a
verified one is the deliverable and stays).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SPAWN = "spawn_background_job"
AWAIT = "await_job_completion"
VERIFY = "verify_exported_artifact"
CLEANUP = "cleanup_job_status_file"

READY = "READY"
NOT_READY = "PENDING"  # the status before the export has written its status file
EXPORT_SCRIPT = Path(__file__).with_name("export_job.py")
MAX_DELAY = 3600.0
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL when cleanup stops the export

#: Test and demo knobs of the payload, and the export's flag for each.
KNOBS = {
    "never_ready": "--never-ready",
    "corrupt_sha": "--corrupt-sha",
    "empty_sha": "--empty-sha",
    "tamper_artifact": "--tamper",
    "fail_export": "--fail",
}

Payload = dict[str, Any]


# ---------------------------------------------------------------- payload helpers
def _status_file(payload: Any) -> str:
    """The payload's ``status_file``: an absolute path; else ``ValueError`` saying why."""
    if not isinstance(payload, dict):
        raise ValueError(f"the payload must be a JSON object, not {type(payload).__name__}")
    path = payload.get("status_file")
    if path is None or path == "":
        raise ValueError(
            "payload['status_file'] is missing: give the absolute path of the status file "
            'the background job should write, e.g. {"status_file": "/tmp/export.status.json"}'
        )
    if not isinstance(path, str) or "\0" in path:
        raise ValueError(f"payload['status_file'] must be a path string, not {path!r}")
    if not os.path.isabs(path):
        raise ValueError(
            f"payload['status_file'] must be an absolute path (workers may run in another "
            f"directory), not {path!r}"
        )
    if path.endswith(os.sep):
        raise ValueError(f"payload['status_file'] must name a file, not a directory: {path!r}")
    return os.path.normpath(path)


def _artifact_path(payload: Payload, status_file: str) -> str:
    path = payload.get("artifact_path")
    if path is None:
        return status_file + ".csv"
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise ValueError(f"payload['artifact_path'] must be an absolute path, not {path!r}")
    return os.path.normpath(path)


def _delay(payload: Payload) -> float:
    value = payload.get("delay_seconds", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"payload['delay_seconds'] must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"payload['delay_seconds'] must be >= 0 seconds, not {value!r}")
    if value > MAX_DELAY:
        raise ValueError(f"payload['delay_seconds'] must be at most {MAX_DELAY:g}, not {value!r}")
    return float(value)


def _rows(payload: Payload) -> int:
    value = payload.get("rows", 100)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"payload['rows'] must be a whole number >= 0, not {value!r}")
    return value


def _check_directory(path: str, what: str) -> None:
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise ValueError(f"the directory of {what} does not exist: {parent!r} (for {path!r})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the directory of {what} is not writable: {parent!r}")
    if os.path.isdir(path):
        raise ValueError(f"{what} is a directory, not a file: {path!r}")


def _outputs(payload: Payload) -> dict[str, Any]:
    outputs = payload.get("outputs")
    return outputs if isinstance(outputs, dict) else {}


def _spawned_pid(payload: Payload) -> int | None:
    spawned = _outputs(payload).get(SPAWN)
    pid = spawned.get("worker_pid") if isinstance(spawned, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _is_our_export(pid: int | None, status_file: str) -> bool:
    """True when ``pid`` is a live (not zombie) export process writing ``status_file``.

    The command line is checked, so a reused PID is never mistaken for the export.
    """
    if pid is None:
        return False
    import psutil  # an outlast dependency; imported here to keep the import of this module light

    deadline = time.monotonic() + 2.0
    while True:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        # An empty command line: the process is in the middle of exec() or of exiting.
        if cmdline or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return any(arg.endswith(EXPORT_SCRIPT.name) for arg in cmdline) and status_file in cmdline


# ---------------------------------------------------------------- stage 1
def spawn_background_job(payload: Payload) -> tuple[dict[str, Any], str]:
    """Start the export as a detached process; ``payload``: ``{"delay_seconds": 1.0,
    "status_file": "<abs path>"}`` (plus optional ``artifact_path``, ``rows`` and the test
    knobs ``never_ready``, ``corrupt_sha``, ``empty_sha``, ``tamper_artifact``,
    ``fail_export``).

    Returns ``({"status_file", "target_delay_seconds", "worker_pid"}, msg)``. Raises
    ``ValueError`` for a bad payload, before anything is started.
    """
    status_file = _status_file(payload)
    delay = _delay(payload)
    rows = _rows(payload)
    artifact = _artifact_path(payload, status_file)
    _check_directory(status_file, "the status file")
    _check_directory(artifact, "the artifact")
    if os.path.lexists(status_file):
        raise ValueError(
            f"the status file already exists: {status_file!r}; another export may be using it "
            "(choose another path, or run cleanup_job_status_file for the old one first)"
        )
    flags = []
    for key, flag in KNOBS.items():
        value = payload.get(key, False)
        if not isinstance(value, bool):
            raise ValueError(f"payload[{key!r}] must be true or false, not {value!r}")
        if value:
            flags.append(flag)
    argv = [
        sys.executable,
        str(EXPORT_SCRIPT),
        "--status-file",
        status_file,
        "--artifact",
        artifact,
        "--delay",
        repr(delay),
        "--rows",
        str(rows),
        *flags,
    ]
    log = os.open(
        status_file + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
    )
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # detached: no terminal, its own session and group
            close_fds=True,
            cwd=os.path.dirname(status_file),
        )
    finally:
        os.close(log)
    # Reap it when it ends, so a long-lived caller (a pool's job process) keeps no zombie.
    threading.Thread(target=proc.wait, name=f"reap-export-{proc.pid}", daemon=True).start()
    out = {"status_file": status_file, "target_delay_seconds": delay, "worker_pid": proc.pid}
    return out, f"spawned background export pid {proc.pid}; ready in about {delay:g}s"


# ---------------------------------------------------------------- stage 2
def check_job_status_file(payload: Payload) -> tuple[dict[str, Any], str]:
    """Read the status file once: ``({"job_status", "progress_pct", "artifact_rows",
    "artifact_sha256"}, msg)``.

    Before the export has written it, ``job_status`` is ``PENDING`` (progress 0). Raises
    ``RuntimeError`` when the export reported ``FAILED``, or died before ``READY`` (polling
    further could only time out).
    """
    status_file = _status_file(payload)
    try:
        with open(status_file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        doc: dict[str, Any] = {"job_status": NOT_READY, "progress_pct": 0}
    else:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise RuntimeError(f"the status file {status_file!r} is not valid: {exc}") from None
    out = {
        "job_status": str(doc.get("job_status", NOT_READY)),
        "progress_pct": int(doc.get("progress_pct") or 0),
        "artifact_rows": int(doc.get("artifact_rows") or 0),
        "artifact_sha256": str(doc.get("artifact_sha256") or ""),
    }
    if out["job_status"] == "FAILED":
        raise RuntimeError(f"the background export failed: {doc.get('error', 'no reason given')}")
    if out["job_status"] != READY:
        pid = doc.get("pid") if isinstance(doc.get("pid"), int) else _spawned_pid(payload)
        if pid is not None and not _is_our_export(pid, status_file):
            # Re-read: it may have written READY and exited since we read the file.
            with contextlib.suppress(OSError, ValueError), open(status_file, "rb") as f:
                if json.loads(f.read()).get("job_status") == READY:
                    return check_job_status_file(payload)
            raise RuntimeError(
                f"the background export (pid {pid}) exited before {READY} "
                f"(last status {out['job_status']} {out['progress_pct']}%; "
                f"see {status_file}.log)"
            )
    return out, f"{out['job_status']} {out['progress_pct']}%"


# ---------------------------------------------------------------- stage 3
def verify_exported_artifact(payload: Payload) -> tuple[dict[str, Any], str]:
    """Check the READY report in ``payload["outputs"]["await_job_completion"]``.

    Raises ``RuntimeError`` when ``artifact_rows <= 0``, ``artifact_sha256`` is empty, the
    artifact is missing, its sha256 differs from the reported one, or its row count differs.
    Returns ``({"verified": True, "artifact_rows", "artifact_sha256"}, msg)``.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"the payload must be a JSON object, not {type(payload).__name__}")
    report = _outputs(payload).get(AWAIT)
    if not isinstance(report, dict):
        raise ValueError(
            f"payload['outputs'][{AWAIT!r}] is missing: poll check_job_status_file until "
            f"{READY} and store its output there first"
        )
    if report.get("job_status", READY) != READY:
        raise RuntimeError(f"the export is not {READY}: job_status={report.get('job_status')!r}")
    rows = report.get("artifact_rows")
    sha = report.get("artifact_sha256")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0:
        raise RuntimeError(f"the export is empty or invalid: artifact_rows={rows!r} (must be > 0)")
    if not isinstance(sha, str) or not sha:
        raise RuntimeError("the export reported no checksum: artifact_sha256 is empty")
    artifact = _artifact_path(payload, _status_file(payload))
    try:
        with open(artifact, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise RuntimeError(f"cannot read the artifact {artifact!r}: {exc}") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha.lower():
        raise RuntimeError(
            f"artifact checksum mismatch for {artifact!r}: reported {sha}, file has {actual}"
        )
    data_rows = max(0, sum(1 for _ in csv.reader(data.decode(errors="replace").splitlines())) - 1)
    if data_rows != rows:
        raise RuntimeError(f"artifact row count mismatch: reported {rows}, file has {data_rows}")
    out = {"verified": True, "artifact_rows": rows, "artifact_sha256": actual}
    return out, f"verified {rows} rows, sha256 {actual[:12]}…"


# ---------------------------------------------------------------- stage 4
def _stop_export(pid: int | None, status_file: str) -> int | None:
    """SIGTERM the export if it still runs (SIGKILL after a grace); its pid if it did."""
    if not _is_our_export(pid, status_file):
        return None
    assert pid is not None
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
        try:
            os.killpg(pid, sig)  # it leads its own group (start_new_session)
        except ProcessLookupError:
            return pid
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _is_our_export(pid, status_file):
                return pid
            time.sleep(0.02)
    return pid


def _remove(path: str, removed: list[str], skipped: list[str]) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        skipped.append(path)  # never ours: spawn refuses such paths
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RuntimeError(f"cannot remove {path!r}: {exc}") from None
    removed.append(path)


def cleanup_job_status_file(payload: Payload) -> tuple[dict[str, Any], str]:
    """Stop the export if it still runs and remove ``status_file`` and ``status_file + ".tmp"``
    (plus its log, and the artifact unless it was verified). Idempotent, and safe with any
    payload: one without a usable ``status_file`` has nothing to clean.

    Returns ``({"status_file", "removed", "stopped_pid", "artifact_kept"}, msg)``.
    """
    nothing: dict[str, Any] = {
        "status_file": None,
        "removed": [],
        "stopped_pid": None,
        "artifact_kept": False,
    }
    try:
        status_file = _status_file(payload)
    except ValueError as exc:
        return nothing, f"nothing to clean: {exc}"
    outputs = payload.get("outputs")
    if isinstance(outputs, dict) and SPAWN not in outputs:
        # A pipeline run whose spawn stage did not succeed started nothing: a file at that
        # path, if any, belongs to someone else.
        return {**nothing, "status_file": status_file}, (
            f"nothing to clean: {SPAWN} did not run, so no background job was started"
        )
    stopped = _stop_export(_spawned_pid(payload), status_file)
    removed: list[str] = []
    skipped: list[str] = []
    for path in (status_file, status_file + ".tmp", status_file + ".log"):
        _remove(path, removed, skipped)
    artifact_kept = True
    try:
        artifact = _artifact_path(payload, status_file)
    except ValueError:
        artifact = None
    if artifact is not None:
        _remove(artifact + ".tmp", removed, skipped)
        verified = _outputs(payload).get(VERIFY)
        if SPAWN in _outputs(payload) and not (
            isinstance(verified, dict) and verified.get("verified") is True
        ):
            _remove(artifact, removed, skipped)
            artifact_kept = False
        else:
            artifact_kept = os.path.exists(artifact)
    out = {
        "status_file": status_file,
        "removed": removed,
        "stopped_pid": stopped,
        "artifact_kept": artifact_kept,
    }
    parts = [f"removed {len(removed)} file(s)" if removed else "no files left to remove"]
    if stopped is not None:
        parts.append(f"stopped the background export (pid {stopped})")
    if skipped:
        parts.append(f"left {len(skipped)} directory path(s) alone: {skipped}")
    return out, "; ".join(parts)
