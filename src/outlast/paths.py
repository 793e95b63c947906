"""Where things live by default. Light on purpose: the CLI's fast path imports it."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is too heavy for the fast path
if TYPE_CHECKING:
    from typing import NoReturn


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


def normalize_store_url(url: object) -> tuple[str, str]:
    """``(scheme, where)`` of a store URL: the one place URLs are read (the CLI's fast path
    included). For the local stores ``where`` is the absolute path, however many slashes
    came before it (``sqlite:////abs/x.db``, SQLAlchemy's spelling, is ``/abs/x.db``); a
    relative path is refused. For PostgreSQL it is the URL itself.

    Raises :class:`~outlast.errors.InvalidInput` saying what is wrong.
    """
    if not isinstance(url, str):
        _invalid(f"a store URL must be a string, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        _invalid(
            f"not a store URL: {url!r}; use sqlite:///abs/path.db, files:///abs/dir "
            "or postgresql://host/db"
        )
    if scheme in ("sqlite", "files"):
        if not rest.startswith("/") or "\0" in rest:
            _invalid(
                f"{scheme} store URLs take an absolute path ({scheme}:///abs/path), not {rest!r}"
            )
        path = os.path.normpath("/" + rest.lstrip("/"))
        return scheme, path
    if scheme in ("postgresql", "postgres"):
        return "postgresql", url
    _invalid(f"unknown store scheme {scheme!r}; use sqlite, files or postgresql")


def _invalid(message: str) -> NoReturn:
    from outlast.errors import InvalidInput  # only now: the fast path imports nothing more

    raise InvalidInput(message)


def sqlite_side_dir(db_path: str) -> str:
    """The folder beside a SQLite store: ``locks/``, ``pulse/`` and ``logs/``."""
    return f"{db_path}.d"


def worker_file_name(worker: str) -> str:
    """A worker's name (``host:pid``) made path-safe."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in worker)


def liveness_lock_name(worker: str) -> str:
    """The file name of a worker process's liveness lock."""
    return f"@{worker_file_name(worker)}.lock"


def liveness_lock_path(url: str, worker: str) -> str | None:
    """Where the liveness lock of ``worker`` lives in a local store, or None."""
    scheme, rest = normalize_store_url(url)
    if scheme == "sqlite":
        return os.path.join(sqlite_side_dir(rest), "locks", liveness_lock_name(worker))
    if scheme == "files":
        return os.path.join(rest, ".outlast", "locks", liveness_lock_name(worker))
    return None


def worker_lock_path(url: str, job_id: str) -> str | None:
    """The worker lock file of a job in a local store, or None for other stores."""
    scheme, rest = normalize_store_url(url)
    if scheme == "sqlite":
        return os.path.join(sqlite_side_dir(rest), "locks", f"{job_id}.lock")
    if scheme == "files":
        return os.path.join(rest, f"{job_id}.worker.lock")
    return None
