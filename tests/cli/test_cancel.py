"""``cancel``, ``rm`` and ``prune``: stopping jobs and their whole process tree, and cleaning up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.helpers import STORES, Outlast, job_processes
from tests.waiting import alive, until

GRACE = 1.0

#: A command whose whole tree ignores SIGTERM or dies of it: the leader (sh) and a subshell
#: ignore it, a grandchild does not; every one writes its PID to $P.
TREE = """
trap "" TERM
echo $$ >> "$P"
(trap "" TERM; sh -c 'echo $$ >> "$P"; exec sleep 300') &
(sh -c 'echo $$ >> "$P"; exec sleep 300') &
wait
"""


@STORES
@pytest.mark.timeout(60)
def test_cancel_kills_the_whole_process_tree(cli: Outlast, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    job_id = cli.start("sh", "-c", TREE, opts=["--grace", str(GRACE)], env={"P": str(pids_file)})

    def recorded() -> list[int]:
        text = pids_file.read_text() if pids_file.exists() else ""
        pids = [int(line) for line in text.split()]
        return pids if len(pids) == 3 else []

    pids = until(recorded, 15, "the tree to record its PIDs")
    command_pid = cli.running_with_pid(job_id)["pid"]
    assert command_pid == pids[0], "the recorded pid is the command's (the group leader)"
    tree = {p.pid for p in job_processes(job_id)}
    assert set(pids) <= tree, (pids, tree)
    for pid in tree:
        assert os.getpgid(pid) == command_pid, "the command runs in its own process group"

    doc = cli("cancel", job_id, "--json").json()
    assert doc["id"] == job_id
    assert doc["status"] == "canceled"
    assert doc["error"]["code"] == "canceled"
    assert doc["finished_at"] is not None

    until(lambda: not any(alive(pid) for pid in tree), GRACE + 5, "the tree to die")
    assert not job_processes(job_id)
    assert cli.wait(job_id).code == 3
    after = cli.status(job_id)
    assert after["status"] == "canceled"
    assert after["error"]["code"] == "canceled"


@pytest.mark.timeout(30)
def test_cancel_sends_sigterm_first(cli: Outlast, tmp_path: Path) -> None:
    got = tmp_path / "got-term"
    script = "trap 'echo term > \"$G\"; exit 0' TERM; echo up; while :; do sleep 0.05; done"
    job_id = cli.start("sh", "-c", script, opts=["--grace", "10"], env={"G": str(got)})
    command_pid = cli.running_with_pid(job_id)["pid"]
    started = time.monotonic()
    assert "canceled" in cli("cancel", job_id).ok().out
    until(lambda: not alive(command_pid), 8, "the command to stop on SIGTERM")
    assert time.monotonic() - started < 8, "it stopped on SIGTERM, well before the grace ended"
    assert got.read_text() == "term\n"
    assert cli.wait(job_id).code == 3
    assert cli.status(job_id)["status"] == "canceled"  # its exit 0 does not make it succeeded


@STORES
@pytest.mark.timeout(30)
def test_cancel_of_a_pending_job_never_starts_it(cli: Outlast, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    # no supervisor: the job stays pending until someone runs it
    job_id = cli.store.create(command=["sh", "-c", f"touch {ran}"]).id
    result = cli("cancel", job_id).ok()
    assert job_id in result.out and "canceled" in result.out
    assert cli.status(job_id)["status"] == "canceled"

    # a supervisor started for it afterwards must not run it either
    supervisor = subprocess.run(
        [sys.executable, "-m", "outlast.run.supervisor", cli.url, job_id],
        env=cli.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=20,
    )
    assert supervisor.returncode == 0, supervisor
    assert not ran.exists(), "a canceled job ran"
    doc = cli.status(job_id)
    assert doc["status"] == "canceled"
    assert doc["attempts"] == 0 and doc["started_at"] is None
    assert cli.wait(job_id).code == 3


@pytest.mark.timeout(30)
def test_cancel_of_a_finished_job_changes_nothing_and_says_so(cli: Outlast) -> None:
    job_id = cli.start("true")
    assert cli.wait(job_id).code == 0
    before = cli.status(job_id)

    result = cli("cancel", job_id).ok()
    assert "already" in result.out, result
    assert "succeeded" in result.out, result
    as_json = cli("cancel", job_id, "--json").json()
    assert as_json["status"] == "succeeded"

    after = cli.status(job_id)
    assert after == before
    assert cli.wait(job_id).code == 0


@STORES
@pytest.mark.timeout(30)
def test_rm_removes_a_finished_job_and_its_log(cli: Outlast) -> None:
    job_id = cli.start("echo", "hello")
    assert cli.wait(job_id).code == 0
    log = cli.log_path(job_id)
    assert log.exists()

    result = cli("rm", job_id).ok()
    assert job_id in result.out
    gone = cli("status", job_id)
    assert gone.code == 2, gone
    assert gone.err.startswith("outlast: error:") and job_id in gone.err
    assert not log.exists()
    assert cli("ls", "--json").json() == {"jobs": [], "next": None}


@pytest.mark.timeout(30)
def test_rm_of_a_running_job_needs_force(cli: Outlast) -> None:
    job_id = cli.start("sleep", "300", opts=["--grace", "0"])
    command_pid = cli.running_with_pid(job_id)["pid"]

    refused = cli("rm", job_id)
    assert refused.code == 2, refused
    assert refused.err.startswith("outlast: error:") and job_id in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    assert "Traceback" not in refused.err
    assert cli.status(job_id)["status"] == "running"
    assert alive(command_pid)

    cli("rm", "--force", job_id).ok()
    until(lambda: not alive(command_pid), 5, "the removed job's command to be stopped")
    assert cli("status", job_id).code == 2
    assert cli("ls", "--json").json() == {"jobs": [], "next": None}
    assert not cli.log_path(job_id).exists()


@pytest.mark.timeout(30)
def test_prune_removes_finished_jobs_but_not_running_ones(cli: Outlast) -> None:
    ok = cli.start("true")
    bad = cli.start("false")
    canceled = cli.store.create(command=["true"]).id
    live = cli.start("sleep", "300", opts=["--grace", "0"])
    assert cli.wait(ok).code == 0
    assert cli.wait(bad).code == 1
    cli("cancel", canceled).ok()
    cli.running_with_pid(live)

    assert cli("prune", "--older-than", "1h").ok().out.strip() == "removed 0 job(s)"
    dry = cli("prune", "--older-than", "0s", "--dry-run").ok()
    *listed, last = dry.out.strip().splitlines()
    assert last == "would remove 3 job(s)"
    assert {line.split()[0] for line in listed} == {ok, bad, canceled}  # it lists them
    assert len(cli("ls", "--json").json()["jobs"]) == 4

    assert cli("prune", "--older-than", "0s").ok().out.strip() == "removed 3 job(s)"
    assert [d["id"] for d in cli("ls", "--json").json()["jobs"]] == [live]
    assert cli.status(live)["status"] == "running"
    for job_id in (ok, bad, canceled):
        assert cli("status", job_id).code == 2
        assert not cli.log_path(job_id).exists()
    cli("cancel", live).ok()
