"""``outlast mcp``: an MCP server (the official ``mcp`` SDK) over the store's jobs.

The tools (:mod:`outlast.mcp.tools`) mirror the CLI and answer with the job document:

- ``run_command``: a detached command job (off unless the operator passed
  ``--allow-commands``: a client that may run commands has a shell);
- ``submit``: a registered job (``@outlast.job``) of the modules given with ``--import``, for
  the pools (``outlast worker``) to run;
- ``status``, ``list_jobs`` (filters and paging, as ``GET /jobs``), ``events`` (after a seq),
  ``logs`` (the last lines, or from a byte offset, so an agent can page);
- ``wait``: until the job ends or pauses for an answer, bounded by a timeout the tool
  enforces, with the reason; the job's events are sent as MCP progress notifications (its
  percent out of 100 once it reports one, else a count);
- ``cancel``, ``resume`` (the answer to a paused job's question), ``retry`` (of a command job
  only with ``--allow-commands``: it runs the command again).

Resources: ``outlast://jobs/{id}`` (the document) and ``outlast://jobs/{id}/log`` (the log's
last lines). A user's mistake is an MCP error result saying what is wrong; the server goes on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import ToolAnnotations

from outlast import __version__
from outlast.errors import OutlastError, StoreError
from outlast.mcp.tools import Tools
from outlast.store import Store

INSTRUCTIONS = """\
outlast runs durable background jobs. Start one (run_command, or submit for a registered
job), keep its id, then call wait (it returns when the job ends OR pauses for an answer,
or after its timeout: call it again) and read logs by offset (pass next_offset back). A
paused job asks a question (job.question): answer it with resume. Always read the job's
status before acting on its result, and cancel what you no longer need."""

_READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
#: Each tool's name (a method of :class:`Tools`) and its hints to the client.
TOOLS: dict[str, ToolAnnotations] = {
    "run_command": ToolAnnotations(destructive_hint=True, open_world_hint=True),
    "submit": ToolAnnotations(destructive_hint=False, open_world_hint=True),
    "status": _READS,
    "list_jobs": _READS,
    "events": _READS,
    "logs": _READS,
    "wait": _READS,
    "cancel": ToolAnnotations(destructive_hint=True, idempotent_hint=True),
    "resume": ToolAnnotations(destructive_hint=False),
    "retry": ToolAnnotations(destructive_hint=False),
}


def _message(exc: OutlastError) -> str:
    return f"the store failed: {exc}" if isinstance(exc, StoreError) else str(exc)


def _as_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A user's mistake (an :class:`OutlastError`) becomes an MCP error result saying what
    is wrong."""
    import inspect

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except OutlastError as exc:
                raise ToolError(_message(exc)) from None

        return guarded_async

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OutlastError as exc:
            raise ToolError(_message(exc)) from None

    return guarded


def _as_resource(fn: Callable[[str], str]) -> Callable[[str], str]:
    """An unknown or malformed id is a resource the client cannot have."""

    @functools.wraps(fn)
    def read(job_id: str) -> str:
        try:
            return fn(job_id)
        except OutlastError as exc:
            raise ResourceNotFoundError(_message(exc)) from None

    return read


def build(store: Store, *, allow_commands: bool = False) -> MCPServer:
    """The MCP server over ``store``. Registered jobs are those of the modules imported
    before (``--import``); ``allow_commands`` lets clients run commands."""
    server: MCPServer = MCPServer(
        "outlast", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    tools = Tools(store, allow_commands=allow_commands)
    for name, hints in TOOLS.items():
        method = getattr(tools, name)
        description = " ".join((method.__doc__ or "").split())
        if name == "run_command" and not allow_commands:
            description += " (It was not: this tool refuses.)"
        server.add_tool(_as_tool(method), name=name, description=description, annotations=hints)
    resources = [
        ("outlast://jobs/{job_id}", "job", "application/json", tools.job_resource),
        ("outlast://jobs/{job_id}/log", "job log", "text/plain", tools.log_resource),
    ]
    for uri, title, mime, read in resources:
        about = " ".join((read.__doc__ or "").split())
        server.resource(uri, name=title, mime_type=mime, description=about)(_as_resource(read))
    return server


def serve(
    store_url: str | None,
    *,
    imports: Sequence[str] = (),
    allow_commands: bool = False,
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = 8766,
    token: str | None = None,
) -> None:
    """Serve MCP over stdio (the default) or streamable HTTP (``http``: at ``/mcp`` on
    ``host:port``; a non-loopback host needs ``token``, sent as ``Authorization: Bearer``)."""
    from outlast.run.registry import import_modules
    from outlast.store import open_store

    import_modules(list(imports))
    if http:
        from outlast import config
        from outlast.http.server import bind, check_exposure

        token = token or config.token()
        check_exposure(host, token)
        sock = bind(host, port)
    store = open_store(store_url, create=True)
    try:
        server = build(store, allow_commands=allow_commands)
        if not http:
            server.run("stdio")
            return
        _serve_http(server, sock, host, port, token)
    finally:
        store.close()


def _serve_http(server: MCPServer, sock: Any, host: str, port: int, token: str | None) -> None:
    import hmac

    import uvicorn
    from starlette.responses import JSONResponse

    app = server.streamable_http_app(host=host)

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and token:
            headers = dict(scope.get("headers") or ())
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                refused = JSONResponse(
                    {"error": "unauthorized", "detail": "send Authorization: Bearer <token>"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refused(scope, receive, send)
                return
        await app(scope, receive, send)

    config = uvicorn.Config(
        guarded, host=host, port=port, log_level="warning", server_header=False, lifespan="on"
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
