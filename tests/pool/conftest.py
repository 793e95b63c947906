"""Fixtures of the pool tests: real ``outlast worker`` processes on a fresh SQLite store.

``pool`` is a :class:`Harness` bound to one test's ``tmp_path``. Jobs are created in-process
(through :func:`outlast.run.api.create_job`, so they record the module
``tests.pool.jobs_for_tests``); workers are real subprocesses that import that module, found
through ``PYTHONPATH`` set to the repository root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from outlast.model import JobState, Status
from outlast.run.api import create_job
from outlast.store import Store, open_store
from tests.pool import jobs_for_tests
from tests.waiting import alive, until

ROOT = Path(__file__).resolve().parents[2]
JOBS = jobs_for_tests.MODULE  # "tests.pool.jobs_for_tests"
TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELED})


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture
def url(store_url: str, tmp_path: Path) -> str:
    """A fresh store of each kind (``store_url``: SQLite, files, PostgreSQL), in a private
    folder (outlast warns of one open to others)."""
    tmp_path.chmod(0o700)
    return store_url


class Worker:
    """An ``outlast worker`` subprocess; its stdout/stderr go to files in the test's folder."""

    def __init__(self, popen: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.out, self.err = out, err

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def children(self) -> list[int]:
        """PIDs of its live job processes."""
        try:
            return [c.pid for c in psutil.Process(self.pid).children() if alive(c.pid)]
        except psutil.NoSuchProcess:
            return []

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.pid} did not exit within {timeout}s\n{self.stderr()}"
            ) from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


class Harness:
    """One test's store, the workers it started, and helpers to submit and wait."""

    def __init__(self, tmp: Path, url: str | None = None) -> None:
        """``url``: the store (by default a SQLite file in ``tmp``)."""
        os.chmod(tmp, 0o700)  # a store folder open to others makes outlast warn on stderr
        self.tmp = tmp
        self.url = url or f"sqlite://{tmp}/s.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTLAST_", "WORKER_"))}
        env.pop("PYTHONWARNINGS", None)
        env.update(
            OUTLAST_STORE=self.url,
            OUTLAST_RETRY_DELAY="0.05",
            WORKER_POLL_MIN="0.02",
            WORKER_POLL_MAX="0.2",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONDONTWRITEBYTECODE="1",
        )
        self.env = env
        self.store: Store = open_store(self.url)
        self.workers: list[Worker] = []
        self.procs: list[subprocess.Popen[str]] = []

    # ------------------------------------------------------------------ processes
    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {**self.env, **(extra or {})}

    def worker(self, *args: str, env: dict[str, str] | None = None) -> Worker:
        """Start ``python -m outlast worker --import JOBS ARGS`` in the background."""
        n = len(self.workers)
        out, err = self.tmp / f"worker-{n}.out", self.tmp / f"worker-{n}.err"
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            popen = subprocess.Popen(
                [sys.executable, "-m", "outlast", "worker", "--import", JOBS, *args],
                env=self._env(env),
                stdin=subprocess.DEVNULL,
                stdout=fout,
                stderr=ferr,
                cwd=self.tmp,
            )
        worker = Worker(popen, out, err)
        self.workers.append(worker)
        return worker

    def cli(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """``python -m outlast ARGS``, waited for."""
        return self.python(["-m", "outlast", *args], env=env, timeout=timeout)

    def python(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [sys.executable, *argv],
                env=self._env(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.tmp,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{argv} did not finish within {timeout}s") from exc

    def background(self, code: str, *args: str) -> subprocess.Popen[str]:
        """``python -c CODE ARGS`` in the background, stdout piped (killed at teardown)."""
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            cwd=self.tmp,
        )
        self.procs.append(proc)
        return proc

    def ready(self, timeout: float = 60.0) -> None:
        """Wait until the running workers take work: a probe job must succeed."""
        probe = self.submit("pt.noop", "probe")
        self.wait_for(probe, {Status.SUCCEEDED}, timeout, "a probe job to run")

    # ------------------------------------------------------------------ jobs
    def submit(self, name: str, *args: Any, queue: str | None = None, **kwargs: Any) -> str:
        return create_job(self.store, name, list(args), kwargs, queue=queue).id

    def get(self, job_id: str) -> JobState:
        return self.store.get(job_id)

    def all(self) -> list[JobState]:
        return self.store.list(limit=None)

    def describe(self) -> str:
        parts = []
        for w in self.workers:
            parts.append(
                f"--- worker {w.pid} (exit {w.popen.poll()}) stderr:\n{w.stderr()[-3000:]}"
            )
        return "\n".join(parts)

    def wait_for(
        self,
        job_id: str,
        statuses: Iterable[Status] = TERMINAL,
        timeout: float = 30.0,
        what: str | None = None,
    ) -> JobState:
        wanted = set(statuses)

        def check() -> JobState | None:
            state = self.get(job_id)
            return state if state.status in wanted else None

        try:
            return until(check, timeout, what or f"job {job_id} to be one of {sorted(wanted)}")  # type: ignore[no-any-return]
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {self.get(job_id)}\n{self.describe()}") from None

    def wait_all(self, count: int, timeout: float = 60.0) -> list[JobState]:
        """Wait until ``count`` jobs (all of them) are terminal; returns every job."""

        def check() -> list[JobState] | None:
            states = self.all()
            done = [s for s in states if s.status in TERMINAL]
            return states if len(states) == count and len(done) == count else None

        try:
            return until(check, timeout, f"all {count} jobs to finish")  # type: ignore[no-any-return]
        except AssertionError as exc:
            counts: dict[str, int] = {}
            for s in self.all():
                counts[s.status] = counts.get(s.status, 0) + 1
            raise AssertionError(f"{exc}; statuses: {counts}\n{self.describe()}") from None

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        for w in self.workers:
            w.kill()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        mine = str(self.tmp)
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(psutil.Error, OSError):
                theirs = proc.environ().get("OUTLAST_STORE", "")
                if theirs == self.url or mine in theirs:
                    os.kill(proc.pid, signal.SIGKILL)
        self.store.close()


@pytest.fixture(autouse=True)
def _tunables(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's tunables (jobs created here, in-process pools): the defaults, except a
    short retry delay, whatever the developer's shell has set."""
    for name in ("WORKER_MAX_RETRIES", "WORKER_POLL_MIN", "WORKER_POLL_MAX", "OUTLAST_STORE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "0.05")


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()
