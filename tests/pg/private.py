"""A PostgreSQL server of the test's own, for tests that restart or cut it off (never the
shared one): ``initdb`` and ``pg_ctl`` from ``/usr/lib/postgresql/*/bin``, in a temporary
folder owned by the ``postgres`` user (initdb refuses to run as root), on a free port."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PrivateServer:
    """``start()``, ``restart(mode)``, ``stop()``; ``url(schema)`` to connect."""

    def __init__(self) -> None:
        bindir = binaries()
        if bindir is None:
            raise RuntimeError("no initdb under /usr/lib/postgresql")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="outlast-pg-"))
        self.data = self.root / "data"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._as_postgres = os.getuid() == 0
        if self._as_postgres:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / tool), *args]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=120)

    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200"
        )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-o", self._options(), "-l",
                  str(self.root / "log"), "-w", "start")  # fmt: skip

    def restart(self, mode: str = "fast") -> None:
        """``fast`` (clients are told: "the database system is shutting down") or
        ``immediate`` (a crash: clients lose their connections, the server recovers)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-o", self._options(), "-l",
                  str(self.root / "log"), "-w", "restart")  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def url(self, schema: str = "outlast") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema={schema}"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
