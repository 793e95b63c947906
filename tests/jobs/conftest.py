"""The tests of Python jobs (arguments, tracebacks, logs, imports, async jobs and client) use
the pool suite's harness: real workers on a fresh store."""

from __future__ import annotations

from tests.pool.conftest import _tunables, pool

__all__ = ["_tunables", "pool"]
