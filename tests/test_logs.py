"""The job log's cap: however the output arrives, the log reads as one unbroken tail of it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from outlast.store.joblog import LogWriter, read_log

OUTPUT = b"".join(b"line %d\n" % i for i in range(1, 401))


@pytest.mark.parametrize("seed", range(20))
def test_any_chunking_keeps_an_unbroken_tail_within_the_cap(tmp_path: Path, seed: int) -> None:
    chunks = random.Random(seed)
    path, cap = tmp_path / "job.log", 1024
    writer, at = LogWriter(path, cap=cap), 0
    while at < len(OUTPUT):
        size = chunks.choice([1, 7, 50, 300, 1500, 3000])  # some larger than the cap
        writer.write(OUTPUT[at : at + size])
        at += size
    writer.close()
    shown = read_log(path)
    assert shown.endswith(b"line 400\n")
    assert OUTPUT.endswith(shown), "the log is not the latest output, in order"
    assert all(p.stat().st_size <= cap for p in tmp_path.glob("job.log*"))


def test_a_chunk_over_twice_the_cap_keeps_its_last_two_caps(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    writer = LogWriter(path, cap=1024)
    writer.write(b"old\n")
    writer.write(OUTPUT)
    writer.close()
    assert read_log(path) == OUTPUT[-2048:]
