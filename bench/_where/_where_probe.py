"""The probe ``bench/where_bench.py`` puts in every process it measures (loaded by the
``sitecustomize.py`` beside it when ``WHERE_OUT`` is set; standard library only at import).

``WHERE_MODE`` says what it does:

- ``cpu``: nothing but answer snapshots (no hooks: the CPU figures are the code's own);
- ``count``: also count, per thread, every SQL statement (sqlite3's trace callback; psycopg's
  ``Cursor.execute``/``executemany`` and the connection's own commands), transactions,
  PostgreSQL round trips, connections and notifications, and the file writes, flocks and
  syncs made through ``os``/``fcntl``;
- ``profile``: also profile the main thread (cProfile on its CPU clock,
  ``time.thread_time``) from the first snapshot to the second, dumped then to
  ``WHERE_OUT/prof-PID``.

A snapshot (on SIGUSR2, or :func:`snapshot` in-process) writes ``WHERE_OUT/snap-PID-N.json``:
the process's role, its CPU (``getrusage``: all threads; and per thread, from
``/proc/self/task``), context switches and the counts so far.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import sys
import threading
import time
import weakref
from collections import defaultdict
from typing import Any

OUT = os.environ.get("WHERE_OUT", "")
MODE = os.environ.get("WHERE_MODE", "cpu")
COUNTS: dict[tuple[str, str, str], float] = defaultdict(float)  # counts; seconds ("wait")
_SNAPS = [0]
_PROFILE: list[Any] = []
_MAIN = threading.main_thread()
_REPLACE = os.replace  # the probe's own file operations are not counted


def _thread() -> str:
    t = threading.current_thread()
    return "main" if t is _MAIN else re.sub(r"-\d+$|\(.*\)$", "", t.name).strip() or "thread"


def count(category: str, detail: str = "", n: float = 1) -> None:
    COUNTS[(_thread(), category, detail)] += n


# ------------------------------------------------------------------------- statement text
_STRING = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w$])-?\d+(?:\.\d+)?(?![\w])")
_LIST = re.compile(r"\?(?:\s*,\s*\?)+")
_ROWS = re.compile(r"\(\?…?\)(?:\s*,\s*\(\?…?\))+")
_SCHEMA = re.compile(r'"?where_[a-z0-9_]+"?\.')
_SPACE = re.compile(r"\s+")
_BLOB = re.compile(r"(?<![\w])[xX]\?")


def norm(sql: Any) -> str:
    """A statement's shape: literals and parameters as ``?``, lists of them as ``?…``, the
    run's schema name left out, whitespace collapsed."""
    if isinstance(sql, bytes | bytearray | memoryview):
        text = bytes(sql).decode(errors="replace")
    elif isinstance(sql, str):
        text = sql
    else:
        try:
            text = sql.as_string(None)
        except Exception:
            text = str(sql)
    text = _SPACE.sub(" ", text).strip()
    text = _BLOB.sub("?", _STRING.sub("?", text))
    text = text.replace("%s", "?").replace("%b", "?").replace("%t", "?")
    text = _NUMBER.sub("?", text)
    text = _LIST.sub("?…", text)
    text = _ROWS.sub("(?…)…", text)
    text = _SCHEMA.sub("", text)
    return text[:240]


def _verb(text: str) -> str:
    return text.split(" ", 1)[0].upper() if text else ""


_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


# ------------------------------------------------------------------------------ sqlite3
def _hook_sqlite() -> None:
    import sqlite3

    connect = sqlite3.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        in_tx = [False]

        def trace(statement: str) -> None:
            text = norm(statement)
            verb = _verb(text)
            count("sql", text)
            if verb == "BEGIN":
                in_tx[0] = True
                count("tx", "begin")
            elif verb in ("COMMIT", "END"):
                in_tx[0] = False
                count("tx", "commit")
            elif verb == "ROLLBACK":
                in_tx[0] = False
                count("tx", "rollback")
            elif not in_tx[0]:
                count("auto", "write" if verb in _WRITES else "read")

        conn.set_trace_callback(trace)
        return conn

    sqlite3.connect = counting_connect


# ------------------------------------------------------------------------------ psycopg
class _PgState:
    in_tx: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _pg_statement(conn: Any, query: Any, n: int = 1) -> str:
    text = norm(query)
    count("sql", text, n)
    # a script of statements separated by ';' (LISTEN a; LISTEN b) is one statement here
    verb = _verb(text)
    if verb in ("BEGIN", "START"):
        _PgState.in_tx[conn] = True
        count("tx", "begin")
    elif verb in ("COMMIT", "END"):
        _PgState.in_tx[conn] = False
        count("tx", "commit")
    elif verb == "ROLLBACK":
        _PgState.in_tx[conn] = False
        count("tx", "rollback")
    elif not _PgState.in_tx.get(conn, False):
        count("auto", "write" if verb in _WRITES else "read", n)
    return text


def _hook_psycopg() -> None:
    """Wrap psycopg once it is imported (a meta-path hook: importing it here would slow
    every process of the benchmark, the ones that never use it too)."""
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name != "psycopg":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            exec_module = loader.exec_module

            def exec_and_patch(module: Any) -> None:
                exec_module(module)
                _patch_psycopg(module)

            loader.exec_module = exec_and_patch  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def _short(text: str) -> str:
    return " ".join(text.split(" ", 7)[:7])


def _patch_psycopg(psycopg: Any) -> None:
    """Count statements, and round trips: a statement outside a pipeline is one (named by
    the statement), a pipeline is one at its end (named by what it held)."""
    from psycopg import _connection_base, _pipeline

    cursor, connection = psycopg.Cursor, psycopg.Connection
    execute, executemany = cursor.execute, cursor.executemany

    def sent(conn: Any, query: Any, n: int = 1) -> None:
        text = _pg_statement(conn, query, n)
        pipeline = conn._pipeline
        if pipeline is None:
            count("rt", text)
        else:
            pipeline.__dict__.setdefault("_where", []).append(_short(text))

    def counting_execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        sent(self._conn, query)
        return execute(self, query, params, **kwargs)

    def counting_executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
        params_seq = list(params_seq)
        _pg_statement(self._conn, query, len(params_seq))
        if self._conn._pipeline is not None:
            self._conn._pipeline.__dict__.setdefault("_where", []).append(
                f"{_short(norm(query))} xN"
            )
        return executemany(self, query, params_seq, **kwargs)

    cursor.execute, cursor.executemany = counting_execute, counting_executemany

    base = _connection_base.BaseConnection
    exec_command, deallocate = base._exec_command, base._deallocate

    def counting_exec_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent(self, command)
        return exec_command(self, command, *args, **kwargs)

    def counting_deallocate(self: Any, name: Any) -> Any:
        count("rt", "(deallocate a prepared statement)")
        return deallocate(self, name)

    base._exec_command = counting_exec_command  # type: ignore[method-assign]
    base._deallocate = counting_deallocate  # type: ignore[method-assign]

    wait = connection.wait

    def timed_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return wait(self, *args, **kwargs)
        finally:  # the time spent waiting for the server (and in libpq) on this thread
            count("wait", "", time.perf_counter() - t0)

    connection.wait = timed_wait
    _patch_pipeline(_pipeline.Pipeline)
    _patch_connection(cursor, connection)


def _patch_pipeline(pipeline: Any) -> None:
    p_exit, p_sync = pipeline.__exit__, pipeline.sync

    def held(self: Any) -> str:
        """What the pipeline held, runs of one statement as ``xN`` (batches differ in size)."""
        statements = self.__dict__.pop("_where", None) or ["executemany"]
        runs: list[list[Any]] = []
        for text in statements:
            if runs and runs[-1][0] == text:
                runs[-1][1] += 1
            else:
                runs.append([text, 1])
        return "pipeline: " + "; ".join(t + (" xN" if n > 1 else "") for t, n in runs)

    def counting_exit(self: Any, *exc: Any) -> Any:
        if self.level == 1:
            count("rt", held(self))
        return p_exit(self, *exc)

    def counting_sync(self: Any) -> Any:
        count("rt", "sync " + held(self))
        return p_sync(self)

    pipeline.__exit__, pipeline.sync = counting_exit, counting_sync


def _patch_connection(cursor: Any, connection: Any) -> None:
    send_prepare = cursor._send_prepare

    def counting_send_prepare(self: Any, *args: Any) -> Any:
        if not self._conn._pipeline:  # a round trip of its own (then the execute)
            count("rt", "(prepare a statement)")
        count("prepare", "")
        return send_prepare(self, *args)

    cursor._send_prepare = counting_send_prepare

    connect = connection.connect.__func__

    def counting_connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
        count("connect", "")
        return connect(cls, *args, **kwargs)

    connection.connect = classmethod(counting_connect)

    notifies = connection.notifies

    def counting_notifies(self: Any, *args: Any, **kwargs: Any) -> Any:
        count("notify", "polls")
        for note in notifies(self, *args, **kwargs):
            count("notify", "received")
            yield note

    connection.notifies = counting_notifies


# ----------------------------------------------------------------------------- files
def _fd_kind(fd: int) -> str:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"
    return _path_kind(target) if target.startswith("/") else target.split(":", 1)[0]


def _path_kind(path: Any) -> str:
    text = os.fsdecode(path) if isinstance(path, bytes | str | os.PathLike) else str(path)
    parent = os.path.basename(os.path.dirname(text))
    name = os.path.basename(text)
    if parent in ("journal", "pulse", "locks", "logs", "workers"):
        return f"{parent}/"
    if name.endswith(("-wal", "-shm", ".db", "-journal")):
        return "db"
    return f"{parent}/*{os.path.splitext(name)[1]}"


def _hook_files() -> None:
    import fcntl

    def wrap(module: Any, name: str, kind: Any) -> None:
        original = getattr(module, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            count("io", f"{name} {kind(args[0]) if args else ''}")
            return original(*args, **kwargs)

        setattr(module, name, counted)

    for name in ("write", "pwrite", "fsync", "fdatasync", "ftruncate"):
        wrap(os, name, _fd_kind)
    for name in ("open", "unlink", "replace"):
        wrap(os, name, _path_kind)
    wrap(fcntl, "flock", lambda fd: _fd_kind(fd if isinstance(fd, int) else fd.fileno()))


# ---------------------------------------------------------------------------- snapshots
def role() -> str:
    argv = " ".join(sys.argv)
    if "jobproc" in argv:
        return "job"
    if " worker" in argv or argv.startswith("worker"):
        # a job process forked by its pool keeps the pool's argv: its parent is the pool
        try:
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
                parent = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            parent = ""
        return "job" if " worker" in parent else "pool"
    if "submit.py" in argv:
        return "submit"
    return "other"


def _threads() -> dict[str, list[float]]:
    """Per thread name: [CPU seconds, seconds spent runnable waiting for a CPU] (the
    kernel's schedstat of each thread)."""
    names = {t.native_id: t for t in threading.enumerate()}
    out: dict[str, list[float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait = (int(x) / 1e9 for x in f.read().split()[:2])
        except OSError:
            continue
        t = names.get(int(tid))
        name = "main" if t is _MAIN else (t.name if t is not None else f"native-{tid}")
        name = re.sub(r"-\d+$|\(.*\)$", "", name).strip() or "thread"
        both = out.setdefault(name, [0.0, 0.0])
        both[0] += run
        both[1] += wait
    return out


def snapshot(tag: str = "") -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _SNAPS[0] += 1
    data = {
        "pid": os.getpid(),
        "role": role(),
        "tag": tag,
        "n": _SNAPS[0],
        "time": time.time(),
        "cpu": usage.ru_utime + usage.ru_stime,
        "utime": usage.ru_utime,
        "stime": usage.ru_stime,
        "nvcsw": usage.ru_nvcsw,
        "nivcsw": usage.ru_nivcsw,
        "threads": _threads(),
        "counts": [[*key, n] for key, n in COUNTS.items()],
    }
    if MODE == "profile":
        _profile_step()
    if OUT:
        path = os.path.join(OUT, f"snap-{os.getpid()}-{_SNAPS[0]}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        _REPLACE(path + ".tmp", path)  # the driver sees it whole
    return data


def _profile_step() -> None:
    import cProfile

    if not _PROFILE:
        profile = cProfile.Profile(time.thread_time)  # the main thread's CPU, not its waits
        _PROFILE.append(profile)
        profile.enable()
    elif _PROFILE[0] is not None:
        profile, _PROFILE[0] = _PROFILE[0], None
        profile.disable()
        profile.dump_stats(os.path.join(OUT, f"prof-{os.getpid()}-{role()}"))


def _on_signal(signum: int, frame: Any) -> None:
    snapshot("signal")


def boot() -> None:
    if MODE == "count":
        _hook_sqlite()
        _hook_psycopg()
        _hook_files()
    signal.signal(signal.SIGUSR2, _on_signal)
