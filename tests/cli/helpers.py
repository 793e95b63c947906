"""Running the real ``outlast`` command in subprocesses, and watching the processes it leaves.

Every test gets an :class:`Outlast` bound to a fresh store in its own ``tmp_path``; the store's
URL goes to the subprocesses through ``$OUTLAST_STORE`` (the test process itself never sets it).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from outlast.store import Store, open_store
from tests.waiting import until

BIN = Path(sys.executable).parent
OUTLAST = str(BIN / "outlast")
TIMEOUT = 30.0  # seconds any one CLI call may take before the test fails

#: The fields of the job document (DESIGN.md, "The job document").
DOC_FIELDS = frozenset(
    {
        "id", "kind", "name", "command", "labels", "queue", "status", "phase", "step",
        "progress", "payload", "result", "error", "attempts", "max_attempts", "run_after",
        "question", "answer", "pid", "worker", "created_at", "started_at", "updated_at",
        "finished_at",
    }
)  # fmt: skip

#: ``@STORES``: run the test against both local adapters.
STORES = pytest.mark.parametrize("cli", ["sqlite", "files"], indirect=True)


def processes_with_env(key: str, predicate: Callable[[str], bool]) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment has ``key`` matching ``predicate``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            value = proc.environ().get(key)
            if value is not None and predicate(value) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def job_processes(job_id: str) -> list[psutil.Process]:
    """Live processes started for ``job_id`` (they carry ``OUTLAST_JOB_ID``)."""
    return processes_with_env("OUTLAST_JOB_ID", lambda v: v == job_id)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


class Result:
    """A finished CLI call."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        self.args = list(args)
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self) -> str:
        return (
            f"<outlast {self.args}: exit {self.code}\nstdout: {self.out!r}\nstderr: {self.err!r}>"
        )

    def ok(self) -> Result:
        assert self.code == 0, f"expected exit 0: {self!r}"
        return self

    def json(self) -> Any:
        return self.ok().parse()

    def parse(self) -> Any:
        """stdout as JSON, whatever the exit code."""
        try:
            return json.loads(self.out)
        except ValueError as exc:
            raise AssertionError(f"not JSON ({exc}): {self!r}") from None


class Lines:
    """Reads a pipe line by line in a thread, so a test can wait for a line with a timeout."""

    _END = object()

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        with contextlib.suppress(ValueError, OSError):
            for line in stream:
                self._queue.put(line)
        self._queue.put(self._END)

    def line(self, timeout: float = TIMEOUT) -> str:
        """The next line (without its newline); fails on timeout or end of stream."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s") from None
        if item is self._END:
            raise AssertionError("the stream ended before the expected line")
        assert isinstance(item, str)
        return item.rstrip("\n")

    def rest(self, timeout: float = TIMEOUT) -> str:
        """Everything up to the end of the stream."""
        deadline = time.monotonic() + timeout
        parts = []
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the stream did not end within {timeout}s") from None
            if item is self._END:
                return "".join(parts)
            assert isinstance(item, str)
            parts.append(item)


class Outlast:
    """The ``outlast`` command bound to one test's store."""

    def __init__(self, kind: str, tmp_path: Path, pycache: Path | None = None) -> None:
        self.kind = kind
        self.tmp = tmp_path
        self.url = f"sqlite://{tmp_path}/s.db" if kind == "sqlite" else f"files://{tmp_path}/jobs"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLAST_")}
        env.update(
            OUTLAST_STORE=self.url,
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",  # `outlast` inside jobs
            OUTLAST_RETRY_DELAY="0.05",
        )
        env.pop("PYTHONWARNINGS", None)
        if pycache is not None:  # compiled modules, shared by the session's subprocesses
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(pycache)
        self.env = env
        self._store: Store | None = None
        self._popen: list[subprocess.Popen[str]] = []

    # ------------------------------------------------------------------ running the CLI
    def __call__(
        self,
        *args: str,
        env: dict[str, str | None] | None = None,
        timeout: float = TIMEOUT,
        cwd: Path | None = None,
    ) -> Result:
        return self.python(None, *args, env=env, timeout=timeout, cwd=cwd)

    def python(
        self,
        code: str | None,
        *args: str,
        env: dict[str, str | None] | None = None,
        timeout: float = TIMEOUT,
        cwd: Path | None = None,
    ) -> Result:
        """``outlast ARGS`` (the console script), or ``python -c CODE ARGS`` when ``code``."""
        argv = [OUTLAST, *args] if code is None else [sys.executable, "-c", code, *args]
        try:
            proc = subprocess.run(
                argv,
                env=self._env(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=cwd or self.tmp,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"outlast {list(args)} did not finish within {timeout}s") from exc
        return Result(args, proc)

    def popen(self, *args: str, env: dict[str, str | None] | None = None) -> subprocess.Popen[str]:
        """Start ``outlast ARGS`` in the background, stdout and stderr piped."""
        proc = subprocess.Popen(
            [OUTLAST, *args],
            env=self._env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.tmp,
        )
        self._popen.append(proc)
        return proc

    def _env(self, extra: dict[str, str | None] | None) -> dict[str, str]:
        env = dict(self.env)
        for key, value in (extra or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(
        self,
        *command: str,
        opts: Sequence[str] = (),
        env: dict[str, str | None] | None = None,
        cwd: Path | None = None,
    ) -> str:
        """``outlast run [OPTS] -- COMMAND`` and the job id it printed."""
        result = self("run", *opts, "--", *command, env=env, cwd=cwd).ok()
        lines = result.out.splitlines()
        assert len(lines) == 1 and lines[0].strip(), f"run printed no single id: {result!r}"
        return lines[0].strip()

    def status(self, job_id: str) -> dict[str, Any]:
        doc = self("status", job_id, "--json").json()
        assert isinstance(doc, dict)
        return doc

    def wait(self, job_id: str, *opts: str, timeout: float = TIMEOUT) -> Result:
        return self("wait", job_id, *opts, timeout=timeout)

    def finish(self, job_id: str, code: int, timeout: float = TIMEOUT) -> dict[str, Any]:
        """``outlast wait ID --json``: check its exit code, return the job's final document."""
        result = self.wait(job_id, "--json", timeout=timeout)
        assert result.code == code, f"expected exit {code}: {result!r}"
        doc = result.parse()
        assert isinstance(doc, dict) and doc["id"] == job_id, result
        return doc

    def running_with_pid(self, job_id: str, timeout: float = 15.0) -> dict[str, Any]:
        """Poll the job until it runs with its command's PID recorded; its document."""

        def check() -> dict[str, Any] | None:
            doc = self.status(job_id)
            assert doc["status"] in ("pending", "running"), doc
            return doc if doc["status"] == "running" and doc["pid"] else None

        return until(check, timeout, f"job {job_id} to run with a pid")  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the store, in-process
    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.url)
        return self._store

    def snapshot(self) -> tuple[dict[str, Any], list[str]]:
        """Everything a CLI call could write: every job, its events, and the log files."""
        with open_store(self.url) as store:
            jobs = {
                s.id: (s.to_dict(), [e.to_dict() for e in store.events(s.id)])
                for s in store.list(limit=None)
            }
            logs = store.log_path("x").parent
            files = sorted(p.name for p in logs.iterdir()) if logs.exists() else []
        return jobs, files

    def log_path(self, job_id: str) -> Path:
        return self.store.log_path(job_id)

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        """Kill whatever this test's jobs left running: supervisors and commands (by PID)."""
        for proc in self._popen:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
        mine = str(self.tmp)
        for proc in processes_with_env("OUTLAST_STORE", lambda v: mine in v):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        if self._store is not None:
            self._store.close()
