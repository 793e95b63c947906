"""The background export job that ``spawn_background_job`` starts as a detached process.

It stands in for a slow export service: over ``--delay`` seconds it advances ``progress_pct``
in a JSON status file, writes a CSV artifact of ``--rows`` data rows, and finishes with::

    {"job_status": "READY", "progress_pct": 100, "artifact_rows": N, "artifact_sha256": "…"}

Every write of the status file (and of the artifact) is atomic: the bytes go to ``PATH.tmp``,
are fsynced, then renamed over ``PATH`` (and the directory fsynced), so a reader never sees a
half-written file. On SIGTERM or SIGINT it removes its ``.tmp`` files and exits.

Knobs for tests and demos (all off by default):

- ``--rows 0``: an empty export (header only); verification rejects it.
- ``--never-ready``: progress stalls below 100 and READY is never written (a poll timeout).
- ``--corrupt-sha``: READY carries a checksum that is not the artifact's.
- ``--empty-sha``: READY carries an empty checksum.
- ``--tamper``: the artifact changes after its checksum was taken (the file no longer matches).
- ``--fail``: the export fails: the status file says ``FAILED`` with an ``error``.

Standard library only; runnable by path (``python export_job.py …``) or as
``python -m examples.async_job_watcher.export_job …``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

STEPS = 5  # progress updates before READY
NEVER_READY_LIMIT = 600.0  # seconds a --never-ready job lives if nobody stops it


def fsync_dir(path: str) -> None:
    """Make a rename in ``path``'s directory durable."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path + ".tmp"``, fsync it, rename it over ``path``, fsync the dir."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def csv_bytes(rows: int) -> bytes:
    """A small, deterministic export: a header and ``rows`` data rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "name", "amount_cents"])
    for i in range(1, rows + 1):
        writer.writerow([i, f"customer-{i:05d}", (i * 7919) % 100000])
    return out.getvalue().encode()


class Export:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.status_file: str = args.status_file
        self.artifact: str = args.artifact

    def status(self, job_status: str, progress: int, **extra: Any) -> None:
        doc = {
            "job_status": job_status,
            "progress_pct": progress,
            "artifact_rows": 0,
            "artifact_sha256": "",
            "artifact_path": self.artifact,
            "pid": os.getpid(),
            "updated_at": datetime.now(UTC).isoformat(),
            **extra,
        }
        write_atomic(self.status_file, json.dumps(doc, sort_keys=True).encode() + b"\n")

    def run(self) -> int:
        args = self.args
        self.status("RUNNING", 0)
        pause = args.delay / STEPS
        for step in range(1, STEPS):
            time.sleep(pause)
            self.status("RUNNING", step * 100 // STEPS)
        if args.never_ready:
            end = time.monotonic() + NEVER_READY_LIMIT
            while time.monotonic() < end:
                time.sleep(max(pause, 0.05))
                self.status("RUNNING", (STEPS - 1) * 100 // STEPS)
            return 1
        time.sleep(pause)
        if args.fail:
            self.status("FAILED", (STEPS - 1) * 100 // STEPS, error="the export source refused")
            return 1
        write_atomic(self.artifact, csv_bytes(args.rows))
        sha = sha256_file(self.artifact)
        if args.tamper:  # the file changes after it was hashed: verification must notice
            with open(self.artifact, "a") as f:
                f.write("999999,tampered,0\n")
        if args.corrupt_sha:
            sha = hashlib.sha256(b"not the artifact").hexdigest()
        if args.empty_sha:
            sha = ""
        self.status("READY", 100, artifact_rows=args.rows, artifact_sha256=sha)
        return 0

    def remove_temporaries(self) -> None:
        for path in (self.status_file + ".tmp", self.artifact + ".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(path)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="A fake background export (status file + CSV).")
    parser.add_argument("--status-file", required=True)
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=100)
    for flag in ("--never-ready", "--corrupt-sha", "--empty-sha", "--tamper", "--fail"):
        parser.add_argument(flag, action="store_true")
    args = parser.parse_args(argv)
    if not args.delay >= 0 or args.rows < 0:
        parser.error("--delay and --rows must be >= 0")
    return args


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    export = Export(args)
    try:
        return export.run()
    finally:
        export.remove_temporaries()


if __name__ == "__main__":
    sys.exit(main())
