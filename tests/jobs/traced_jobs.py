"""A job module that sets up OpenTelemetry in the worker that imports it (as an application
would), exporting each finished span as a JSON line to ``$OUTLAST_TEST_SPANS``: the test of
a trace that crosses processes reads them there."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import outlast


class _JsonLines(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(os.environ["OUTLAST_TEST_SPANS"], "a") as f:
            for span in spans:
                context = span.get_span_context()
                assert context is not None
                line = {
                    "name": span.name,
                    "trace_id": f"{context.trace_id:032x}",
                    "span_id": f"{context.span_id:016x}",
                    "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                    "pid": os.getpid(),
                }
                f.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


if os.environ.get("OUTLAST_TEST_SPANS"):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_JsonLines()))
    trace.set_tracer_provider(provider)


@outlast.job(name="traced.one")
def one(x: int) -> int:
    return x
