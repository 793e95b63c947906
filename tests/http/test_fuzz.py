"""Schemathesis against the live server's ``/openapi.json``: generated requests, valid and
not, to every operation; none may get a 500, and every answer must match the schema.

Kept bounded (a few examples per operation) so the suite stays fast; the real server runs
in its own process, so a crash or a hang there fails the test too.
"""

from __future__ import annotations

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.schemas import BaseSchema
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from outlast.store import Store
from tests.http.harness import Server


@pytest.fixture(scope="module")
def api(server: Server, http_store: Store) -> BaseSchema:
    for i in range(3):  # something to find: pending, canceled and succeeded jobs
        task = http_store.create(kind="function", name="fuzzed", labels={"n": str(i)})
        if i == 1:
            task.cancel()
        elif i == 2:
            task.start()
            task.succeed({"ok": True})
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.timeout(180)
def test_no_request_gets_a_server_error(api: BaseSchema) -> None:
    """Positive and negative cases for every operation. (Schemathesis's own pytest
    integration, ``from_fixture``, does not run under pytest 9 here, so the operations are
    driven with their hypothesis strategies directly.)"""
    failures: list[str] = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        if operation.path == "/events":
            continue  # a valid request streams for ever; test_streams.py covers it
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(
                max_examples=8,
                deadline=None,
                suppress_health_check=list(hypothesis.HealthCheck),
                database=None,
                phases=[hypothesis.Phase.generate],
            )
            def run(case: schemathesis.Case) -> None:
                case.call_and_validate(timeout=10, checks=CHECKS)

            try:
                run()
            except hypothesis.errors.Unsatisfiable:
                pass  # nothing to break: an operation without parameters has no negative case
            except Exception as exc:  # collect them all, report every operation that failed
                failures.append(f"{operation.label} ({mode}): {exc}")
    assert not failures, "\n\n".join(failures)
