"""Fixtures of the CLI acceptance tests: ``cli`` is the real ``outlast`` bound to a fresh store.

A test runs against SQLite unless it asks for both local adapters with ``@STORES``
(``pytest.mark.parametrize("cli", ["sqlite", "files"], indirect=True)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import Outlast


@pytest.fixture(scope="session")
def pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the CLI subprocesses keep compiled modules: each of the hundreds of ``outlast``
    calls would otherwise compile outlast from source again (the environment may set
    PYTHONDONTWRITEBYTECODE), and nothing is written into the source tree."""
    return tmp_path_factory.mktemp("pycache")


@pytest.fixture
def cli(request: pytest.FixtureRequest, tmp_path: Path, pycache: Path) -> Iterator[Outlast]:
    os.chmod(tmp_path, 0o700)  # a store folder open to others makes outlast warn on stderr
    outlast = Outlast(getattr(request, "param", "sqlite"), tmp_path, pycache)
    try:
        yield outlast
    finally:
        outlast.close()
