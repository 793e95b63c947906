"""The PostgreSQL tests: the shared conformance suite (through the ``adapter`` fixture, here
always PostgreSQL) and this adapter's own tests. Each test gets its own schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.store import Store, open_store
from tests.pg import support
from tests.store.adapters import Adapter

try:
    import psycopg  # noqa: F401
except ImportError:  # pip install 'outlast[postgres]' to run these
    collect_ignore_glob = ["test_*.py"]

POSTGRESQL = Adapter("postgresql", support.make_url, write_raw=support.write_raw)


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Job logs of a PostgreSQL store live in the user's state folder: a test's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(params=[POSTGRESQL], ids=lambda adapter: adapter.name)
def adapter(request: pytest.FixtureRequest) -> Adapter:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def store_url(adapter: Adapter, tmp_path: Path) -> Iterator[str]:
    url = adapter.make_url(tmp_path)
    if url is None:
        pytest.skip(f"no PostgreSQL server at {support.BASE_URL}")
    try:
        yield url
    finally:
        support.drop_schema(url)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()
