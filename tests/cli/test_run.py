"""``outlast run``: a detached job that outlives its starter, its environment, and ``wait``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli.helpers import OUTLAST, STORES, Lines, Outlast


@STORES
@pytest.mark.timeout(60)
def test_job_survives_the_death_of_the_shell_that_started_it(cli: Outlast, tmp_path: Path) -> None:
    done = tmp_path / "done"
    shell = subprocess.Popen(
        ["bash", "-c", f'{OUTLAST} run -- sh -c "sleep 1; echo done > $F"; sleep 30'],
        env=cli._env({"F": str(done)}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's shell has
    )
    try:
        assert shell.stdout is not None
        job_id = Lines(shell.stdout).line(timeout=20)
        assert job_id, "outlast run printed no id"
        os.killpg(shell.pid, signal.SIGKILL)  # the shell, its group and its `sleep 30`
        shell.wait(timeout=10)
        assert not done.exists(), "the job finished before its starter was killed"

        result = cli.wait(job_id)
        assert result.code == 0, result
        assert result.out.strip() == f"{job_id} succeeded"
        assert done.read_text() == "done\n"
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
        shell.communicate(timeout=10)


@STORES
@pytest.mark.timeout(60)
def test_command_sees_its_job_and_store_and_can_report(cli: Outlast, tmp_path: Path) -> None:
    inside = tmp_path / "inside.json"
    script = (
        'echo "job=$OUTLAST_JOB_ID"; echo "store=$OUTLAST_STORE"; '
        "outlast report --step s --progress 50 --message '\"hi\"' && "
        'outlast status "$OUTLAST_JOB_ID" --json > "$F"'
    )
    # --store instead of $OUTLAST_STORE: the supervisor must pass the store on to the command
    job_id = cli.start(
        "sh", "-c", script, opts=["--store", cli.url], env={"OUTLAST_STORE": None, "F": str(inside)}
    )
    final = cli.finish(job_id, 0)
    assert final["status"] == "succeeded"
    assert final["step"] == "s"

    log = cli("logs", job_id).ok().out
    assert f"job={job_id}\n" in log
    assert f"store={cli.url}\n" in log

    assert inside.exists(), f"`outlast status` failed inside the job; its log:\n{log}"
    seen = json.loads(inside.read_text())
    assert (seen["id"], seen["status"]) == (job_id, "running")
    assert (seen["step"], seen["phase"], seen["progress"]) == ("s", "progress", 50.0)

    events = [e.to_dict() for e in cli.store.events(job_id)]
    mine = [e for e in events if e["step"] == "s"]
    assert len(mine) == 1, events
    assert (mine[0]["status"], mine[0]["message"]) == ("progress", "hi")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


@pytest.mark.timeout(30)
def test_run_prints_only_the_id_or_the_document(cli: Outlast) -> None:
    plain = cli("run", "--name", "quick", "--", "true").ok()
    assert plain.err == ""
    assert len(plain.out.splitlines()) == 1

    doc = cli(
        "run", "--json", "--name", "n", "--label", "a=1", "--attempts", "2", "--", "echo", "-x"
    ).json()
    assert {"id", "kind", "name", "command", "labels", "status", "max_attempts"} <= set(doc)
    assert (doc["kind"], doc["name"], doc["command"]) == ("command", "n", ["echo", "-x"])
    assert (doc["labels"], doc["max_attempts"]) == ({"a": "1"}, 2)
    assert cli.finish(doc["id"], 0)["name"] == "n"
    assert cli("logs", doc["id"]).ok().out == "-x\n"
    assert cli.finish(plain.out.strip(), 0)["name"] == "quick"


@STORES
@pytest.mark.timeout(30)
def test_wait_exits_0_on_success_and_1_on_failure(cli: Outlast) -> None:
    ok = cli.start("sh", "-c", "exit 0")
    bad = cli.start("sh", "-c", "exit 3")

    done = cli.finish(ok, 0)
    assert (done["status"], done["error"], done["result"]) == ("succeeded", None, {"exit_code": 0})
    assert done["finished_at"] is not None

    failed = cli.finish(bad, 1)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "error"
    assert "code 3" in failed["error"]["message"], failed["error"]
    assert failed["attempts"] == 1
    plain = cli.wait(bad)
    assert (plain.code, plain.out.strip()) == (1, f"{bad} failed")


@pytest.mark.timeout(30)
def test_commands_killed_by_a_signal_or_unable_to_start_fail(cli: Outlast, tmp_path: Path) -> None:
    killed = cli.start("sh", "-c", "kill -KILL $$")
    missing = cli.start(str(tmp_path / "no-such-program"))
    assert "SIGKILL" in cli.finish(killed, 1)["error"]["message"]
    error = cli.finish(missing, 1)["error"]
    assert "no-such-program" in error["message"], error


@pytest.mark.timeout(30)
def test_wait_exits_3_when_canceled_and_124_on_timeout(cli: Outlast) -> None:
    job_id = cli.start("sleep", "300", opts=["--grace", "1"])
    timed_out = cli.wait(job_id, "--timeout", "0.5")
    assert timed_out.code == 124, timed_out
    assert job_id in timed_out.err
    cli("cancel", job_id).ok()
    assert cli.finish(job_id, 3)["status"] == "canceled"
    assert cli.wait(job_id).code == 3


@pytest.mark.timeout(30)
def test_a_failed_attempt_is_retried(cli: Outlast, tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    script = 'if [ -e "$M" ]; then echo second; exit 0; fi; touch "$M"; echo first; exit 1'
    job_id = cli.start("sh", "-c", script, opts=["--attempts", "2"], env={"M": str(marker)})
    final = cli.finish(job_id, 0)
    assert final["status"] == "succeeded"
    assert (final["attempts"], final["max_attempts"]) == (2, 2)
    assert cli("logs", job_id).ok().out == "first\nsecond\n"


@pytest.mark.timeout(30)
def test_attempts_run_out(cli: Outlast) -> None:
    job_id = cli.start("sh", "-c", "echo try; exit 5", opts=["--attempts", "2"])
    final = cli.finish(job_id, 1)
    assert (final["status"], final["attempts"]) == ("failed", 2)
    assert "code 5" in final["error"]["message"]
    assert cli("logs", job_id).ok().out == "try\ntry\n"


@STORES
@pytest.mark.timeout(60)
def test_run_command_is_the_python_api_of_outlast_run(cli: Outlast, tmp_path: Path) -> None:
    """``outlast.run_command`` is what ``outlast run`` calls: a detached supervisor, the
    given working directory and environment, the grace period as a typed field."""
    import outlast

    work = tmp_path / "work"
    work.mkdir()
    env = {**cli.env, "GREETING": "hello from the caller"}
    task = outlast.run_command(
        ["sh", "-c", 'echo "$GREETING in $(pwd)"; outlast report --step s --progress 50'],
        name="greet",
        labels={"via": "python"},
        grace=2.5,
        cwd=str(work),
        env=env,
        store=cli.store,
    )
    state = cli.store.wait(task.id, timeout=30)
    assert state.status == "succeeded" and state.result == {"exit_code": 0}, state
    assert (state.name, state.labels, state.grace) == ("greet", {"via": "python"}, 2.5)
    assert state.payload == {} and state.command is not None and state.command[0] == "sh"
    assert cli("logs", task.id).ok().out == f"hello from the caller in {work}\n"
    assert [e.step for e in cli.store.events(task.id)] == ["job", "s", "job"]
    with pytest.raises(outlast.InvalidInput):
        outlast.run_command("sh -c true", store=cli.store)  # a string is not an argv
    with pytest.raises(outlast.InvalidInput):
        outlast.run_command(["true"], grace=-1, store=cli.store)
