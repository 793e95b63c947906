"""What every request passes before it is routed or its body parsed: the bearer token and the
body size limit. Pure ASGI, so an unauthenticated or oversized request costs no parsing and
gets the same JSON error shape as everything else."""

from __future__ import annotations

import hmac
import re
from typing import Any

from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Bodies larger than this many bytes are refused with 413.
MAX_BODY = 1024 * 1024

#: Routes that may take the token as ``?token=``: EventSource cannot set headers.
_QUERY_TOKEN = re.compile(r"/events|/jobs/[^/]+/events")


def error_response(
    status: int, error: str, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one shape of every error answer: ``{"error": …, "detail": …}``."""
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def route_path(scope: Scope) -> str:
    """The request path below the app's mount point."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


#: What stays open with a token set: the dashboard's page and files, liveness, the API's
#: description. Everything else (``/jobs``, ``/events``, ``/schedules``, any route added
#: later) wants the token: a new route is never open by mistake.
PUBLIC = frozenset({"/", "/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect"})


def protected(path: str) -> bool:
    return path not in PUBLIC and not path.startswith("/static/")


class Guard:
    """Checks ``Authorization: Bearer <token>`` on every route but :data:`PUBLIC` (when
    a token is set) in constant time, and buffers request bodies up to :data:`MAX_BODY`."""

    def __init__(self, app: ASGIApp, token: str | None, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if self.token is not None and protected(path):
            problem = self._auth_problem(scope, path)
            if problem is not None:
                headers = {"WWW-Authenticate": 'Bearer realm="outlast"'}
                await error_response(401, "unauthorized", problem, headers)(scope, receive, send)
                return
        length = Headers(scope=scope).get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            too_big = length.isdigit()
            response = error_response(
                413 if too_big else 400,
                "body too large" if too_big else "bad request",
                f"request bodies are at most {self.max_body} bytes"
                if too_big
                else f"invalid Content-Length {length!r}",
            )
            await response(scope, receive, send)
            return
        await self._buffered(scope, receive, send)

    def _auth_problem(self, scope: Scope, path: str) -> str | None:
        assert self.token is not None
        header = Headers(scope=scope).get("authorization")
        if header is not None:
            scheme, _, value = header.strip().partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                return "malformed Authorization header; send 'Authorization: Bearer <token>'"
            given: str | None = value.strip()
        elif _QUERY_TOKEN.fullmatch(path):
            given = QueryParams(scope["query_string"]).get("token")
        else:
            given = None
        if not given:
            return "this route needs 'Authorization: Bearer <token>'"
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token):
            return "wrong token"
        return None

    async def _buffered(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the whole body first (refusing it past the limit), then replay it to the app;
        later ``receive`` calls go to the server, so a client's disconnect is still seen."""
        chunks: list[bytes] = []
        size = 0
        pending: Message | None = None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                pending = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body:
                detail = f"request bodies are at most {self.max_body} bytes"
                await error_response(413, "body too large", detail)(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        first: Message = pending or {
            "type": "http.request",
            "body": b"".join(chunks),
            "more_body": False,
        }
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return first
            return await receive()

        await self.app(scope, replay, send)
