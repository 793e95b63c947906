"""The fast path of ``outlast status ID [--json] [--store URL]`` for local stores.

Scripts and agents run ``status`` in a loop, so it must cost little more than starting Python:
this reads the stored document with sqlite3 (or one file) and json alone, without the model,
the store, click or psutil. It answers only when that is exactly right: anything unusual (a
flag it does not know, a PostgreSQL store, a corrupt document, a job that looks abandoned and
needs reconciling) returns None, and the full CLI handles the call.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing is too heavy for the fast path
if TYPE_CHECKING:
    from typing import Any

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_STATUSES = frozenset({"pending", "running", "paused", "succeeded", "failed", "canceled"})


def _parse(argv: list[str]) -> tuple[str, bool, str | None] | None:
    """``status ID`` with ``--json`` and ``--store URL`` before or after the verb."""
    verb = 0
    while verb < len(argv) and argv[verb] != "status":  # only --json, --store before it
        arg = argv[verb]
        step = 2 if arg == "--store" else 1 if arg == "--json" or arg.startswith("--store=") else 0
        if not step:
            return None
        verb += step
    if verb >= len(argv):
        return None
    job_id, as_json, store = None, False, None
    rest = iter(argv[:verb] + argv[verb + 1 :])
    for arg in rest:
        if arg == "--json":
            as_json = True
        elif arg == "--store":
            store = next(rest, None)
            if store is None:
                return None
        elif arg.startswith("--store="):
            store = arg[len("--store=") :]
        elif arg.startswith("-") or job_id is not None:
            return None
        else:
            job_id = arg
    if job_id is None or len(job_id) > 128 or not job_id[:1].isalnum():
        return None
    if not set(job_id) <= _ID_CHARS:
        return None
    return job_id, as_json, store


def _read(url: str, job_id: str) -> dict[str, Any] | None:
    from outlast.paths import normalize_store_url

    scheme, path = normalize_store_url(url)  # a bad URL raises: the full path says why
    if scheme == "sqlite":
        import sqlite3

        if not os.path.exists(path):
            return None
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
        try:
            row = conn.execute("SELECT doc FROM jobs WHERE id = ?", (job_id,)).fetchone()
        finally:
            conn.close()
        raw = row[0] if row else None
    elif scheme == "files":
        try:
            with open(os.path.join(path, f"{job_id}.json"), "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
    else:
        return None
    if not raw:
        return None
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("id") != job_id or doc.get("status") not in _STATUSES:
        return None
    return doc


def _worker_gone(url: str, job_id: str, worker: str | None) -> bool:
    """True when neither the job's worker lock nor its worker's liveness lock is held."""
    from outlast.paths import liveness_lock_path, worker_lock_path

    job_lock = worker_lock_path(url, job_id)
    if job_lock is None:
        return False
    if not _lock_free(job_lock):
        return False
    alive = liveness_lock_path(url, worker) if worker else None
    return alive is None or _lock_free(alive)


def _lock_free(path: str) -> bool:
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def status(argv: list[str]) -> int | None:
    """Answer ``status`` from the stored document; None hands the call to the full CLI."""
    parsed = _parse(argv)
    if parsed is None:
        return None
    job_id, as_json, url = parsed
    if url is None:
        from outlast.paths import default_store_url

        url = os.environ.get("OUTLAST_STORE") or default_store_url()
    try:
        doc = _read(url, job_id)
        if doc is None:
            return None
        status = doc["status"]
        worker = doc.get("worker")
        if (status == "running" or (status == "pending" and worker)) and _worker_gone(
            url, job_id, worker
        ):
            return None  # looks abandoned: the full path reconciles it
        retries: list[str] = []
        if not as_json and status in ("succeeded", "failed", "canceled"):
            found = _retries(url, job_id)  # the full path says which jobs retried it too
            if found is None:
                return None
            retries = found
    except Exception:  # anything odd: let the full path say it properly
        return None
    from outlast.cli import render

    sys.stdout.write((render.dumps(doc) if as_json else render.job_text(doc)) + "\n")
    if retries:
        sys.stdout.write(f"retried as: {' '.join(retries)}\n")
    return 0


def _retries(url: str, job_id: str) -> list[str] | None:
    """The jobs that retry ``job_id`` (SQLite: one indexed query; files: its ``.retries``
    list); None where only the full path can tell."""
    from outlast.paths import normalize_store_url

    scheme, path = normalize_store_url(url)
    if scheme == "files":
        try:
            with open(os.path.join(path, f"{job_id}.retries"), "rb") as handle:
                listed = handle.read().decode("utf-8", "replace").split()
        except FileNotFoundError:
            return []
        if not all(set(i) <= _ID_CHARS for i in listed):
            return None
        return [i for i in listed if os.path.exists(os.path.join(path, f"{i}.json"))]
    if scheme != "sqlite":
        return None
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    try:
        sql = "SELECT id FROM jobs WHERE retry_of = ? ORDER BY created_at"
        return [row[0] for row in conn.execute(sql, (job_id,))]
    finally:
        conn.close()
