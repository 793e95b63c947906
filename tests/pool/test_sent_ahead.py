"""A pool sends a busy job process its next job before the current one ends (while jobs are
short): the process starts it as soon as it has sent the outcome before, without a turn of
the pool's loop between them. What that must never cost, on every store:

- a job is not left waiting behind a long one while another process idles (taken back);
- a pool stopped with a job sent ahead gives it back unstarted (attempt uncounted), and a
  process that dies with one sent ahead leaves it to the next process; it runs later, once;
- a cancel meant for one job never lands on the job after it (the words name the job), and a
  job taken back is never started (:class:`outlast.boot.Words`, at the job process itself).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from outlast import boot, codec
from outlast.machine import Outcome
from outlast.model import Kind, Status
from outlast.run import pool as pool_module
from outlast.run.api import create_job
from outlast.run.pool import Pool
from outlast.run.slots import Slot
from outlast.store import Store, open_store
from tests.pool import jobs_for_tests
from tests.pool.conftest import read_lines
from tests.waiting import until

WARM_UP = 4  # short jobs first: the pool sends ahead only once it knows its jobs are short


@pytest.fixture(autouse=True)
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job counts as short (the pool's measure of its jobs is timing: not in a test),
    and a job may wait behind a long one (what the tests send ahead waits behind one)."""
    monkeypatch.setattr(pool_module, "PREFETCH_BELOW", 600.0)
    monkeypatch.setattr(pool_module, "AHEAD_BEHIND_MAX", 600.0)


def _warm_up(store: Store) -> None:
    for i in range(WARM_UP):
        create_job(store, "pt.noop", [i], {}, queue="mine", priority=9)


def _behind(pool: Pool, job_id: str) -> Slot | None:
    """The slot whose process has ``job_id`` sent ahead to it, if any."""
    return next((s for s in pool.slots if s.ahead is not None and s.ahead.id == job_id), None)


def _running_job(pool: Pool, job_id: str) -> Slot | None:
    """The slot whose process runs ``job_id``, if any."""
    return next((s for s in pool.slots if s.task is not None and s.task.id == job_id), None)


@contextlib.contextmanager
def _running(pool: Pool) -> Iterator[threading.Thread]:
    """The pool run on a thread of this process (its job processes are real), stopped at
    the end."""
    runner = threading.Thread(target=pool.run)
    runner.start()
    try:
        yield runner
    finally:
        pool.stop()
        runner.join(60)
    assert not runner.is_alive()


def _long_jobs(store: Store, tmp_path: Path, n: int) -> tuple[list[str], list[Path]]:
    """Short jobs, then ``n`` long cooperative jobs."""
    _warm_up(store)
    marks = [tmp_path / f"long{i}.txt" for i in range(n)]
    longs = [
        create_job(store, "pt.cooperative", [str(m)], {}, queue="mine", priority=5).id
        for m in marks
    ]
    return longs, marks


def _short_job_behind(store: Store, tmp_path: Path, marks: list[Path]) -> tuple[str, Path]:
    """Once every long job runs: a short job, sent ahead to a busy process (none idles)."""
    for m in marks:
        until(lambda m=m: read_lines(m) == ["started"] or None, 30, "a long job")
    short_marks = tmp_path / "short.txt"
    short = create_job(store, "pt.mark_start", [str(short_marks)], {}, queue="mine").id
    return short, short_marks


@pytest.mark.timeout(120)
def test_a_job_sent_ahead_is_taken_back_when_another_process_idles(
    tmp_path: Path, url: str
) -> None:
    """And nothing more is sent ahead to that process until it has read the job taken back
    (it does when its job ends; ``skip`` names one job, the last taken back: a second
    take-back would start the first there as well as where it went, as 19 of 1,000 kill
    cycles did)."""
    with open_store(url) as store:
        longs, marks = _long_jobs(store, tmp_path, 2)
        pool = Pool(store, concurrency=2, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            short, short_marks = _short_job_behind(store, tmp_path, marks)
            slot = until(lambda: _behind(pool, short), 10, "the short job to be sent ahead")
            assert slot.task is not None and slot.task.id in longs
            assert read_lines(short_marks) == []  # behind a job that runs for a minute
            # the other long job ends: its process idles, so the short job is taken back
            # from behind the one still running and runs there
            other = next(job for job in longs if job != slot.task.id)
            store.open(other).cancel()
            until(lambda: store.get(short).terminal or None, 30, "the short job")
            done = store.get(short)
            assert done.status == Status.SUCCEEDED and done.attempts == 1
            assert len(read_lines(short_marks)) == 1
            still = store.get(slot.task.id)
            assert still.status == Status.RUNNING
            assert read_lines(marks[longs.index(still.id)]) == ["started"]
            # the other process busy again (with a timeout: nothing is sent ahead behind
            # it), then a second short job: not sent ahead behind the unread take-back
            again = tmp_path / "again.txt"
            busy = create_job(
                store, "pt.cooperative", [str(again)], {}, queue="mine", timeout=60
            ).id
            until(lambda: read_lines(again) == ["started"] or None, 30, "another long job")
            second_marks = tmp_path / "second.txt"
            second = create_job(store, "pt.mark_start", [str(second_marks)], {}, queue="mine").id
            until(lambda: store.get(second).status == Status.RUNNING or None, 30, "its claim")
            time.sleep(0.2)  # (where the pool would send it ahead)
            sent_behind = _behind(pool, second) is slot
            store.open(busy).cancel()  # it runs where a process frees
            until(lambda: store.get(second).terminal or None, 30, "the second short job")
            # the process it was taken from goes on: its job, then the next one sent to it
            store.open(still.id).cancel()
            until(lambda: store.get(still.id).terminal or None, 30, "the long job to stop")
            after = create_job(store, "pt.noop", ["after"], {}, queue="mine").id
            until(lambda: store.get(after).terminal or None, 30, "a job after them")
            assert store.get(after).status == Status.SUCCEEDED
        for job, job_marks in ((short, short_marks), (second, second_marks)):
            state = store.get(job)
            assert (state.status, state.attempts) == (Status.SUCCEEDED, 1), state
            assert len(read_lines(job_marks)) == 1, f"{job} ran {read_lines(job_marks)}"
        assert not sent_behind, "sent ahead behind an unread take-back"


def _misnumbered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pool sends the job whose id is put in the list returned under a number 100
    past its count (the process answers for a job the pool does not count as running)."""
    real_send = Pool._send
    confused: list[str] = []

    def send(slot: Slot, task: Any, state: Any) -> None:
        if confused and task.id == confused[0]:
            slot.sent += 100
            try:
                real_send(slot, task, state)
            finally:
                slot.sent -= 100
            return
        real_send(slot, task, state)

    monkeypatch.setattr(Pool, "_send", staticmethod(send))
    return confused


@pytest.mark.timeout(120)
def test_an_outcome_is_written_only_to_the_job_it_came_from(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every answer of a job process names its job's number; one the pool does not count as
    running there is never written to the job that does (the second guard behind
    ``Slot.unanswered``): the process is stopped, that job fails as its process would have
    died, and the pool goes on. Made here by sending one job under a number the pool does not
    count (the bug it guards against ran a job the pool had taken back)."""
    marks = tmp_path / "confused.txt"
    confused = _misnumbered(monkeypatch)
    with open_store(url) as store:
        job = create_job(store, "pt.mark_start", [str(marks)], {}, queue="mine", attempts=1).id
        confused.append(job)
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            until(lambda: store.get(job).terminal or None, 30, "the job")
            after = create_job(store, "pt.noop", ["after"], {}, queue="mine").id
            until(lambda: store.get(after).terminal or None, 30, "a job after it")
            assert store.get(after).status == Status.SUCCEEDED
        state = store.get(job)
        assert len(read_lines(marks)) == 1  # it ran; its answer was not believed
        assert state.status == Status.FAILED, state
        assert state.error is not None and "answered for another job" in state.error.message
        assert any(f"while job #1 ({job}) ran there" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(120)
def test_a_job_sent_ahead_to_a_process_that_answered_for_another_is_never_started_twice(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process may have started the job sent ahead as it answered: that job fails with
    the one it ran (its next attempt, with a new number, runs elsewhere), rather than
    going back to the pool's hand, where the same attempt would start a second time."""
    confused = _misnumbered(monkeypatch)
    with open_store(url) as store:
        [long], marks = _long_jobs(store, tmp_path, 1)
        confused.append(long)
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            starts = tmp_path / "starts.txt"
            until(lambda: read_lines(marks[0]) == ["started"] or None, 30, "the long job")
            behind = create_job(store, "pt.timed", [str(starts), 0.3], {}, queue="mine").id
            until(lambda: _behind(pool, behind), 10, "the job to be sent ahead")
            store.open(long).cancel()  # its answer names the number it was sent under
            until(lambda: store.get(behind).terminal or None, 30, "the job sent ahead")
        assert store.get(long).status == Status.CANCELED  # failed, as canceled meanwhile
        state = store.get(behind)
        assert state.status == Status.SUCCEEDED, state
        attempts = [line.split()[2] for line in read_lines(starts) if line.startswith("S ")]
        assert len(attempts) == len(set(attempts)), f"an attempt started twice: {attempts}"
        assert attempts[-1] == str(state.attempts)
        # One start is right either way: ["2"] when it was still sent ahead as the process
        # was stopped (it failed with the long job, not started), ["1"] when the pool's own
        # look at the cancel took it back first (on a busy machine it can come before the
        # job's check_cancel); what must never be is one attempt started twice (above).


@pytest.mark.timeout(120)
def test_a_job_is_not_sent_ahead_behind_a_job_that_runs_long(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs claimed after it never overtake a job held behind a long one: with both
    processes on long jobs nothing is sent ahead to them, and the first process free takes
    the jobs in the claim's order."""
    monkeypatch.setattr(pool_module, "AHEAD_BEHIND_MAX", 0.05)  # the pool's own rule
    with open_store(url) as store:
        longs, marks = _long_jobs(store, tmp_path, 2)
        pool = Pool(store, concurrency=2, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            for m in marks:
                until(lambda m=m: read_lines(m) == ["started"] or None, 30, "a long job")
            time.sleep(0.1)  # both have run longer than AHEAD_BEHIND_MAX
            order = tmp_path / "order.txt"
            first = create_job(store, "pt.mark_start", [str(order)], {}, queue="mine", priority=3)
            later = [
                create_job(store, "pt.mark_start", [str(order)], {}, queue="mine").id
                for _ in range(6)
            ]
            ids = [first.id, *later]
            # claimed (the pool holds one per process in hand while all are busy)
            until(lambda: store.get(first.id).status == Status.RUNNING or None, 30, "a claim")
            # (a job sent ahead would go to the first process's; the second one frees)
            freed = pool.slots[1].task
            assert freed is not None and freed.id in longs
            store.open(freed.id).cancel()
            until(lambda: all(store.get(j).terminal for j in ids) or None, 30, "the short jobs")
            assert [line.split()[0] for line in read_lines(order)] == ids
            other = next(job for job in longs if job != freed.id)
            assert store.get(other).status == Status.RUNNING  # they did not wait for it
            store.open(other).cancel()


@pytest.mark.timeout(120)
def test_a_pool_stopped_gives_back_a_job_sent_ahead_unstarted(tmp_path: Path, url: str) -> None:
    with open_store(url) as store:
        [long], marks = _long_jobs(store, tmp_path, 1)
        pool = Pool(
            store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE], grace=30
        )
        with _running(pool) as runner:
            short, short_marks = _short_job_behind(store, tmp_path, marks)
            allowed = store.get(short).max_attempts
            until(lambda: _behind(pool, short), 10, "the short job to be sent ahead")
            pool.stop()  # the long job has its grace: it is canceled meanwhile
            until(lambda: pool.slots[0].ahead is None or None, 10, "the short job's take-back")
            store.open(long).cancel()
            runner.join(60)
        assert store.get(long).status == Status.CANCELED
        back = store.get(short)
        # given back: the attempt is not counted against it (attempts is the fencing token)
        assert back.status == Status.PENDING and back.max_attempts == allowed + 1, back
        assert read_lines(short_marks) == []
        # and it runs, once, under the next pool
        pool = Pool(
            store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE], burst=True
        )
        pool.run()
        assert store.get(short).status == Status.SUCCEEDED
        assert len(read_lines(short_marks)) == 1


@pytest.mark.timeout(120)
def test_a_job_sent_ahead_to_a_process_that_dies_runs_on_the_next(tmp_path: Path, url: str) -> None:
    with open_store(url) as store:
        [long], marks = _long_jobs(store, tmp_path, 1)
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            short, short_marks = _short_job_behind(store, tmp_path, marks)
            slot = until(partial(_behind, pool, short), 10, "the short job to be sent ahead")
            dead = slot.process.pid
            os.kill(dead, signal.SIGKILL)  # with its job, and the one sent ahead to it
            until(lambda: store.get(short).terminal or None, 30, "the short job")
            assert pool.slots[0].process.pid != dead
            done = store.get(short)
            assert done.status == Status.SUCCEEDED and done.attempts == 1, done
            assert len(read_lines(short_marks)) == 1
            # the long job's attempt failed with its process (pt.cooperative: one attempt)
            until(lambda: store.get(long).terminal or None, 30, "the long job's end")
            assert store.get(long).status == Status.FAILED
        # a pool that stopped holds nothing open (the journal of the outcome it wrote for
        # the dead process kept a connection on PostgreSQL: one was left for the collector)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            del pool, slot
            gc.collect()
        assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


@pytest.mark.timeout(120)
def test_the_outcome_a_process_sent_before_it_died_is_read_first(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process sends its job's outcome, starts the job sent ahead and dies, all while the
    pool is between two looks: one ``select`` may then report its death but not the outcome
    on its channel (made certain here: the channel is hidden from the pool until the death
    shows). The outcome is read first: the job that returned succeeds, and the job sent
    ahead, which started, fails with the process (its next attempt runs it), instead of the
    first failing as killed and the second going back in hand to start its attempt again."""
    hiding: list[Slot] = []
    real_select = select.select

    def hidden_until_death(r: Any, w: Any, x: Any, timeout: Any = None) -> Any:
        ready, writable, errors = real_select(r, w, x, timeout)
        if hiding:
            slot = hiding[0]
            if slot.process.sentinel in ready:
                hiding.clear()  # the death, without the outcome: the race, once
            ready = [fd for fd in ready if fd != slot.conn.fileno()]
        return ready, writable, errors

    monkeypatch.setattr(pool_module, "select", SimpleNamespace(select=hidden_until_death))
    with open_store(url) as store:
        _warm_up(store)
        release = tmp_path / "release"
        first = create_job(store, "pt.wait_for", [str(release)], {}, queue="mine").id
        starts = tmp_path / "starts.txt"
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool):
            until(partial(_running_job, pool, first), 30, "the first job")
            behind = create_job(store, "pt.die_once", [str(starts)], {}, queue="mine").id
            slot = until(partial(_behind, pool, behind), 10, "the job to be sent ahead")
            dead = slot.process.pid
            hiding.append(slot)
            release.touch()  # the first returns; the one behind starts and dies
            until(lambda: store.get(behind).terminal or None, 30, "the job sent ahead")
            assert not hiding, "the process died unseen"
            assert pool.slots[0].process.pid != dead
        done = store.get(first)
        assert done.status == Status.SUCCEEDED and done.result == "there", done
        state = store.get(behind)
        assert state.status == Status.SUCCEEDED and state.result == "lived", state
        attempts = [line.split()[2] for line in read_lines(starts)]
        assert attempts == ["1", "2"], f"its starts: {attempts}"


@pytest.mark.timeout(120)
def test_a_process_dead_while_idle_is_replaced_and_its_job_runs_on_the_next(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle process killed after the pool last looked (the OOM killer, a stray kill) is
    found dead as a job is sent to it: the pool replaces it and the job runs on the new
    one, under its first attempt, rather than the pool stopping on a broken pipe. Both ways
    the death shows are met: the send fails (a broken pipe), or it lands (the kernel may
    not have released the dead end yet) and the death is seen next, before the job's start
    was journaled: it never started, so its attempt is not counted."""
    real_assign = Pool._assign
    armed: list[bool] = []
    killed: list[int] = []

    def assign(self: Pool, slot: Slot, task: Any) -> None:
        if armed and not killed:
            pid = slot.process.pid
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
            until(lambda: _zombie(pid) or None, 10, "the idle process to die")
        real_assign(self, slot, task)

    monkeypatch.setattr(Pool, "_assign", assign)
    with open_store(url) as store:
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool) as runner:
            until(lambda: pool.slots or None, 30, "the pool's process")
            armed.append(True)
            marks = tmp_path / "marks.txt"
            job = create_job(store, "pt.mark_start", [str(marks)], {}, queue="mine").id
            until(lambda: store.get(job).terminal or None, 30, "the job")
            assert runner.is_alive()
            assert killed and pool.slots[0].process.pid != killed[0]
        state = store.get(job)
        assert len(read_lines(marks)) == 1
        assert state.status == Status.SUCCEEDED and state.attempts == 1, list(store.events(job))
        said = [r.getMessage() for r in caplog.records]
        assert any(
            f"job process {killed[0]} died while idle" in m
            or f"job process {killed[0]} died (signal 9) before starting job {job}" in m
            for m in said
        ), said


@pytest.mark.timeout(120)
def test_a_job_whose_process_died_after_journaling_its_outcome_is_not_run_again(
    tmp_path: Path, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job process killed by itself (not with its pool) after its function returned and
    the outcome was journaled, before the outcome reached the pool: the pool writes the
    journaled outcome instead of failing the attempt as died and running the job again."""
    with open_store(url) as store:
        pool = Pool(store, concurrency=1, queues=["mine"], imports=[jobs_for_tests.MODULE])
        with _running(pool) as runner:
            starts = tmp_path / "starts.txt"
            job = create_job(store, "pt.die_after_return", [str(starts)], {}, queue="mine").id
            until(lambda: store.get(job).terminal or None, 30, "the job")
            assert runner.is_alive()
            dead = read_lines(starts)[0].split()[3]
            until(lambda: pool.slots[0].process.pid != int(dead) or None, 10, "a new process")
        state = store.get(job)
        assert (tmp_path / "starts.txt.died").exists()
        assert len(read_lines(starts)) == 1, read_lines(starts)
        assert state.status == Status.SUCCEEDED and state.result == "returned"
        assert state.attempts == 1, list(store.events(job))
        said = [r.getMessage() for r in caplog.records]
        assert any(
            f"job process {dead} died (signal 9) after job {job} returned" in m for m in said
        ), said


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie, not reaped yet, or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# ---------------------------------------------------------------- at the job process


class _Process:
    """One real job process introduced as a pool's (this test's) with shared words."""

    def __init__(self, store: Store) -> None:
        booting = boot.spawn(store.url, [jobs_for_tests.MODULE])
        self.popen = booting.popen
        self.words, passed = boot.Words.create()
        try:
            boot.introduce(booting.sock, "test-pool", "token", store.liveness_fd(), passed)
        finally:
            os.close(passed)
        self.conn = boot.Channel(booting.sock.detach())
        assert self.conn.poll(60) and self.conn.recv() == "ready"
        self.sent = 0

    def send(self, store: Store, job_id: str) -> int:
        [task] = store.claim(None, 1, ["proc"], [Kind.FUNCTION])
        assert task.id == job_id and task.snapshot is not None
        self.sent += 1
        self.conn.send((task.id, task.attempt, codec.encode(task.snapshot), [], self.sent))
        return self.sent

    def cancel(self, number: int) -> None:
        self.words.cancel = number
        os.kill(self.popen.pid, signal.SIGUSR1)

    def outcome(self) -> tuple[int, object]:
        assert self.conn.poll(30), "no answer from the job process"
        return self.conn.recv()

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self.conn.close()
        self.words.close()


@pytest.mark.timeout(120)
def test_a_cancel_signal_is_for_the_job_it_names_and_a_job_taken_back_never_starts(
    tmp_path: Path, url: str
) -> None:
    with open_store(url) as store:
        marks = [tmp_path / f"{name}.txt" for name in ("first", "second", "skipped")]
        jobs = [create_job(store, "pt.cooperative", [str(m)], {}, queue="proc").id for m in marks]
        proc = _Process(store)
        try:
            first, second = proc.send(store, jobs[0]), proc.send(store, jobs[1])
            until(lambda: read_lines(marks[0]) == ["started"] or None, 30, "the first job")
            assert read_lines(marks[1]) == []  # sent ahead: it waits for the first
            proc.cancel(first)
            number, said = proc.outcome()
            assert number == first and isinstance(said, Outcome) and said.verb == "cancel"
            until(lambda: read_lines(marks[1]) == ["started"] or None, 30, "the second job")
            # a late signal meant for the first job (the pool had not read its outcome yet)
            proc.cancel(first)
            time.sleep(0.3)  # the job looks for a cancel every 20 ms
            assert read_lines(marks[1]) == ["started"] and not proc.conn.poll(0)
            proc.cancel(second)
            number, said = proc.outcome()
            assert number == second and isinstance(said, Outcome) and said.verb == "cancel"
            assert read_lines(marks[1]) == ["started", "stopped"]
            # a job taken back (its number set as skip before the process looks) is held
            proc.words.skip = proc.sent + 1
            skipped = proc.send(store, jobs[2])
            assert proc.outcome() == (skipped, "held")
            assert read_lines(marks[2]) == []
        finally:
            proc.close()
