"""A pipeline whose job process dies at the end of an attempt (a crash, the OOM killer)
still ends as its stages said, on every store: a cancel stays a cancel, and a stage that
failed for good fails the job, whatever attempt finishes it. (A pool whose job process
dies counts the death as a failed attempt; the retry resumes from the stages checkpointed.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

from outlast.model import JobState, Status
from outlast.run import reap
from outlast.run.api import create_job
from outlast.run.pool import Pool
from outlast.store import open_store
from tests.pool import jobs_for_tests
from tests.pool.conftest import read_lines
from tests.pool.test_sent_ahead import _running
from tests.waiting import until


class Ran(NamedTuple):
    state: JobState
    lines: list[str]  # what the stages wrote: "W|S|C attempt pid"
    said: tuple[Any, ...]  # for a failed assertion: the state's outcome and the events


def _run(url: str, tmp_path: Path, name: str, cancel: bool = False) -> Ran:
    """Run pipeline ``name`` (its payload: the path its stages write lines to) in a pool on
    this thread to its end; with ``cancel``, canceled once a stage has written its line. The
    pool is left only once the process that died has been replaced."""
    lines = tmp_path / "lines.txt"
    with open_store(url) as store:
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            job = create_job(store, name, payload={"path": str(lines)}, queue="mine").id
            if cancel:
                until(lambda: lines.exists() or None, 30, "the first stage")
                store.open(job).cancel()
            until(lambda: store.get(job).terminal or None, 60, "the job")
            [dead] = read_lines(tmp_path / "lines.txt.died")  # its process died once
            until(lambda: pool.slots[0].process.pid != int(dead) or None, 10, "a new process")
        state = store.get(job)
        events = [(e.status, e.step, e.message) for e in store.events(job)]
    said = (state.status, state.attempts, state.error, state.result, events)
    return Ran(state, read_lines(lines), said)


@pytest.mark.timeout(120)
def test_a_pipeline_that_read_its_cancel_and_died_after_journaling_it_ends_canceled(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline reads a cancel from the store itself (its poll stage looks every 0.1 s)
    and may do so before its pool's next look: it runs its cleanup, its outcome (canceled)
    is journaled, and its process dies before sending it. The pool did not ask for that
    cancel, yet the store did: the journaled cancel is written, not counted as a death (the
    retry found every stage checkpointed and ended the job succeeded)."""
    monkeypatch.setattr(Pool, "_check_running", lambda self: None)  # the pool never looks
    ran = _run(url, tmp_path, "pt.cancel_then_die", cancel=True)
    assert [line for line in ran.lines if line.startswith("C ")] == [ran.lines[-1]]
    assert ran.lines[-1].startswith("C 1 "), ran.lines
    assert ran.state.status == Status.CANCELED and ran.state.attempts == 1, ran.said


@pytest.mark.timeout(120)
def test_a_pipeline_whose_stage_failed_for_good_ends_failed_after_its_process_died(
    tmp_path: Path, url: str
) -> None:
    """A stage fails for good (``Fail``: checkpointed failed), and the cleanup's process
    dies: the retry runs the cleanup again and the job ends failed, with the stage's error
    (the retry found every stage checkpointed, raised nothing, and ended it succeeded)."""
    ran = _run(url, tmp_path, "pt.fail_then_die")
    assert [line.split()[:2] for line in ran.lines] == [["C", "1"], ["C", "2"]], ran.said
    state = ran.state
    assert state.status == Status.FAILED and state.attempts == 2, ran.said
    assert state.error is not None and "the export was refused" in state.error.message
    assert state.pipeline is not None
    assert state.pipeline.stages["publish"].status == "skipped", ran.said


@pytest.mark.timeout(120)
def test_a_pipeline_whose_cleanup_died_after_a_cancel_ends_canceled(
    tmp_path: Path, url: str
) -> None:
    """Canceled while it runs, the pool tells it, its cleanup starts, and its process dies:
    the job ends canceled, the cleanup run again to its end, and the job is never retried
    as a failure (it was, and the retry ended it succeeded)."""
    ran = _run(url, tmp_path, "pt.cancel_cleanup_dies", cancel=True)
    assert ran.state.status == Status.CANCELED, ran.said
    kinds = [line.split()[0] for line in ran.lines]
    assert kinds == ["W", "C", "C"], (ran.lines, ran.said)  # the work never again


@pytest.mark.timeout(120)
@pytest.mark.parametrize("waits", ["paused", "retry"])
def test_a_pipeline_canceled_between_attempts_runs_its_cleanup(
    tmp_path: Path, url: str, waits: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first attempt began an export, then the job waits: paused for an answer, or
    pending for its retry (a 60 s backoff). Canceled then, it runs its cleanup in one more
    run, and ends canceled (it was canceled at once, the export never cleaned up)."""
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "60")
    lines = tmp_path / "lines.txt"
    payload = {"path": str(lines), "flaky": waits == "retry"}
    with open_store(url) as store:
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            job = create_job(store, "pt.export_then_wait", payload=payload, queue="mine").id
            expect = Status.PAUSED if waits == "paused" else Status.PENDING
            until(lambda: (store.get(job).status == expect and lines.exists()) or None, 30, waits)
            _, after = reap.cancel(store, job)
            assert after.status == Status.PENDING and after.cancel_requested, after
            until(lambda: store.get(job).terminal or None, 30, "the cleanup")
        state = store.get(job)
    said = (state.status, state.attempts, state.error, read_lines(lines))
    assert state.status == Status.CANCELED, said
    assert [line.split()[:2] for line in read_lines(lines)] == [["B", "1"], ["C", "2"]], said
    assert state.pipeline is not None and state.pipeline.stages["cleanup"].status == "succeeded"
