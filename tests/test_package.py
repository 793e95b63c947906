"""The package's public face, and the CLI's light fast path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import outlast
from outlast.store import open_store

HEAVY = ("fastapi", "psycopg", "rich", "uvicorn", "starlette", "pydantic")


def test_all_names_resolve_and_are_sorted() -> None:
    assert list(outlast.__all__) == sorted(outlast.__all__)
    for name in outlast.__all__:
        assert getattr(outlast, name) is not None, name
    assert set(dir(outlast)) == set(outlast.__all__)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = outlast.nope  # type: ignore[attr-defined]


def test_public_names_cover_the_design() -> None:
    for name in (
        "open_store",
        "job",
        "submit",
        "spawn",
        "current",
        "Pause",
        "Fail",
        "JobState",
        "ProgressEvent",
        "Status",
        "OutlastError",
        "JobNotFound",
        "InvalidJobId",
        "JobActive",
        "WorkerLockHeld",
        "Task",
        "Store",
    ):
        assert name in outlast.__all__, name


def _imported_modules(args: list[str], env: dict[str, str]) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "outlast", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    names = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_status_fast_path_imports_nothing_heavy(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/s.db"
    with open_store(url) as store:
        job = store.create(command=["true"])
    env = dict(os.environ, OUTLAST_STORE=url)
    fast = _imported_modules(["status", job.id], env)
    assert "sqlite3" in fast
    for heavy in (*HEAVY, "click", "psutil", "typing", "dataclasses", "outlast.store"):
        assert heavy not in fast, f"`outlast status` imported {heavy}"


def test_full_cli_loads_no_server_or_driver(tmp_path: Path) -> None:
    open_store(f"sqlite://{tmp_path}/s.db").close()  # `ls` reads a store; it creates none
    env = dict(os.environ, OUTLAST_STORE=f"sqlite://{tmp_path}/s.db")
    loaded = _imported_modules(["ls"], env)
    assert "click" in loaded
    for heavy in HEAVY:
        assert not any(m == heavy or m.startswith(heavy + ".") for m in loaded), heavy


def test_the_python_api_names_of_the_architecture() -> None:
    """Pipelines and commands are created from the top-level package; PollTimeout is in the
    one exception tree."""
    from outlast.pipeline import Pipeline, Stage, poll

    assert (outlast.Pipeline, outlast.Stage, outlast.poll) == (Pipeline, Stage, poll)
    assert callable(outlast.run_command)
    assert issubclass(outlast.PollTimeout, outlast.OutlastError)
    assert outlast.PollTimeout.code == "timeout"


def test_sqlite_close_closes_the_connections_of_every_thread(tmp_path: Path) -> None:
    import threading

    def db_fds() -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _points_at(fd, tmp_path / "s.db"))

    store = open_store(f"sqlite://{tmp_path}/s.db")
    job = store.create(name="x")
    done = threading.Event()
    keep = threading.Event()

    def other_thread() -> None:
        store.get(job.id)  # this thread's own connection
        done.set()
        keep.wait(10)  # still alive when the store is closed

    thread = threading.Thread(target=other_thread)
    thread.start()
    done.wait(10)
    assert db_fds() >= 2  # this thread's connections and the other's
    store.close()
    assert db_fds() == 0, "a thread's connection stayed open after close()"
    keep.set()
    thread.join()


def _points_at(fd: str, path: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


def test_the_package_ships_every_file_of_the_dashboard() -> None:
    """pyproject's package-data globs cover each file under ``http/static`` (a glob does not
    reach into folders: the vendored chart library, its license and version note are
    listed on their own)."""
    import tomllib

    root = Path(outlast.__file__).parent
    pyproject = root.parents[1] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("outlast is not run from its checkout")
    config = tomllib.loads(pyproject.read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["outlast"]
    shipped = {p for pattern in patterns for p in root.glob(pattern) if p.is_file()}
    static = {p for p in (root / "http" / "static").rglob("*") if p.is_file()}
    assert static and static <= shipped, sorted(str(p) for p in static - shipped)
    vendor = root / "http" / "static" / "vendor" / "uplot"
    assert {p.name for p in vendor.iterdir()} >= {"uPlot.iife.min.js", "LICENSE", "VERSION"}
    assert "1.6.32" in (vendor / "uPlot.iife.min.js").read_text()[:200]
    assert "1.6.32" in (vendor / "VERSION").read_text()
