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
