"""Queueing many jobs at once: ``outlast.submit_many``, ``outlast submit --from-file`` and
``POST /jobs:batch`` share this.

Every job is checked (its call against the function's signature, its options) before any is
written; then they are inserted in batches of :attr:`Store.CREATE_BATCH`, one transaction
each on the SQL stores. A job that cannot be made is an error naming it (``job 3: …``), and
nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from outlast import when
from outlast.errors import InvalidInput, OutlastError
from outlast.model import Call, Kind
from outlast.run import registry
from outlast.run.api import Options, _spec, call_fields, default_store, job_fields, shared_fields
from outlast.run.registry import JobSpec
from outlast.store import Store, Task

#: Jobs one call may queue at most (a file is read and checked whole before it is written).
MANY_MAX = 1_000_000
#: The keys of a line that are its call (a line of only these shares the batch's options).
_CALL_KEYS = frozenset({"args", "kwargs", "payload"})
#: The keys a line of ``submit --from-file`` (or a job of ``POST /jobs:batch``) may have.
LINE_KEYS = frozenset(
    {"args", "kwargs", "payload", "queue", "labels", "priority", "delay", "timeout", "unique_key"}
)


def submit_many(
    job: JobSpec | str | Any, calls: Iterable[Any], store: Store | None = None
) -> list[Task]:
    """Queue one job per item of ``calls`` for the pools; returns their tasks, in order.

    An item is the call's positional arguments (a list or tuple) or its keyword arguments
    (a dict); for a pipeline, its payload (a dict). ``job`` may carry options for every
    job (``resize.options(queue="images")``). Much faster than ``submit`` in a loop: one
    transaction per :attr:`Store.CREATE_BATCH` jobs (BENCHMARKS.md, issue #18)."""
    spec, options = _spec_and_options(job)
    shared = shared_fields(spec, **options)
    made = _calls(spec, calls, shared["limit_key"])
    return (store or default_store()).create_many(made, common=shared)


def _calls(spec: JobSpec, calls: Iterable[Any], limit_key: str | None) -> list[dict[str, Any]]:
    """Each item of ``calls`` as :meth:`Store.create_many`'s fields of its job, checked as
    :func:`call_fields` checks one call; an error names the job."""
    if spec.kind == Kind.PIPELINE or (limit_key is None and spec.limit_key is not None):
        made = []  # a payload or a key per call: each made whole
        for n, item in enumerate(calls):
            if n >= MANY_MAX:
                raise InvalidInput(f"submit_many queues at most {MANY_MAX:,} jobs a call")
            made.append(_numbered(n, lambda item=item: _call_of(spec, item, limit_key)))
        return made
    # A function's call, nothing more, per job (the batch's template gives the rest: its
    # payload is empty and its limit key the batch's): what call_fields makes of it.
    module, root, check = spec.module, registry.module_root(spec.module), registry.check_call
    made = []
    n = 0
    try:
        for n, item in enumerate(calls):
            if n >= MANY_MAX:
                break
            kind = type(item)
            if kind is list or kind is tuple:
                args, kwargs = list(item), {}
            elif isinstance(item, Mapping):
                args, kwargs = [], dict(item)
            elif isinstance(item, Sequence) and not isinstance(item, str | bytes):
                args, kwargs = list(item), {}
            else:
                raise InvalidInput(
                    "a call is a list of arguments or a dict of keyword arguments, "
                    f"not {type(item).__name__}"
                )
            check(spec, args, kwargs)
            made.append({"call": Call(module, args, kwargs, root)})
    except OutlastError as exc:
        raise InvalidInput(f"job {n + 1}: {exc}") from None
    if n >= MANY_MAX:
        raise InvalidInput(f"submit_many queues at most {MANY_MAX:,} jobs a call")
    return made


def create_lines(store: Store, name: str, lines: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Queue one job of the registered ``name`` per line (a JSON object with the keys of
    :data:`LINE_KEYS`, all optional; ``delay`` a duration or seconds); every line is
    checked before any job is written."""
    spec = registry.lookup(name)
    made = []
    for n, line in enumerate(lines):
        if n >= MANY_MAX:
            raise InvalidInput(f"one batch holds at most {MANY_MAX:,} jobs")
        made.append(_numbered(n, lambda line=line: _fields_of_line(spec, line)))
    if not made:
        raise InvalidInput("no jobs given")
    return store.create_many(made, common=shared_fields(spec))


def read_jsonl(text: str) -> list[dict[str, Any]]:
    """The objects of a JSON Lines text (blank lines skipped); an error names the line."""
    found = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise InvalidInput(f"line {number}: not JSON ({exc})") from None
        if not isinstance(value, dict):
            raise InvalidInput(f"line {number}: a JSON object, not {type(value).__name__}")
        found.append(value)
    return found


def _numbered(n: int, make: Any) -> dict[str, Any]:
    try:
        fields: dict[str, Any] = make()
    except OutlastError as exc:
        raise InvalidInput(f"job {n + 1}: {exc}") from None
    return fields


def _spec_and_options(job: Any) -> tuple[JobSpec, dict[str, Any]]:
    if isinstance(job, Options):
        if job.connection is not None:
            raise InvalidInput("submit_many inserts in its own transactions: no connection=")
        if job.on_conflict != "return":
            raise InvalidInput("submit_many returns the live holder of a unique key: no raise")
        options = {"queue": job.queue, **job._fields()}
        options.pop("on_conflict")
        return job.spec, options
    return _spec(job), {}


def _call_of(spec: JobSpec, item: Any, limit_key: str | None) -> dict[str, Any]:
    if spec.kind == Kind.PIPELINE:
        if not isinstance(item, Mapping):
            raise InvalidInput(
                f"a pipeline's call is its payload object, not {type(item).__name__}"
            )
        return call_fields(spec, payload=item, limit_key=limit_key)
    if isinstance(item, Mapping):
        return call_fields(spec, (), item, limit_key=limit_key)
    if isinstance(item, Sequence) and not isinstance(item, str | bytes):
        return call_fields(spec, item, None, limit_key=limit_key)
    raise InvalidInput(
        f"a call is a list of arguments or a dict of keyword arguments, not {type(item).__name__}"
    )


def _fields_of_line(spec: JobSpec, line: Mapping[str, Any]) -> dict[str, Any]:
    """A line's fields: only its call's when it gives no options (the batch's shared fields
    are the job's own: checked once), else every field."""
    unknown = sorted(set(line) - LINE_KEYS)
    if unknown:
        raise InvalidInput(f"unknown keys {unknown} (known: {sorted(LINE_KEYS)})")
    args, kwargs, payload = line.get("args", []), line.get("kwargs", {}), line.get("payload")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise InvalidInput("args is a list and kwargs an object")
    if _CALL_KEYS.issuperset(line):
        return call_fields(spec, args, kwargs, payload)
    labels = line.get("labels")
    if labels is not None and not (
        isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
    ):
        raise InvalidInput("labels is an object of strings")
    run_after, _ = when.due_time(line.get("delay"), None)
    timeout = line.get("timeout")
    return job_fields(
        spec,
        args,
        kwargs,
        payload=payload,
        queue=line.get("queue"),
        labels=labels,
        priority=line.get("priority"),
        run_after=run_after,
        timeout=None if timeout is None else when.parse_duration(timeout, "timeout"),
        unique_key=line.get("unique_key"),
    )
