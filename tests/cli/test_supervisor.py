"""The supervisor of a command job (issue 12): a command that cannot run fails at once, a
transient start failure is retried by the supervisor itself, nothing the command started
escapes a cancel or outlives the job, and the saved environment goes with the job."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.cli.helpers import STORES, Outlast, job_processes
from tests.waiting import alive, until


@STORES
@pytest.mark.timeout(60)
def test_a_command_that_is_not_there_fails_at_once_and_is_not_retried(cli: Outlast) -> None:
    job_id = cli.start("no-such-binary-for-outlast", "x", opts=["--attempts", "3"])
    result = cli.wait(job_id, "--timeout", "30")
    assert result.code == 1, result
    doc = cli.status(job_id)
    assert (doc["status"], doc["attempts"]) == ("failed", 1), doc
    assert "no-such-binary-for-outlast" in doc["error"]["message"]
    assert "No such file" in doc["error"]["message"]
    assert doc["error"]["type"] == "CannotStart" and doc["error"]["hint"]


@pytest.mark.timeout(60)
def test_a_command_that_cannot_be_executed_fails_at_once(cli: Outlast, tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    os.chmod(script, stat.S_IRUSR | stat.S_IWUSR)
    job_id = cli.start(str(script), opts=["--attempts", "2"])
    assert cli.wait(job_id, "--timeout", "30").code == 1
    doc = cli.status(job_id)
    assert (doc["status"], doc["attempts"]) == ("failed", 1), doc
    assert "Permission denied" in doc["error"]["message"], doc["error"]


@pytest.mark.timeout(60)
def test_a_command_that_fails_is_retried_by_its_supervisor(cli: Outlast, tmp_path: Path) -> None:
    """Before: a failure recorded for retry left the job pending with nobody to run it."""
    counter = tmp_path / "runs"
    job_id = cli.start(
        "sh", "-c", 'echo x >> "$C"; [ $(wc -l < "$C") -ge 3 ]',
        opts=["--attempts", "3"], env={"C": str(counter)},
    )  # fmt: skip
    assert cli.wait(job_id, "--timeout", "40").code == 0
    assert counter.read_text().count("x") == 3
    assert cli.status(job_id)["attempts"] == 3


#: A command whose child leaves the process group (``setsid``), and another child that stays.
ESCAPE = """
setsid sh -c 'echo $$ >> "$P"; exec sleep 301' &
sh -c 'echo $$ >> "$P"; exec sleep 302' &
wait
"""


def _pids(path: Path, count: int) -> list[int]:
    text = path.read_text() if path.exists() else ""
    pids = [int(line) for line in text.split()]
    return pids if len(pids) == count else []


@STORES
@pytest.mark.timeout(60)
def test_a_descendant_that_left_the_group_does_not_escape_a_cancel(
    cli: Outlast, tmp_path: Path
) -> None:
    pids_file = tmp_path / "pids"
    job_id = cli.start("sh", "-c", ESCAPE, opts=["--grace", "1"], env={"P": str(pids_file)})
    pids = until(lambda: _pids(pids_file, 2), 15, "both children to start")
    leader = cli.running_with_pid(job_id)["pid"]
    assert any(os.getpgid(pid) != leader for pid in pids), "the setsid child left the group"
    assert cli("cancel", job_id).code == 0
    until(lambda: not any(alive(pid) for pid in pids), 10, "every descendant to die")
    assert cli.wait(job_id).code == 3
    assert not job_processes(job_id)


@pytest.mark.timeout(60)
def test_what_a_finished_command_left_running_is_stopped(cli: Outlast, tmp_path: Path) -> None:
    """A command that exits while a ``setsid`` child it started runs on (its output closed,
    so nothing holds the log pipe): the job is over, and so is the child."""
    pid_file = tmp_path / "pid"
    command = "setsid sh -c 'echo $$ > \"$P\"; exec sleep 303' >/dev/null 2>&1 & sleep 0.5"
    job_id = cli.start("sh", "-c", command, env={"P": str(pid_file)})
    assert cli.wait(job_id, "--timeout", "30").code == 0
    pid = int(until(lambda: pid_file.read_text().strip() if pid_file.exists() else "", 10))
    until(lambda: not alive(pid), 10, "the orphan to be stopped")


@pytest.mark.timeout(60)
def test_the_saved_environment_is_removed_when_the_job_ends(cli: Outlast) -> None:
    """The run context (cwd and environment, which can hold secrets) lives beside the store
    only while the job may still need it."""
    job_id = cli.start("true", env={"MY_API_TOKEN": "s3cr3t-value"})
    context = cli.log_path(job_id).with_suffix(".ctx")
    assert cli.wait(job_id, "--timeout", "30").code == 0
    until(lambda: not context.exists(), 10, "the context file to go")
    retried = cli.start("sh", "-c", "exit 1", opts=["--attempts", "2"])
    assert cli.wait(retried, "--timeout", "30").code == 1
    until(lambda: not cli.log_path(retried).with_suffix(".ctx").exists(), 10, "it to go too")


@pytest.mark.timeout(90)
def test_a_wait_on_the_store_leaves_no_command_stranded(cli: Outlast) -> None:
    """``Store.wait`` reconciles a job whose supervisor died. With the run layer loaded (as
    here) that restarts the command's supervisor and kills what the dead one left; with the
    store alone (another program), the job is left for the run layer, not made ``pending``
    with nobody to run it."""
    import signal
    import subprocess
    import sys

    import outlast

    task = outlast.run_command(["sleep", "30"], attempts=3, store=cli.store)
    first = cli.running_with_pid(task.id)
    os.kill(int(first["worker"].rpartition(":")[2]), signal.SIGKILL)
    state = cli.store.wait(task.id, timeout=3)  # reconciled, restarted: running again
    until(lambda: cli.store.get(task.id).attempts == 2 or None, 20, "the second attempt")
    until(lambda: not alive(first["pid"]), 10, "the first attempt's command to be killed")
    second = cli.running_with_pid(task.id)
    assert second["pid"] != first["pid"], state
    os.kill(int(second["worker"].rpartition(":")[2]), signal.SIGKILL)
    code = (
        "import sys; from outlast.store import open_store;"
        " s = open_store(sys.argv[1]); print(s.wait(sys.argv[2], timeout=2).status)"
    )
    alone = subprocess.run(
        [sys.executable, "-c", code, cli.url, task.id], capture_output=True, text=True, timeout=30
    )
    assert alone.stdout.strip() == "running", alone  # not stranded: left for the run layer
    assert cli.status(task.id)["attempts"] in (2, 3)  # `outlast status` reconciles it
    until(lambda: cli.store.get(task.id).attempts == 3 or None, 20, "the third attempt")
    assert cli("cancel", task.id).code == 0


@pytest.mark.timeout(60)
def test_a_command_job_whose_supervisor_never_took_it_is_started_by_who_looks(
    cli: Outlast, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor that dies before its first write (a full disk) leaves its job pending
    with no worker; a reader that reconciles it (``wait``, ``status``) starts another once
    the job has waited :data:`reap.STRANDED_AFTER` seconds, instead of leaving it forever."""
    from outlast.model import Kind, Status
    from outlast.run import reap

    out = tmp_path / "ran.txt"
    task = cli.store.create(kind=Kind.COMMAND, command=["sh", "-c", f"echo ran > {out}"])
    assert reap.reconcile(cli.store, cli.store.get(task.id)).status == Status.PENDING
    monkeypatch.setattr(reap, "STRANDED_AFTER", 0.0)
    state = reap.wait_for(cli.store, task.id, timeout=30)
    assert state.status == Status.SUCCEEDED, state
    assert out.read_text() == "ran\n"
