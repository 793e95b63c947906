"""The store: where job state and events live. ``open_store(url)`` picks the adapter.

URLs: ``sqlite:///abs/path.db``, ``files:///abs/dir``, ``postgresql://…``. With no URL,
``$OUTLAST_STORE``, else SQLite in the user's state directory.
"""

from __future__ import annotations

import os
from typing import Any

from outlast import config, paths
from outlast.errors import InvalidInput
from outlast.store.base import (
    Applied,
    Capabilities,
    ChangeWatch,
    Listener,
    MaintenanceLock,
    Reconciler,
    Store,
    Transition,
    use_reconciler,
)
from outlast.store.common import parse_label, worker_name
from outlast.store.follower import Follower, follow, wait_until_due
from outlast.store.journal import Journal
from outlast.store.task import Reporter, Task

__all__ = [
    "Applied",
    "Capabilities",
    "ChangeWatch",
    "Follower",
    "Journal",
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
    "use_reconciler",
    "wait_until_due",
    "worker_name",
]


def default_url() -> str:
    """SQLite in the user's state directory, e.g. ``~/.local/state/outlast/outlast.db``."""
    return paths.default_store_url()


def store_class(url: str | None = None) -> type[Store]:
    """The class of the store at ``url`` (its module, and a database's driver, imported);
    raises :class:`InvalidInput` for a URL no store takes, or a missing driver."""
    scheme, _ = paths.normalize_store_url(url or config.store_url() or default_url())
    if scheme == "sqlite":
        from outlast.store.sqlite import SQLiteStore

        return SQLiteStore
    if scheme == "files":
        from outlast.store.files import FilesStore

        return FilesStore
    try:
        from outlast.store.postgresql import PostgresStore
    except ImportError as exc:
        raise InvalidInput(
            f"the PostgreSQL store is not available ({exc}); pip install 'outlast[postgres]'"
        ) from exc
    return PostgresStore


def open_store(url: str | None = None, *, create: bool = True) -> Store:
    """Open the store at ``url`` (or ``$OUTLAST_STORE``, or the default SQLite file).

    ``create=False`` is for callers that only read (``outlast status``, ``ls``, ``wait``,
    ``logs``): a local store that does not exist is then an error naming its path, and
    nothing is created.
    """
    scheme, where = paths.normalize_store_url(url or config.store_url() or default_url())
    if scheme in ("sqlite", "files") and not create and not os.path.exists(where):
        raise InvalidInput(
            f"no {scheme} store at {where} (nothing was created); check --store or $OUTLAST_STORE"
        )
    cls: Any = store_class(url)  # each engine's own constructor
    store: Store = cls(where) if scheme in ("sqlite", "files") else cls(where, create=create)
    return store
