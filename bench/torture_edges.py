"""Torture at the edges: a corrupt store, a full disk, and hostile HTTP clients.

Part of the reliability harness (``bench/torture.py`` imports this module). Everything here is
real: ``python -m outlast`` in subprocesses, store files on disk (and a small tmpfs), a real
``outlast serve`` on a free loopback port, and real sockets. A broken promise is never raised:
it is recorded as one line in :attr:`Section.failures`.

- :func:`corruption` damages one job's stored document in each store (and the header of a
  copy of a SQLite database), then uses the CLI and the HTTP server as a user would.
- :func:`disk_full` fills a 4 MiB tmpfs under a SQLite and a files store while jobs are being
  submitted, then frees it and checks that nothing was stranded and that work resumes.
- :func:`hostile_clients` opens hundreds (or thousands) of event streams against a server,
  counts 200s and 503s, watches the server's descriptors, runs the CLI beside it, and sends
  malformed requests.

Run it: ``.venv/bin/python bench/torture_edges.py --quick [--pg postgresql://…/db]``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import errno
import http.client
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYTHON = sys.executable
CLI_TIMEOUT = 30.0  # seconds any one CLI call may take before it counts as hung
#: The per-client stream cap of ``outlast serve`` when nothing is set (README, Configuration).
DEFAULT_PER_CLIENT = 100
#: The soft descriptor limit most login shells and services start with.
COMMON_NOFILE = 1024


@dataclass
class Section:
    name: str  # e.g. "corruption"
    figures: dict[str, object] = field(default_factory=dict)  # what was measured, printable
    failures: list[str] = field(default_factory=list)  # each broken promise, one line
    skipped: str | None = None  # why the section could not run here (e.g. no mount permission)


# ------------------------------------------------------------------------------ the CLI
@dataclass
class Ran:
    """One finished ``python -m outlast …`` call."""

    args: list[str]
    code: int
    out: str
    err: str

    @property
    def first(self) -> str:
        """The first non-empty line of stderr (else of stdout), shortened."""
        for text in (self.err, self.out):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()[:200]
        return ""

    def describe(self) -> str:
        return f"exit {self.code}, stderr {self.first!r}"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``OUTLAST_*`` setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLAST_")}
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{env.get('PATH', '')}"  # `outlast` in jobs
    env.pop("PYTHONWARNINGS", None)
    env.update(extra or {})
    return env


def _cli(*args: str, timeout: float = CLI_TIMEOUT, cwd: str | None = None) -> Ran:
    argv = [PYTHON, "-m", "outlast", *args]
    try:
        done = subprocess.run(
            argv,
            env=_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            cwd=cwd or tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return Ran(list(args), -1, "", f"(harness) no answer within {timeout:g}s")
    return Ran(list(args), done.returncode, done.stdout, done.stderr)


def _error_problem(ran: Ran, code: int | None = None) -> str | None:
    """What is wrong with a failing call's output, or None when it failed as documented: a
    nonzero exit (``code`` when given), one ``outlast: error: …`` line, no traceback."""
    if "Traceback" in ran.err or "Traceback" in ran.out:
        return f"a Python traceback ({ran.describe()})"
    if ran.code == 0:
        return f"exit 0, expected an error (stdout {ran.out.strip()[:80]!r})"
    if code is not None and ran.code != code:
        return f"exit {ran.code}, expected {code} (stderr {ran.first!r})"
    lines = [line for line in ran.err.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("outlast: error: "):
        return f"not one 'outlast: error:' line: {ran.describe()} ({len(lines)} lines)"
    return None


def _ok_problem(ran: Ran) -> str | None:
    """What is wrong with a call that should have succeeded, or None."""
    if "Traceback" in ran.err or "Traceback" in ran.out:
        return f"a Python traceback ({ran.describe()})"
    if ran.code != 0:
        return ran.describe()
    return None


def _start_job(url: str, *command: str) -> tuple[str | None, Ran]:
    """``outlast run --store URL -- COMMAND``: the id it printed (None when it failed)."""
    ran = _cli("run", "--store", url, "--", *command)
    lines = ran.out.split()
    return (lines[0] if ran.code == 0 and len(lines) == 1 else None), ran


def _status_doc(url: str, job_id: str) -> dict[str, Any] | None:
    ran = _cli("status", job_id, "--json", "--store", url)
    if ran.code != 0:
        return None
    try:
        doc = json.loads(ran.out)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class _Tally:
    """Checks that ran and passed, per group; a failed one becomes a failure line."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.ran: collections.Counter[str] = collections.Counter()
        self.passed: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # stores are checked side by side

    def check(self, group: str, what: str, problem: str | None) -> bool:
        with self._lock:
            self.ran[group] += 1
            if problem is None:
                self.passed[group] += 1
                return True
            self.section.failures.append(f"{group}: {what}: {problem}")
            return False

    def figures(self) -> dict[str, object]:
        return {f"{g} checks passed": f"{self.passed[g]}/{n}" for g, n in self.ran.items()}


# ------------------------------------------------------------------------------ the server
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``python -m outlast serve --store URL`` on a free loopback port, its output in a file."""

    def __init__(
        self,
        url: str,
        folder: Path,
        env: dict[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
    ) -> None:
        self.url = url
        self.log_path = folder / f"server-{time.monotonic_ns()}.log"
        self._env = _env(env)
        self._nofile = nofile
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        for _ in range(3):  # the free port may be taken between the probe and the bind
            if self._start():
                return
        raise RuntimeError(f"outlast serve did not start: {self.output()[-500:]!r}")

    def _where(self) -> list[str]:
        return ["--host", "127.0.0.1", "--port", str(self.port)]

    def _start(self) -> bool:
        self.port = _free_port()
        nofile = self._nofile

        def limits() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "outlast", "serve", "--store", self.url, *self._where()],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.log_path.parent,
                preexec_fn=limits,  # no other thread runs while a server starts
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, http.client.HTTPException):
                if request(self.port, "GET", "/healthz", timeout=2)[0] == 200:
                    return True
            time.sleep(0.05)
        self.close()
        raise RuntimeError(f"outlast serve did not answer within 30s: {self.output()[-500:]!r}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def _serving(
    url: str, folder: Path, env: dict[str, str] | None = None, nofile: tuple[int, int] | None = None
) -> Iterator[Server]:
    server = Server(url, folder, env, nofile)
    try:
        yield server
    finally:
        server.close()


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request: ``(status, lower-cased headers, body)``; an event stream's body is not
    read (the connection is closed after its headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        got = {k.lower(): v for k, v in response.getheaders()}
        streaming = got.get("content-type", "").startswith("text/event-stream")
        data = b"" if streaming else response.read()
        return response.status, got, data
    finally:
        conn.close()


def _http_problem(status: int, allowed: Callable[[int], bool], body: bytes = b"") -> str | None:
    if allowed(status):
        return None
    return f"HTTP {status} {body[:120]!r}"


# ============================================================================ 1. corruption
def corruption(quick: bool, pg_url: str | None = None) -> Section:
    """Damage one job's stored document in every store (and a copy's SQLite header); the CLI
    and the server must say so in one line (never a traceback or a 500) and go on serving the
    other jobs unchanged."""
    section = Section("corruption")
    started = time.monotonic()
    tally = _Tally(section)
    kinds = ["sqlite", "files"] + (["postgresql"] if pg_url else [])
    for kind in kinds:
        began = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix=f"torture-corrupt-{kind}-") as tmp:
                _corrupt_store(kind, Path(tmp), quick, pg_url, tally)
        except Exception as exc:  # the harness itself: still a line, never a raise
            section.failures.append(f"{kind}: harness error: {type(exc).__name__}: {exc}")
        section.figures[f"{kind} seconds"] = round(time.monotonic() - began, 1)
    if not pg_url:
        section.figures["postgresql"] = "not run (no --pg URL)"
    section.figures.update(tally.figures())
    section.figures["seconds"] = round(time.monotonic() - started, 1)
    return section


def _pg_conninfo(pg_url: str) -> str:
    """``pg_url`` without a ``schema`` query parameter (not a libpq option)."""
    parts = urllib.parse.urlsplit(pg_url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "schema"]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _pg_execute(pg_url: str, statement: str, schema: str, params: tuple[Any, ...] = ()) -> int:
    """Run ``statement`` (``{schema}`` is the quoted schema name); the rows it touched."""
    import psycopg
    from psycopg import sql

    query = sql.SQL(statement).format(schema=sql.Identifier(schema))
    with psycopg.connect(_pg_conninfo(pg_url), autocommit=True, connect_timeout=10) as conn:
        return conn.execute(query, params).rowcount


def _corrupt_store(kind: str, tmp: Path, quick: bool, pg_url: str | None, tally: _Tally) -> None:
    schema = f"torture_corrupt_{os.getpid()}"
    if kind == "sqlite":
        url = f"sqlite://{tmp}/s.db"
    elif kind == "files":
        url = f"files://{tmp}/jobs"
    else:
        assert pg_url
        conninfo = _pg_conninfo(pg_url)
        url = f"{conninfo}{'&' if '?' in conninfo else '?'}schema={schema}"
        _pg_execute(pg_url, "DROP SCHEMA IF EXISTS {schema} CASCADE", schema)
    try:
        ids = _finished_jobs(kind, url, 3 if quick else 6, tally)
        if len(ids) < 2:
            return
        victim, others = ids[len(ids) // 2], [i for i in ids if i != ids[len(ids) // 2]]
        before = {i: _status_doc(url, i) for i in others}
        _damage(kind, url, tmp, victim, schema, pg_url)
        _check_corrupt_cli(kind, url, victim, others, before, tally)
        _check_corrupt_http(kind, url, tmp, victim, others, tally)
        if kind == "sqlite":
            _check_bad_header(tmp, others[0], tally)
    finally:
        if kind == "postgresql" and pg_url:
            _pg_execute(pg_url, "DROP SCHEMA IF EXISTS {schema} CASCADE", schema)


def _finished_jobs(kind: str, url: str, count: int, tally: _Tally) -> list[str]:
    ids = []
    for _ in range(count):
        job_id, ran = _start_job(url, "true")
        if tally.check(kind, "outlast run -- true", None if job_id else ran.describe()):
            assert job_id is not None
            ids.append(job_id)
    for job_id in ids:
        ran = _cli("wait", job_id, "--timeout", "30", "--store", url)
        tally.check(kind, f"outlast wait {job_id} (a `true` job)", _ok_problem(ran))
    return ids


def _damage(kind: str, url: str, tmp: Path, victim: str, schema: str, pg_url: str | None) -> None:
    garbage = b"\x00\xff\xfe garbage \x00 {not json"
    if kind == "files":
        root = Path(url[len("files://") :])
        found = [root / f"{victim}.json"] if (root / f"{victim}.json").exists() else []
        found = found or list(root.rglob(f"{victim}.json"))
        if not found:
            raise RuntimeError(f"no {victim}.json under {root}")
        found[0].write_bytes(garbage)
    elif kind == "sqlite":
        with contextlib.closing(sqlite3.connect(tmp / "s.db", timeout=30)) as conn:
            changed = conn.execute("UPDATE jobs SET doc = ? WHERE id = ?", (garbage, victim))
            conn.commit()
            if changed.rowcount != 1:
                raise RuntimeError(f"the UPDATE of job {victim} changed {changed.rowcount} rows")
    else:
        assert pg_url
        rows = _pg_execute(
            pg_url, "UPDATE {schema}.jobs SET doc = %s WHERE id = %s", schema, (garbage, victim)
        )
        if rows != 1:
            raise RuntimeError(f"the UPDATE of job {victim} changed {rows} rows")


def _names_job(ran: Ran, job_id: str) -> str | None:
    problem = _error_problem(ran, code=5)  # README: a store that fails (corrupt) exits 5
    if problem:
        return problem
    if job_id not in ran.err and "corrupt" not in ran.err.lower():
        return f"the error names neither the job nor corruption: {ran.first!r}"
    if ran.out.strip():
        return f"printed something on stdout too: {ran.out.strip()[:80]!r}"
    return None


def _check_corrupt_cli(
    kind: str,
    url: str,
    victim: str,
    others: list[str],
    before: dict[str, dict[str, Any] | None],
    tally: _Tally,
) -> None:
    for args in (
        ["status", victim],
        ["status", victim, "--json"],
        ["wait", victim, "--timeout", "2"],
        ["cancel", victim],
    ):
        ran = _cli(*args, "--store", url)
        tally.check(kind, f"outlast {' '.join(args)} (corrupt job)", _names_job(ran, victim))
    ran = _cli("ls", "--store", url)
    problem = _ok_problem(ran) or next(
        (f"job {i} missing from the listing" for i in others if i not in ran.out), None
    )
    tally.check(kind, "outlast ls (beside a corrupt job)", problem)
    ran = _cli("ls", "--json", "--store", url)
    problem = _ok_problem(ran)
    if problem is None:
        try:
            listed = {doc["id"] for doc in json.loads(ran.out)["jobs"]}
            missing = [i for i in others if i not in listed]
            problem = f"jobs {missing} missing from the listing" if missing else None
        except (ValueError, TypeError, KeyError) as exc:
            problem = f"not a JSON list of jobs ({exc}): {ran.out[:80]!r}"
    tally.check(kind, "outlast ls --json (beside a corrupt job)", problem)
    for job_id in others:
        doc = _status_doc(url, job_id)
        problem = None
        if doc is None:
            problem = _cli("status", job_id, "--json", "--store", url).describe()
        elif doc != before[job_id]:
            problem = "its document changed after another job was damaged"
        tally.check(kind, f"outlast status {job_id} --json (an intact job)", problem)
        ran = _cli("status", job_id, "--store", url)
        tally.check(kind, f"outlast status {job_id} (an intact job)", _ok_problem(ran))


def _check_corrupt_http(
    kind: str, url: str, tmp: Path, victim: str, others: list[str], tally: _Tally
) -> None:
    group = f"{kind} http"

    def refused(status: int) -> bool:
        return 400 <= status < 500 or status == 503

    def not_5xx(status: int) -> bool:
        return status < 500 or status == 503

    seen: dict[str, int] = {}
    with _serving(url, tmp) as server:
        port = server.port
        for method, path, allowed in (
            ("GET", f"/jobs/{victim}", refused),
            ("GET", f"/jobs/{victim}/events", not_5xx),
            ("GET", f"/jobs/{victim}/log?tail=5", not_5xx),
            ("POST", f"/jobs/{victim}/cancel", refused),
        ):
            try:
                status, _, body = request(port, method, path)
                problem = _http_problem(status, allowed, body)
                seen[f"{method} {path.replace(victim, '{corrupt}')}"] = status
            except (OSError, http.client.HTTPException) as exc:
                problem = f"no answer: {exc!r}"
            tally.check(group, f"{method} {path} (corrupt job)", problem)
        tally.section.figures[f"{kind} corrupt job over HTTP"] = seen
        try:
            status, _, body = request(port, "GET", "/jobs")
            problem = _http_problem(status, lambda s: s == 200, body)
            if problem is None:
                listed = {doc["id"] for doc in json.loads(body)["jobs"]}
                missing = [i for i in others if i not in listed]
                problem = f"jobs {missing} missing from GET /jobs" if missing else None
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as exc:
            problem = f"no usable answer: {exc!r}"
        tally.check(group, "GET /jobs (beside a corrupt job)", problem)
        for job_id in others:
            try:
                status, _, body = request(port, "GET", f"/jobs/{job_id}")
                problem = _http_problem(status, lambda s: s == 200, body)
            except (OSError, http.client.HTTPException) as exc:
                problem = f"no answer: {exc!r}"
            tally.check(group, f"GET /jobs/{job_id} (an intact job)", problem)
        tally.check(group, "GET /events sends `ready` beside a corrupt job", _list_stream(port))
        log = server.output()
    problem = None
    if "Traceback" in log:
        problem = f"a traceback in the server's log: {_traceback_line(log)!r}"
    tally.check(group, "server log without a traceback", problem)


def _list_stream(port: int) -> str | None:
    """None when ``GET /events`` answers 200 and sends its ``ready`` event within 10 s."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/events")
        response = conn.getresponse()
        if response.status != 200:
            return f"HTTP {response.status} {response.read()[:120]!r}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = response.fp.readline()
            if not line:
                return "the stream ended before its `ready` event"
            if line.strip() == b"event: ready":
                return None
        return "no `ready` event within 10s"
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer: {exc!r}"
    finally:
        conn.close()


def _traceback_line(log: str) -> str:
    """The last line of the first traceback in ``log`` (the exception), for a report."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if "Traceback" in line)
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            return line[:200]
    return lines[start][:200]


def _check_bad_header(tmp: Path, some_job: str, tally: _Tally) -> None:
    """The first 100 bytes (the SQLite header) of a copy of the database overwritten."""
    copy = tmp / "copy"
    copy.mkdir(mode=0o700)
    shutil.copyfile(tmp / "s.db", copy / "s.db")
    os.chmod(copy / "s.db", 0o600)
    with open(copy / "s.db", "r+b") as handle:
        handle.write(bytes((i * 37 + 11) % 256 for i in range(100)))
    url = f"sqlite://{copy}/s.db"
    for args in (["ls"], ["ls", "--json"], ["status", some_job], ["run", "--", "true"]):
        store_args = (
            [args[0], "--store", url, *args[1:]] if args[0] == "run" else [*args, "--store", url]
        )
        ran = _cli(*store_args)
        problem = _error_problem(ran, code=5)
        if problem is None and not any(
            word in ran.err.lower() for word in ("corrupt", "not a database", str(copy))
        ):
            problem = f"the error does not say what is wrong: {ran.first!r}"
        tally.check("sqlite header", f"outlast {' '.join(args)} (garbage header)", problem)


# ============================================================================ 2. disk_full
def disk_full(quick: bool) -> Section:
    """A SQLite and a files store on a 4 MiB tmpfs, filled while jobs are submitted: errors are
    one clear line, nothing is stranded, old jobs stay intact, and work resumes once freed."""
    section = Section("disk_full")
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="torture-disk-"))
    mount = base / "small"
    mount.mkdir(mode=0o700)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        section.skipped = f"cannot mount a tmpfs: {(done.stderr or done.stdout).strip()[:200]}"
        return section
    try:
        _disk_full(mount, quick, section)
    except Exception as exc:
        section.failures.append(f"harness error: {type(exc).__name__}: {exc}")
    finally:
        _kill_store_processes(str(mount))
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    section.figures["seconds"] = round(time.monotonic() - started, 1)
    return section


def _kill_store_processes(fragment: str) -> None:
    """SIGKILL what this section's jobs left running: processes whose ``OUTLAST_STORE`` names
    the section's folder (supervisors and their commands, which this harness started)."""
    import psutil

    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if fragment in proc.environ().get("OUTLAST_STORE", ""):
                os.kill(proc.pid, signal.SIGKILL)


def _fill(path: Path) -> int:
    """Append to ``path`` until the disk is full; the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written = 0
    chunk = b"\0" * 65536
    try:
        with contextlib.suppress(OSError):
            while True:
                written += os.write(fd, chunk)
        with contextlib.suppress(OSError):  # the last partial blocks
            while True:
                written += os.write(fd, b"\0" * 512)
    finally:
        os.close(fd)
    return written


@dataclass
class _Filled:
    """What happened to one store while the disk filled."""

    url: str
    before: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    failed_in_a_row: int = 0
    refusals: int = 0


def _disk_full(mount: Path, quick: bool, section: Section) -> None:
    tally = _Tally(section)
    stores = {
        "sqlite": _Filled(f"sqlite://{mount}/s.db"),
        "files": _Filled(f"files://{mount}/jobs"),
    }
    for name, store in stores.items():  # jobs from before the disk filled
        for _ in range(2):
            job_id, ran = _start_job(store.url, "echo", "hi")
            if tally.check(name, "outlast run -- echo hi (disk not full)", _ok_problem(ran)):
                assert job_id is not None
                ran = _cli("wait", job_id, "--timeout", "30", "--store", store.url)
                tally.check(name, f"outlast wait {job_id}", _ok_problem(ran))
                store.before[job_id] = _status_doc(store.url, job_id)
    filler = mount / "filler"
    size = _fill(filler)
    os.truncate(filler, max(0, size - 160 * 1024))  # room for a few jobs, then full again
    errors: list[Ran] = []
    limit = 20 if quick else 60
    for attempt in range(limit):
        live = [s for s in stores.values() if s.failed_in_a_row < 3]
        if not live:
            break
        if attempt == limit // 2 and any(s.refusals == 0 for s in live):
            _fill(mount / "filler-2")  # the jobs did not fill it: leave no room at all
        for store in live:
            _submit_on_full(store, errors, tally)
    _edge_steps(mount, list(stores.values()), errors, quick, tally)
    section.figures.update(
        {
            "jobs before the disk filled": {n: len(s.before) for n, s in stores.items()},
            "jobs created while filling": {n: len(s.created) for n, s in stores.items()},
            "submits refused": len(errors),
            "their exit codes": dict(collections.Counter(r.code for r in errors)),
            "distinct errors": sorted({_generic(r.first, mount) for r in errors}),
        }
    )
    _fill(filler)  # full to the last page while the jobs are read
    reads = {}
    for name, store in stores.items():
        tally.check(name, "the disk filled (some submit was refused)", _none_if(store.refusals))
        reads[name] = _check_while_full(name, store, tally)
    section.figures["reads on the full disk"] = reads
    for path in mount.glob("filler*"):
        path.unlink()
    with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
        recovered = {
            name: pool.submit(_check_recovered, name, store, quick, tally)
            for name, store in stores.items()
        }
        section.figures["recovery ok"] = {name: f.result() for name, f in recovered.items()}
    section.figures.update(tally.figures())


def _edge_steps(
    mount: Path, stores: list[_Filled], errors: list[Ran], quick: bool, tally: _Tally
) -> None:
    """Submit with a page, two pages, … of room left, so that a submit runs out of room at
    each point of what it writes (the command's environment, the document, events, logs)."""
    filler = mount / "filler"  # the big one: the disk is already full
    for pages in (1, 2, 4, 8, 12, 16) if quick else range(1, 33):
        for store in stores:  # the stores share the disk: make the room anew for each
            _fill(filler)
            os.truncate(filler, max(0, filler.stat().st_size - pages * 4096))
            _submit_on_full(store, errors, tally)


def _generic(line: str, mount: Path) -> str:
    """An error line without its job id and temporary folder, to count kinds of errors."""
    return re.sub(r"\b[0-9a-f]{20}\b", "<id>", line.replace(str(mount), "<disk>"))


def _none_if(count: int) -> str | None:
    return None if count else "never refused: the disk did not fill"


def _submit_on_full(store: _Filled, errors: list[Ran], tally: _Tally) -> None:
    name = store.url.partition(":")[0]
    job_id, ran = _start_job(store.url, "echo", "hi")
    if job_id is not None:
        store.created.append(job_id)
        store.failed_in_a_row = 0
        return
    store.failed_in_a_row += 1
    store.refusals += 1
    errors.append(ran)
    problem = _error_problem(ran)
    if problem is None and ran.out.strip():
        problem = f"printed {ran.out.strip()[:60]!r} on stdout but failed"
    tally.check(name, "outlast run on a full disk", problem)


def _check_while_full(name: str, store: _Filled, tally: _Tally) -> str:
    """Every job read while the disk is full: it is shown, or refused in one clear line (a
    SQLite store in WAL mode may need room for its ``-shm`` file just to be opened)."""
    reads = [["status", i, "--json"] for i in [*store.before, *store.created]] + [["ls", "--json"]]
    shown = refused = 0
    for args in reads:
        ran = _cli(*args, "--store", store.url)
        if ran.code == 0:
            shown += 1
        problem = _ok_problem(ran) and _error_problem(ran)
        refused += ran.code != 0 and problem is None
        tally.check(name, f"outlast {' '.join(args)} on a full disk", problem)
    return f"{shown} answered, {refused} refused in one line"


def _check_recovered(name: str, store: _Filled, quick: bool, tally: _Tally) -> bool:
    """Once there is room: no job is stranded, old jobs are unchanged, new work runs."""
    timeout = "10" if quick else "30"  # the disk is free again: a live job moves at once
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        waits = list(
            pool.map(
                lambda i: _cli(
                    "wait", i, "--timeout", timeout, "--json", "--store", store.url, timeout=60
                ),
                store.created,
            )
        )
    for job_id, ran in zip(store.created, waits, strict=True):
        problem = None
        if ran.code not in (0, 1, 3) or "Traceback" in ran.err:
            problem = (
                f"`outlast wait --timeout {timeout}` after the disk was freed: {ran.describe()}"
            )
            with contextlib.suppress(ValueError, TypeError, KeyError):
                doc = json.loads(ran.out)
                problem = (
                    f"still {doc['status']} {timeout}s after the disk was freed (worker "
                    f"{doc['worker']}, attempts {doc['attempts']}, `outlast wait` exit {ran.code})"
                )
        tally.check(name, f"job {job_id} (created while filling) ends", problem)
    ran = _cli("ls", "--status", "pending", "--json", "--store", store.url)
    problem = _ok_problem(ran)
    if problem is None and json.loads(ran.out)["jobs"]:
        problem = f"jobs left pending: {[d['id'] for d in json.loads(ran.out)['jobs']]}"
    tally.check(name, "no job left pending", problem)
    ran = _cli("ls", "--json", "--limit", "10000", "--store", store.url)
    problem = _ok_problem(ran)
    if problem is None:
        phantoms = (
            {d["id"] for d in json.loads(ran.out)["jobs"]} - set(store.before) - set(store.created)
        )
        problem = f"jobs no submit reported: {sorted(phantoms)}" if phantoms else None
    tally.check(name, "no job recorded by a refused submit", problem)
    for job_id, doc in store.before.items():
        now = _status_doc(store.url, job_id)
        tally.check(
            name,
            f"job {job_id} (from before the disk filled) intact",
            None if now is not None and now == doc else f"now {now!r:.160}",
        )
    fresh, ran = _start_job(store.url, "true")
    if not tally.check(name, "outlast run -- true after freeing the disk", _ok_problem(ran)):
        return False
    assert fresh is not None
    deadline = time.monotonic() + (20 if quick else 60)
    status = None
    while time.monotonic() < deadline:
        doc = _status_doc(store.url, fresh)
        status = doc.get("status") if doc else None
        if status in ("succeeded", "failed", "canceled"):
            break
        time.sleep(0.1)
    return tally.check(
        name,
        f"job {fresh} (after freeing the disk) succeeds",
        None if status == "succeeded" else f"its status is {status!r}",
    )


# ============================================================================ 3. hostile clients
@dataclass
class _Conn:
    """One raw event-stream client."""

    sock: socket.socket
    source: str
    sent: bool = False
    buf: bytes = b""
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    ended: bool = False  # a 200 stream the server closed


class _Crowd:
    """Many non-blocking ``GET /events`` clients driven by one selector."""

    def __init__(self, port: int, server: Server) -> None:
        self.port, self.server = port, server
        self.sel = selectors.DefaultSelector()
        self.conns: list[_Conn] = []
        self.peak_fds = server.fds()
        self._sampled = 0.0
        self._request = (
            f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Accept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
        ).encode()

    def launch(self, sources: list[str]) -> None:
        """Start one connection from each address in ``sources`` (all at once)."""
        for source in sources:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            conn = _Conn(sock, source)
            self.conns.append(conn)
            try:
                sock.bind((source, 0))
                code = sock.connect_ex(("127.0.0.1", self.port))
            except OSError as exc:
                conn.error = f"connect: {exc.strerror or exc}"
                sock.close()
                continue
            if code not in (0, errno.EINPROGRESS):
                conn.error = f"connect: {os.strerror(code)}"
                sock.close()
                continue
            self.sel.register(sock, selectors.EVENT_WRITE, conn)

    def settled(self) -> bool:
        return all(c.status is not None or c.error is not None for c in self.conns)

    def pump(self, timeout: float) -> None:
        """One round: handle what is ready, drain open streams, sample the server's fds."""
        if self.sel.get_map():
            for key, _ in self.sel.select(timeout):
                self._on_ready(key.data)
        else:
            time.sleep(timeout)
        now = time.monotonic()
        if now - self._sampled >= 0.05:
            self._sampled = now
            self.peak_fds = max(self.peak_fds, self.server.fds())

    def run_until(self, done: Callable[[], bool], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                return False
            self.pump(0.05)
        return True

    def _drop(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def _on_ready(self, conn: _Conn) -> None:
        if not conn.sent:
            code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                conn.error = f"connect: {os.strerror(code)}"
                self._drop(conn)
                return
            try:
                conn.sock.send(self._request)
            except OSError as exc:
                conn.error = f"send: {exc.strerror or exc}"
                self._drop(conn)
                return
            conn.sent = True
            self.sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            conn.error = f"recv: {exc.strerror or exc}"
            self._drop(conn)
            return
        if not data:
            if conn.status is None:
                conn.error = "closed before an answer"
            else:
                conn.ended = True
            self._drop(conn)
        elif conn.status is None:
            conn.buf += data
            if b"\r\n\r\n" in conn.buf:
                self._answered(conn)

    def _answered(self, conn: _Conn) -> None:
        head = conn.buf.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        conn.buf = b""
        try:
            conn.status = int(head[0].split()[1])
        except (IndexError, ValueError):
            conn.error = f"not HTTP: {head[0][:60]!r}"
            self._drop(conn)
            return
        for line in head[1:]:
            key, _, value = line.partition(":")
            conn.headers[key.strip().lower()] = value.strip()
        if conn.status != 200:
            self._drop(conn)  # a refused client goes away, as a polite one would

    def open_streams(self) -> list[_Conn]:
        return [c for c in self.conns if c.status == 200 and not c.ended and c.error is None]

    def close_all(self) -> None:
        for conn in self.conns:
            if conn.sock.fileno() != -1:
                self._drop(conn)
        self.sel.close()


def hostile_clients(quick: bool) -> Section:
    """Floods of event streams against ``outlast serve``, the CLI beside them, and malformed
    requests.

    Phase "total": the server runs with ``OUTLAST_MAX_STREAMS_PER_CLIENT=5000`` so its total
    cap is what is hit, N streams spread over 8 loopback source addresses (127.0.0.1 to .8, each
    a different "client" to the server). The total cap is 1000 and N = 2000 in the full
    profile; in the quick one N = 300, so the cap there is 200 (1000 would not be reached).
    Phase "per client" (the documented default caps, nothing set): two source addresses open
    150 streams each (300 in the full profile); each must get exactly 100 (the default per
    client cap) and 503s for the rest — one greedy client does not starve another.

    The servers run with this process's original descriptor limit; only this process raises
    its own to hold its clients."""
    section = Section("hostile_clients")
    started = time.monotonic()
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = 300 if quick else 2000
    need = n + 512
    try:
        if limits[0] != resource.RLIM_INFINITY and limits[0] < need:
            hard = limits[1]
            resource.setrlimit(
                resource.RLIMIT_NOFILE,
                (need if hard == resource.RLIM_INFINITY else min(need, hard), hard),
            )
        with tempfile.TemporaryDirectory(prefix="torture-hostile-") as tmp:
            _hostile(Path(tmp), quick, n, limits, section)
    except Exception as exc:
        section.failures.append(f"harness error: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    section.figures["seconds"] = round(time.monotonic() - started, 1)
    return section


def _hostile(folder: Path, quick: bool, n: int, limits: tuple[int, int], section: Section) -> None:
    url = f"sqlite://{folder}/s.db"
    finished: list[str] = []
    for _ in range(3):
        job_id, ran = _start_job(url, "true")
        if job_id is None:
            section.failures.append(f"setup: outlast run -- true: {ran.describe()}")
            return
        finished.append(job_id)
    for job_id in finished:
        _cli("wait", job_id, "--timeout", "30", "--store", url)
    cap = 200 if quick else 1000
    section.figures.update(
        {"N": n, "server nofile limit": limits[0], "total cap": cap, "per-client cap": 5000}
    )
    env = {"OUTLAST_MAX_STREAMS": str(cap), "OUTLAST_MAX_STREAMS_PER_CLIENT": "5000"}
    with _serving(url, folder, env, nofile=limits) as server:
        _flood(server, n, cap, finished[0], quick, section)
        _malformed(server, finished[0], section)
        if not server.alive():
            section.failures.append(f"the server died: {server.output()[-300:]!r}")
        log = server.output()
    _check_log(log, "server (total cap)", section)
    per_source = 150 if quick else 300
    with _serving(url, folder, nofile=limits) as server:
        _per_client(server, per_source, section)
        log = server.output()
    _check_log(log, "server (per-client cap)", section)
    # soft and hard: a limit `outlast serve` cannot lift, so its stream cap must fit it
    common = (min(COMMON_NOFILE, limits[0]), min(COMMON_NOFILE, limits[1]))
    with _serving(url, folder, nofile=common) as server:
        _within_common_limit(server, common[0], quick, section)
        log = server.output()
    # a crowd larger than the limit takes every descriptor for a moment: said in one line
    # (streams refused with 503s, accepts paused), never a traceback or a stream cut short
    warned = sum(1 for line in log.splitlines() if "out of file descriptors" in line)
    section.figures[f"nofile {common[0]} phase: one-line warnings"] = warned
    _check_log(log, f"server (nofile {common[0]}, default caps)", section, descriptors=True)


def _within_common_limit(server: Server, nofile: int, quick: bool, section: Section) -> None:
    """The default caps (1000 streams, 100 per client) under the descriptor limit most
    shells give (1024): a crowd of clients that each stay under the per-client cap must get
    200s or 503s, never a reset, and the server must go on answering."""
    sources = 8 if quick else 10
    each = 75 if quick else DEFAULT_PER_CLIENT
    phase = f"nofile {nofile}"
    crowd = _Crowd(server.port, server)
    try:
        crowd.launch([f"127.0.1.{1 + i % sources}" for i in range(sources * each)])
        crowd.run_until(crowd.settled, 60)
        crowd.run_until(lambda: False, 1.0)  # a stream the server cannot keep ends soon
        codes = collections.Counter(c.status for c in crowd.conns if c.status is not None)
        errors = collections.Counter(c.error for c in crowd.conns if c.error is not None)
        waiting = sum(1 for c in crowd.conns if c.status is None and c.error is None)
        ended = sum(1 for c in crowd.conns if c.ended)
        section.figures[f"{phase} phase (default caps)"] = (
            f"{sources} clients x {each}: {codes.get(200, 0)} x 200 ({ended} of them ended at"
            f" once), {codes.get(503, 0)} x 503, {sum(errors.values())} errors, {waiting}"
            f" unanswered, peak fds {crowd.peak_fds}"
        )
        if ended:
            section.failures.append(
                f"{phase}: the server accepted {ended} streams (200) and ended them at once"
            )
        if errors or waiting:
            section.failures.append(
                f"{phase}: {sum(errors.values())} clients got no HTTP answer "
                f"({dict(errors.most_common(3))}) and {waiting} waited 60s in vain"
            )
        try:
            status = request(server.port, "GET", "/healthz", timeout=10)[0]
        except (OSError, http.client.HTTPException) as exc:
            status = 0
            section.failures.append(f"{phase}: GET /healthz with the crowd open: {exc!r}")
        if status not in (0, 200):
            section.failures.append(f"{phase}: GET /healthz with the crowd open: HTTP {status}")
    finally:
        crowd.close_all()


def _check_log(log: str, who: str, section: Section, descriptors: bool = False) -> None:
    """Fail on a traceback in the server's log, and on running out of descriptors unless
    ``descriptors`` (a limit the crowd is larger than: then only the server's own one-line
    warnings may say so)."""
    if "Traceback" in log:
        section.failures.append(f"{who}: a traceback in its log: {_traceback_line(log)!r}")
    for line in log.splitlines():
        out = "Too many open files" in line or "EMFILE" in line
        if out and not (descriptors and "out of file descriptors" in line):
            section.failures.append(f"{who}: ran out of descriptors: {line[:200]!r}")
            break


def _warm_up(server: Server, n: int) -> int:
    """A first crowd of ``n`` streams, opened and closed; then the server's fds.

    What a server opens on first demand and keeps is bounded, not per client: its thread
    pools grow to the load they met (each thread keeps its own SQLite connection, two fds)
    and the store's notification files stay open. The baseline is taken after a crowd of the
    size to come, so that what the flood leaves behind is compared with a warm server."""
    crowd = _Crowd(server.port, server)
    crowd.launch([f"127.0.0.{1 + i % 8}" for i in range(n)])
    crowd.run_until(crowd.settled, 30)
    crowd.close_all()
    time.sleep(1.0)
    samples = []
    for _ in range(5):
        samples.append(server.fds())
        time.sleep(0.05)
    return sorted(samples)[len(samples) // 2]


def _flood(server: Server, n: int, cap: int, done_id: str, quick: bool, section: Section) -> None:
    cold = server.fds()
    baseline = _warm_up(server, n)
    crowd = _Crowd(server.port, server)
    sources = [f"127.0.0.{1 + i % 8}" for i in range(n)]
    began = time.monotonic()
    try:
        crowd.launch(sources)
        if not crowd.run_until(crowd.settled, 30 if quick else 90):
            waiting = sum(1 for c in crowd.conns if c.status is None and c.error is None)
            section.failures.append(f"total cap: {waiting} of {n} streams had no answer in time")
        section.figures["seconds to answer all"] = round(time.monotonic() - began, 2)
        _count_answers(crowd, n, cap, "total cap", section)
        _beside_the_crowd(crowd, server, done_id, section)
        peak = max(crowd.peak_fds, server.fds())
    finally:
        crowd.close_all()
    closed = time.monotonic()
    back: float | None = None
    while time.monotonic() - closed < 5:
        if 0 <= server.fds() <= baseline + 10:
            back = time.monotonic() - closed
            break
        time.sleep(0.05)
    after = server.fds()
    section.figures.update(
        {
            "fds cold": cold,
            "fds baseline (warm)": baseline,
            "fds peak": peak,
            "fds after": after,
            "seconds to baseline": "never (5s)" if back is None else round(back, 3),
        }
    )
    if back is None or back > 1.0:
        took = "not within 5s" if back is None else f"after {back:.2f}s"
        section.failures.append(
            f"total cap: the server's fds came back within baseline+10 ({baseline + 10}) {took}"
            f" (now {after})"
        )
    _slot_freed(server, section)


def _count_answers(crowd: _Crowd, n: int, cap: int, phase: str, section: Section) -> None:
    codes = collections.Counter(c.status for c in crowd.conns if c.status is not None)
    errors = collections.Counter(c.error for c in crowd.conns if c.error is not None)
    no_retry = sum(1 for c in crowd.conns if c.status == 503 and "retry-after" not in c.headers)
    ended = sum(1 for c in crowd.conns if c.ended)
    section.figures.update({"200s": codes.get(200, 0), "503s": codes.get(503, 0)})
    others = {k: v for k, v in codes.items() if k not in (200, 503)}
    if others:
        section.figures["other statuses"] = others
        section.failures.append(f"{phase}: answers other than 200/503: {others}")
    if errors:
        section.figures["client errors"] = dict(errors)
        section.failures.append(f"{phase}: clients with no HTTP answer: {dict(errors)}")
    if no_retry:
        section.failures.append(f"{phase}: {no_retry} 503s without Retry-After")
    if ended:
        section.failures.append(f"{phase}: the server ended {ended} open streams early")
    if codes.get(200, 0) != min(n, cap):
        section.failures.append(
            f"{phase}: {codes.get(200, 0)} streams accepted, expected {min(n, cap)} (the cap)"
        )


def _beside_the_crowd(crowd: _Crowd, server: Server, done_id: str, section: Section) -> None:
    """While the streams are open: the CLI in other processes of this user, and the API."""
    url = server.url

    def api(path: str) -> tuple[int, bytes]:
        status, _, body = request(server.port, "GET", path, timeout=10)
        return status, body

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ls = pool.submit(_cli, "ls", "--store", url)
        wait = pool.submit(_cli, "wait", done_id, "--timeout", "5", "--store", url)
        jobs = pool.submit(api, "/jobs")
        health = pool.submit(api, "/healthz")
        crowd.run_until(lambda: all(f.done() for f in (ls, wait, jobs, health)), 60)
        for what, future in (("outlast ls", ls), (f"outlast wait {done_id} --timeout 5", wait)):
            ran = future.result()
            problem = _ok_problem(ran)
            text = ran.out + ran.err
            if problem is None and ("Too many open files" in text or "EMFILE" in text):
                problem = f"EMFILE: {ran.first!r}"
            if problem:
                section.failures.append(
                    f"while {len(crowd.open_streams())} streams open: {what}: {problem}"
                )
        for path, answer in (("/jobs", jobs), ("/healthz", health)):
            try:
                status, body = answer.result()
                problem = _http_problem(status, lambda s: s == 200, body)
            except (OSError, http.client.HTTPException) as exc:
                problem = f"no answer: {exc!r}"
            if problem:
                section.failures.append(f"while the streams are open: GET {path}: {problem}")


def _slot_freed(server: Server, section: Section) -> None:
    """After the crowd left, a new stream is accepted (its slots were given back)."""
    deadline = time.monotonic() + 5
    status = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            status = request(server.port, "GET", "/events", timeout=5)[0]
            if status == 200:
                return
        time.sleep(0.1)
    section.failures.append(f"after the crowd left, GET /events still answers {status}")


def _per_client(server: Server, per_source: int, section: Section) -> None:
    crowd = _Crowd(server.port, server)
    sources = ["127.0.0.2", "127.0.0.3"]
    try:
        crowd.launch([s for s in sources for _ in range(per_source)])
        if not crowd.run_until(crowd.settled, 60):
            section.failures.append("per-client cap: some streams had no answer within 60s")
        counts: dict[str, object] = {}
        for source in sources:
            mine = [c for c in crowd.conns if c.source == source]
            ok = sum(1 for c in mine if c.status == 200)
            refused = [c for c in mine if c.status == 503]
            counts[source] = f"{ok} x 200, {len(refused)} x 503"
            expected = min(per_source, DEFAULT_PER_CLIENT)
            if ok != expected or len(refused) != per_source - expected:
                section.failures.append(
                    f"per-client cap: {source} got {counts[source]}, expected {expected} x 200"
                    f" and {per_source - expected} x 503"
                )
            if any("retry-after" not in c.headers for c in refused):
                section.failures.append(f"per-client cap: a 503 to {source} lacks Retry-After")
        section.figures["per-client phase (default caps)"] = counts
    finally:
        crowd.close_all()


def _malformed_requests(job_id: str) -> list[tuple[str, str, bytes | None, dict[str, str]]]:
    as_json = {"Content-Type": "application/json"}
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        ("GET", "/jobs/../../etc/passwd", None, {}),
        ("GET", "/jobs/..%2F..%2Fetc%2Fpasswd", None, {}),
        ("GET", "/jobs/%2e%2e", None, {}),
        ("GET", "/jobs/%00", None, {}),
        ("GET", "/jobs/a%00b", None, {}),
        ("GET", "/jobs/%ff%fe", None, {}),
        ("GET", "/jobs/" + "a" * 129, None, {}),
        ("GET", "/jobs/" + "a" * 7000, None, {}),
        ("GET", "/jobs/bad..id!/events", None, {}),
        ("GET", f"/jobs/{job_id}/events", None, {"Last-Event-ID": "x1"}),
        ("GET", f"/jobs/{job_id}/events?after=-1", None, {}),
        ("GET", f"/jobs/{job_id}/events?after=99999999999999999999999", None, {}),
        ("GET", f"/jobs/{job_id}/log?tail=-5", None, {}),
        ("GET", f"/jobs/{job_id}/log?tail=abc", None, {}),
        ("GET", "/jobs?limit=-1", None, {}),
        ("GET", "/jobs?limit=99999999999999999999999", None, {}),
        ("GET", "/jobs?status=bogus", None, {}),
        ("GET", "/jobs?label=noequals", None, {}),
        ("GET", "/jobs?before=../../x", None, {}),
        ("POST", "/jobs", b"{", as_json),
        ("POST", "/jobs", b"null", as_json),
        ("POST", "/jobs", b"[]", as_json),
        ("POST", "/jobs", b'{"name": 5}', as_json),
        ("POST", "/jobs", b'{"name": "no.such.job"}', as_json),
        ("POST", "/jobs", b'{"name": "x", "args": [1e999]}', as_json),
        ("POST", "/jobs", b'{"name": "x", "nope": 1}', as_json),
        ("POST", "/jobs", b"\xff\xfe{", as_json),
        ("POST", "/jobs", deep, as_json),
        ("POST", "/jobs", b'{"name": "x"}', {"Content-Type": "text/plain"}),
        ("POST", "/jobs", b'{"name": "x"}', {}),
        ("POST", "/jobs", b"x" * (2 * 1024 * 1024), as_json),
        ("POST", f"/jobs/{job_id}/resume", b"{not json", as_json),
        ("POST", "/jobs/%00/cancel", None, {}),
        ("DELETE", "/jobs/..", None, {}),
        ("PUT", "/jobs", b"{}", as_json),
    ]


def _malformed(server: Server, job_id: str, section: Section) -> None:
    histogram: collections.Counter[str] = collections.Counter()
    sent = 0
    for method, path, body, headers in _malformed_requests(job_id):
        sent += 1
        try:
            status, _, answer = request(server.port, method, path, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            histogram["no answer"] += 1
            section.failures.append(f"malformed: {method} {path[:60]}: no answer: {exc!r}")
            continue
        histogram[str(status)] += 1
        if status >= 500:
            section.failures.append(
                f"malformed: {method} {path[:60]} body {(body or b'')[:30]!r}: HTTP {status}"
                f" {answer[:100]!r}"
            )
    sent += 1  # a request line that is not HTTP at all
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GARBAGE \x00\xff NOT-HTTP\r\n\r\n")
        try:
            reply = sock.recv(200)
        except OSError:
            reply = b""
    code = reply.split(b" ")[1].decode("latin-1") if reply.startswith(b"HTTP/") else "closed"
    histogram[code] += 1
    if code.startswith("5"):
        section.failures.append(f"malformed: a garbage request line: HTTP {code}")
    section.figures["malformed requests"] = sent
    section.figures["malformed statuses"] = dict(sorted(histogram.items()))


# ============================================================================ main
def _print(section: Section, seconds: float) -> None:
    print(f"== {section.name} ({seconds:.1f}s)")
    if section.skipped:
        print(f"   skipped: {section.skipped}")
    for key, value in section.figures.items():
        print(f"   {key}: {value}")
    for failure in section.failures:
        print(f"   FAIL {failure}")
    if not section.failures and not section.skipped:
        print("   ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="the short profile")
    parser.add_argument("--pg", metavar="URL", help="also a PostgreSQL store (corruption)")
    parser.add_argument(
        "--only",
        choices=["corruption", "disk_full", "hostile_clients"],
        action="append",
        help="run only these sections (repeatable)",
    )
    args = parser.parse_args(argv)
    runs: dict[str, Callable[[], Section]] = {
        "corruption": lambda: corruption(args.quick, args.pg),
        "disk_full": lambda: disk_full(args.quick),
        "hostile_clients": lambda: hostile_clients(args.quick),
    }
    failed = False
    for name, run in runs.items():
        if args.only and name not in args.only:
            continue
        began = time.monotonic()
        section = run()
        _print(section, time.monotonic() - began)
        failed = failed or bool(section.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
