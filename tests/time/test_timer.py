"""Jobs that wait for their time hold no process: a command or spawned job due more than
``machine.PARK_AFTER`` seconds ahead waits parked, and the store's one timer process starts
its worker a moment before its time (outlast.run.timer). On every store, with real
supervisors, a real timer, and no maintainer unless named. Before, each delayed command held
a sleeping supervisor (23 MB on SQLite, 40 MB and three connections on PostgreSQL)."""

from __future__ import annotations

import fcntl
import os
import signal
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psutil
import pytest

from outlast.machine import PARK_AFTER
from outlast.model import JobState, Status, utcnow
from outlast.run import maintain, spawn, timer
from outlast.run.api import run_command, spawn_job
from outlast.store import Store, _local
from tests.pool import jobs_for_tests  # noqa: F401 - registers pt.noop
from tests.waiting import alive, kill_tree, until

#: A delay the timer is for (past PARK_AFTER), and one the job's own worker waits out.
FAR = PARK_AFTER + 2.0
NEAR = 2.0
WORKERS = ("outlast.run.supervisor", "outlast.run.dedicated")


pytestmark = pytest.mark.usefixtures("own_state")


@pytest.fixture
def store(store: Store) -> Iterator[Store]:
    """The store, and after the test, its timer and whatever its jobs left running killed."""
    yield store
    kill_tree(_procs(store.url, ("outlast.run.timer", *WORKERS)))


def _procs(url: str, modules: tuple[str, ...]) -> list[psutil.Process]:
    """The live processes of the store at ``url`` running one of ``modules``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(proc.info["cmdline"] or [])
        ours = url in line.split() and any(f"-m {m} " in line for m in modules)
        if ours and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _timers(url: str) -> list[psutil.Process]:
    return _procs(url, ("outlast.run.timer",))


class _Most:
    """The most timers and workers of the store seen alive at once, sampled every 20 ms."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.timers = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.timers = max(self.timers, len(_timers(self.url)))
            self.workers = max(self.workers, len(_procs(self.url, WORKERS)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _marker(marks: Path) -> list[str]:
    return ["sh", "-c", f'echo "$OUTLAST_JOB_ID" >> {marks}']


def _done(store: Store, job_id: str) -> JobState | None:
    state = store.get(job_id)
    return state if state.terminal else None


@pytest.mark.timeout(90)
def test_delayed_jobs_wait_with_no_process_and_one_timer_starts_them_at_their_time(
    store: Store, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    counting = _Most(store.url)
    due = utcnow() + timedelta(seconds=FAR)
    far = [run_command(_marker(marks), at=due, store=store).id for _ in range(6)]
    spawned = spawn_job(store, "pt.noop", run_after=due).id
    near = run_command(_marker(marks), delay=NEAR, store=store).id
    canceled = far.pop()
    times: dict[str, datetime | None] = {j: store.get(j).run_after for j in [*far, spawned]}
    # the far ones hold no process: one timer, and the near one's supervisor
    until(lambda: len(_timers(store.url)) == 1, 10, "the store's timer")
    assert store.timer_running()
    held = [j for j in [*far, spawned, near] if store.worker_holds(j)]
    assert held in ([], [near]), held  # the near one's supervisor may not have its lock yet
    store.open(canceled).cancel()  # a parked job is canceled with nothing to stop
    assert store.get(canceled).status == Status.CANCELED
    states = {j: until(lambda j=j: _done(store, j), 40, f"job {j}") for j in [*far, spawned, near]}
    counting.stop()
    for job_id, state in states.items():
        assert state.status == Status.SUCCEEDED, state
        assert state.started_at is not None
        if job_id in times:  # never before its time
            at = times[job_id]
            assert at is not None and state.started_at >= at, (state, at)
    ran = marks.read_text().split()
    assert sorted(ran) == sorted([*far, near]) and canceled not in ran
    assert counting.timers == 1, counting.timers
    # 6 workers at their time, and the near one's, at most: never one per job from the start
    assert counting.workers <= len(far) + 2, counting.workers
    until(lambda: not _timers(store.url), 20, "the timer to exit with nothing left to wait for")
    assert not store.timer_running()


@pytest.mark.timeout(90)
def test_a_retry_with_a_long_backoff_lets_its_supervisor_go(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first retry of ``OUTLAST_RETRY_DELAY=2.1 x PARK_AFTER`` backs off more than
    PARK_AFTER: the supervisor unbinds the job and exits, and the timer starts the retry."""
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", str(PARK_AFTER * 2.1))
    marks = tmp_path / "marks.txt"
    job = run_command(["sh", "-c", f"echo x >> {marks}; exit 3"], attempts=2, store=store).id
    until(lambda: marks.exists(), 20, "the first attempt")
    waiting = until(
        lambda: (s := store.get(job)).status == Status.PENDING and s.worker is None and s,
        20,
        "the retry to wait unbound",
    )
    assert waiting.attempts == 1 and waiting.run_after is not None
    until(lambda: not _procs(store.url, WORKERS), 20, "the supervisor to exit")
    until(lambda: store.timer_running(), 10, "the timer")
    state = until(lambda: _done(store, job), 40, "the retry")
    assert state.status == Status.FAILED and state.attempts == 2, state
    assert marks.read_text().split() == ["x", "x"]


@pytest.mark.timeout(90)
def test_a_killed_timer_is_started_again_by_the_next_delayed_job_and_by_the_maintainer(
    store: Store, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    first = run_command(_marker(marks), delay=FAR + 1, store=store).id
    [old] = until(lambda: _timers(store.url), 10, "the store's timer")
    os.kill(old.pid, signal.SIGKILL)  # a reboot, as far as the jobs can tell
    until(lambda: not alive(old.pid), 10, "the timer to die")
    assert not store.timer_running()
    second = run_command(_marker(marks), delay=FAR + 1, store=store).id  # starts another
    [new] = until(lambda: _timers(store.url), 10, "a new timer")
    assert new.pid != old.pid
    os.kill(new.pid, signal.SIGKILL)
    until(lambda: not alive(new.pid), 10, "the second timer to die")
    # the maintainer, seeing jobs wait for their time and no timer, starts one
    maintainer = maintain.Maintainer(store)
    assert maintainer.sweep(thorough=True)
    until(lambda: store.timer_running(), 10, "the maintainer's timer")
    for job in (first, second):
        state = until(lambda j=job: _done(store, j), 40, f"job {job}")
        assert state.status == Status.SUCCEEDED, state
    assert sorted(marks.read_text().split()) == sorted([first, second])


@pytest.mark.timeout(60)
def test_a_worker_the_timer_starts_ahead_waits_however_far_and_others_park(
    store: Store, tmp_path: Path
) -> None:
    """The timer starts a crowd's first workers more than PARK_AFTER ahead; such a worker
    (``--wait``) waits for its time. Before, it parked the job again and exited, and the
    timer's cursor had passed it: 100 jobs of one time started up to 15 s late
    (bench/delayed_bench.py). A worker started without it, as far ahead, parks the job."""
    marks = tmp_path / "marks.txt"
    due = utcnow() + timedelta(seconds=FAR)
    waited = store.create(command=_marker(marks), run_after=due).id
    parked = store.create(command=_marker(marks), run_after=due + timedelta(seconds=60)).id
    spawn.spawn_supervisor(store, waited, wait=True)
    spawn.spawn_supervisor(store, parked)
    until(lambda: store.worker_holds(waited), 10, "the waiting worker to take its job")
    until(
        # (the command line as listed: the process may be a zombie by now, which psutil
        # refuses to read again; it failed so once)
        lambda: not [p for p in _procs(store.url, WORKERS) if parked in p.info["cmdline"]],
        10,
        "the other worker to park its job and exit",
    )
    assert store.worker_holds(waited) and not store.worker_holds(parked)
    state = until(lambda: _done(store, waited), 30, "the waited job")
    assert state.status == Status.SUCCEEDED and state.started_at is not None
    assert state.started_at >= due
    assert store.get(parked).status == Status.PENDING
    assert marks.read_text().split() == [waited]


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The timer's worker starts, counted instead of made (in process)."""
    started: list[str] = []

    def start_worker(store_: Store, state: JobState, wait: bool = False) -> bool:
        assert wait  # the timer's workers wait for their time
        started.append(state.id)
        return True

    monkeypatch.setattr(timer.reap, "start_worker", start_worker)
    return started


def test_a_timer_starts_at_most_a_batch_of_workers_a_pass_and_pages_through_the_rest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs past their time, a batch a pass; a later one tells how long to sleep; a
    full page read says to go on at once; then nothing left."""
    started = _counted(monkeypatch)
    now = utcnow()
    past = now - timedelta(seconds=1)
    soon = [
        store.create(command=["true"], run_after=past + timedelta(microseconds=i)).id
        for i in range(timer.BATCH + 3)
    ]
    later = store.create(command=["true"], run_after=now + timedelta(seconds=60)).id
    the_timer = timer.Timer(store)
    assert the_timer.step() == timer.BATCH_PAUSE
    assert started == soon[: timer.BATCH]
    wait = the_timer.step()
    assert started == soon and wait is not None
    assert 55 < wait < 60  # until a LEAD before the later one's time
    store.open(later).cancel()
    assert the_timer.step() is None  # nothing waits that it has not dealt with: it may exit
    assert the_timer.started == len(soon)
    paged = [store.create(command=["true"], run_after=now).id for _ in range(3)]
    monkeypatch.setattr(timer, "PAGE", 2)
    assert the_timer.step() == 0.0  # a full page: there may be more, read on at once
    assert the_timer.step() is None
    assert started == soon + sorted(paged)


def test_a_crowd_of_jobs_of_one_time_is_started_ahead_one_worker_at_a_time(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 jobs of the same time: the first worker starts early enough that, one every
    START_COST, the last still starts LEAD before the time (a hundred Python processes
    started at once took ~10 s on this machine: BENCHMARKS.md)."""
    started = _counted(monkeypatch)
    now = utcnow()
    due = now + timedelta(seconds=10)
    crowd = sorted(store.create(command=["true"], run_after=due).id for _ in range(30))
    first = 10 - timer.LEAD - 29 * timer.START_COST
    the_timer = timer.Timer(store)
    monkeypatch.setattr(timer, "utcnow", lambda: now)
    wait = the_timer.step()
    assert started == [] and wait == pytest.approx(first)
    later = now + timedelta(seconds=first + timer.START_COST * 1.5)
    monkeypatch.setattr(timer, "utcnow", lambda: later)
    wait = the_timer.step()
    assert started == crowd[:2] and wait == pytest.approx(timer.START_COST / 2)
    monkeypatch.setattr(timer, "utcnow", lambda: due)  # past every start: a batch at once
    assert the_timer.step() == timer.BATCH_PAUSE
    assert started == crowd[: 2 + timer.BATCH]


def test_a_job_parked_for_an_earlier_time_than_a_started_crowds_is_started_too(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crowd of 40 jobs of one time gets its workers from 10.8 s ahead. A job parked 9 s
    before the crowd's time, for 2 s before it (7 s ahead: parked), was behind the timer's
    cursor, which had passed the crowd's first jobs: the timer never started it (the
    maintainer's safety net did, 5 s late; with no maintainer, nobody until the next job
    was parked). The timer reads every job it has not dealt with."""
    started = _counted(monkeypatch)
    due = utcnow() + timedelta(seconds=60)
    crowd = sorted(store.create(command=["true"], run_after=due).id for _ in range(40))
    clock = [due - timedelta(seconds=9)]
    monkeypatch.setattr(timer, "utcnow", lambda: clock[0])
    the_timer = timer.Timer(store)
    while the_timer.step() == timer.BATCH_PAUSE:
        pass
    assert started and started == crowd[: len(started)] and len(started) < len(crowd)
    earlier = store.create(command=["true"], run_after=due - timedelta(seconds=2)).id
    while the_timer.step() == timer.BATCH_PAUSE:
        pass
    # next, before the rest of the crowd (its worker waits for its time with --wait)
    assert started[-1] == earlier
    clock[0] = due
    while the_timer.step() is not None:
        pass
    assert sorted(started) == sorted([*crowd, earlier]) and len(started) == 41  # each once
    assert len(the_timer.handled) == 41  # their workers (none here) have not taken them
    for job in [*crowd, earlier]:
        store.open(job).cancel()
    assert the_timer.step() is None and the_timer.handled == {}  # gone: forgotten


def test_a_job_the_timer_started_that_fails_into_a_long_backoff_is_read_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer passes over the jobs it has dealt with, by id and time: the same job back
    for a later time (its attempt failed into a backoff past PARK_AFTER, unbinding its
    worker) is waiting again, and gets a worker again before that time."""
    started = _counted(monkeypatch)
    monkeypatch.setenv("OUTLAST_RETRY_DELAY", "60")
    job = store.create(command=["true"], run_after=utcnow(), max_attempts=2).id
    the_timer = timer.Timer(store)
    assert the_timer.step() is None and started == [job]
    task = store.open(job)  # what its worker does with it
    task.hold_worker_lock()
    assert task.start()
    again = task.fail("boom", retry=True)
    task.release_worker_lock()
    assert again.status == Status.PENDING and again.run_after is not None
    wait = the_timer.step()
    # until a LEAD before its new time (the backoff has jitter: 30-60 s)
    expected = (again.run_after - utcnow()).total_seconds() - timer.LEAD
    assert wait is not None and abs(wait - expected) < 1.0, (wait, expected)
    assert [s.id for s in the_timer.waiting()[0]] == [job]


def test_the_timer_lock_is_one_process_per_store(store: Store) -> None:
    lock, other = store.timer_lock(), store.timer_lock()
    assert not store.timer_running()
    assert lock.try_acquire()
    try:
        assert store.timer_running()
        assert not other.try_acquire()
        assert timer.serve(store) == 0  # another is the timer: returns at once
    finally:
        lock.release()
        other.release()
    assert not store.timer_running()
    assert other.try_acquire()
    other.release()
    assert timer.serve(store) == 0  # nothing waits: it exits at once


def test_a_timer_rides_out_a_probe_of_its_lock(store: Store) -> None:
    """``timer_running`` probes a local store's timer flock with a shared lock; a timer
    taking the lock at that moment gave up, exited, and a second one was started. Here
    the probe's lock is held for 50 ms: the timer waits it out and takes the lock."""
    parts = getattr(store, "parts", None)
    if parts is None:
        pytest.skip("PostgreSQL's probe reads pg_locks: it takes nothing")
    path = parts.liveness.path(_local.TIMER)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        threading.Timer(0.05, fcntl.flock, (fd, fcntl.LOCK_UN)).start()
        lock = store.timer_lock()
        assert timer._take(lock)
        lock.release()
    finally:
        os.close(fd)
