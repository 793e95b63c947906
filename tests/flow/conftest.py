"""The flow-control tests use the pool suite's harness: real workers on a fresh store."""

from __future__ import annotations

from tests.pool.conftest import _tunables, pool

__all__ = ["_tunables", "pool"]
