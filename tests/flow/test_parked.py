"""Parked jobs: a command (or spawned job) of a full concurrency key holds no process while it
waits. Its worker lets it go and exits; whoever frees a slot of the key starts the worker of
the next one in claim order. On every store, with real supervisors and no maintainer, and
the store's maintainer as the safety net (a killed worker, a key's slots raised elsewhere)
that starts a bounded number of workers per pass."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from outlast.model import JobState, Status
from outlast.run import maintain, reap
from outlast.run.api import run_command, set_slots, spawn_job
from outlast.store import Store
from tests.pool import jobs_for_tests  # noqa: F401 - registers pt.limited
from tests.pool.conftest import Worker, read_lines
from tests.waiting import kill_tree, until

pytestmark = pytest.mark.usefixtures("own_state")


@pytest.fixture
def store(store: Store) -> Iterator[Store]:
    """The store, and after the test, whatever its jobs left running killed."""
    yield store
    kill_tree([*_workers(store.url), *_workers(store.url, module="outlast.run.dedicated")])


def _workers(
    url: str, job_id: str | None = None, module: str = "outlast.run.supervisor"
) -> list[psutil.Process]:
    """The live supervisors (or other workers) of the store at ``url`` (of ``job_id``'s, if
    given)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(proc.info["cmdline"] or [])
        if module not in line or url not in line:
            continue
        if job_id is not None and job_id not in line:
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


class _Most:
    """Counts the store's live supervisors (or other workers) every 20 ms, keeping the most
    seen at once."""

    def __init__(self, mark: str, module: str = "outlast.run.supervisor") -> None:
        self.mark, self.module, self.most = mark, module, 0
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            found = _workers(self.mark, module=self.module)
            self.most = max(self.most, len(found))
            self.pids.update(proc.pid for proc in found)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def _script(marks: Path, gate: Path, seconds: float = 0.1) -> list[str]:
    """A command that waits for ``gate`` to exist, then marks its start and its end."""
    return [
        "sh",
        "-c",
        f'while [ ! -e {gate} ]; do sleep 0.02; done; echo "+ $OUTLAST_JOB_ID" >> {marks};'
        f' sleep {seconds}; echo "- $OUTLAST_JOB_ID" >> {marks}',
    ]


def _starts(marks: Path) -> list[str]:
    return [line.split()[1] for line in read_lines(marks) if line.startswith("+")]


def _most_at_once(marks: Path) -> int:
    running: set[str] = set()
    most = 0
    for line in read_lines(marks):
        sign, job = line.split()
        (running.add if sign == "+" else running.discard)(job)
        most = max(most, len(running))
    return most


@pytest.mark.timeout(120)
def test_a_group_of_one_slot_holds_two_supervisors_at_most_and_runs_in_claim_order(
    store: Store, tmp_path: Path
) -> None:
    marks, gate = tmp_path / "marks.txt", tmp_path / "go"
    set_slots("g", 1, store)
    counting = _Most(store.url)
    jobs = [run_command(_script(marks, gate), group="g", store=store).id for _ in range(8)]
    # the first runs (waiting at its gate); the others wait parked, with no process
    until(lambda: store.get(jobs[0]).status == Status.RUNNING, 30, "the first to start")
    urgent = run_command(_script(marks, gate), group="g", store=store, priority=5).id
    until(lambda: len(_workers(store.url)) == 1, 30, "only the running one's supervisor")
    assert all(store.get(j).status == Status.PENDING for j in [*jobs[1:], urgent])
    shown = subprocess.run(
        [sys.executable, "-m", "outlast", "group", "ls", "--json", "--store", store.url],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout)["groups"] == [
        {"name": "g", "slots": 1, "running": 1, "waiting": 8}
    ]
    gate.touch()
    for job in [*jobs, urgent]:
        assert reap.wait_for(store, job, timeout=60).status == Status.SUCCEEDED, job
    most = counting.stop()
    assert _most_at_once(marks) == 1
    assert _starts(marks) == [jobs[0], urgent, *jobs[1:]]  # claim order: priority, then age
    assert most <= 2, f"{most} supervisors at once"  # one ending while it starts the next
    # the first job's supervisor ran the others in turn (a poll of a parked job may start one)
    assert len(counting.pids) <= 2, counting.pids
    print(f"at most {most} supervisors alive, {len(counting.pids)} in all, for 9 commands")


@pytest.mark.timeout(120)
def test_raising_a_groups_slots_starts_its_parked_jobs_at_once(
    store: Store, tmp_path: Path
) -> None:
    marks, gate = tmp_path / "marks.txt", tmp_path / "go"
    jobs = [run_command(_script(marks, gate), group="g", store=store).id for _ in range(4)]
    until(lambda: store.get(jobs[0]).status == Status.RUNNING, 30, "the first to start")
    set_slots("g", 3, store)  # what `outlast group set` and PUT /groups/{name} do
    until(
        lambda: (
            [store.get(j).status for j in jobs]
            == [Status.RUNNING, Status.RUNNING, Status.RUNNING, Status.PENDING]
        ),
        30,
        "two more of the group to start",
    )
    gate.touch()
    for job in jobs:
        assert reap.wait_for(store, job, timeout=60).status == Status.SUCCEEDED
    assert _most_at_once(marks) <= 3


def _group_behind_a_killed_supervisor(store: Store, tmp_path: Path) -> tuple[str, str]:
    """A group of one slot: its first job running ``sleep 60``, whose supervisor is then
    SIGKILLed (the job still says running), and a second parked behind it."""
    marks, gate = tmp_path / "marks.txt", tmp_path / "go"
    first = run_command(["sleep", "60"], group="g", store=store).id
    second = run_command(_script(marks, gate), group="g", store=store).id
    until(lambda: store.get(first).status == Status.RUNNING, 30, "the first to start")
    [supervisor] = until(lambda: _workers(store.url, first), 30, "its supervisor")
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait(10)
    gate.touch()
    return first, second


@pytest.mark.timeout(120)
def test_the_maintainer_goes_on_with_a_group_whose_running_supervisor_was_killed(
    store: Store, tmp_path: Path
) -> None:
    first, second = _group_behind_a_killed_supervisor(store, tmp_path)
    maintainer = maintain.Maintainer(store)
    until(lambda: maintainer.sweep(thorough=True) and store.get(second).status != "pending", 30)
    assert store.get(first).status == Status.FAILED  # one attempt, its supervisor killed
    assert reap.wait_for(store, second, timeout=60).status == Status.SUCCEEDED


@pytest.mark.timeout(120)
def test_waiting_for_a_parked_job_goes_on_past_a_killed_supervisor_with_no_maintainer(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no pool, server or scheduler runs: whoever waits for the parked job reconciles
    its group's dead job, whose slot then goes to the parked one (once the parked job has
    waited STRANDED_AFTER: shortened here, as the waiter is this process)."""
    monkeypatch.setattr(reap, "STRANDED_AFTER", 0.5)
    first, second = _group_behind_a_killed_supervisor(store, tmp_path)
    assert reap.wait_for(store, second, timeout=60).status == Status.SUCCEEDED
    assert store.get(first).status == Status.FAILED


@pytest.mark.timeout(120)
def test_the_maintainer_starts_a_bounded_number_of_workers_per_pass(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs nobody took (a store restored from a backup, a reboot): each pass starts at most
    RESTART_BATCH workers, loose ones and parked ones of a key with room alike."""
    monkeypatch.setattr(reap, "STRANDED_AFTER", 0.0)
    monkeypatch.setattr(maintain, "RESTART_BATCH", 3)
    loose = [store.create(command=["true"]).id for _ in range(5)]
    store.set_slots("k", 2)
    keyed = [store.create(command=["true"], limit_key="k").id for _ in range(4)]
    maintainer = maintain.Maintainer(store)
    assert maintainer.sweep(thorough=True)
    assert maintainer.strays == 3  # three of the loose ones
    until(lambda: sum(store.get(j).status == Status.SUCCEEDED for j in loose) == 3, 30)
    assert all(store.get(j).status == Status.PENDING for j in keyed)
    assert maintainer.sweep(thorough=True)
    assert maintainer.strays == 6  # the last two loose ones, and one of the key's
    for job in loose:
        assert reap.wait_for(store, job, timeout=60).status == Status.SUCCEEDED
    # the key's other jobs follow by hand-off from the one that ran, and by the next pass
    maintainer.sweep(thorough=True)
    for job in keyed:
        assert reap.wait_for(store, job, timeout=60).status == Status.SUCCEEDED


@pytest.mark.timeout(120)
def test_spawned_jobs_of_a_full_key_wait_parked_and_run_one_at_a_time(
    store: Store, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    counting = _Most(store.url, "outlast.run.dedicated")
    jobs = [
        spawn_job(store, "pt.limited", [str(marks), "a"], {"sleep": 0.3}, limit=1).id
        for _ in range(5)
    ]
    for job in jobs:
        assert reap.wait_for(store, job, timeout=60).status == Status.SUCCEEDED, job
    most = counting.stop()
    assert _most_at_once(marks) == 1
    assert sorted(_starts(marks)) == sorted(jobs)
    assert most <= 3, f"{most} dedicated workers at once"  # not one per job


@contextlib.contextmanager
def _command_behind_a_pools_job(
    store: Store, tmp_path: Path, mode: str, gate: Path, *pool_args: str
) -> Iterator[tuple[Worker, str, str]]:
    """A key of one slot held by a function job that a pool (``mode``: processes or async)
    runs until ``gate`` exists (the async one until canceled), and a command of the key
    parked behind it, which marks its start in ``marks.txt`` once ``gate`` exists: yields
    the pool, the function job and the command. The test holds the store's maintenance
    lock meanwhile and reads with :meth:`Store.get` (which starts nothing), so neither a
    maintainer nor a reader can start the command: only the pool's hand-off."""
    from outlast.run import registry
    from outlast.run.api import create_job
    from tests.jobs import pyjobs
    from tests.pool.conftest import Harness

    held = store.maintenance_lock()
    assert held.try_acquire()
    (tmp_path / "h").mkdir()
    harness = Harness(tmp_path / "h", store.url)
    try:
        set_slots("g", 1, store)
        if mode == "async":
            spec, args = registry.lookup("py.anap"), [60.0, None]
        else:
            spec, args = registry.lookup("pt.wait_for"), [str(gate)]
        function = create_job(store, spec, args, limit_key="g").id
        modes = ["--async"] if mode == "async" else []
        pool = harness.worker("--import", pyjobs.MODULE, *modes, *pool_args)
        until(lambda: store.get(function).status == Status.RUNNING, 30, "the pool's job")
        command = run_command(_script(tmp_path / "marks.txt", gate, 0.0), group="g", store=store)
        assert command.state().status == Status.PENDING
        assert _workers(store.url, command.id) == []  # parked: no process of its own
        yield pool, function, command.id
    finally:
        harness.close()
        held.release()


def _ended(store: Store, job_id: str) -> JobState:
    return until(lambda: (s := store.get(job_id)).terminal and s, 30, f"job {job_id} to end")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["processes", "async"])
def test_a_pools_job_of_a_key_hands_its_slot_to_the_keys_parked_command(
    store: Store, tmp_path: Path, mode: str
) -> None:
    """A key shared by a function job, run by a pool, and a command (``outlast run --group``
    beside ``limit_key=``): the command waits parked, with no process, while the pool's job
    holds the key's one slot, and the pool starts its supervisor once that job ended."""
    gate = tmp_path / "go"
    with _command_behind_a_pools_job(store, tmp_path, mode, gate) as (_, function, command):
        if mode == "async":
            store.open(function).cancel()
        gate.touch()
        done = _ended(store, command)
        assert done.status == Status.SUCCEEDED, done
        assert _starts(tmp_path / "marks.txt") == [command]
        assert store.get(function).finished_at <= done.started_at  # one slot: one at a time


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["processes", "async"])
def test_a_pool_that_stops_hands_the_slots_of_the_jobs_it_gives_back(
    store: Store, tmp_path: Path, mode: str
) -> None:
    """SIGTERM with a keyed job running past the pool's grace: the job is given back
    (pending again, for another pool) and its slot goes to the key's parked command, which
    the stopping pool starts."""
    gate = tmp_path / "go"
    with _command_behind_a_pools_job(store, tmp_path, mode, gate, "--grace", "0.2") as (
        pool,
        function,
        command,
    ):
        pool.popen.send_signal(signal.SIGTERM)
        assert pool.wait(60) == 0, pool.stderr()
        assert store.get(function).status == Status.PENDING  # given back
        until(lambda: _workers(store.url, command), 30, "the command's supervisor")
        gate.touch()
        done = _ended(store, command)
        assert done.status == Status.SUCCEEDED, done


def test_a_pools_hand_offs_are_looked_at_together_at_most_every_so_often(store: Store) -> None:
    """The keys of ended jobs are gathered: one look at the parked keys per period, however
    many batches of outcomes end meanwhile; jobs without a key cost no look at all, and a
    pool that stops looks at once."""
    from outlast.model import Kind
    from outlast.store import Task

    looks: list[int] = []
    real = store.parked_keys

    def counted() -> list[str]:
        looks.append(1)
        return real()

    store.parked_keys = counted  # type: ignore[method-assign]
    keyed = [store.create(kind=Kind.FUNCTION, name="f", limit_key=f"k{i}") for i in range(3)]
    plain = store.create(kind=Kind.FUNCTION, name="f")

    def ended(task: Task) -> Task:
        return Task(store, task.id, snapshot=store.get(task.id))

    offs = reap.HandOffs(store, every=3600.0)
    offs.ended([ended(plain)])
    assert offs.due_at() is None and offs.run() == 0 and looks == []
    offs.ended([ended(keyed[0])])
    assert offs.run() == 0 and len(looks) == 1  # the first look is at once
    offs.ended([ended(keyed[1])])
    offs.ended([ended(keyed[2])])
    due = offs.due_at()
    assert due is not None and due > time.monotonic() + 3000
    assert offs.run() == 0 and len(looks) == 1  # not yet
    assert offs.run(force=True) == 0 and len(looks) == 2  # both keys in one look
    assert offs.due_at() is None
