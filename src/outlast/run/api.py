"""The Python API for creating jobs: the one place each kind of job is created.

- ``submit(job, …)`` queues a registered function (or pipeline) for the pools;
- ``spawn(job, …)`` runs it in a dedicated detached worker, now;
- ``run_command(argv, …)`` runs a command in a detached supervisor.

The CLI, the HTTP edge (and later the MCP server) call these: no edge creates a job itself.
Anything that is not JSON is refused here, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outlast import config
from outlast.errors import InvalidInput, OutlastError, StoreError
from outlast.ids import DEDICATED
from outlast.model import Call, ErrorInfo, Kind, PipelineState
from outlast.run import registry
from outlast.run import spawn as spawner
from outlast.run.registry import JobSpec
from outlast.stages import OUTPUTS
from outlast.store import Store, Task, open_store

_default: Store | None = None
_default_lock = threading.Lock()


def use_store(store: Store | str | None) -> Store:
    """Set the store that ``submit``/``spawn``/``run_command`` use by default (a Store or a
    URL)."""
    global _default
    with _default_lock:
        _default = store if isinstance(store, Store) else open_store(store)
        return _default


def default_store() -> Store:
    """The store the API uses when given none: ``$OUTLAST_STORE`` or the default."""
    global _default
    with _default_lock:
        if _default is None:
            _default = open_store()
        return _default


class Job(JobSpec):
    """A function registered with ``@outlast.job``: call it to run it here, or queue it."""

    def submit(self, *args: Any, **kwargs: Any) -> Task:
        """Queue a job for the pools (see :func:`outlast.submit`)."""
        return submit(self, *args, **kwargs)

    def spawn(self, *args: Any, **kwargs: Any) -> Task:
        """Run a job in its own detached worker (see :func:`outlast.spawn`)."""
        return spawn(self, *args, **kwargs)


def job(
    name: str | None = None,
    *,
    attempts: int | None = None,
    timeout: float | None = None,
    queue: str = "default",
) -> Callable[[Callable[..., Any]], Job]:
    """Register a function as a job: ``@outlast.job(name="resize", attempts=3)``.

    The name defaults to ``module.function``. The function takes JSON arguments and returns
    a JSON result; inside it, :func:`outlast.current` gives the reporter, the answer after a
    resume and cooperative cancel checks.
    """
    if callable(name):  # used bare: @outlast.job
        fn, name = name, None
        return job()(fn)  # type: ignore[return-value,unused-ignore]
    registry.check_options(attempts, timeout, queue)

    def decorate(fn: Callable[..., Any]) -> Job:
        if not callable(fn) or isinstance(fn, type):
            raise InvalidInput("@outlast.job decorates a function")
        spec_name = name or f"{fn.__module__}.{fn.__qualname__}"
        spec = Job(spec_name, fn, attempts, timeout, queue)
        registry.register(spec)
        return spec

    return decorate


def _spec(job: object) -> JobSpec:
    """The registered job behind ``job``: a spec, a pipeline (its ``spec``), or a name."""
    if isinstance(job, JobSpec):
        return job
    if isinstance(getattr(job, "spec", None), JobSpec):
        return job.spec  # type: ignore[attr-defined,no-any-return]
    if isinstance(job, str):
        return registry.lookup(job)
    raise InvalidInput(f"expected a registered job or its name, not {type(job).__name__}")


def create_job(
    store: Store,
    job: JobSpec | str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    labels: Mapping[str, str] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> Task:
    """Record a pending function (or pipeline) job with its JSON arguments.

    A function takes ``args`` and ``kwargs`` (and may carry a ``payload`` of the caller's
    data); a pipeline takes a ``payload`` object, its input, and no arguments.
    """
    spec = _spec(job)
    args, kwargs = list(args), dict(kwargs or {})  # checked (JSON) and frozen by the store
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidInput(f"a payload must be a JSON object, not {type(payload).__name__}")
    pipeline = None
    if spec.kind == Kind.PIPELINE:
        if args or kwargs:
            raise InvalidInput(f"pipeline {spec.name!r} takes a payload object, not arguments")
        if payload is not None and OUTPUTS in payload:
            raise InvalidInput(
                f"payload key {OUTPUTS!r} is where a pipeline keeps its stages' outputs; "
                "use another name"
            )
        pipeline = PipelineState(cleanup=spec.cleanup)
    return store.create(
        kind=spec.kind,
        name=spec.name,
        labels=labels,
        queue=spec.queue if queue is None else queue,
        payload=dict(payload or {}),
        max_attempts=spec.attempts or config.max_retries(),
        call=Call(spec.module, args, kwargs),
        timeout=spec.timeout,
        pipeline=pipeline,
    )


def _split(spec: JobSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``submit``/``spawn``'s arguments as ``create_job``'s: a pipeline's one positional
    argument (or ``payload=``) is its payload."""
    if spec.kind != Kind.PIPELINE:
        return {"args": args, "kwargs": kwargs}
    payload = kwargs.pop("payload", None)
    if len(args) == 1 and payload is None:
        payload = args[0]
    elif args:
        raise InvalidInput(f"pipeline {spec.name!r} takes one payload object")
    if kwargs:
        raise InvalidInput(f"pipeline {spec.name!r} takes a payload, not {sorted(kwargs)}")
    return {"payload": payload}


def submit(job: JobSpec | str | Any, *args: Any, **kwargs: Any) -> Task:
    """Queue ``job(*args, **kwargs)`` (a pipeline: ``submit(pipeline, payload)``) for the
    pools (``outlast worker``); returns its task."""
    spec = _spec(job)
    return create_job(default_store(), spec, **_split(spec, args, kwargs))


def spawn(job: JobSpec | str | Any, *args: Any, **kwargs: Any) -> Task:
    """Run ``job(*args, **kwargs)`` (a pipeline: ``spawn(pipeline, payload)``) in its own
    detached worker, as ``run_command`` does for commands; returns its task at once."""
    spec = _spec(job)
    return spawn_job(default_store(), spec, **_split(spec, args, kwargs))


def spawn_job(
    store: Store,
    job: JobSpec | str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> Task:
    """Create a job of ``job`` in the reserved ``@dedicated`` queue (pools never claim it)
    and start its dedicated detached worker."""
    spec = _spec(job)
    if spec.module in ("", "__main__"):
        raise InvalidInput(
            f"job {spec.name!r} is defined in __main__; a detached worker cannot import it: "
            "define job functions in an importable module"
        )
    task = create_job(store, spec, args, kwargs, queue=DEDICATED, labels=labels, payload=payload)
    _start(task, lambda: spawner.spawn_dedicated(store, task.id))
    return task


def run_command(
    argv: Sequence[str],
    *,
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    attempts: int = 1,
    grace: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    store: Store | None = None,
) -> Task:
    """Run ``argv`` as a detached command job and return its task at once.

    A supervisor process, in a new session with no terminal, runs the command in its own
    process group with ``OUTLAST_JOB_ID`` and ``OUTLAST_STORE`` set, its output going to the
    job's log, and records how it ended; it retries with backoff while ``attempts`` are left.
    ``cwd`` and ``env`` default to this process's; they are kept beside the store (0600),
    not in the job document, since an environment can hold secrets. ``grace``: seconds
    between SIGTERM and SIGKILL when the job is canceled (None: the supervisor's 10 s).
    """
    from outlast.run.logs import max_bytes

    if isinstance(argv, str) or not isinstance(argv, Sequence):
        raise InvalidInput("argv must be a list of strings: the command and its arguments")
    max_bytes()  # a bad $OUTLAST_LOG_MAX_BYTES is refused before anything is written
    store = store or default_store()
    env = dict(os.environ if env is None else env)
    try:  # first, so that a full disk fails the call before anything is recorded
        written = spawner.write_context(store, cwd or os.getcwd(), env)
    except OSError as exc:
        raise StoreError(f"cannot save the command's environment: {exc}") from exc
    try:
        task = store.create(
            kind=Kind.COMMAND,
            command=list(argv),
            name=name,
            labels=labels,
            max_attempts=attempts,
            grace=grace,
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(written)
        raise

    def start() -> None:
        spawner.adopt_context(store, written, task.id)
        spawner.spawn_supervisor(store, task.id)

    _start(task, start)
    return task


def _start(task: Task, start: Callable[[], Any]) -> None:
    """Start a new job's detached worker; if that fails (no processes left, a full disk),
    the job fails at once, not retried, and the error says why, instead of waiting forever
    (if even that cannot be written, the error says the job stays pending)."""
    try:
        start()
    except OSError as exc:
        error = ErrorInfo("error", f"cannot start the job's worker: {exc}", type="OSError")
        try:
            task.fail(error, retry=False)
        except OutlastError as also:
            raise StoreError(
                f"cannot start the worker of job {task.id} ({exc}), nor record that it "
                f"failed ({also}): it stays pending; remove it with `outlast rm --force`"
            ) from exc
        raise StoreError(f"cannot start the worker of job {task.id}: {exc}") from exc
