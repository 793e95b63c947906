"""OpenTelemetry, when it is installed (``pip install outlast[otel]``): one trace from the
code that creates a job to the job's end.

- Creating a job (``submit``, ``spawn``, ``run_command``, ``POST /jobs``) stores the W3C
  ``traceparent`` of the current span on the job (``JobState.trace``), if there is one.
- The worker that runs the job opens a span ``job <name>`` (kind CONSUMER) whose parent is
  that context, with the job's id, kind, queue and attempt as attributes; it ends with the
  attempt, marked as an error when it failed. Each pipeline stage is a child span
  ``stage <name>``. A command's supervisor puts the context in the command's environment
  as ``TRACEPARENT`` (the convention of OpenTelemetry's environment carriers).

outlast never imports ``opentelemetry`` itself: a process that has not imported it (and
set a tracer provider) pays one dictionary lookup per job and makes no span.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from outlast.model import JobState


def available() -> bool:
    """Whether this process uses OpenTelemetry: its API is imported (by the application, or
    ``opentelemetry-instrument``) and a tracer provider is set. outlast never imports it
    itself, so a process that does not trace pays one dictionary lookup."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None (no OpenTelemetry, no span)."""
    if not available():
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def job_span(state: JobState) -> Iterator[Any]:
    """The worker's span for one attempt of ``state``, joined to the trace it was created
    in (a new trace when it has none); yields the span, or None without OpenTelemetry."""
    if not available():
        yield None
        return
    from opentelemetry import propagate, trace

    parent = propagate.extract({"traceparent": state.trace}) if state.trace else None
    tracer = trace.get_tracer("outlast")
    attributes: dict[str, Any] = {
        "outlast.job.id": state.id,
        "outlast.job.kind": str(state.kind),
        "outlast.job.queue": state.queue,
        "outlast.job.attempt": state.attempts,
    }
    with tracer.start_as_current_span(
        f"job {state.name}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_attempt(span: Any, verb: str, error_type: str | None, message: str | None) -> None:
    """Mark the span with how the attempt ended (an error for a failure)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("outlast.outcome", verb)
    if verb == "fail":
        span.set_status(Status(StatusCode.ERROR, message))
        if error_type:
            span.set_attribute("error.type", error_type)


@contextlib.contextmanager
def stage_span(name: str) -> Iterator[None]:
    """A pipeline stage's span, a child of the job's."""
    if not available():
        yield
        return
    from opentelemetry import trace

    with trace.get_tracer("outlast").start_as_current_span(f"stage {name}"):
        yield
