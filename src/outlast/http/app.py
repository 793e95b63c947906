"""The HTTP edge: ``create_app(store, token=None)`` builds the FastAPI application.

Routes (DESIGN.md, "HTTP edge"): ``GET /healthz``; ``GET /jobs`` (newest first, filtered by
``status``, ``label=k=v``, ``name`` and ``id_prefix``, paged by ``limit`` and the ``before``
cursor); ``POST /jobs``
(registered job names only — never a command); ``GET /jobs/{id}``; ``POST /jobs/{id}/cancel``;
``POST /jobs/{id}/resume``; ``DELETE /jobs/{id}``; ``GET /jobs/{id}/log`` (the log's tail);
``GET /jobs/{id}/events`` and ``GET /events`` (Server-Sent Events, see :mod:`.sse`);
``GET /schedules``, ``GET /schedules/{name}``, ``POST /schedules/{name}/pause|resume|run``,
``DELETE /schedules/{name}``; ``GET /groups``, ``PUT /groups/{name}``; ``GET /queues``;
``GET /stats/timeline``; ``GET /metrics``; ``POST``/``DELETE /session``; ``GET /``, the
dashboard. Every answer is JSON (errors:
``{"error", "detail"}``), except the log (text), the streams and the dashboard.

The edge holds no business rules: each route parses its input, calls the store or the run
layer, and renders the result. Store calls block, so the JSON routes are plain functions that
FastAPI runs in its thread pool, and the streams are async and hop to threads for reads.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Request, Security
from fastapi import Path as FastPath
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from fastapi.staticfiles import StaticFiles

from outlast import __version__
from outlast.bus import Bus, StoreBus
from outlast.errors import InvalidInput, JobNotFound
from outlast.http import errors, signin, sse
from outlast.http.deps import ExistingJob, JobId
from outlast.http.guard import Guard, redact_access_log, session_value
from outlast.http.schemas import (
    BatchCreated,
    BulkAction,
    BulkResult,
    CreateBatch,
    CreateJob,
    ErrorBody,
    Group,
    GroupPage,
    Health,
    JobDocument,
    JobPage,
    Login,
    QueuePage,
    Resume,
    Retries,
    ScheduleDocument,
    SchedulePage,
    SetSlots,
    TimelineDoc,
    WorkerPage,
)
from outlast.http.signin import SESSION_COOKIE
from outlast.model import JobState, Status
from outlast.run import api, reap, schedules
from outlast.store import Store, parse_label
from outlast.store.query import MAX_NAME_SEARCH

STATIC = Path(__file__).with_name("static")
#: The dashboard's page may only load what the app itself serves.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody} for code in codes}


def _json_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """Error answers of a route whose success is not JSON (a stream): still JSON."""
    content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    return {code: {"description": "Error", "content": content} for code in codes}


def _doc(state: JobState, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(state.to_dict(), status_code=status, headers=headers)


def create_app(
    store: Store,
    token: str | None = None,
    *,
    bus: Bus | None = None,
    heartbeat: float = sse.HEARTBEAT,
    hosts: Collection[str] | None = None,
) -> FastAPI:
    """The HTTP API and dashboard over ``store``.

    With ``token``, every route but ``/healthz`` and ``/session`` (the dashboard's files and
    the API's description too) needs ``Authorization: Bearer <token>`` or the dashboard's
    session cookie (``POST /session`` with the token sets it; the streams also take
    ``?token=``, masked in uvicorn's access log); ``/`` answers a browser without either
    with a sign-in page (:mod:`outlast.http.signin`). Requests that may change something
    are refused from another site, and their bodies must be JSON (see
    :mod:`outlast.http.guard`). ``hosts``: the only names the ``Host`` header may give
    (``outlast serve`` on loopback without a token passes the loopback names: DNS
    rebinding). ``bus`` defaults to
    :class:`~outlast.bus.StoreBus` over ``store``, whose streams reconcile a job whose worker
    died. ``heartbeat``: seconds between keep-alive comments on a quiet stream. Mount the
    result in your own app, or serve it with :func:`outlast.http.serve`.
    """
    app = FastAPI(
        title="outlast",
        version=__version__,
        summary="Background jobs that outlast the process that started them.",
        description="Jobs, their progress as Server-Sent Events, and a live dashboard at `/`.",
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(Guard, token=token, hosts=hosts)
    redact_access_log()
    recheck = functools.partial(reap.reconcile, store)
    bus = bus or StoreBus(store, recheck=recheck)
    app.state.store, app.state.bus = store, bus
    auth = [Security(HTTPBearer(auto_error=False))] if token else []
    denied = (401,) if token else ()

    @app.get("/healthz", response_model=Health, tags=["meta"], responses=_errors(503))
    def healthz() -> Response:
        """Liveness, and that the store answers."""
        store.list(limit=1)
        return JSONResponse({"status": "ok"})

    @app.get(
        "/metrics",
        tags=["meta"],
        response_class=PlainTextResponse,
        responses=_json_errors(503, *denied),
        dependencies=auth,
    )
    def prometheus_metrics() -> Response:
        """The store's numbers in Prometheus' text format (see :mod:`outlast.http.metrics`):
        jobs by queue, status and kind, the oldest due job per queue, the last hour's
        finished jobs with wait and run time histograms, busy workers, schedules."""
        from outlast.http import metrics

        body = metrics.render(store.stats())
        return Response(body, media_type=metrics.CONTENT_TYPE_LATEST)

    @app.post("/session", status_code=204, tags=["meta"], responses=_json_errors(400, 401, 422))
    def sign_in(body: Login, request: Request) -> Response:
        """Trade the token for the dashboard's session cookie (HttpOnly, SameSite=Strict, 12
        hours), so that no page and no URL ever holds the token."""
        if token is None:
            return Response(status_code=204)
        if not hmac.compare_digest(body.token.encode(), token.encode()):
            return JSONResponse({"error": "unauthorized", "detail": "wrong token"}, 401)
        response = Response(status_code=204)
        root = request.scope.get("root_path", "")
        signin.set_session(response, session_value(token), root, request.url.scheme == "https")
        return response

    @app.delete("/session", status_code=204, tags=["meta"])
    def sign_out(request: Request) -> Response:
        """Forget the session cookie."""
        response = Response(status_code=204)
        response.delete_cookie(SESSION_COOKIE, path=request.scope.get("root_path") or "/")
        return response

    app.include_router(_action_routes(store, denied), dependencies=auth)
    app.include_router(_job_routes(store, denied), dependencies=auth)
    app.include_router(_stats_routes(store, denied), dependencies=auth)
    app.include_router(_schedule_routes(store, denied), dependencies=auth)
    app.include_router(
        sse.router(store, bus, recheck, _json_errors(400, 404, 422, 503, *denied), heartbeat),
        dependencies=auth,
    )

    @app.get("/", include_in_schema=False)
    def dashboard() -> Response:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _job_routes(store: Store, denied: tuple[int, ...]) -> APIRouter:
    """The JSON routes under ``/jobs``; plain functions, run in FastAPI's thread pool."""
    routes = APIRouter(tags=["jobs"])

    @routes.get(
        "/jobs",
        response_model=JobPage,
        responses=_errors(400, 422, *denied),
    )
    def list_jobs(
        status: Status | None = None,
        label: Annotated[
            list[str] | None, Query(description="key=value; repeat to require several")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        before: Annotated[
            str | None, Query(max_length=128, description="the `next` of the previous page")
        ] = None,
        name: Annotated[
            str | None,
            Query(max_length=MAX_NAME_SEARCH, description="in the name, ignoring case"),
        ] = None,
        id_prefix: Annotated[
            str | None, Query(max_length=128, description="the start of the job's id")
        ] = None,
    ) -> Response:
        """Jobs, newest first; ``next`` is the cursor of the following page, or null.
        ``name`` finds the jobs whose name holds it, ignoring case (``resize`` finds
        ``images.resize``); ``id_prefix``, those whose id starts with it."""
        labels: dict[str, str] = {}
        for item in label or ():
            labels.update(parse_label(item))
        try:
            states = store.list(
                status, labels or None, limit, before, name=name, id_prefix=id_prefix
            )
        except JobNotFound:
            raise InvalidInput(f"unknown cursor {before!r}: pass the `next` of a page") from None
        states = [s if s.terminal else reap.reconcile(store, s) for s in states]
        cursor = states[-1].id if len(states) == limit else None
        return JSONResponse({"jobs": [s.to_dict() for s in states], "next": cursor})

    @routes.post(
        "/jobs",
        status_code=201,
        response_model=JobDocument,
        responses=_errors(400, 413, 422, *denied),
    )
    def create_job(body: CreateJob) -> Response:
        """Queue a job of a function registered with ``@outlast.job`` (400 for any other
        name); a pool (``outlast worker``) runs it. ``delay`` (``"15m"``, seconds) or
        ``run_after`` (ISO 8601 with a zone) runs it later; ``timeout`` and ``keep`` take
        durations too."""
        from outlast import when

        run_after, _ = when.due_time(body.delay, body.run_after)
        timeout = None if body.timeout is None else when.parse_duration(body.timeout, "timeout")
        task = api.create_job(
            store,
            body.name,
            body.args,
            body.kwargs,
            queue=body.queue,
            labels=body.labels,
            run_after=run_after,
            timeout=timeout,
            keep=None if body.keep is None else when.parse_duration(body.keep, "keep"),
            priority=body.priority,
            unique_key=body.unique_key,
            on_conflict=body.on_conflict,
            limit_key=body.limit_key,
            limit=body.limit,
        )
        status = 200 if task.existing else 201  # 200: the live job that holds the key
        return _doc(store.get(task.id), status, {"Location": f"/jobs/{task.id}"})

    @routes.post(
        "/jobs:batch",
        status_code=201,
        response_model=BatchCreated,
        responses=_errors(400, 413, 422, *denied),
    )
    def create_batch(body: CreateBatch) -> Response:
        """Queue many jobs of one registered function: every job is checked before any is
        written (a 400 names the first bad one: ``job 3: …``), then they are inserted 1,000
        per transaction. What ``outlast submit NAME --from-file`` does."""
        from outlast.run import bulk

        lines = [job.model_dump(exclude_none=True) for job in body.jobs]
        ids = [task.id for task in bulk.create_lines(store, body.name, lines)]
        return JSONResponse({"ids": ids, "count": len(ids)}, status_code=201)

    @routes.get(
        "/jobs/{job_id}",
        response_model=JobDocument,
        responses=_errors(400, 404, 422, *denied),
    )
    def get_job(state: ExistingJob) -> Response:
        """The job document, reconciled first if the job's worker died."""
        return _doc(state)

    @routes.post(
        "/jobs/{job_id}/cancel",
        response_model=JobDocument,
        responses=_errors(400, 404, 413, 422, *denied),
    )
    def cancel_job(job_id: JobId) -> Response:
        """Cancel the job; a finished job keeps its outcome (the document says which)."""
        return _doc(reap.cancel(store, job_id)[1])

    @routes.post(
        "/jobs/{job_id}/resume",
        response_model=JobDocument,
        responses=_errors(400, 404, 409, 413, 422, *denied),
    )
    def resume_job(job_id: JobId, body: Resume | None = None) -> Response:
        """Answer a paused job's question and queue it again (409 unless it is paused)."""
        return _doc(reap.resume(store, job_id, body.answer if body else None))

    @routes.delete(
        "/jobs/{job_id}",
        status_code=204,
        response_class=Response,
        responses=_errors(400, 404, 409, 422, *denied),
    )
    def delete_job(job_id: JobId, force: bool = False) -> Response:
        """Delete the job, its events and its log; 409 for a live job unless ``force``."""
        store.delete(job_id, force=force)
        return Response(status_code=204)

    @routes.get(
        "/jobs/{job_id}/log",
        response_class=PlainTextResponse,
        responses=_json_errors(400, 404, 422, *denied),
    )
    def job_log(job_id: JobId, tail: Annotated[int, Query(ge=1, le=10000)] = 200) -> Response:
        """The last ``tail`` lines of the job's output (404 when it has none)."""
        store.get(job_id)
        text = store.log_tail(job_id, tail)
        if text is None:
            raise JobNotFound(f"job {job_id} has no log (yet)")
        return PlainTextResponse(text)

    return routes


def _action_routes(store: Store, denied: tuple[int, ...]) -> APIRouter:
    """Retry of finished jobs; bulk retry, cancel and delete; concurrency keys' slots."""
    routes = APIRouter(tags=["jobs"])

    @routes.post(
        "/jobs/bulk/{action}",
        response_model=BulkResult,
        responses=_errors(400, 404, 409, 413, 422, *denied),
    )
    def bulk(action: Literal["retry", "cancel", "delete"], body: BulkAction) -> Response:
        """Retry, cancel or delete many jobs at once: by ``ids``, or every job matching the
        filter. ``dry_run`` answers the count and ids without acting (what a confirmation
        shows). Retry makes new jobs (their ids are answered); retry and delete act on all the
        jobs or none: a job that is not finished is refused (409) before anything is done."""
        states = api.select_jobs(
            store, ids=body.ids, status=body.status, label=body.label, since=body.since
        )
        ids = [s.id for s in states]
        if not body.dry_run:
            if action == "retry":
                ids = [t.id for t in api.retry(ids, store=store)]
            elif action == "cancel":
                for job_id in ids:
                    reap.cancel(store, job_id)
            else:
                ids = api.delete_jobs(ids, store)
        return JSONResponse({"count": len(ids), "jobs": ids, "dry_run": body.dry_run})

    @routes.post(
        "/jobs/{job_id}/retry",
        status_code=201,
        response_model=JobDocument,
        responses=_errors(400, 404, 409, 413, 422, *denied),
    )
    def retry_job(job_id: JobId) -> Response:
        """A new job with this finished job's definition, linked by ``retry_of`` (409 for a
        job that is not finished); the finished job stays as it was."""
        [task] = api.retry([job_id], store=store)
        return _doc(store.get(task.id), 201, {"Location": f"/jobs/{task.id}"})

    @routes.get("/workers", response_model=WorkerPage, tags=["queues"], responses=_errors(*denied))
    def list_workers() -> Response:
        """The live workers (pools, servers, schedulers, supervisors, dedicated workers):
        host, pid, kind, queues, concurrency, version, since, running jobs (what ``outlast
        workers`` prints). Liveness is each worker's lock, never a heartbeat."""
        return JSONResponse({"workers": store.workers()})

    @routes.get("/queues", response_model=QueuePage, tags=["queues"], responses=_errors(*denied))
    def list_queues() -> Response:
        """Every queue that holds jobs: its jobs by status, and how long its oldest due
        pending job has waited (what ``outlast queues`` prints)."""
        queues = store.stats().by_queue()
        return JSONResponse({"queues": [{"name": n, **q} for n, q in queues.items()]})

    @routes.get("/groups", response_model=GroupPage, tags=["groups"], responses=_errors(*denied))
    def list_groups() -> Response:
        """Concurrency keys (command groups, limit keys): their slots, running jobs, and the
        command and spawned jobs waiting to start (parked for a slot, or delayed)."""
        return JSONResponse({"groups": store.groups()})

    @routes.put(
        "/groups/{name}",
        response_model=Group,
        tags=["groups"],
        responses=_errors(400, 413, 422, *denied),
    )
    def set_group(name: Annotated[str, FastPath(max_length=200)], body: SetSlots) -> Response:
        """Set (or, with null, unset) how many jobs of the key run at once."""
        api.set_slots(name, body.slots, store)
        group = {"name": name, "slots": body.slots, "running": 0, "waiting": 0}
        found = [g for g in store.groups() if g["name"] == name]
        return JSONResponse(found[0] if found else group)

    @routes.get(
        "/jobs/{job_id}/retries",
        response_model=Retries,
        responses=_errors(400, 404, 422, *denied),
    )
    def job_retries(job_id: JobId) -> Response:
        """The ids of the jobs that retry this one, oldest first."""
        store.get(job_id)
        return JSONResponse({"jobs": store.retries_of(job_id)})

    return routes


def _stats_routes(store: Store, denied: tuple[int, ...]) -> APIRouter:
    """What the store's jobs did over time."""
    routes = APIRouter(tags=["queues"])

    @routes.get(
        "/stats/timeline",
        response_model=TimelineDoc,
        responses=_errors(400, 422, 503, *denied),
    )
    def stats_timeline(
        window: Annotated[
            str, Query(max_length=32, description="how far back: seconds, or 90m, 1h, 1d")
        ] = "1h",
        step: Annotated[str, Query(max_length=32, description="one step: seconds, or 1m")] = "60",
    ) -> Response:
        """Throughput and waiting time over the window, step by step (the dashboard's chart):
        the jobs that finished in each step by outcome, and the median and 95th percentile of
        their waits. Read from the store: right for every pool on every host."""
        from outlast import when

        seconds = when.parse_duration(window, "window")
        every = when.parse_duration(step, "step")
        return JSONResponse(store.timeline(seconds, every).to_dict())

    return routes


ScheduleName = Annotated[str, FastPath(description="the schedule's name", max_length=128)]


def _schedule_routes(store: Store, denied: tuple[int, ...]) -> APIRouter:
    """``/schedules``: read them, pause, resume, run one now, remove. (Adding one takes a
    command or an import: that is the CLI's and Python's, not the network's.)"""
    routes = APIRouter(tags=["schedules"])

    def answer(found: Any) -> Response:
        return JSONResponse(schedules.describe(store, found))

    @routes.get("/schedules", response_model=SchedulePage, responses=_errors(*denied))
    def list_schedules() -> Response:
        """Every schedule by name, with its next fire time and its last job's status."""
        docs = [schedules.describe(store, s) for s in store.schedules()]
        return JSONResponse({"schedules": docs})

    one = _errors(400, 404, 422, *denied)

    @routes.get("/schedules/{name}", response_model=ScheduleDocument, responses=one)
    def get_schedule(name: ScheduleName) -> Response:
        """One schedule."""
        return answer(store.get_schedule(name))

    @routes.post("/schedules/{name}/pause", response_model=ScheduleDocument, responses=one)
    def pause_schedule(name: ScheduleName) -> Response:
        """Stop firing the schedule until it is resumed."""
        return answer(store.pause_schedule(name))

    @routes.post("/schedules/{name}/resume", response_model=ScheduleDocument, responses=one)
    def resume_schedule(name: ScheduleName) -> Response:
        """Fire the schedule again, from its next fire time after now."""
        return answer(store.pause_schedule(name, paused=False))

    @routes.post(
        "/schedules/{name}/run", status_code=201, response_model=JobDocument, responses=one
    )
    def run_schedule(name: ScheduleName) -> Response:
        """Make one job of the schedule now (its fire times stay); answers the job."""
        job = schedules.run_now(store, name)
        return _doc(job, 201, {"Location": f"/jobs/{job.id}"})

    @routes.delete("/schedules/{name}", status_code=204, response_class=Response, responses=one)
    def delete_schedule(name: ScheduleName) -> Response:
        """Remove the schedule (the jobs it made stay)."""
        schedules.remove(store, name)
        return Response(status_code=204)

    return routes
