"""A worker in the store's registry of workers (``outlast workers``, ``GET /workers``) for as
long as it runs; see :meth:`outlast.store.Store.register_worker`. A registry that cannot be
written (a store briefly away) costs a warning, never the worker."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

from outlast.errors import OutlastError
from outlast.store import Store

log = logging.getLogger("outlast.worker")


@contextlib.contextmanager
def present(
    store: Store,
    kind: str,
    *,
    queues: Sequence[str] = (),
    concurrency: int | None = None,
    job_id: str | None = None,
) -> Iterator[None]:
    """Registered as ``kind`` inside, taken out on leaving (a death takes it out too: its
    liveness lock frees)."""
    try:
        store.register_worker(kind, queues=queues, concurrency=concurrency, job_id=job_id)
    except OutlastError as exc:
        log.warning("cannot enter the registry of workers: %s", exc)
    try:
        yield
    finally:
        with contextlib.suppress(OutlastError):
            store.unregister_worker()
