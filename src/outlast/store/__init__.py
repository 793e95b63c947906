"""The store: where job state and events live. ``open_store(url)`` picks the adapter.

URLs: ``sqlite:///abs/path.db``, ``files:///abs/dir``, ``postgresql://…``. With no URL,
``$OUTLAST_STORE``, else SQLite in the user's state directory.
"""

from __future__ import annotations

from outlast import config, paths
from outlast.errors import InvalidInput
from outlast.store.base import (
    Applied,
    Capabilities,
    Listener,
    MaintenanceLock,
    Reconciler,
    Store,
    Transition,
)
from outlast.store.common import parse_label, worker_name
from outlast.store.follower import Follower, follow, wait_until_due
from outlast.store.task import Reporter, Task

__all__ = [
    "Applied",
    "Capabilities",
    "Follower",
    "Listener",
    "MaintenanceLock",
    "Reconciler",
    "Reporter",
    "Store",
    "Task",
    "Transition",
    "default_url",
    "follow",
    "open_store",
    "parse_label",
    "wait_until_due",
    "worker_name",
]


def default_url() -> str:
    """SQLite in the user's state directory, e.g. ``~/.local/state/outlast/outlast.db``."""
    return paths.default_store_url()


def open_store(url: str | None = None) -> Store:
    """Open the store at ``url`` (or ``$OUTLAST_STORE``, or the default SQLite file)."""
    url = url or config.store_url() or default_url()
    if not isinstance(url, str):
        raise InvalidInput(f"a store URL must be a string, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidInput(
            f"not a store URL: {url!r}; use sqlite:///abs/path.db, files:///abs/dir "
            "or postgresql://host/db"
        )
    if scheme in ("sqlite", "files"):
        if not rest.startswith("/") or "\0" in rest:
            raise InvalidInput(f"{scheme} store URLs take an absolute path: {scheme}:///abs/path")
        if scheme == "sqlite":
            from outlast.store.sqlite import SQLiteStore

            return SQLiteStore(rest)
        from outlast.store.files import FilesStore

        return FilesStore(rest)
    if scheme in ("postgresql", "postgres"):
        try:
            from outlast.store.postgresql import PostgresStore
        except ImportError as exc:
            raise InvalidInput(
                f"the PostgreSQL store is not available ({exc}); pip install 'outlast[postgres]'"
            ) from exc
        return PostgresStore(url)
    raise InvalidInput(f"unknown store scheme {scheme!r}; use sqlite, files or postgresql")
