"""Fixtures for the pipeline tests: a fresh SQLite store per test, real worker processes.

Every test gets ``$OUTLAST_STORE`` pointing at ``tmp_path/s.db`` and ``$PYTHONPATH`` holding the
repository root (so detached workers import ``examples.async_job_watcher`` and
``tests.pipeline.pipelines``). Whatever a test leaves running under its ``tmp_path`` (export
jobs, dedicated workers, pools) is killed when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from outlast.model import JobState, ProgressEvent
from outlast.run import api
from outlast.run.pool import Pool
from outlast.store import Store

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_MODULE = "examples.async_job_watcher.pipeline"
TEST_MODULE = "tests.pipeline.pipelines"
TIMEOUT = 60.0  # generous: the machine is shared

T = TypeVar("T")


def wait_until(
    fn: Callable[[], T | None], timeout: float = TIMEOUT, interval: float = 0.05, what: str = ""
) -> T:
    """Call ``fn`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what or fn}")
        time.sleep(interval)


def status_files(path: Path) -> list[Path]:
    """The status file, its temporary file and its log, where they still exist."""
    return [p for p in (path, Path(f"{path}.tmp"), Path(f"{path}.log")) if p.exists()]


def export_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def steps_of(events: list[ProgressEvent], step: str) -> list[str]:
    return [str(e.status) for e in events if e.step == step]


def assert_stage_events(events: list[ProgressEvent], stage: str, end: str = "completed") -> None:
    """The stage's events are ``started``, then only ``progress``, then ``end``."""
    seen = steps_of(events, stage)
    assert seen, f"no events for stage {stage}"
    assert seen[0] == "started", seen
    assert seen[-1] == end, seen
    assert all(s == "progress" for s in seen[1:-1]), seen


def _kill_tree_under(marker: str) -> None:
    me = os.getpid()
    victims = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info["pid"] != me and any(marker in arg for arg in cmdline):
            victims.append(proc)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(victims, timeout=5)


class Env:
    """One test's store, work directory and the ways to drive workers."""

    def __init__(self, tmp_path: Path, store: Store) -> None:
        self.tmp = tmp_path
        self.store = store
        self.url = store.url
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []

    def status_file(self, name: str = "export") -> Path:
        return self.work / f"{name}.status.json"

    def payload(self, name: str = "export", delay: float = 0.3, **extra: Any) -> dict[str, Any]:
        return {"delay_seconds": delay, "status_file": str(self.status_file(name)), **extra}

    # ------------------------------------------------------------ processes
    def environ(self) -> dict[str, str]:
        return dict(os.environ)

    def cli(self, *args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "outlast", *args],
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.tmp,
        )

    def cli_json(self, *args: str) -> dict[str, Any]:
        done = self.cli(*args, "--json")
        assert done.stdout, f"no output from outlast {args}: {done.stderr}"
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc

    def start_worker(self, *modules: str, burst: bool = True) -> subprocess.Popen[bytes]:
        """``outlast worker [--burst] --import MODULE…`` as a subprocess."""
        argv = [sys.executable, "-m", "outlast", "worker"] + (["--burst"] if burst else [])
        for module in modules or (EXAMPLE_MODULE, TEST_MODULE):
            argv += ["--import", module]
        proc = subprocess.Popen(argv, env=self.environ(), cwd=self.tmp, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def run_pool(self, concurrency: int = 1) -> int:
        """An in-process burst pool: runs what is pending, returns when nothing is."""
        pool = Pool(self.store, concurrency, imports=[EXAMPLE_MODULE, TEST_MODULE], burst=True)
        return pool.run()

    # ------------------------------------------------------------ jobs
    def wait_terminal(self, job_id: str, timeout: float = TIMEOUT) -> JobState:
        state = self.store.wait(job_id, timeout=timeout)
        assert state.terminal, f"job {job_id} is still {state.status} after {timeout}s"
        return state

    def wait_state(
        self, job_id: str, predicate: Callable[[JobState], bool], what: str = ""
    ) -> JobState:
        """Poll the job until ``predicate(state)`` holds; returns that state."""

        def check() -> JobState | None:
            state = self.store.get(job_id)
            return state if predicate(state) else None

        return wait_until(check, what=what or f"job {job_id}")

    def events(self, job_id: str) -> list[ProgressEvent]:
        return self.store.events(job_id)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(10)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    url = f"sqlite://{tmp_path}/s.db"
    monkeypatch.setenv("OUTLAST_STORE", url)
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), path) if p))
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "0.05")
    monkeypatch.setenv("WORKER_POLL_MAX", "0.25")
    monkeypatch.setattr(api, "_default", None)  # restored after the test
    store = api.use_store(url)
    environment = Env(tmp_path, store)
    try:
        yield environment
    finally:
        environment.close()
        _kill_tree_under(f"{tmp_path}/")
        store.close()
