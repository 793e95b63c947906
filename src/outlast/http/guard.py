"""What every request passes before it is routed or its body parsed. Pure ASGI, so a refused
request costs no parsing and gets the same JSON error shape as everything else:

- **Host** (when the server is bound to loopback without a token): the ``Host`` header must
  name a loopback address, so a page whose own name resolves to 127.0.0.1 (DNS rebinding)
  cannot read the API.
- **Cross-site writes**: a request that may change something (``POST``, ``PUT``, ``PATCH``,
  ``DELETE``) is refused when the browser says it comes from another site
  (``Sec-Fetch-Site``) or another origin (``Origin`` not this ``Host``); a body must be JSON
  (``Content-Type: application/json``), which a cross-site form cannot send without asking
  first (and CORS is off: nothing allows it). A client that is not a browser sends neither
  header and is judged by its token alone.
- **The token**: ``Authorization: Bearer <token>``, or the dashboard's session cookie (set by
  ``POST /session`` with the token: HttpOnly, SameSite=Strict, 12 hours, an HMAC of the
  token, so it works across server restarts and dies with a new token). The two stream
  routes still take ``?token=`` from clients that cannot send a header; the access log
  masks it (:func:`redact_access_log`).
- **The body size** limit.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Collection
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outlast.http import signin
from outlast.http.signin import SESSION_COOKIE, SESSION_TTL

#: Bodies larger than this many bytes are refused with 413.
MAX_BODY = 1024 * 1024

#: Routes that may take the token as ``?token=``: EventSource cannot set headers.
_QUERY_TOKEN = re.compile(r"/events|/jobs/[^/]+/events")
#: Methods that may change something: refused from another site.
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_TOKEN_IN_QUERY = re.compile(r"([?&]token=)[^&\s\"]*")


def session_value(token: str, issued: int | None = None) -> str:
    """A session cookie's value for ``token``: the time it was issued and an HMAC of it
    keyed by the token (nothing is kept on the server)."""
    issued = int(time.time()) if issued is None else issued
    mac = hmac.new(token.encode(), f"outlast-session:{issued}".encode(), hashlib.sha256)
    return f"{issued}.{mac.hexdigest()}"


def session_ok(token: str, value: str) -> bool:
    """Whether a session cookie's value was made for ``token`` in the last 12 hours."""
    issued, _, _ = value.partition(".")
    if not issued.isdigit():
        return False
    age = time.time() - int(issued)
    if not -60 <= age <= SESSION_TTL:
        return False
    return hmac.compare_digest(session_value(token, int(issued)), value)


def redact_access_log() -> None:
    """Mask ``token=…`` in the request lines uvicorn's access log writes (idempotent)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _MaskToken) for f in logger.filters):
        logger.addFilter(_MaskToken())


class _MaskToken(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_IN_QUERY.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _TOKEN_IN_QUERY.sub(r"\1***", record.msg)
        return True


def cross_site(headers: Headers) -> str | None:
    """Why a request that may change something is refused as coming from another site (a
    browser says so in ``Sec-Fetch-Site`` and ``Origin``), or None."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site} request cannot change anything here"
    if site == "same-origin":  # the browser's own word, which no page can forge: a proxy
        return None  # that rewrites Host (nginx's default) must not refuse the dashboard
    origin = headers.get("origin")
    if origin is not None and (
        origin == "null" or urlsplit(origin).netloc != headers.get("host", "")
    ):
        return f"a request from {origin} cannot change anything here"
    return None


def host_name(host: str) -> str:
    """A ``Host`` header's name, without the port (``[::1]:8765`` is ``::1``)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


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


#: What stays open with a token set: liveness and signing in. Everything else (the
#: dashboard's files, the API's description, ``/jobs``, ``/events``, ``/metrics``, any route
#: added later) wants the token: a new route is never open by mistake. ``/`` answers a
#: browser without a session with the sign-in page (:mod:`outlast.http.signin`).
PUBLIC = frozenset({"/healthz", "/session"})


def protected(path: str) -> bool:
    return path not in PUBLIC


class Guard:
    """Checks the ``Host`` (when ``hosts`` is given), refuses cross-site writes and bodies
    that are not JSON, checks the token on every route but :data:`PUBLIC` (when a token is
    set) in constant time, and buffers request bodies up to :data:`MAX_BODY`."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        max_body: int = MAX_BODY,
        hosts: Collection[str] | None = None,
    ) -> None:
        """``hosts``: the names the ``Host`` header may give (None: any)."""
        self.app = app
        self.token = token.encode() if token else None
        self._token_text = token
        self.max_body = max_body
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        headers = Headers(scope=scope)
        form = self.token is not None and path == "/session" and signin.is_form(headers)
        refused = self._refusal(scope, headers, json_only=not form)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if form:
            await self._sign_in_form(scope, receive, send)
            return
        if self.token is not None and protected(path):
            problem = self._auth_problem(scope, path)
            if problem is not None and path == "/" and scope["method"] in ("GET", "HEAD"):
                await self._sign_in_page(scope)(scope, receive, send)
                return
            if problem is not None:
                challenge = {"WWW-Authenticate": 'Bearer realm="outlast"'}
                await error_response(401, "unauthorized", problem, challenge)(scope, receive, send)
                return
        length = headers.get("content-length")
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

    def _sign_in_page(self, scope: Scope) -> Response:
        """``/`` without a session: the sign-in page, or a link's ``?token=`` traded for
        the session cookie and dropped from the address."""
        assert self._token_text is not None
        root = scope.get("root_path", "")
        given = QueryParams(scope["query_string"]).get("token")
        if given is None:
            return signin.page(root)
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token or b""):
            return signin.page(root, "Wrong token: try again.")
        secure = scope.get("scheme") == "https"
        return signin.signed_in(root, session_value(self._token_text), secure)

    async def _sign_in_form(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The sign-in page's form (``POST /session``, form-encoded; refused from another
        site like any write): the token is traded for the cookie."""
        assert self._token_text is not None
        root = scope.get("root_path", "")
        problem = None if scope["method"] == "POST" else "sign in with POST"
        body = b""
        while problem is None:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > 4096:
                problem = "the form is too large"
            elif not message.get("more_body", False):
                break
        if problem is not None:
            await error_response(403, "forbidden", problem)(scope, receive, send)
            return
        given = QueryParams(body.decode("utf-8", "replace")).get("token", "")
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self.token or b""):
            response = signin.page(root, "Wrong token: try again.")
        else:
            secure = scope.get("scheme") == "https"
            response = signin.signed_in(root, session_value(self._token_text), secure)
        await response(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers, json_only: bool) -> JSONResponse | None:
        """The answer to a request refused before its token is looked at, or None
        (``json_only``: a body that may change something must be JSON)."""
        if self.hosts is not None:
            host = headers.get("host", "")
            if host_name(host).lower() not in self.hosts:
                detail = (
                    f"this server answers to {', '.join(sorted(self.hosts))}, not {host!r} "
                    "(a name that points here from elsewhere is refused: DNS rebinding)"
                )
                return error_response(403, "forbidden host", detail)
        if scope["method"] in UNSAFE:
            problem = cross_site(headers)
            if problem is not None:
                return error_response(403, "cross-site request", problem)
            length = headers.get("content-length", "0")
            has_body = headers.get("transfer-encoding") is not None or length not in ("", "0")
            kind = headers.get("content-type", "").partition(";")[0].strip().lower()
            if has_body and kind != "application/json" and json_only:
                detail = f"send the body as JSON (Content-Type: application/json), not {kind!r}"
                return error_response(415, "unsupported media type", detail)
        return None

    def _auth_problem(self, scope: Scope, path: str) -> str | None:
        assert self.token is not None and self._token_text is not None
        headers = Headers(scope=scope)
        header = headers.get("authorization")
        cookie = _session_cookie(headers)
        if header is None and cookie is not None:
            if session_ok(self._token_text, cookie):
                return None
            return "the session has expired or the token changed: sign in again"
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


def _session_cookie(headers: Headers) -> str | None:
    raw = headers.get("cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:  # a malformed Cookie header: as if there were none
        return None
    morsel = jar.get(SESSION_COOKIE)
    return None if morsel is None else morsel.value
