"""A damaged store's surroundings (issue 12): a full disk (``outlast run`` says so in one
line, leaves no job stranded, and what the store held stays readable; a real, small tmpfs,
skipped where this process may not mount one), and a removed ``-wal`` file."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from outlast.store import open_store
from tests.cli.helpers import Outlast, error_lines


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(folder: Path) -> None:
    """Write until the disk is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)


@pytest.mark.parametrize("scheme", ["sqlite", "files"])
@pytest.mark.timeout(60)
def test_a_full_disk_fails_run_in_one_line_and_strands_nothing(
    cli: Outlast, small_disk: Path, scheme: str
) -> None:
    url = f"sqlite://{small_disk}/s.db" if scheme == "sqlite" else f"files://{small_disk}/jobs"
    with open_store(url) as store:
        kept = store.create(command=["true"], name="kept")
        kept.cancel()
    _fill(small_disk)
    for _ in range(3):
        result = cli("run", "--store", url, "--", "true", timeout=30)
        assert result.code != 0, result
        assert "Traceback" not in result.err + result.out, result
        lines = error_lines(result.err)
        assert len(lines) == 1 and lines[0].startswith("outlast: error: "), result
        assert "No space left" in lines[0] or "full" in lines[0], result
    os.unlink(small_disk / "filler")
    with open_store(url) as store:
        states = store.list(limit=None)
        assert kept.id in {s.id for s in states}
        stranded = [s for s in states if s.status == "pending"]
        assert not stranded, stranded


@pytest.mark.timeout(60)
def test_a_removed_wal_file_is_an_error_that_says_what_to_do(cli: Outlast) -> None:
    """Issue 12, item 9: an operator deletes ``-wal`` under running processes; the next
    process met "disk I/O error" and no hint."""
    store = cli.store
    for _ in range(5):
        store.create(command=["true"])
    os.unlink(f"{cli.url[len('sqlite://') :]}-wal")  # while this process keeps it open
    result = cli("ls", timeout=30)
    lines = error_lines(result.err)
    assert result.code == 5 and len(lines) == 1, result
    assert "-wal" in lines[0] and "stop every process" in lines[0], result
