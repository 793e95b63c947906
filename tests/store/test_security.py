"""Secrets stay out of the store, and the store's files are private to their owner."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.store import Store, open_store
from tests.store.adapters import Adapter

SECRET = "s3cr3t-value"


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A usual umask, so that modes come from the store, not from a strict umask."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_secrets_are_masked_before_they_are_stored(
    store: Store, store_url: str, adapter: Adapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_API_TOKEN", SECRET)
    store.create(name="leaky", max_attempts=1)
    [task] = store.claim()
    event = task.report("call", "progress", f"calling with {SECRET} now")
    assert event is not None and event.message == "calling with *** now"
    task.report("call", "progress", {"header": f"Bearer {SECRET}", "list": [SECRET]})
    state = task.fail(RuntimeError(f"boom {SECRET}"))
    assert state.error is not None and state.error.message == "boom ***"
    assert store.get(task.id).error.message == "boom ***"  # type: ignore[union-attr]
    messages = [e.message for e in store.events(task.id)]
    assert messages[1] == "calling with *** now"
    assert messages[2] == {"header": "Bearer ***", "list": ["***"]}
    assert SECRET not in repr(messages)
    assert SECRET not in repr(store.get(task.id).to_dict())
    root = adapter.root(store_url) if adapter.root else None
    if root is not None:
        for path in root.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"{path} holds the secret"


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    dirs, files = [root], []
    for path in root.rglob("*"):
        (dirs if path.is_dir() else files).append(path)
    return dirs, files


def test_store_folders_are_0700_and_files_0600(
    adapter: Adapter, tmp_path: Path, umask_022: None
) -> None:
    root_of = adapter.need("root")
    job_files = adapter.need("job_files")
    url = adapter.make_url(tmp_path / "fresh")
    if url is None:
        pytest.skip(f"the {adapter.name} store is not available")
    with open_store(url) as store:
        store.create(name="kept")
        [task] = store.claim()
        task.report("s", "progress", "secret payloads live here")
        store.create(name="done").cancel()
        root = root_of(url)
        assert isinstance(root, Path)
        expected = job_files(url, task.id)
        assert isinstance(expected, list)
        dirs, files = _walk(root)
        for path in expected:
            assert path in files, f"{path} is not where the adapter keeps the job"
        for path in dirs:
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, f"{path} is not 0700"
        for path in files:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == 0o600, f"{path} is {mode:o}, not 0600"


def test_a_store_folder_open_to_others_is_reported(
    adapter: Adapter, tmp_path: Path, caplog: pytest.LogCaptureFixture, umask_022: None
) -> None:
    root_of = adapter.need("root")
    url = adapter.make_url(tmp_path / "wide")
    if url is None:
        pytest.skip(f"the {adapter.name} store is not available")
    root = root_of(url)
    assert isinstance(root, Path)
    root.mkdir(parents=True)
    root.chmod(0o755)
    if adapter.name == "sqlite":
        # The folder a database file sits in is the user's (it may be /tmp), and the file is
        # 0600: not reported. The store's own folder beside it is.
        caplog.set_level(logging.WARNING)
        with open_store(url) as store:
            store.create(name="j")
        assert not caplog.records, caplog.records
        root = Path(f"{url[len('sqlite://') :]}.d")
        root.chmod(0o755)
    caplog.set_level(logging.WARNING)
    with open_store(url) as store:
        store.create(name="j")
    assert any(str(root) in r.getMessage() for r in caplog.records), caplog.records
