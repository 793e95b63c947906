"""The Python API for function jobs: ``submit`` (queue for pools) and ``spawn`` (run detached).

Both take a registered job (the object ``@outlast.job`` returned, or its name) and JSON
arguments; anything that is not JSON is refused here, before anything is written.
"""

from __future__ import annotations

import threading
from typing import Any

from outlast import config
from outlast.errors import InvalidInput
from outlast.machine import check_json
from outlast.run import registry
from outlast.store import Store, Task, open_store

_default: Store | None = None
_default_lock = threading.Lock()


def use_store(store: Store | str | None) -> Store:
    """Set the store that ``submit``/``spawn`` use by default (a Store or a URL)."""
    global _default
    with _default_lock:
        _default = store if isinstance(store, Store) else open_store(store)
        return _default


def default_store() -> Store:
    """The store ``submit``/``spawn`` use when given none: ``$OUTLAST_STORE`` or the default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = open_store()
        return _default


def _spec(job: registry.JobSpec | str) -> registry.JobSpec:
    if isinstance(job, registry.JobSpec):
        return job
    if isinstance(job, str):
        return registry.lookup(job)
    raise InvalidInput(f"submit takes a registered job or its name, not {type(job).__name__}")


def create_job(
    store: Store,
    job: registry.JobSpec | str,
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    queue: str | None = None,
    labels: dict[str, str] | None = None,
    payload: dict[str, Any] | None = None,
) -> Task:
    """Record a pending function (or pipeline) job with its JSON arguments."""
    spec = _spec(job)
    check_json(args, "the job's arguments")
    check_json(kwargs, "the job's keyword arguments")
    if payload is not None and not isinstance(payload, dict):
        raise InvalidInput("a pipeline's payload must be a JSON object")
    body: dict[str, Any] = dict(payload or {})
    if spec.kind == "function":
        body.update(args=list(args), kwargs=dict(kwargs))
    else:
        for reserved in ("outputs", "stages", "cleanup", "finalize"):
            if reserved in body:
                raise InvalidInput(f"payload key {reserved!r} is reserved for the pipeline")
        body["cleanup"] = list(getattr(spec.fn, "cleanup_stages", []))
    body["module"] = spec.module
    if spec.timeout is not None:
        body["timeout"] = spec.timeout
    return store.create(
        kind=spec.kind,
        name=spec.name,
        labels=labels,
        queue=spec.queue if queue is None else queue,
        payload=body,
        max_attempts=spec.attempts or config.max_retries(),
    )


def submit(job: registry.JobSpec | str, *args: Any, **kwargs: Any) -> Task:
    """Queue ``job(*args, **kwargs)`` for the pools (``outlast worker``); returns its task."""
    return create_job(default_store(), job, list(args), kwargs)


def spawn(job: registry.JobSpec | str, *args: Any, **kwargs: Any) -> Task:
    """Run ``job(*args, **kwargs)`` in its own detached worker process, as ``outlast run`` does
    for commands; returns its task at once."""
    return spawn_spec(_spec(job), list(args), kwargs)


DEDICATED = "@dedicated"  # the queue of spawned jobs: pools never claim from it


def spawn_dedicated(store: Store, job_id: str) -> int:
    """Start the detached worker of a spawned job (also used to restart it for a retry)."""
    from outlast.run.spawn import start_detached

    return start_detached(store, job_id, ["-m", "outlast.run.dedicated", store.url, job_id])


def spawn_spec(
    spec: registry.JobSpec,
    args: list[Any],
    kwargs: dict[str, Any],
    payload: dict[str, Any] | None = None,
) -> Task:
    """Create a job of ``spec`` and start its dedicated detached worker."""
    if spec.module in ("", "__main__"):
        raise InvalidInput(
            f"job {spec.name!r} is defined in __main__; a detached worker cannot import it: "
            "define job functions in an importable module"
        )
    store = default_store()
    task = create_job(store, spec, args, kwargs, queue=DEDICATED, payload=payload)
    spawn_dedicated(store, task.id)
    return task
