"""The sign-in page a server with a token answers at ``/`` to a browser without a session:
a plain form (no script, no file of the dashboard's: those want the session too) that posts
the token to ``/session`` once and is sent back to the dashboard with its session cookie.
The token never rides in a URL this way; a link with ``?token=`` is still traded, and the
address the browser keeps has no token (a redirect drops it).
"""

from __future__ import annotations

import html

from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, RedirectResponse, Response

#: The dashboard's session cookie, and how long it lasts.
SESSION_COOKIE = "outlast_session"
SESSION_TTL = 12 * 3600
#: The sign-in page loads nothing: its style is inline, its form posts to this server only.
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outlast · sign in</title>
<style>
body{{font:16px system-ui,sans-serif;margin:0;display:grid;place-items:center;min-height:100vh;
background:#f5f6f8;color:#1c1e21}}
form{{background:#fff;padding:1.5rem;border-radius:8px;box-shadow:0 1px 4px #0002;
max-width:22rem;width:calc(100% - 3rem)}}
h1{{font-size:1.2rem;margin:0 0 .5rem}} p{{margin:.5rem 0;color:#555}}
input{{font:inherit;width:100%;box-sizing:border-box;padding:.5rem;margin:.5rem 0}}
button{{font:inherit;padding:.5rem 1rem}} .error{{color:#b00020}}
</style></head><body>
<form method="post" action="{action}">
<h1>outlast</h1>
<p>This server wants its token. It is traded for a session cookie for 12 hours; no page
keeps it.</p>
{error}<input name="token" type="password" autocomplete="current-password" required
autofocus aria-label="token" placeholder="token">
<button type="submit">Sign in</button>
</form></body></html>
"""


def page(root: str, error: str | None = None, status: int = 401) -> Response:
    """The sign-in page (``error``: why the last try failed), for an app mounted at
    ``root``."""
    shown = f'<p class="error" role="alert">{html.escape(error)}</p>\n' if error else ""
    body = _PAGE.format(action=html.escape(f"{root}/session"), error=shown)
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}
    return HTMLResponse(body, status_code=status, headers=headers)


def signed_in(root: str, cookie: str, secure: bool) -> Response:
    """Back to the dashboard (without any query), with the session cookie."""
    response = RedirectResponse(f"{root}/", status_code=303)
    set_session(response, cookie, root, secure)
    return response


def set_session(response: Response, cookie: str, root: str, secure: bool) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, for the app's path, 12 hours."""
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=SESSION_TTL,
        path=root or "/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def is_form(headers: Headers) -> bool:
    """Whether a body is an HTML form's (``application/x-www-form-urlencoded``)."""
    kind = headers.get("content-type", "").partition(";")[0].strip().lower()
    return kind == "application/x-www-form-urlencoded"
