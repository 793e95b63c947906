"""Shared fixtures: ``store`` is parametrized over every adapter of tests/store/adapters.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.store import Store, open_store
from tests.store.adapters import ADAPTERS, Adapter


@pytest.fixture(params=ADAPTERS, ids=lambda adapter: adapter.name)
def adapter(request: pytest.FixtureRequest) -> Adapter:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def store_url(adapter: Adapter, tmp_path: Path) -> str:
    """The URL of a fresh, empty store of the adapter; skips when it cannot run here."""
    url = adapter.make_url(tmp_path)
    if url is None:
        pytest.skip(f"the {adapter.name} store is not available on this machine")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL store's job logs go to the user's state folder: this test's own; and
    retries come quickly (the detached workers the test starts read both)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "0.05")
