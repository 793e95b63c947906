"""The pool suite (tests/pool: real ``outlast worker`` processes) on a PostgreSQL store.

Each ``test_*`` of the pool modules is collected here again with a ``pool`` harness whose
store is a fresh PostgreSQL schema.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from _pytest.fixtures import FixtureFunctionDefinition

from outlast.store import open_store
from tests.pg import support
from tests.pool.conftest import Harness

pytestmark = pytest.mark.timeout(180)


class PgHarness(Harness):
    def __init__(self, tmp: Path, url: str) -> None:
        super().__init__(tmp)
        self.store.close()
        self.url = url
        self.env["OUTLAST_STORE"] = url
        self.store = open_store(url)

    def close(self) -> None:
        schema = support.schema_of(self.url)
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error, OSError):
                if schema in proc.environ().get("OUTLAST_STORE", "") or any(
                    schema in arg for arg in proc.cmdline()
                ):
                    os.kill(proc.pid, signal.SIGKILL)
        super().close()


@pytest.fixture
def pool(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    harness = PgHarness(tmp_path, store_url)
    try:
        yield harness
    finally:
        harness.close()


_SUITE = (
    "test_bad_input",
    "test_exactly_once",
    "test_failures",
    "test_lifecycle",
    "test_pause_cancel",
    "test_spawn",
)

for _name in _SUITE:
    _module = importlib.import_module(f"tests.pool.{_name}")
    for _attr, _value in vars(_module).items():
        if _attr.startswith("test_") and callable(_value):
            globals()[f"{_attr}__{_name[5:]}"] = _value
        elif isinstance(_value, FixtureFunctionDefinition) and _attr != "pool":
            globals()[_attr] = _value
