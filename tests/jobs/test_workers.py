"""The registry of workers on every store: pools and supervisors are listed with what they
run while they live, and gone the moment they die (liveness is their lock, never a
heartbeat); a SIGTERMed pool takes itself out."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from outlast import __version__
from tests.jobs import pyjobs
from tests.pool.conftest import Harness
from tests.store.adapters import ADAPTERS, Adapter
from tests.waiting import until


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: a.name)
def test_workers_are_listed_while_they_live(adapter: Adapter, tmp_path: Path) -> None:
    url = adapter.make_url(tmp_path / "store")
    if url is None:
        pytest.skip(f"no {adapter.name} store here")
    pool = Harness(tmp_path, url)
    try:
        first = pool.worker("--import", pyjobs.MODULE, "-c", "2", "--queue", "q1")
        second = pool.worker("--import", pyjobs.MODULE, "--async", "-c", "5")
        command = pool.cli("run", "--", "sleep", "30").stdout.strip()

        def listed() -> list[dict[str, object]]:
            return json.loads(pool.cli("workers", "--json").stdout)  # type: ignore[no-any-return]

        def kinds() -> dict[str, dict[str, object]] | None:
            found = {str(w["kind"]): w for w in listed()}
            return found if {"pool", "async-pool", "supervisor"} <= found.keys() else None

        found = until(kinds, 30, "the pools and the supervisor in the registry")
        assert found["pool"]["queues"] == ["q1"] and found["pool"]["concurrency"] == 2
        assert found["pool"]["pid"] == first.pid and found["pool"]["version"] == __version__
        assert found["async-pool"]["concurrency"] == 5
        assert found["supervisor"]["job"] == command
        text = pool.cli("workers").stdout
        assert text.startswith("KIND") and "async-pool" in text and command in text

        os.kill(first.pid, signal.SIGKILL)  # dead: gone as soon as its lock is free
        first.wait()
        # (its job processes, which share its liveness lock, die of its death a moment
        # later: a few ms, where a guess from a heartbeat would take its whole period)
        until(lambda: "pool" not in {w["kind"] for w in listed()}, 5, "the dead pool gone")
        second.popen.send_signal(signal.SIGTERM)  # stops: takes itself out
        assert second.wait(30) == 0
        assert pool.cli("cancel", command).returncode == 0
        until(lambda: listed() == [], 20, "an empty registry")
    finally:
        pool.close()
