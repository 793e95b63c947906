"""OpenTelemetry: the span that submits a job and the worker's span for it are one trace (the
SDK's in-memory exporter, in this process; and across processes, through a real pool whose
job module exports its spans); a pipeline's stages are children of the job's
span; a command gets ``TRACEPARENT``; without a tracer provider, no trace is stored."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.model import Kind, Status
from outlast.run import tracing
from outlast.run.api import create_job, run_command
from outlast.run.execute import execute
from outlast.store import Store, open_store
from tests.jobs import pyjobs

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    """A tracer provider for this process (set once: OpenTelemetry allows no other)."""
    if tracing.available() is False:
        provider = sdk.TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    yield EXPORTER


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    tmp_path.chmod(0o700)
    opened = open_store(f"sqlite://{tmp_path}/s.db")
    yield opened
    opened.close()


def _run(store: Store, job_id: str) -> None:
    [task] = store.claim(limit=1)
    assert task.id == job_id and task.attempt is not None
    execute(store, job_id, task.attempt)
    task.release_worker_lock()


def test_one_trace_from_submit_to_the_jobs_end(traced: InMemorySpanExporter, store: Store) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /orders") as request:
        job_id = create_job(store, pyjobs.one, [7]).id
        failing = create_job(store, pyjobs.boom, ["no"], attempts=1).id
    stored = store.get(job_id).trace
    assert stored is not None and stored.startswith("00-")
    assert f"{request.get_span_context().trace_id:032x}" in stored
    _run(store, job_id)
    _run(store, failing)
    assert store.get(job_id).status == Status.SUCCEEDED
    spans = {s.name: s for s in traced.get_finished_spans()}
    job = spans["job py.one"]
    root = spans["POST /orders"]
    assert job.context.trace_id == root.context.trace_id, "not one trace"
    assert job.parent is not None and job.parent.span_id == root.context.span_id
    assert job.kind == trace.SpanKind.CONSUMER
    assert job.attributes["outlast.job.id"] == job_id
    assert job.attributes["outlast.outcome"] == "succeed"
    failed = spans["job py.boom"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"


def test_a_command_gets_the_trace_in_its_environment(
    traced: InMemorySpanExporter, store: Store, tmp_path: Path
) -> None:
    out = tmp_path / "env"
    with trace.get_tracer("tests").start_as_current_span("deploy") as span:
        task = run_command(["sh", "-c", f'echo "$TRACEPARENT" > {out}'], store=store)
    state = store.wait(task.id, timeout=30)
    assert state.status == Status.SUCCEEDED
    assert out.read_text().strip() == state.trace
    assert f"{span.get_span_context().trace_id:032x}" in out.read_text()


def test_no_span_no_trace(store: Store) -> None:
    # outside any span there is nothing to store, whether a provider is set or not
    state = store.create(kind=Kind.FUNCTION, name="plain")
    assert state.state().trace is None
    assert create_job(store, pyjobs.one, [1]).state().trace is None


def test_a_pipelines_stages_are_children_of_its_span(
    traced: InMemorySpanExporter, store: Store
) -> None:
    with trace.get_tracer("tests").start_as_current_span("nightly"):
        job_id = create_job(store, pyjobs.PIPE, payload={"a": 1}).id
    _run(store, job_id)
    assert store.get(job_id).status == Status.SUCCEEDED
    spans = {s.name: s for s in traced.get_finished_spans()}
    job = spans["job py.pipe"]
    for stage in ("stage count", "stage again"):
        assert spans[stage].parent is not None
        assert spans[stage].parent.span_id == job.context.span_id
        assert spans[stage].context.trace_id == spans["nightly"].context.trace_id


def test_one_trace_across_processes_through_a_real_pool(
    traced: InMemorySpanExporter, tmp_path: Path
) -> None:
    """The submitter's span here; the job's span in a job process of a real ``outlast
    worker`` (whose job module set up its own exporter): one trace, parent and child."""
    from tests.jobs import traced_jobs
    from tests.pool.conftest import Harness

    spans_file = tmp_path / "spans.jsonl"
    pool = Harness(tmp_path)
    try:
        tracer = trace.get_tracer("tests")
        with tracer.start_as_current_span("POST /orders") as request:
            job_id = create_job(pool.store, traced_jobs.one, [5]).id
        env = {"OUTLAST_TEST_SPANS": str(spans_file)}
        worker = pool.cli("worker", "--import", traced_jobs.__name__, "--burst", "-c", "1", env=env)
        assert worker.returncode == 0, worker
        assert pool.get(job_id).status == Status.SUCCEEDED
        lines = [json.loads(line) for line in spans_file.read_text().splitlines()]
        [job] = [s for s in lines if s["name"] == "job traced.one"]
        root = request.get_span_context()
        assert job["trace_id"] == f"{root.trace_id:032x}", "not one trace"
        assert job["parent_id"] == f"{root.span_id:016x}"
        assert job["pid"] != os.getpid()
    finally:
        pool.close()
