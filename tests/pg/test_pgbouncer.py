"""Through PgBouncer in transaction pooling mode, session advisory locks cannot work: the store
refuses to take worker locks there, or warns loudly when it cannot tell. Skipped without a
``pgbouncer`` binary."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from outlast.errors import StoreError
from outlast.store import open_store

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bouncer(store_url: str) -> Iterator[Callable[[str], str]]:
    """``start(extra_config)`` runs a PgBouncer in transaction mode in front of the test
    server and returns ``store_url`` rewritten to go through it."""
    if shutil.which("pgbouncer") is None or os.geteuid() != 0:
        pytest.skip("needs the pgbouncer binary (and root, to run it as postgres)")
    folder = tempfile.mkdtemp(prefix="outlast-pgbouncer-")
    procs: list[subprocess.Popen[bytes]] = []

    def start(extra: str) -> str:
        port = _free_port()
        with open(os.path.join(folder, "users.txt"), "w") as f:
            f.write('"postgres" ""\n')
        conf = os.path.join(folder, "pgbouncer.ini")
        with open(conf, "w") as f:
            f.write(
                "[databases]\ntest = host=127.0.0.1 port=5432 dbname=test\n"
                f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n"
                f"auth_type = trust\nauth_file = {folder}/users.txt\npool_mode = transaction\n"
                f"unix_socket_dir =\nlogfile = {folder}/pgb.log\n{extra}\n"
            )
        shutil.chown(folder, "postgres")
        for name in os.listdir(folder):
            shutil.chown(os.path.join(folder, name), "postgres")
        procs.append(subprocess.Popen(["pgbouncer", "-u", "postgres", conf]))
        url = store_url.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url.split("?")[0]).close()
                return url
            except psycopg.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        shutil.rmtree(folder, ignore_errors=True)


def test_transaction_pooling_is_refused_for_worker_locks(bouncer: Callable[[str], str]) -> None:
    url = bouncer("")
    with open_store(url) as store:
        store.create(name="j")
        with pytest.raises(StoreError, match="session mode"):
            store.claim()


def test_a_pooler_that_lets_the_options_through_is_warned_about(
    bouncer: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    url = bouncer("ignore_startup_parameters = options")
    caplog.set_level(logging.WARNING)
    with open_store(url) as store:
        job = store.create(name="j")
        store.open(job.id).hold_worker_lock()
    assert any("pooler" in r.getMessage() for r in caplog.records), caplog.records
