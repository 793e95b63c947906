"""The shapes at the HTTP edge: request bodies (strict: unknown fields are refused) and the
documents the routes answer with, for ``/openapi.json``. The documents are DESIGN.md's job
document and event, exactly as ``to_dict()`` writes them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatus = Literal["pending", "running", "paused", "succeeded", "failed", "canceled"]
EventStatusName = Literal["started", "progress", "completed", "skipped", "paused", "failed"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateJob(Strict):
    """Queue a job of a function registered with ``@outlast.job`` in the server's process."""

    name: str = Field(min_length=1, max_length=200, description="a registered job name")
    args: list[Any] = Field(default_factory=list, description="positional JSON arguments")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword JSON arguments")
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict)
    delay: float | str | None = Field(
        default=None, description="run no sooner than this from now: seconds, or '90s', '15m'"
    )
    run_after: str | None = Field(
        default=None,
        max_length=64,
        description="run at this ISO 8601 time with a zone (a past time runs now); or delay",
    )
    timeout: float | str | None = Field(
        default=None, description="stop each attempt after this long (code timeout)"
    )
    keep: float | str | None = Field(
        default=None, description="remove the finished job after this long"
    )
    priority: int | None = Field(
        default=None,
        ge=-1_000_000,
        le=1_000_000,
        description="higher runs first (default: the registered job's own, else 0)",
    )
    unique_key: str | None = Field(
        default=None,
        max_length=500,
        description="while a live job holds this key, answer it (200) instead of a new one",
    )
    on_conflict: Literal["return", "raise"] = Field(
        default="return", description="raise: a live job holding unique_key is a 409"
    )
    limit_key: str | None = Field(
        default=None, max_length=200, description="a concurrency key (default: the job's)"
    )
    limit: int | None = Field(default=None, ge=1, le=100_000, description="its slots")


class BulkAction(Strict):
    """The jobs a bulk action acts on: ``ids``, or a filter (at least one of ``status``,
    ``label``, ``since``). ``dry_run`` only counts and lists them."""

    ids: list[str] = Field(default_factory=list, max_length=10_000)
    status: JobStatus | None = None
    label: str | None = Field(default=None, max_length=500, description="key=value")
    since: str | None = Field(default=None, max_length=64, description="made within: '1h'")
    dry_run: bool = False


class Group(BaseModel):
    """A concurrency key: its slots (null: unset), the jobs of it running now, and its
    command and spawned jobs waiting to start (parked for a slot, or delayed)."""

    name: str
    slots: int | None
    running: int
    waiting: int


class QueueDoc(BaseModel):
    """A queue: its jobs by status, and how long its longest-waiting due job has waited."""

    name: str
    pending: int
    running: int
    paused: int
    succeeded: int
    failed: int
    canceled: int
    oldest_due_seconds: float


class WorkerDoc(BaseModel):
    """A live worker of the registry (``Store.register_worker``)."""

    name: str = Field(description="host:pid")
    host: str
    pid: int | None
    kind: str = Field(
        description="pool, async-pool, server, scheduler, timer, supervisor, dedicated"
    )
    queues: list[str]
    concurrency: int | None
    job: str | None = Field(description="the one job of a supervisor or dedicated worker")
    version: str
    since: str
    jobs: int = Field(description="running jobs it holds")


class WorkerPage(BaseModel):
    workers: list[WorkerDoc]


class QueuePage(BaseModel):
    queues: list[QueueDoc]


class GroupPage(BaseModel):
    groups: list[Group]


class SetSlots(Strict):
    """How many jobs of the key run at once; null unsets (each job's own limit, else 1)."""

    slots: int | None = Field(ge=1, le=100_000)


class Retries(BaseModel):
    """The ids of the jobs that retry a job, oldest first."""

    jobs: list[str]


class BulkResult(BaseModel):
    """How many jobs the action took, and their ids (for a retry: the new jobs' ids)."""

    count: int
    jobs: list[str]
    dry_run: bool


class FiredDoc(BaseModel):
    """The schedule and fire time that made a job."""

    schedule: str
    fire_at: str
    reason: Literal["on_time", "catch_up", "manual"]


class Resume(Strict):
    """The answer to a paused job's question."""

    answer: Any = None


class ErrorInfoDoc(BaseModel):
    code: str
    message: str
    hint: str | None
    type: str | None
    traceback: str | None = Field(
        default=None, description="the job code's traceback (redacted, its last 16 KiB)"
    )


class Login(Strict):
    """Sign the dashboard in: the server's token, traded for a session cookie."""

    token: str = Field(min_length=1, max_length=4096)


class BatchJob(Strict):
    """One job of a batch: its input and options (all optional)."""

    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    payload: dict[str, Any] | None = Field(default=None, description="a pipeline's input")
    queue: str | None = Field(default=None, min_length=1, max_length=200)
    labels: dict[str, str] | None = None
    priority: int | None = Field(default=None, ge=-1_000_000, le=1_000_000)
    delay: float | str | None = Field(default=None, description="seconds, or '90s', '15m'")
    timeout: float | str | None = None
    unique_key: str | None = Field(default=None, max_length=500)


class CreateBatch(Strict):
    """Many jobs of one registered function, checked together before any is written."""

    name: str = Field(min_length=1, max_length=200, description="a registered job name")
    jobs: list[BatchJob] = Field(min_length=1, max_length=100_000)


class BatchCreated(BaseModel):
    """The new jobs' ids, in the order given (a live holder's id for a unique key held)."""

    ids: list[str]
    count: int


class CallDoc(BaseModel):
    """How a function or pipeline job is called."""

    module: str
    args: list[Any]
    kwargs: dict[str, Any]
    path: str | None = Field(
        default=None, description="the folder of the module's top package, if not installed"
    )


class StageDoc(BaseModel):
    status: str
    message: Any


class PipelineDoc(BaseModel):
    """A pipeline job's stage checkpoints (its outputs are in ``payload.outputs``)."""

    cleanup: list[str]
    stages: dict[str, StageDoc]
    finalize: ErrorInfoDoc | None


class JobDocument(BaseModel):
    """A job: the document of DESIGN.md ("The job document"); times are ISO 8601 UTC."""

    id: str
    kind: Literal["command", "function", "pipeline"]
    name: str
    command: list[str] | None
    call: CallDoc | None
    labels: dict[str, str]
    queue: str
    priority: int
    status: JobStatus
    phase: str | None
    step: str | None
    progress: float | None
    payload: dict[str, Any]
    result: Any
    error: ErrorInfoDoc | None
    attempts: int
    max_attempts: int
    timeout: float | None
    grace: float | None
    run_after: str | None
    question: Any
    answer: Any
    cancel_requested: bool
    pipeline: PipelineDoc | None
    keep: float | None
    fired: FiredDoc | None
    retry_of: str | None
    unique_key: str | None
    limit_key: str | None
    limit: int | None
    trace: str | None = Field(
        default=None, description="the W3C traceparent of the span that created the job"
    )
    pid: int | None
    pid_started_at: str | None
    worker: str | None
    created_at: str
    started_at: str | None
    updated_at: str
    finished_at: str | None


class EventDocument(BaseModel):
    """One progress event: the ``data:`` of a Server-Sent Event."""

    job_id: str
    seq: int = Field(ge=1)
    at: str
    step: str
    status: EventStatusName
    message: Any


class JobPage(BaseModel):
    """One page of jobs, newest first; pass ``next`` as ``before`` for the following page."""

    jobs: list[JobDocument]
    next: str | None


class TimelineWaits(BaseModel):
    p50: list[float | None]
    p95: list[float | None]


class TimelineDoc(BaseModel):
    """Throughput and waiting time per step of the window, as columns: ``times[i]`` (seconds
    since the epoch) starts step ``i``; ``finished[outcome][i]`` jobs ended in it, and
    ``wait_seconds`` are the median and 95th percentile of how long they waited from
    creation to their last start (null: none finished). The last step is the one filling."""

    at: str
    window_seconds: float
    step_seconds: float
    start: str
    times: list[float]
    finished: dict[Literal["succeeded", "failed", "canceled"], list[int]]
    wait_seconds: TimelineWaits


class JobTemplateDoc(BaseModel):
    """What each job of a schedule is made from."""

    kind: Literal["command", "function", "pipeline"]
    name: str
    command: list[str] | None
    call: CallDoc | None
    payload: dict[str, Any]
    labels: dict[str, str]
    queue: str
    max_attempts: int
    timeout: float | None
    grace: float | None
    keep: float | None
    priority: int
    cwd: str | None
    cleanup: list[str]


class ScheduleDocument(BaseModel):
    """A schedule (``Schedule.to_dict()``) and the status of the last job it made."""

    id: str
    cron: str | None
    every: float | None
    tz: str
    misfire: Literal["once", "skip"]
    overlap: bool
    paused: bool
    job: JobTemplateDoc
    next_at: str | None
    last_fire_at: str | None
    last_job: str | None
    fires: int
    skipped: int
    created_at: str
    updated_at: str
    last_status: JobStatus | None


class SchedulePage(BaseModel):
    schedules: list[ScheduleDocument]


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer: a short ``error`` and a ``detail`` that says what is wrong."""

    error: str
    detail: Any


class Health(BaseModel):
    status: Literal["ok"]
