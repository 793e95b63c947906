"""Where things live by default. Light on purpose: the CLI's fast path imports it."""

from __future__ import annotations

import os
import sys


def state_dir() -> str:
    """The user's state directory for outlast (platformdirs' ``user_state_dir``; on Linux the
    XDG rule, computed here without importing platformdirs)."""
    if sys.platform.startswith("linux"):
        base = os.environ.get("XDG_STATE_HOME", "").strip()
        if not base or not os.path.isabs(base):
            base = os.path.join(os.path.expanduser("~"), ".local", "state")
        return os.path.join(base, "outlast")
    import platformdirs

    return str(platformdirs.user_state_dir("outlast"))


def default_store_url() -> str:
    return f"sqlite://{os.path.join(state_dir(), 'outlast.db')}"


def sqlite_side_dir(db_path: str) -> str:
    """The folder beside a SQLite store: ``locks/``, ``pulse/`` and ``logs/``."""
    return f"{db_path}.d"


def liveness_lock_name(worker: str) -> str:
    """The file name of a worker process's liveness lock (``host:pid`` made path-safe)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in worker)
    return f"@{safe}.lock"


def liveness_lock_path(url: str, worker: str) -> str | None:
    """Where the liveness lock of ``worker`` lives in a local store, or None."""
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        return os.path.join(sqlite_side_dir(rest), "locks", liveness_lock_name(worker))
    if scheme == "files":
        return os.path.join(rest, ".outlast", "locks", liveness_lock_name(worker))
    return None


def worker_lock_path(url: str, job_id: str) -> str | None:
    """The worker lock file of a job in a local store, or None for other stores."""
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        return os.path.join(sqlite_side_dir(rest), "locks", f"{job_id}.lock")
    if scheme == "files":
        return os.path.join(rest, f"{job_id}.worker.lock")
    return None
