"""The Python API for creating jobs: the one place each kind of job is created.

- ``submit(job, …)`` queues a registered function (or pipeline) for the pools;
- ``spawn(job, …)`` runs it in a dedicated detached worker, now;
- ``run_command(argv, …)`` runs a command in a detached supervisor;
- ``schedule(job_or_argv, cron=… | every=…, …)`` makes one of them at each fire time.

Each takes ``delay`` (a duration: ``90``, ``"15m"``) or ``at`` (an aware time or ISO 8601 text)
to run later, ``timeout`` and ``keep``. For a function's own call, these options go through
``job.options(delay=…, timeout=…).submit(*args, **kwargs)``, so they can never collide with
the function's keyword arguments.

The CLI, the HTTP edge (and later the MCP server) call these: no edge creates a job itself.
Anything that is not JSON is refused here, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from outlast import config, machine, when
from outlast.errors import InvalidInput, JobActive, JobNotFound, OutlastError, StoreError
from outlast.ids import DEDICATED
from outlast.model import Call, ErrorInfo, JobState, Kind, PipelineState, Schedule, utcnow
from outlast.run import registry, schedules, tracing
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

    def options(
        self,
        *,
        delay: object = None,
        at: object = None,
        timeout: object = None,
        keep: object = None,
        queue: str | None = None,
        labels: Mapping[str, str] | None = None,
        attempts: int | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
        on_conflict: str = "return",
        connection: Any = None,
        limit_key: str | None = None,
        limit: int | None = None,
    ) -> Options:
        """This job with options for one call: ``job.options(delay="10m").submit(x)``.

        ``delay`` (seconds or ``"15m"``) or ``at`` (an aware time or ISO 8601 text): not to
        run before then (a time already past runs now). ``timeout``: the attempt is stopped
        then (code ``timeout``). ``keep``: how long the finished job is kept. ``queue``,
        ``labels``, ``attempts``, ``priority`` as in ``@outlast.job``. ``unique_key``: while
        a live job holds it, submitting returns that job (``on_conflict="return"``) or raises
        ``DuplicateJob`` (``"raise"``). ``connection`` (PostgreSQL): an open psycopg
        connection; ``.submit`` inserts the job in its transaction (it exists only if that
        commits). Checked here, before anything is stored."""
        options = Options(self, delay, at, timeout, keep, queue, labels, attempts, priority)
        options.unique_key, options.on_conflict = unique_key, on_conflict
        options.connection = connection
        machine.check_limit(limit_key, limit)
        options.limit_key, options.limit = limit_key, limit
        return options


class Options:
    """A registered job with per-call options (see :meth:`Job.options`)."""

    def __init__(
        self,
        spec: JobSpec,
        delay: object,
        at: object,
        timeout: object,
        keep: object,
        queue: str | None,
        labels: Mapping[str, str] | None,
        attempts: int | None,
        priority: int | None = None,
    ) -> None:
        self.spec = spec
        self.priority = None if priority is None else machine.check_priority(priority)
        self.unique_key: str | None = None
        self.on_conflict = "return"
        self.connection: Any = None
        self.limit_key: str | None = None
        self.limit: int | None = None
        self.run_after, self.past = when.due_time(delay, at)
        self.timeout = None if timeout is None else when.parse_duration(timeout, "timeout")
        self.keep = None if keep is None else when.parse_duration(keep, "keep")
        registry.check_options(attempts, self.timeout, queue or spec.queue)
        self.queue, self.labels, self.attempts = queue, labels, attempts

    def _fields(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "run_after": self.run_after,
            "timeout": self.timeout,
            "keep": self.keep,
            "attempts": self.attempts,
            "priority": self.priority,
            "unique_key": self.unique_key,
            "on_conflict": self.on_conflict,
            "limit_key": self.limit_key,
            "limit": self.limit,
        }

    def submit(self, *args: Any, **kwargs: Any) -> Task:
        """Queue the job with these options (see :func:`outlast.submit`)."""
        return create_job(
            default_store(),
            self.spec,
            queue=self.queue,
            connection=self.connection,
            **_split(self.spec, args, kwargs),
            **self._fields(),
        )

    def spawn(self, *args: Any, **kwargs: Any) -> Task:
        """Run the job in its own detached worker with these options (a delayed one waits
        for its time there)."""
        if self.queue is not None:
            raise InvalidInput("a spawned job runs in its own worker: no queue")
        if self.connection is not None:
            raise InvalidInput("a spawned job starts its worker now: no connection=")
        return spawn_job(
            default_store(), self.spec, **_split(self.spec, args, kwargs), **self._fields()
        )


def job(
    name: str | None = None,
    *,
    attempts: int | None = None,
    timeout: object = None,
    queue: str = "default",
    cron: str | None = None,
    every: object = None,
    tz: str | None = None,
    misfire: str = "once",
    overlap: bool = True,
    priority: int = 0,
    limit: int | None = None,
    limit_key: str | None = None,
) -> Callable[[Callable[..., Any]], Job]:
    """Register a function as a job: ``@outlast.job(name="resize", attempts=3)``.

    The name defaults to ``module.function``. The function takes JSON arguments and returns
    a JSON result; inside it, :func:`outlast.current` gives the reporter, the answer after a
    resume and cooperative cancel checks. ``timeout`` (seconds or ``"10m"``): each attempt
    is stopped then, with code ``timeout``. ``priority``: higher goes first (default 0).
    ``limit_key="tenant:{tenant_id}"`` (formatted with each call's arguments) and
    ``limit=2``: at most 2 jobs of one key run at once, across all pools and hosts
    (``outlast group set KEY --slots N`` overrides the number for a key).

    ``cron="0 3 * * *"`` (with ``tz="Europe/Berlin"``) or ``every="10m"`` also declares a
    schedule of the same name that calls the function with no arguments; a pool (or
    ``outlast serve``, ``outlast scheduler``) that imports the module stores it, and the
    store's maintainer fires it (see :func:`schedule` for the options).
    """
    if callable(name):  # used bare: @outlast.job
        fn, name = name, None
        return job()(fn)  # type: ignore[return-value,unused-ignore]
    seconds = None if timeout is None else when.parse_duration(timeout, "timeout")
    registry.check_options(attempts, seconds, queue)
    machine.check_priority(priority)
    if limit is not None and limit_key is None:
        raise InvalidInput("limit= needs limit_key=: what is limited, e.g. 'tenant:{tenant_id}'")
    machine.check_limit(limit_key, limit)
    declared = None
    if cron is not None or every is not None:
        from outlast import cron as rules

        interval = None if every is None else when.parse_duration(every, "every")
        probe = rules.template(Kind.FUNCTION, "probe")  # the schedule's rules, checked now
        rules.new_schedule("probe", probe, cron=cron, every=interval, tz=tz, misfire=misfire)
        declared = {
            "cron_expr": cron,
            "every": interval,
            "tz": tz,
            "misfire": misfire,
            "overlap": overlap,
        }

    def decorate(fn: Callable[..., Any]) -> Job:
        if not callable(fn) or isinstance(fn, type):
            raise InvalidInput("@outlast.job decorates a function")
        spec_name = name or f"{fn.__module__}.{fn.__qualname__}"
        spec = Job(
            spec_name,
            fn,
            attempts,
            seconds,
            queue,
            schedule=declared,
            priority=priority,
            limit_key=limit_key,
            limit=limit,
        )
        registry.register(spec)
        return spec

    return decorate


def schedule(
    job: JobSpec | str | Sequence[str] | Any,
    *,
    cron: str | None = None,
    every: object = None,
    tz: str | None = None,
    name: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    queue: str | None = None,
    attempts: int | None = None,
    timeout: object = None,
    keep: object = None,
    misfire: str = "once",
    overlap: bool = True,
    replace: bool = True,
    priority: int | None = None,
    store: Store | None = None,
) -> Schedule:
    """Store a schedule that makes a job at each fire time: ``cron`` (five fields, matched
    against wall-clock time in ``tz``) or ``every`` (a duration: ``"10m"``, seconds).

    ``job`` is a registered job (or its name; called with ``args``/``kwargs``, a pipeline
    with ``payload``; queued for the pools), or a command's argv as a list (run by a
    supervisor in this folder, with this environment). ``misfire``: after fires were missed
    (no process maintained the store), ``"once"`` makes one catch-up job, ``"skip"`` none.
    ``overlap=False`` skips a fire while the last job is still live. The name defaults to
    the job's; ``replace`` (the default) updates a schedule of that name, keeping its
    history. Returns the schedule as stored. See :mod:`outlast.cron` for the rules.
    """
    store = store or default_store()
    common: dict[str, Any] = {
        "cron_expr": cron,
        "every": every,
        "tz": tz,
        "misfire": misfire,
        "overlap": overlap,
        "labels": labels,
        "timeout": timeout,
        "keep": keep,
        "replace": replace,
    }
    if isinstance(job, list | tuple) and all(isinstance(a, str) for a in job):
        if name is None:
            raise InvalidInput("a command's schedule needs a name=")
        if args or kwargs or payload is not None or queue is not None:
            raise InvalidInput("a command's schedule takes no args, kwargs, payload or queue")
        return schedules.add_command(
            store, name, list(job), attempts=attempts or 1, priority=priority or 0, **common
        )
    spec = _spec(job)
    return schedules.add_job(
        store,
        spec,
        name=name,
        args=args,
        kwargs=kwargs,
        payload=payload,
        queue=queue,
        attempts=attempts,
        priority=priority,
        **common,
    )


def _spec(job: object) -> JobSpec:
    """The registered job behind ``job``: a spec, a pipeline (its ``spec``), or a name."""
    if isinstance(job, JobSpec):
        return job
    if isinstance(getattr(job, "spec", None), JobSpec):  # a pipeline, or Options
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
    run_after: datetime | None = None,
    timeout: float | None = None,
    keep: float | None = None,
    attempts: int | None = None,
    priority: int | None = None,
    unique_key: str | None = None,
    on_conflict: str = "return",
    connection: Any = None,
    limit_key: str | None = None,
    limit: int | None = None,
) -> Task:
    """Record a pending function (or pipeline) job with its JSON arguments.

    A function takes ``args`` and ``kwargs`` (and may carry a ``payload`` of the caller's
    data); a pipeline takes a ``payload`` object, its input, and no arguments.
    ``run_after``: not claimed before then. ``timeout``, ``attempts``, ``priority``:
    override the job's own. ``keep``: seconds the finished job is kept. ``unique_key``: see
    :meth:`Store.create` (a live job that holds it is returned, or ``DuplicateJob``).
    ``connection`` (PostgreSQL): a psycopg connection whose open transaction the job is
    inserted in; it exists only if that transaction commits. ``limit_key``, ``limit``: a
    concurrency key for this call (default: the job's template, formatted with the call).
    """
    fields = job_fields(
        _spec(job),
        args,
        kwargs,
        queue=queue,
        labels=labels,
        payload=payload,
        run_after=run_after,
        timeout=timeout,
        keep=keep,
        attempts=attempts,
        priority=priority,
        unique_key=unique_key,
        limit_key=limit_key,
        limit=limit,
    )
    return store.create(on_conflict=on_conflict, connection=connection, **fields)


def job_fields(
    spec: JobSpec,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    payload: Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """What :meth:`Store.create` is given for a call of ``spec`` (see :func:`create_job`):
    the call checked against the function's signature, the job's own options where the
    call gives none (``options``: :func:`shared_fields`' keywords)."""
    shared = shared_fields(spec, **options)
    return {**shared, **call_fields(spec, args, kwargs, payload, shared["limit_key"])}


def shared_fields(
    spec: JobSpec,
    *,
    queue: str | None = None,
    labels: Mapping[str, str] | None = None,
    run_after: datetime | None = None,
    timeout: float | None = None,
    keep: float | None = None,
    attempts: int | None = None,
    priority: int | None = None,
    unique_key: str | None = None,
    limit_key: str | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """The fields of a job of ``spec`` that do not depend on its call: its options, or the
    job's own where none is given (``limit_key`` None here: the call's, see
    :func:`call_fields`)."""
    return {
        "kind": spec.kind,
        "name": spec.name,
        "labels": labels,
        "queue": spec.queue if queue is None else queue,
        "max_attempts": attempts or spec.attempts or config.max_retries(),
        "timeout": spec.timeout if timeout is None else timeout,
        "pipeline": PipelineState(cleanup=spec.cleanup) if spec.kind == Kind.PIPELINE else None,
        "run_after": run_after,
        "keep": keep,
        "priority": spec.priority if priority is None else priority,
        "unique_key": unique_key,
        "limit_key": limit_key,
        "limit": limit if limit is not None else spec.limit,
        "trace": tracing.current_traceparent(),
    }


def call_fields(
    spec: JobSpec,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    limit_key: str | None = None,
) -> dict[str, Any]:
    """The fields of one call of ``spec`` (its call, payload and limit key: the job's
    template formatted with the call unless ``limit_key`` is given), checked: a function's
    arguments against its signature (refused now, not after attempts and backoff in a
    worker), a pipeline's payload for its reserved key."""
    args, kwargs = list(args), dict(kwargs or {})  # checked (JSON) and frozen by the store
    if payload is not None and not isinstance(payload, Mapping):
        raise InvalidInput(f"a payload must be a JSON object, not {type(payload).__name__}")
    if spec.kind == Kind.PIPELINE:
        if args or kwargs:
            raise InvalidInput(f"pipeline {spec.name!r} takes a payload object, not arguments")
        if payload is not None and OUTPUTS in payload:
            raise InvalidInput(
                f"payload key {OUTPUTS!r} is where a pipeline keeps its stages' outputs; "
                "use another name"
            )
    else:
        registry.check_call(spec, args, kwargs)
    return {
        "call": Call(spec.module, args, kwargs, registry.module_root(spec.module)),
        "payload": dict(payload or {}),
        "limit_key": limit_key
        if limit_key is not None
        else registry.limit_key_of(spec, args, kwargs, payload),
    }


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
    pools (``outlast worker``); returns its task.

    Options of the call (queue, labels, priority, delay, timeout, …) never mix with the
    function's own keyword arguments: they go through ``job.options(…)``, as in
    ``submit(resize.options(queue="images", labels={"user": "7"}), path, width=300)``."""
    if isinstance(job, Options):
        return job.submit(*args, **kwargs)
    spec = _spec(job)
    return create_job(default_store(), spec, **_split(spec, args, kwargs))


async def asubmit(job: JobSpec | str | Any, *args: Any, **kwargs: Any) -> Task:
    """:func:`submit` for asyncio (FastAPI, Starlette): the insert runs in the loop's
    executor, never blocking the event loop. ``await outlast.asubmit(resize, "a.png")``;
    with options: ``await outlast.asubmit(resize.options(queue="images"), "a.png")``."""
    from outlast.store.aio import offload

    return await offload(partial(submit, job, *args, **kwargs))


async def aspawn(job: JobSpec | str | Any, *args: Any, **kwargs: Any) -> Task:
    """:func:`spawn` for asyncio (starting the worker runs in the loop's executor)."""
    from outlast.store.aio import offload

    return await offload(partial(spawn, job, *args, **kwargs))


def spawn(job: JobSpec | str | Any, *args: Any, **kwargs: Any) -> Task:
    """Run ``job(*args, **kwargs)`` (a pipeline: ``spawn(pipeline, payload)``) in its own
    detached worker, as ``run_command`` does for commands; returns its task at once (with
    options: ``spawn(job.options(timeout="10m"), …)``)."""
    if isinstance(job, Options):
        return job.spawn(*args, **kwargs)
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
    run_after: datetime | None = None,
    timeout: float | None = None,
    keep: float | None = None,
    attempts: int | None = None,
    priority: int | None = None,
    unique_key: str | None = None,
    on_conflict: str = "return",
    limit_key: str | None = None,
    limit: int | None = None,
) -> Task:
    """Create a job of ``job`` in the reserved ``@dedicated`` queue (pools never claim it)
    and start its dedicated detached worker (which waits for a near ``run_after``; one more
    than :data:`~outlast.machine.PARK_AFTER` seconds ahead, the store's timer starts it
    then: :mod:`outlast.run.timer`)."""
    spec = _spec(job)
    if spec.module in ("", "__main__"):
        raise InvalidInput(
            f"job {spec.name!r} is defined in __main__; a detached worker cannot import it: "
            "define job functions in an importable module"
        )
    task = create_job(
        store,
        spec,
        args,
        kwargs,
        queue=DEDICATED,
        labels=labels,
        payload=payload,
        run_after=run_after,
        timeout=timeout,
        keep=keep,
        attempts=attempts,
        priority=priority,
        unique_key=unique_key,
        on_conflict=on_conflict,
        limit_key=limit_key,
        limit=limit,
    )
    keyed = limit_key is not None or spec.limit_key is not None
    waits = keyed or machine.parks_at(run_after, utcnow())
    if not task.existing and not (waits and _parked(store, task.id)):  # a live one has its own
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
    delay: object = None,
    at: object = None,
    timeout: object = None,
    keep: object = None,
    priority: int = 0,
    unique_key: str | None = None,
    on_conflict: str = "return",
    group: str | None = None,
) -> Task:
    """Run ``argv`` as a detached command job and return its task at once.

    ``group``: a pueue-style group (a concurrency key): the job waits ``pending`` while the
    group's slots (``outlast group set NAME --slots N``; 1 by default) are all taken,
    *parked*, with no process of its own; when a job of the group ends, its supervisor runs
    the next one itself, in claim order (highest priority, then the oldest).

    ``delay`` (seconds, ``"15m"``) or ``at`` (an aware time, ISO 8601 text): the job
    waits for that time (a time already past runs now). Up to
    :data:`~outlast.machine.PARK_AFTER` (5 s) ahead its supervisor starts now and waits;
    further ahead the job waits *parked*, with no process, and the store's timer starts its
    supervisor a moment before its time (:mod:`outlast.run.timer`).
    ``timeout`` (seconds, ``"10m"``): each attempt gets SIGTERM then, and SIGKILL after
    ``grace``, and fails with code ``timeout``. ``keep``: how long the finished job is kept
    (default ``$OUTLAST_KEEP``, else forever).

    A supervisor process, in a new session with no terminal, runs the command in its own
    process group with ``OUTLAST_JOB_ID`` and ``OUTLAST_STORE`` set, its output going to the
    job's log, and records how it ended; it retries with backoff while ``attempts`` are left.
    ``cwd`` and ``env`` default to this process's; they are kept beside the store (0600),
    not in the job document, since an environment can hold secrets. ``grace``: seconds
    between SIGTERM and SIGKILL when the job is canceled (None: the supervisor's 10 s).
    """
    from outlast.store.joblog import max_bytes

    if isinstance(argv, str) or not isinstance(argv, Sequence):
        raise InvalidInput("argv must be a list of strings: the command and its arguments")
    max_bytes()  # a bad $OUTLAST_LOG_MAX_BYTES is refused before anything is written
    run_after, _ = when.due_time(delay, at)
    seconds = None if timeout is None else when.parse_duration(timeout, "timeout")
    kept = None if keep is None else when.parse_duration(keep, "keep")
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
            run_after=run_after,
            timeout=seconds,
            keep=kept,
            priority=priority,
            unique_key=unique_key,
            on_conflict=on_conflict,
            limit_key=group,
            trace=tracing.current_traceparent(),
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(written)
        raise
    if task.existing:  # a live job holds the unique key: it has its supervisor
        with contextlib.suppress(OSError):
            os.unlink(written)
        return task

    def start() -> None:
        spawner.adopt_context(store, written, task.id)
        waits = group is not None or machine.parks_at(run_after, utcnow())
        if not (waits and _parked(store, task.id)):
            spawner.spawn_supervisor(store, task.id)

    _start(task, start)
    return task


def set_slots(key: str, slots: int | None, store: Store | None = None) -> None:
    """Set how many jobs of the concurrency ``key`` may run at once (None: unset; see
    :meth:`Store.set_slots`), then start the workers of the key's parked command and spawned
    jobs that have a slot now (``outlast group set``, ``PUT /groups/{name}``). Pools claim
    the key's function jobs at their next claim."""
    from outlast.run import reap

    store = store or default_store()
    store.set_slots(key, slots)
    reap.start_parked(store, key)


def _parked(store: Store, job_id: str) -> bool:
    """Whether the new command or spawned job waits parked: for its time (the store's timer
    starts its worker) or for a slot of its key (a freed slot does)."""
    from outlast.run import timer  # not at import: a submit of a function job never needs it

    return timer.parked_at_start(store, store.get(job_id))


def _may_wait(state: JobState) -> bool:
    """Whether a new job may wait parked (:func:`_parked` reads it again to tell)."""
    return state.limit_key is not None or machine.parks_at(state.run_after, utcnow())


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


def retry(job_ids: Sequence[str], store: Store | None = None) -> list[Task]:
    """Retry finished jobs: a new job for each, with its definition, linked by
    ``retry_of`` (the finished ones stay as they were), inserted together; the new command
    jobs' supervisors and spawned jobs' workers are started here. A retried command runs in
    this process's folder with its environment (the old one's was not kept: it can hold
    secrets). Refuses, before anything is written, a job that is not finished."""
    store = store or default_store()
    ids = list(job_ids)
    made = store.retry(ids)
    asked = set(ids)
    for state in made:
        if state.retry_of not in asked or state.status != "pending" or state.worker is not None:
            continue  # a live job that holds the unique key: it has its worker
        if state.kind == Kind.COMMAND:
            task = store.open(state.id)

            def start(state_id: str = state.id, waits: bool = _may_wait(state)) -> None:
                written = spawner.write_context(store, os.getcwd(), dict(os.environ))
                spawner.adopt_context(store, written, state_id)
                if not (waits and _parked(store, state_id)):
                    spawner.spawn_supervisor(store, state_id)

            _start(task, start)
        elif state.queue == DEDICATED:
            task = store.open(state.id)
            if not (_may_wait(state) and _parked(store, state.id)):
                _start(task, partial(spawner.spawn_dedicated, store, state.id))
    return [store.open(state.id) for state in made]


def delete_jobs(
    job_ids: Sequence[str], store: Store | None = None, force: bool = False
) -> list[str]:
    """Remove jobs with their events and logs (the bulk ``rm``, ``POST /jobs/bulk/delete``):
    all of them or none. A job that is not finished is refused before anything is removed
    (with ``force``: canceled first, its processes stopped); one removed meanwhile by someone
    else is skipped. A finished job never changes again, so nothing can come between the
    check and the removal. Returns the ids removed."""
    from outlast.run import reap

    store = store or default_store()
    found = store.get_many(list(job_ids))
    states = [found.pop(job_id) for job_id in job_ids if job_id in found]
    live = [s.id for s in states if not s.terminal]
    if live and not force:
        shown = ", ".join(live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
        raise JobActive(
            f"{len(live)} of the jobs are not finished ({shown}): nothing was removed; cancel "
            "them first, or remove them with force"
        )
    removed = []
    for state in states:
        if not state.terminal:
            reap.cancel(store, state.id)
        try:
            store.delete(state.id, force=force)
        except JobNotFound:
            continue
        removed.append(state.id)
    return removed


def select_jobs(
    store: Store,
    *,
    ids: Sequence[str] = (),
    status: str | None = None,
    label: Mapping[str, str] | str | None = None,
    since: object = None,
) -> list[Any]:
    """The jobs a bulk action acts on: ``ids``, or those of ``status`` with ``label`` made
    within ``since`` (a duration); newest first. With no filter at all: refused (a bulk
    action on every job must say so, with ``status``)."""
    from datetime import timedelta

    from outlast.model import utcnow

    if ids:
        if status is not None or label or since is not None:
            raise InvalidInput("give job ids or filters (status, label, since), not both")
        return [store.get(job_id) for job_id in ids]
    if status is None and not label and since is None:
        raise InvalidInput("say which jobs: ids, or a status, a label or a time (since)")
    states = store.list(status=status, label=label or None, limit=None)
    if since is not None:
        cutoff = utcnow() - timedelta(seconds=when.parse_duration(since, "since"))
        states = [s for s in states if s.created_at >= cutoff]
    return states
