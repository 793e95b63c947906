"""A supervisor killed with SIGKILL leaves nothing running unobserved, and a reused PID is safe."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.helpers import STORES, Outlast, job_processes
from tests.waiting import alive, until


def _kill_supervisor(cli: Outlast, doc: dict[str, Any]) -> int:
    """SIGKILL the job's supervisor (``worker`` is ``host:pid``) and wait until it is dead
    and its locks free (the job looks abandoned): the kernel lets go of a dead process's
    flocks a moment after it exits (the last close of a file of an exiting task is deferred,
    up to a tick), so a look at once could still find the job held (seen once in ~15 runs)."""
    host, _, pid = doc["worker"].rpartition(":")
    assert host == os.uname().nodename
    supervisor = int(pid)
    assert supervisor != doc["pid"]
    assert alive(supervisor)
    os.kill(supervisor, signal.SIGKILL)
    until(lambda: not alive(supervisor), 5, "the supervisor to die")
    store = cli.store
    until(lambda: store.abandoned(store.get(doc["id"])), 5, "its locks to be free")
    return supervisor


def _reconciled_by(cli: Outlast, verb: str, job_id: str) -> dict[str, Any]:
    """Let ``verb`` be the first call that sees the dead supervisor; the job afterwards."""
    if verb == "status":
        return cli.status(job_id)
    if verb == "ls":
        listed = {d["id"]: d for d in cli("ls", "--json").json()["jobs"]}
        return listed[job_id]
    assert verb == "wait"
    result = cli.wait(job_id, "--json")
    assert result.code == 1, result
    doc = result.parse()
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("verb", ["status", "ls", "wait"])
@pytest.mark.timeout(30)
def test_a_killed_supervisor_is_reconciled_to_abandoned(cli: Outlast, verb: str) -> None:
    job_id = cli.start("sh", "-c", "echo up; exec sleep 300", opts=["--grace", "10"])
    doc = cli.running_with_pid(job_id)
    command = doc["pid"]
    assert alive(command)
    _kill_supervisor(cli, doc)

    after = _reconciled_by(cli, verb, job_id)
    assert after["status"] == "failed", after
    assert after["error"]["code"] == "abandoned", after["error"]
    assert after["finished_at"] is not None
    until(lambda: not alive(command), 5, "the orphaned command to be killed")
    assert not job_processes(job_id)
    assert cli.status(job_id)["status"] == "failed"
    assert cli.wait(job_id).code == 1


@STORES
@pytest.mark.timeout(30)
def test_a_killed_supervisor_kills_the_whole_leftover_group(cli: Outlast) -> None:
    tree = "trap '' TERM; (trap '' TERM; exec sleep 300) & sleep 300 & wait"
    job_id = cli.start("sh", "-c", tree)
    doc = cli.running_with_pid(job_id)
    members = until(lambda: len(job_processes(job_id)) >= 3 and job_processes(job_id), 10)
    _kill_supervisor(cli, doc)

    after = cli.status(job_id)
    assert (after["error"] or {}).get("code") == "abandoned", {
        k: after[k] for k in ("status", "error", "worker", "pid", "finished_at", "updated_at")
    }
    until(lambda: not any(alive(p.pid) for p in members), 5, "the leftover group to die")


@pytest.mark.timeout(40)
def test_a_killed_supervisor_with_attempts_left_runs_the_job_again(
    cli: Outlast, tmp_path: Path
) -> None:
    marker = tmp_path / "first-done"
    script = f"if [ -e {marker} ]; then echo second; exit 0; fi; touch {marker}; echo first; "
    job_id = cli.start("sh", "-c", script + "exec sleep 300", opts=["--attempts", "2"])
    doc = cli.running_with_pid(job_id)
    first = doc["pid"]
    assert doc["attempts"] == 1
    # its output read into the log before the supervisor dies (else it dies in the pipe)
    until(lambda: "first" in cli("logs", job_id).ok().out, 10, "the first attempt's output")
    supervisor = _kill_supervisor(cli, doc)

    after = cli.status(job_id)
    assert after["status"] in ("pending", "running"), after
    assert after["error"] is None or after["error"]["code"] == "abandoned"
    until(lambda: not alive(first), 5, "the first attempt's command to be killed")

    result = cli.wait(job_id)
    assert result.code == 0, result
    final = cli.status(job_id)
    assert final["status"] == "succeeded"
    assert final["attempts"] == 2
    assert final["worker"] != doc["worker"], "a new supervisor ran the second attempt"
    assert final["worker"].rpartition(":")[2] != str(supervisor)
    log = cli("logs", job_id).ok().out
    assert "first" in log and "second" in log


#: Run in a child process that then exits: it records a running job whose worker is dead and
#: whose pid is the given (unrelated) process, with the given start time (or none).
_DEAD_WORKER = """
import sys
from datetime import datetime
from outlast.store import open_store
url, pid, started = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open_store(url) as store:
    task = store.create(command=["sleep", "300"])
    assert task.start()
    task.set_pid(pid, started_at=datetime.fromisoformat(started) if started else None)
    print(task.id)
"""


@STORES
@pytest.mark.parametrize(
    "recorded_start",
    ["2001-01-01T00:00:00+00:00", ""],
    ids=["wrong-start-time", "no-start-time"],
)
@pytest.mark.timeout(30)
def test_a_reused_pid_is_never_signaled(cli: Outlast, recorded_start: str) -> None:
    # an unrelated process that leads its own group: a blind killpg(pid) would hit it
    unrelated = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        job_id = (
            cli.python(_DEAD_WORKER, cli.url, str(unrelated.pid), recorded_start).ok().out.strip()
        )
        state = cli.store.get(job_id)
        assert (state.status, state.pid) == ("running", unrelated.pid)
        assert cli.store.abandoned(state), "the worker that started the job has exited"

        doc = cli.status(job_id)
        assert doc["status"] == "failed", doc
        assert doc["error"]["code"] == "abandoned"
        assert unrelated.poll() is None, "outlast killed an unrelated process"
        assert alive(unrelated.pid)
        os.killpg(unrelated.pid, 0)  # its group is still there too
    finally:
        unrelated.kill()
        unrelated.wait(timeout=10)


@pytest.mark.timeout(40)
def test_the_retry_after_a_killed_supervisor_runs_in_the_same_environment_and_folder(
    cli: Outlast, tmp_path: Path
) -> None:
    """The second attempt, started by whoever reconciled the job, must not run the command in
    that caller's environment and working folder instead of the ones given to ``outlast run``."""
    seen = tmp_path / "seen"
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = (
        f'echo "var=$JOB_VAR cwd=$(pwd)" >> {seen}; '
        f"if [ $(wc -l < {seen}) -ge 2 ]; then exit 0; fi; exec sleep 300"
    )
    job_id = cli.start(
        "sh", "-c", script, opts=["--attempts", "2"], env={"JOB_VAR": "from-run"}, cwd=workdir
    )
    _kill_supervisor(cli, cli.running_with_pid(job_id))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # reconciled from another folder, by a caller without JOB_VAR
    assert cli("status", job_id, cwd=elsewhere).ok()
    result = cli.wait(job_id, timeout=20)
    attempts = seen.read_text().splitlines()
    assert attempts == [f"var=from-run cwd={workdir}"] * 2, attempts
    assert result.code == 0, result


@pytest.mark.timeout(30)
def test_a_live_supervisor_waiting_to_retry_is_not_taken_for_dead(
    cli: Outlast, tmp_path: Path
) -> None:
    marker = tmp_path / "tried"
    script = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 1"
    job_id = cli.start(
        "sh", "-c", script, opts=["--attempts", "2"], env={"OUTLAST_RETRY_DELAY": "4.8"}
    )
    for event in cli.store.watch(job_id, timeout=20):  # until the first attempt has failed
        if event.status == "failed":
            assert isinstance(event.message, dict) and "retry_in" in event.message, event
            break
    else:
        raise AssertionError("the first attempt never failed")

    # within the backoff, at least 2.4 s: two CLI runs must fit in it, on a loaded machine
    # too (the supervisor waits out a backoff under machine.PARK_AFTER, 5 s; a longer one
    # would leave the job to the maintainer, unbound)
    waiting = cli.status(job_id)
    assert waiting["status"] == "pending", waiting
    assert waiting["error"]["code"] == "error", "a live supervisor was reconciled as dead"
    assert waiting["worker"], "the job stays bound to its supervisor while it waits"
    listed = {d["id"]: d for d in cli("ls", "--json").json()["jobs"]}[job_id]
    assert (listed["status"], listed["error"]["code"]) == ("pending", "error")

    final = cli.finish(job_id, 0)
    assert (final["status"], final["attempts"]) == ("succeeded", 2)
