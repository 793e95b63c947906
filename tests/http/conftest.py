"""Fixtures of the HTTP tests: a SQLite store, and server processes over it (one of each per
session: every test makes its own jobs).

``server`` has no token; ``secured`` requires :data:`TOKEN`. Both run ``create_app`` under
uvicorn in a child process; tests talk to them over real sockets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.store import Store, open_store
from tests.http.harness import Server

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="session")
def http_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("http")
    os.chmod(path, 0o700)
    return path


@pytest.fixture(scope="session")
def http_store_url(http_dir: Path) -> str:
    return f"sqlite://{http_dir}/outlast.db"


@pytest.fixture(scope="session")
def http_store(http_store_url: str) -> Iterator[Store]:
    store = open_store(http_store_url)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(scope="session")
def server(http_store_url: str, http_store: Store, http_dir: Path) -> Iterator[Server]:
    srv = Server(http_store_url, http_dir, ping=0.5)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="session")
def secured(http_store_url: str, http_store: Store, http_dir: Path) -> Iterator[Server]:
    srv = Server(http_store_url, http_dir, token=TOKEN)
    try:
        yield srv
    finally:
        srv.close()
