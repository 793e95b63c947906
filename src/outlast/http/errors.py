"""Every failure of a request becomes a JSON ``{"error", "detail"}`` with the right status.

Outlast's own errors map by type (not found 404, bad input 400, conflicts and a corrupt job
409, a failing store 503); FastAPI's validation errors become 400 (malformed JSON) or 422
(wrong shape) with the offending fields named. Anything else is a bug: a 500 with no
internals, logged here.
"""

from __future__ import annotations

import http
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from outlast import errors
from outlast.http.guard import error_response
from outlast.http.sse import TooManyStreams

#: Seconds a client refused for too many streams is told to wait.
RETRY_AFTER = 5

log = logging.getLogger("outlast.http")

#: Outlast's errors by HTTP status; the first match in this order wins (subclasses first).
STATUS: tuple[tuple[type[errors.OutlastError], int, str], ...] = (
    (errors.InvalidJobId, 400, "invalid job id"),
    (errors.InvalidInput, 400, "invalid input"),
    (errors.JobNotFound, 404, "not found"),
    (errors.JobActive, 409, "job is active"),
    (errors.ScheduleExists, 409, "schedule exists"),
    (errors.DuplicateJob, 409, "duplicate job"),
    (errors.InvalidTransition, 409, "conflict"),
    (errors.WorkerLockHeld, 409, "conflict"),
    (errors.StoreError, 503, "store unavailable"),
    # the request was fine, the stored document is not: nothing to retry; the operator may
    # remove it (DELETE /jobs/{id}?force=true)
    (errors.CorruptJob, 409, "corrupt job"),
)


def _outlast(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.OutlastError)
    for kind, status, error in STATUS:
        if isinstance(exc, kind):
            if status >= 500:
                log.error("%s %s: %s", request.method, request.url.path, exc)
            return error_response(status, error, exc.message)
    return error_response(400, "rejected", exc.message)


def _fields(errs: Any) -> list[dict[str, Any]]:
    """Pydantic's errors without their input echo (it can be large or not JSON)."""
    return [
        {
            "loc": [str(part) for part in e.get("loc", ())],
            "msg": e.get("msg"),
            "type": e.get("type"),
        }
        for e in errs
    ]


def _validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    for e in errs:
        if e.get("type") == "json_invalid":
            reason = (e.get("ctx") or {}).get("error", "")
            return error_response(400, "malformed JSON", f"the body is not valid JSON: {reason}")
    return error_response(422, "invalid request", _fields(errs))


def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    try:
        error = http.HTTPStatus(exc.status_code).phrase.lower()
    except ValueError:
        error = "error"
    return error_response(exc.status_code, error, exc.detail, dict(exc.headers or {}) or None)


def _internal(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error", "the server failed; see its log")


def _too_many(request: Request, exc: Exception) -> Response:
    return error_response(
        503,
        "too many streams",
        f"{exc}; try again later",
        # closed after the answer: a crowd refused must not keep the descriptors it was refused
        {"Retry-After": str(RETRY_AFTER), "Connection": "close"},
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(TooManyStreams, _too_many)
    app.add_exception_handler(errors.OutlastError, _outlast)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _internal)
