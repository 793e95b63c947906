"""Waking waiters across processes (issue 12, item 4): one inotify instance per process and
store, however many listeners; past the user's inotify limits, polling instead of an error."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from outlast.store import notify, open_store


def _inotify_instances() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            continue
    return count


def test_many_listeners_share_one_inotify_instance(tmp_path: Path) -> None:
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        job = store.create(command=["true"])
        before = _inotify_instances()
        listeners = [store.listen([job.id]) for _ in range(300)]  # more than the user limit
        try:
            assert _inotify_instances() - before <= 1
            woken: list[bool] = []
            waiter = threading.Thread(target=lambda: woken.append(listeners[-1].wait(10)))
            waiter.start()
            time.sleep(0.05)
            store.open(job.id).relabel("k", "v")
            waiter.join(10)
            assert woken == [True]
        finally:
            for listener in listeners:
                listener.close()
        assert all(listener.fileno() is None for listener in listeners)  # eventfds closed


def test_past_the_inotify_limits_waiters_poll_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Exhausted:
        class flags:
            MODIFY = 2

        @staticmethod
        def INotify() -> Any:
            raise OSError(24, "Too many open files")

    monkeypatch.setattr(notify, "inotify", lambda: Exhausted)
    caplog.set_level(logging.WARNING)
    with open_store(f"sqlite://{tmp_path}/s.db") as store:
        job = store.create(command=["true"])
        with store.listen([job.id]) as listener:
            assert listener.fileno() is None
            assert listener.wait(1.0) is True  # a short poll, then the caller re-checks
        state = store.wait(job.id, timeout=0.3)  # waits still work, by polling
        assert state.status == "pending"
    assert any("falls back to polling" in r.getMessage() for r in caplog.records)
