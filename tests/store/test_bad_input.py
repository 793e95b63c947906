"""Bad input is refused cleanly: hostile ids, corrupt documents, bad arguments and URLs."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from outlast.errors import CorruptJob, InvalidInput, InvalidJobId, JobNotFound
from outlast.store import Store, open_store
from tests.store.adapters import Adapter

BAD_IDS = {
    "dotdot-slash": "../x",
    "deep-escape": "../../etc/passwd",
    "slash": "a/b",
    "absolute": "/etc/passwd",
    "dot": ".",
    "dotdot": "..",
    "empty": "",
    "nul": "ab\0cd",
    "newline": "ab\ncd",
    "long": "a" * 10_000,
}


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_bad_ids_are_refused_before_touching_anything(
    store: Store, tmp_path: Path, bad: str
) -> None:
    good = store.create(name="good")
    good.report("s", "progress", "x")
    before = tree(tmp_path)
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: store.get(bad),
        "open": lambda: store.open(bad),
        "delete": lambda: store.delete(bad),
        "delete-force": lambda: store.delete(bad, force=True),
        "events": lambda: store.events(bad),
        "watch": lambda: next(iter(store.watch(bad, timeout=1))),
        "wait": lambda: store.wait(bad, timeout=1),
        "list-before": lambda: store.list(before=bad),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidJobId):
            call()
            pytest.fail(f"{name} accepted {bad[:20]!r}")
    assert tree(tmp_path) == before, "a bad id created or removed a file"
    # The store is still fine.
    assert store.get(good.id).name == "good"
    assert [e.message for e in store.events(good.id)] == ["x"]
    assert store.create(name="after").state().name == "after"


def test_an_id_from_a_nonexistent_but_clean_name_is_not_found(store: Store) -> None:
    for job_id in ("deadbeef", "x", "a.b-c_d", "9" * 128):
        with pytest.raises(JobNotFound):
            store.get(job_id)
        with pytest.raises(JobNotFound):
            store.open(job_id).report("s", "progress")


def _good_doc(store: Store, job_id: str) -> dict[str, object]:
    return store.get(job_id).to_dict()


def _with(doc: dict[str, object], **changes: object) -> bytes:
    return json.dumps({**doc, **changes}).encode()


CORRUPTIONS: dict[str, Callable[[dict[str, object]], bytes]] = {
    "empty": lambda doc: b"",
    "truncated": lambda doc: _with(doc)[: len(_with(doc)) // 2],
    "json-list": lambda doc: json.dumps([doc]).encode(),
    "json-string": lambda doc: b'"hello"',
    "unknown-status": lambda doc: _with(doc, status="exploded"),
    "invalid-utf8": lambda doc: _with(doc, name="MARK").replace(b"MARK", b"\xc3\x28\xff"),
    "missing-fields": lambda doc: json.dumps({"id": doc["id"]}).encode(),
    "other-job": lambda doc: _with(doc, id="someotherjob"),
    "bad-time": lambda doc: _with(doc, created_at="yesterday"),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_a_corrupt_document_is_reported_and_skipped(
    store: Store,
    store_url: str,
    adapter: Adapter,
    caplog: pytest.LogCaptureFixture,
    corrupt: Callable[[dict[str, object]], bytes],
) -> None:
    write_raw = adapter.need("write_raw")
    first = store.create(name="first")
    bad = store.create(name="bad")
    last = store.create(name="last")
    assert len(store.list()) == 3  # a listing before the damage (adapters may cache)
    write_raw(store_url, bad.id, corrupt(_good_doc(store, bad.id)))

    with pytest.raises(CorruptJob) as info:
        store.get(bad.id)
    assert bad.id in str(info.value)

    caplog.set_level(logging.WARNING)
    assert [s.id for s in store.list()] == [last.id, first.id]
    assert [s.id for s in store.list(status="pending")] == [last.id, first.id]
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(bad.id in r.getMessage() for r in warned), warned

    with pytest.raises(CorruptJob):
        store.open(bad.id).cancel()
    assert sorted(t.id for t in store.claim(limit=10)) == sorted([first.id, last.id])
    assert store.create(name="later").state().name == "later"
    store.delete(bad.id, force=True)  # a corrupt job can still be cleaned up
    with pytest.raises(JobNotFound):
        store.get(bad.id)


def test_stale_tmp_files_are_ignored(store: Store, store_url: str, adapter: Adapter) -> None:
    if adapter.name != "files":
        pytest.skip("only the files adapter writes through temp files")
    root = adapter.need("root")(store_url)
    assert isinstance(root, Path)
    jobs = [store.create(name=f"j{i}") for i in range(2)]
    ghost = {**_good_doc(store, jobs[0].id), "id": "0000ghost", "name": "ghost"}
    (root / f"{jobs[0].id}.json.0123abcd.tmp").write_bytes(b'{"id": "trunc')
    (root / f"{jobs[1].id}.json.tmp").write_bytes(b"")
    (root / "0000ghost.json.ffff.tmp").write_text(json.dumps(ghost))
    (root / "junk.tmp").write_bytes(b"\xff\xfe")
    (root / ".tmp").write_bytes(b"x")
    for job in jobs:
        assert store.get(job.id).name == job.state().name
    assert [s.id for s in store.list()] == [jobs[1].id, jobs[0].id]
    with pytest.raises(JobNotFound):
        store.get("0000ghost")
    assert [t.id for t in store.claim(limit=5)] == [jobs[0].id, jobs[1].id]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"payload": {"s": {1, 2}}},
        {"payload": {"x": float("nan")}},
        {"payload": {"x": float("inf")}},
        {"payload": {1: "int key"}},
        {"payload": {"o": object()}},
        {"payload": [1, 2]},
        {"labels": {"k": 1}},
        {"labels": {"k": None}},
        {"labels": {1: "v"}},
        {"labels": {"": "v"}},
        {"labels": {"a=b": "v"}},
        {"kind": "bogus"},
        {"command": []},
        {"command": "echo hi"},
        {"command": ["echo", 1]},
        {"queue": ""},
    ],
    # (an object()'s repr holds its address: each xdist worker would name the test apart)
    ids=lambda kwargs: re.sub(r" at 0x[0-9a-f]+", "", repr(kwargs)),
)
def test_bad_create_arguments_are_refused(store: Store, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        store.create(name="j", **kwargs)  # type: ignore[arg-type]
    assert store.list() == []
    assert store.claim() == []


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://relative/s.db",
        "sqlite://s.db",
        "files://relative/dir",
        "files://jobs",
        "sqlite://",
        "nosuch:///tmp/x",
        "redis://localhost/0",
        "/tmp/outlast-test.db",
        "sqlite:/tmp/outlast-test.db",
        "relative.db",
    ],
)
def test_bad_store_urls_are_refused(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput):
        open_store(url)
    assert os.listdir(tmp_path) == [], "a refused URL still created files"
