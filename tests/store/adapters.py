"""The store adapters under test, and what the suite needs to know about each one.

Adding an adapter to the conformance suite is one line in :data:`ADAPTERS`. An adapter that
needs something this machine may lack (a PostgreSQL server) returns None from ``make_url`` and
every test of it is skipped; a hook it leaves as None skips only the tests that need it. A
future PostgreSQL entry would read, for example::

    Adapter("postgresql", _postgres_url, write_raw=_postgres_write_raw),

with ``_postgres_url`` returning a fresh database's URL from ``$OUTLAST_TEST_POSTGRESQL``, or None.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pg.support import make_url as pg_url
from tests.pg.support import write_raw as pg_write_raw


@dataclass(frozen=True)
class Adapter:
    name: str
    #: The URL of a fresh store kept under ``base`` (an empty folder), or None when the
    #: adapter cannot run on this machine.
    make_url: Callable[[Path], str | None]
    #: The folder a local store keeps everything in (permission and leak checks).
    root: Callable[[str], Path] | None = None
    #: The files that hold a job's state (must exist once the job does).
    job_files: Callable[[str, str], list[Path]] | None = None
    #: Overwrite a job's stored document with raw bytes, behind the store's back.
    write_raw: Callable[[str, str, bytes], None] | None = None

    def need(self, hook: str) -> Callable[..., object]:
        """The hook, or skip the test when this adapter does not offer it."""
        value = getattr(self, hook)
        if value is None:
            pytest.skip(f"the {self.name} adapter has no {hook} hook")
        return value  # type: ignore[no-any-return]


def _path(url: str, scheme: str) -> Path:
    prefix = f"{scheme}://"
    assert url.startswith(prefix), url
    return Path(url[len(prefix) :])


# ---------------------------------------------------------------------------------- sqlite
def _sqlite_write_raw(url: str, job_id: str, raw: bytes) -> None:
    conn = sqlite3.connect(_path(url, "sqlite"), timeout=30)
    try:
        with conn:
            updated = conn.execute("UPDATE jobs SET doc = ? WHERE id = ?", (raw, job_id)).rowcount
    finally:
        conn.close()
    assert updated == 1, f"no row for job {job_id}"


SQLITE = Adapter(
    "sqlite",
    make_url=lambda base: f"sqlite://{base}/s.db",
    root=lambda url: _path(url, "sqlite").parent,
    job_files=lambda url, job_id: [_path(url, "sqlite")],
    write_raw=_sqlite_write_raw,
)


# ----------------------------------------------------------------------------------- files
def _files_write_raw(url: str, job_id: str, raw: bytes) -> None:
    path = _path(url, "files") / f"{job_id}.json"
    assert path.exists(), f"no document {path}"
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, raw)
    finally:
        os.close(fd)


FILES = Adapter(
    "files",
    make_url=lambda base: f"files://{base}/jobs",
    root=lambda url: _path(url, "files"),
    job_files=lambda url, job_id: [_path(url, "files") / f"{job_id}.json"],
    write_raw=_files_write_raw,
)


#: Every adapter the conformance suite runs against (PostgreSQL: a fresh schema per test,
#: skipped when no server answers at 127.0.0.1:5432).
ADAPTERS: list[Adapter] = [
    SQLITE,
    FILES,
    Adapter("postgresql", pg_url, write_raw=pg_write_raw),
]
