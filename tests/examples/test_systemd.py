"""examples/systemd: the unit files pass ``systemd-analyze verify`` (with the executable
pointed at this checkout's ``outlast``), and stop a worker after its grace period."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "examples" / "systemd"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("unit", ["outlast-worker@.service", "outlast-serve.service"])
def test_the_unit_files_verify(unit: str, tmp_path: Path) -> None:
    outlast = Path(sys.executable).with_name("outlast")
    text = (UNITS / unit).read_text().replace("/srv/app/.venv/bin/outlast", str(outlast))
    target = tmp_path / unit.replace("@.", "@default.")
    target.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(target)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    if "worker" in unit:  # systemd waits longer than the pool's grace before its SIGKILL
        grace = float(re.search(r"--grace (\d+)", text).group(1))  # type: ignore[union-attr]
        stop = float(re.search(r"TimeoutStopSec=(\d+)", text).group(1))  # type: ignore[union-attr]
        assert stop > grace


@pytest.mark.parametrize("verb", [["worker"], ["worker", "--async"], ["serve", "--port", "0"]])
def test_readiness_and_stopping_reach_systemd(verb: list[str], tmp_path: Path) -> None:
    """With ``$NOTIFY_SOCKET`` (a ``Type=notify`` unit), ``READY=1`` once the service works,
    ``STOPPING=1`` on SIGTERM."""
    import os
    import signal
    import socket

    tmp_path.chmod(0o700)
    address = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(30)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLAST_")}
    env.update(NOTIFY_SOCKET=address, OUTLAST_STORE=f"sqlite://{tmp_path}/s.db")
    proc = subprocess.Popen(
        [sys.executable, "-m", "outlast", *verb],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        assert listener.recv(256) == b"READY=1"
        proc.send_signal(signal.SIGTERM)
        assert listener.recv(256) == b"STOPPING=1"
        # uvicorn ends by the signal it got (systemd counts KillSignal as a clean stop)
        assert proc.wait(30) in ((0, -signal.SIGTERM) if verb[0] == "serve" else (0,))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        listener.close()
