"""What the MCP tools do: one method of :class:`Tools` per tool, over one store.

Each method's docstring is the tool's description an agent reads, its annotated parameters
are the tool's JSON schema, and its return type the structured output's schema. A tool
answers with the job document of DESIGN.md (the same shape as ``GET /jobs/{id}``). A user's
mistake (an unknown id, a bad argument, a move the status machine does not allow) raises an
:class:`~outlast.errors.OutlastError`, which :mod:`outlast.mcp.server` turns into an MCP error
result; the server goes on.
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from outlast.errors import InvalidInput, JobNotFound
from outlast.http.schemas import EventDocument, JobDocument, JobPage, JobStatus
from outlast.model import JobState, Kind, ProgressEvent, Status
from outlast.run import reap
from outlast.store import Store
from outlast.store.aio import afollow, offload
from outlast.store.follower import settled, wait_released

#: Seconds a ``wait`` may last at most (an MCP request should not hang much longer; call
#: ``wait`` again to go on waiting).
WAIT_MAX = 3600.0
#: Bytes of log one ``logs`` call returns at most.
LOG_LIMIT_MAX = 1024 * 1024
#: Lines of log the ``outlast://jobs/{id}/log`` resource holds.
RESOURCE_LOG_LINES = 1000

Duration = Annotated[float | str | None, Field(description="seconds, or a duration: '90s', '10m'")]
#: The options `submit` and `run_command` share, as `outlast submit` and `outlast run` take them.
At = Annotated[
    str | None,
    Field(description="run at this time, ISO 8601 with a zone (past: now); not with delay"),
]
Keep = Annotated[
    float | str | None,
    Field(description="remove the finished job after this long: seconds, or '7d'"),
]
UniqueKey = Annotated[str | None, Field(description="while a live job holds it, return that job")]
OnConflict = Annotated[
    Literal["return", "raise"],
    Field(description="a live job holds unique_key: return it, or refuse (raise)"),
]


class CommandsOff(InvalidInput):
    """run_command is off: the operator starts `outlast mcp --allow-commands` to let clients
    run commands (use submit for registered jobs)"""


class CommandRetryOff(InvalidInput):
    """retrying a command job runs its command again, and this server does not run commands:
    the operator starts `outlast mcp --allow-commands` to let clients do so (or retry it with
    the CLI: `outlast retry ID`)"""


class WaitResult(BaseModel):
    """Why ``wait`` returned, and the job as it is."""

    reason: Literal["succeeded", "failed", "canceled", "paused", "timeout"] = Field(
        description="the job's outcome, 'paused' (it waits for an answer: resume it), or"
        " 'timeout' (it is still live: wait again)"
    )
    question: Any = Field(default=None, description="the paused job's question")
    job: JobDocument


class EventPage(BaseModel):
    """The job's events after ``after``; pass ``next_after`` back to read on."""

    events: list[EventDocument]
    next_after: int
    done: bool = Field(description="the job is finished and every event was read")


class LogSlice(BaseModel):
    """A piece of the job's log (stdout and stderr, interleaved)."""

    text: str
    offset: int = Field(description="byte offset of the text's start in the log")
    next_offset: int = Field(description="pass as offset to read on from here")
    size: int = Field(description="bytes of log kept now")
    done: bool = Field(description="the job is finished and the whole log was read")


class Retried(BaseModel):
    """The new jobs made by ``retry``, one per job asked (or the live job that holds its
    unique key)."""

    jobs: list[JobDocument]


def progress_message(state: JobState, event: ProgressEvent | None) -> str:
    """One line for an MCP progress notification: status, percent, step, message."""
    parts = [str(state.status)]
    if state.progress is not None:
        parts.append(f"{state.progress:g}%")
    if event is not None:
        parts.append(event.step)
        if event.message is not None:
            text = event.message if isinstance(event.message, str) else json.dumps(event.message)
            parts.append(text[:200])
    return " · ".join(parts)


def progress_value(state: JobState, last: float) -> tuple[float, float | None]:
    """The ``progress`` and ``total`` of the next MCP progress notification after ``last``:
    the job's percent out of 100 when it reports one, else a count of the notifications (one
    more than ``last``) with no total. It always grows, as MCP wants: a percent that did not
    (two events at 40 %) is sent a thousandth above the last."""
    if state.progress is None:
        return last + 1, None
    return max(min(float(state.progress), 100.0), last + 0.001), 100.0


class Tools:
    """The tools over ``store``. Registered jobs are those of the modules imported before
    (``--import``); ``allow_commands`` lets clients run commands."""

    def __init__(self, store: Store, *, allow_commands: bool = False) -> None:
        self.store = store
        self.allow_commands = allow_commands

    def _get(self, job_id: str) -> JobState:
        state = self.store.get(job_id)
        return state if state.terminal else reap.reconcile(self.store, state)

    # ------------------------------------------------------------------ starting jobs
    def run_command(
        self,
        argv: Annotated[list[str], Field(min_length=1, description="the command and its args")],
        name: Annotated[str | None, Field(description="a name (default: the command)")] = None,
        labels: Annotated[dict[str, str] | None, Field(description="labels to find it by")] = None,
        timeout: Duration = None,
        cwd: Annotated[
            str | None, Field(description="working folder (default: the server's)")
        ] = None,
        attempts: Annotated[int, Field(ge=1, le=100)] = 1,
        delay: Duration = None,
        at: At = None,
        grace: Annotated[
            float | None,
            Field(ge=0, description="seconds between SIGTERM and SIGKILL on cancel (default 10)"),
        ] = None,
        group: Annotated[
            str | None,
            Field(description="a group (concurrency key): waits while its slots are taken"),
        ] = None,
        priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000)] = 0,
        keep: Keep = None,
        unique_key: UniqueKey = None,
        on_conflict: OnConflict = "return",
    ) -> JobDocument:
        """Run a command (argv, no shell) as a detached job; returns its document at once.
        The options are those of `outlast run` and outlast.run_command in Python. Off unless
        the server was started with --allow-commands."""
        if not self.allow_commands:
            raise CommandsOff(CommandsOff.__doc__)
        if cwd is not None and not os.path.isdir(cwd):
            raise InvalidInput(f"cwd {cwd!r} is not a folder on the server's machine")
        from outlast.run.api import run_command as start

        task = start(
            argv,
            name=name,
            labels=labels,
            timeout=timeout,
            cwd=cwd,
            attempts=attempts,
            delay=delay,
            at=at,
            grace=grace,
            group=group,
            priority=priority,
            keep=keep,
            unique_key=unique_key,
            on_conflict=on_conflict,
            store=self.store,
        )
        return task.state().to_dict()  # type: ignore[return-value]

    def submit(
        self,
        name: Annotated[str, Field(min_length=1, description="the registered job's name")],
        args: Annotated[list[Any] | None, Field(description="positional JSON arguments")] = None,
        kwargs: Annotated[
            dict[str, Any] | None, Field(description="keyword JSON arguments")
        ] = None,
        payload: Annotated[dict[str, Any] | None, Field(description="a pipeline's input")] = None,
        queue: str | None = None,
        labels: dict[str, str] | None = None,
        delay: Duration = None,
        timeout: Duration = None,
        priority: Annotated[int | None, Field(ge=-1_000_000, le=1_000_000)] = None,
        unique_key: UniqueKey = None,
        on_conflict: OnConflict = "return",
        at: At = None,
        attempts: Annotated[
            int | None, Field(ge=1, description="attempts at most (default: the job's own)")
        ] = None,
        keep: Keep = None,
        limit_key: Annotated[
            str | None,
            Field(description="a concurrency key for this call (default: the job's own)"),
        ] = None,
        limit: Annotated[
            int | None, Field(ge=1, description="jobs of limit_key running at once")
        ] = None,
    ) -> JobDocument:
        """Queue a registered job (@outlast.job in a module the server imported with
        --import) for the pools (`outlast worker`); returns its document. The options are
        those of job.options(...) in Python and of `outlast submit`."""
        from outlast.machine import check_limit
        from outlast.run import registry
        from outlast.run.api import Options, create_job

        spec = registry.lookup(name)
        if spec.kind == "pipeline" and (args or kwargs):
            raise InvalidInput("a pipeline takes payload, not args/kwargs")
        if spec.kind != "pipeline" and payload is not None:
            raise InvalidInput("payload is for pipelines; a function takes args/kwargs")
        # checked as job.options(...) checks them, before anything is written
        options = Options(spec, delay, at, timeout, keep, queue, labels, attempts, priority)
        check_limit(limit_key if limit_key is not None else spec.limit_key, limit)
        task = create_job(
            self.store,
            spec,
            args or [],
            kwargs or {},
            queue=options.queue,
            labels=options.labels,
            payload=payload,
            run_after=options.run_after,
            timeout=options.timeout,
            keep=options.keep,
            attempts=options.attempts,
            priority=options.priority,
            unique_key=unique_key,
            on_conflict=on_conflict,
            limit_key=limit_key,
            limit=limit,
        )
        return task.state().to_dict()  # type: ignore[return-value]

    # ------------------------------------------------------------------ reading jobs
    def status(self, job_id: str) -> JobDocument:
        """A job's document: status, progress, step, result, error, question."""
        return self._get(job_id).to_dict()  # type: ignore[return-value]

    def list_jobs(
        self,
        status: JobStatus | None = None,
        labels: Annotated[
            dict[str, str] | None, Field(description="only jobs with all these labels")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=500)] = 20,
        before: Annotated[str | None, Field(description="the `next` of the last page")] = None,
        name: Annotated[
            str | None, Field(description="only jobs whose name holds this (any case)")
        ] = None,
        id_prefix: Annotated[str | None, Field(description="only ids starting so")] = None,
    ) -> JobPage:
        """Jobs, newest first, filtered by status, labels, name and id prefix (all must
        hold); pass `next` back as `before` for the following page (null: the last page)."""
        try:
            found = self.store.list(
                status, labels or None, limit, before, name=name, id_prefix=id_prefix
            )
        except JobNotFound:
            raise InvalidInput(f"unknown cursor {before!r}: pass the `next` of a page") from None
        states = [s if s.terminal else reap.reconcile(self.store, s) for s in found]
        cursor = states[-1].id if len(states) == limit else None
        return {"jobs": [s.to_dict() for s in states], "next": cursor}  # type: ignore[return-value]

    def events(
        self,
        job_id: str,
        after: Annotated[int, Field(ge=0, description="the last seq read (0: from the start)")] = 0,
        limit: Annotated[int, Field(ge=1, le=1000)] = 200,
    ) -> EventPage:
        """A job's progress events after seq `after`; pass `next_after` back to read on."""
        state = self._get(job_id)
        found = self.store.events(job_id, after, limit)
        last = found[-1].seq if found else after
        return {  # type: ignore[return-value]
            "events": [e.to_dict() for e in found],
            "next_after": last,
            "done": state.terminal and len(found) < limit,
        }

    def logs(
        self,
        job_id: str,
        offset: Annotated[int, Field(ge=0, description="byte offset to read from")] = 0,
        limit: Annotated[int, Field(ge=1, le=LOG_LIMIT_MAX, description="bytes at most")] = 65536,
        tail: Annotated[int | None, Field(ge=1, le=10_000, description="last lines")] = None,
    ) -> LogSlice:
        """A job's output (stdout and stderr, interleaved). `tail`: its last lines; else up
        to `limit` bytes from byte `offset` (pass `next_offset` back to read on)."""
        from outlast.run.logs import read_slice

        finished = self._get(job_id).terminal
        piece = read_slice(self.store, job_id, offset, limit, tail, finished)
        return piece  # type: ignore[return-value]

    async def wait(
        self,
        job_id: str,
        ctx: Context,
        timeout: Annotated[float, Field(gt=0, le=WAIT_MAX, description="seconds")] = 60.0,
        through_pause: bool = False,
    ) -> WaitResult:
        """Wait until the job ends or pauses for an answer, at most `timeout` seconds;
        returns why (reason) and the job. Progress notifications carry its events: progress
        is the job's percent (total 100) once it reports one, else a count (no total). A
        canceled job returns once its processes are gone. `through_pause`: wait on through
        pauses."""
        deadline = time.monotonic() + timeout
        last: JobState | None = None
        sent = 0.0  # the last progress sent: it never goes down
        updates = afollow(
            self.store, job_id, timeout=timeout, until=None if through_pause else settled
        )
        async for state, new in updates:
            changed = last is None or state.updated_at != last.updated_at
            last = state
            notes: list[ProgressEvent | None] = list(new) or ([None] if changed else [])
            for event in notes:
                sent, total = progress_value(state, sent)
                await ctx.report_progress(sent, total, progress_message(state, event))
        assert last is not None
        if last.status == Status.CANCELED:
            await offload(wait_released, self.store, last, deadline)
        paused = last.status == Status.PAUSED and not through_pause
        reason = str(last.status) if last.terminal or paused else "timeout"
        return {  # type: ignore[return-value]
            "reason": reason,
            "question": last.question if last.status == Status.PAUSED else None,
            "job": last.to_dict(),
        }

    # ------------------------------------------------------------------ acting on jobs
    def cancel(self, job_id: str) -> JobDocument:
        """Cancel a job: its processes get SIGTERM, then SIGKILL after its grace period;
        its cleanup stages still run. Returns its document."""
        _, after = reap.cancel(self.store, job_id)
        return after.to_dict()  # type: ignore[return-value]

    def resume(
        self, job_id: str, answer: Annotated[Any, Field(description="any JSON value")] = None
    ) -> JobDocument:
        """Answer a paused job's question and queue it again; returns its document."""
        return reap.resume(self.store, job_id, answer).to_dict()  # type: ignore[return-value]

    def retry(self, job_ids: Annotated[list[str], Field(min_length=1, max_length=500)]) -> Retried:
        """Run finished jobs again: a new job each, with the same definition, linked by
        retry_of (the finished ones stay as they were). A command job's command runs again:
        refused unless the server was started with --allow-commands."""
        from outlast.run.api import retry as retry_jobs

        if not self.allow_commands:
            for job_id in job_ids:
                if self.store.get(job_id).kind == Kind.COMMAND:
                    raise CommandRetryOff(f"job {job_id}: {CommandRetryOff.__doc__}")
        made = retry_jobs(job_ids, self.store)
        return {"jobs": [t.state().to_dict() for t in made]}  # type: ignore[return-value]

    # ------------------------------------------------------------------ resources
    def job_resource(self, job_id: str) -> str:
        """A job's document (JSON)."""
        return json.dumps(self._get(job_id).to_dict(), ensure_ascii=False)

    def log_resource(self, job_id: str) -> str:
        """A job's output, its last 1,000 lines (the logs tool pages through all of it)."""
        self.store.get(job_id)
        return self.store.log_tail(job_id, RESOURCE_LOG_LINES) or ""
