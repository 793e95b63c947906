"""Time through the command line: ``run/submit/spawn --in/--at/--timeout/--keep``, the
``schedule`` verbs, ``prune --dry-run``, and bad input (a clear error, nothing stored)."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import psutil
import pytest

from outlast.model import Status
from tests.pool.conftest import Harness
from tests.waiting import alive, until

STUBBORN = (
    "python3 -c 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    " time.sleep(600)' & echo $! > child.pid; sleep 60"
)


def _ok(result: object) -> str:
    assert result.returncode == 0, result  # type: ignore[attr-defined]
    return result.stdout  # type: ignore[attr-defined,no-any-return]


@pytest.mark.timeout(60)
def test_run_timeout_ends_the_command_and_its_stubborn_child(pool: Harness) -> None:
    begun = time.monotonic()
    job = _ok(pool.cli("run", "--timeout", "1", "--grace", "1", "--", "sh", "-c", STUBBORN)).strip()
    state = pool.wait_for(job, {Status.FAILED}, 30)
    took = time.monotonic() - begun
    assert state.error is not None and state.error.code == "timeout", state
    assert "timeout of 1s" in state.error.message
    assert took < 1 + 1 + 5, took  # the timeout, the grace, and a loaded box's slack
    child = int((pool.tmp / "child.pid").read_text())
    until(lambda: not alive(child), 10, "the child that ignores SIGTERM to be killed")
    shown = _ok(pool.cli("status", job))
    assert "[timeout]" in shown and "timeout:  1s" in shown


@pytest.mark.timeout(60)
def test_run_in_waits_and_says_when(pool: Harness) -> None:
    job = _ok(pool.cli("run", "--in", "6s", "--", "true")).strip()
    shown = _ok(pool.cli("status", job))
    # "in 6.0s" when status ran within 50 ms of the run, less on a loaded machine (6 s: the
    # status's own process must start before the job does, on a machine 3x slower too)
    assert "runs at:" in shown and re.search(r"\(in [0-6]\.\ds\)", shown), shown
    pending = pool.get(job)
    assert pending.status == Status.PENDING and pending.run_after is not None
    due = pending.run_after
    state = pool.wait_for(job, {Status.SUCCEEDED}, 30)
    assert state.started_at is not None
    # the promise: never before its time; run_after is 6 s after the CLI read --in, which is
    # before the store stamped created_at (by a loaded machine's import time, >100 ms at worst)
    assert state.started_at >= due
    assert 5.5 <= (due - state.created_at).total_seconds() <= 6.0


@pytest.mark.timeout(60)
def test_at_in_the_past_runs_now_and_says_so(pool: Harness) -> None:
    result = pool.cli("run", "--at", "2020-01-01T00:00Z", "--", "true")
    job = _ok(result).strip()
    assert "in the past; the job runs now" in result.stderr
    assert pool.wait_for(job, {Status.SUCCEEDED}, 30)


@pytest.mark.timeout(90)
def test_a_delayed_command_whose_supervisor_died_is_started_by_the_maintainer(
    pool: Harness,
) -> None:
    job = _ok(pool.cli("run", "--in", "2s", "--", "true")).strip()
    supervisor = until(lambda: _supervisor_of(job), 10, "the waiting supervisor")
    os.kill(supervisor, signal.SIGKILL)  # a reboot, as far as the job can tell
    until(lambda: not alive(supervisor), 10, "the supervisor to die")
    assert pool.get(job).status == Status.PENDING
    pool.worker()  # its maintainer finds the job nobody took, once it is due
    assert pool.wait_for(job, {Status.SUCCEEDED}, 40)


def _supervisor_of(job: str) -> int | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "outlast.run.supervisor" in cmd and job in cmd:
            return proc.pid
    return None


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "--in", "10 parsecs", "--", "true"], "'10 parsecs'"),
        (["run", "--in", "-5s", "--", "true"], "must be >= 0"),
        (["run", "--at", "2026-12-24T03:00", "--", "true"], "no time zone"),
        (["run", "--at", "soon", "--", "true"], "'soon'"),
        (["run", "--in", "1m", "--at", "2026-12-24T03:00Z", "--", "true"], "not both"),
        (["run", "--timeout", "0", "--", "true"], "--timeout"),
        (["run", "--keep", "forever-ish", "--", "true"], "--keep"),
        (["submit", "pt.noop", "--import", "tests.pool.jobs_for_tests", "--in", "1y"], "'1y'"),
        (["schedule", "add", "x", "--cron", "61 * * * *", "--", "true"], "'61 * * * *'"),
        (["schedule", "add", "x", "--cron", "0 3 * * *", "--tz", "Mars/X", "--", "true"], "Mars/X"),
        (["schedule", "add", "x", "--every", "10 parsecs", "--", "true"], "'10 parsecs'"),
        (["schedule", "add", "x", "--every", "0.5", "--", "true"], "at least 1 second"),
        (["schedule", "add", "x", "--", "true"], "--cron EXPR or --every"),
        (["schedule", "add", "x", "--every", "1m"], "a command after --"),
        (["schedule", "add", "../x", "--every", "1m", "--", "true"], "invalid job id"),
        (["schedule", "pause", "nosuch"], "no schedule nosuch"),
    ],
)
def test_bad_time_input_is_a_clear_error_and_stores_nothing(
    pool: Harness, args: list[str], says: str
) -> None:
    result = pool.cli(*args)
    assert result.returncode == 2, result
    assert result.stderr.startswith("outlast: error:") and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert pool.all() == [] and pool.store.schedules() == []


@pytest.mark.timeout(90)
def test_schedule_verbs_from_add_to_rm(pool: Harness) -> None:
    out = _ok(
        pool.cli(
            "schedule",
            "add",
            "echoes",
            "--every",
            "1s",
            "--label",
            "k=v",
            "--",
            "sh",
            "-c",
            "echo fired $OUTLAST_JOB_ID; pwd",
        )
    )
    assert out.startswith("echoes: next run at ")
    again = pool.cli("schedule", "add", "echoes", "--every", "1s", "--", "true")
    assert again.returncode == 2 and "--replace" in again.stderr
    runner = pool.background(
        "import sys, outlast.cli; sys.argv = ['outlast', 'scheduler']; outlast.cli.main()"
    )
    job = until(lambda: [s for s in pool.all() if s.fired], 20, "a fire")[0]
    state = pool.wait_for(job.id, {Status.SUCCEEDED}, 20)
    assert state.labels == {"k": "v"} and state.kind == "command"
    log = _ok(pool.cli("logs", job.id))
    assert log == f"fired {job.id}\n{pool.tmp}\n"  # in the folder it was added from
    [doc] = json.loads(_ok(pool.cli("schedule", "ls", "--json")))["schedules"]
    assert doc["id"] == "echoes" and doc["every"] == 1.0 and doc["last_status"]
    table = _ok(pool.cli("schedule", "ls"))
    assert "echoes" in table and "every 1s" in table
    assert _ok(pool.cli("schedule", "pause", "echoes")).strip() == "echoes paused"
    time.sleep(0.5)
    count = len(pool.all())
    time.sleep(2.0)
    assert len(pool.all()) == count  # paused: nothing fires
    manual = _ok(pool.cli("schedule", "run-now", "echoes")).strip()
    assert pool.wait_for(manual, {Status.SUCCEEDED}, 20).fired.reason == "manual"  # type: ignore[union-attr]
    assert "resumed" in _ok(pool.cli("schedule", "resume", "echoes"))
    shown = _ok(pool.cli("schedule", "show", "echoes"))
    assert shown.count("next:") == 5
    assert _ok(pool.cli("schedule", "rm", "echoes")).strip() == "echoes removed"
    assert pool.store.schedules() == []
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(10) == 0


@pytest.mark.timeout(60)
def test_prune_dry_run_lists_and_keep_removes(pool: Harness) -> None:
    kept = _ok(pool.cli("run", "--keep", "1s", "--", "true")).strip()
    other = _ok(pool.cli("run", "--", "true")).strip()
    for job in (kept, other):
        pool.wait_for(job, {Status.SUCCEEDED}, 30)
    time.sleep(1.2)
    dry = pool.cli("prune", "--dry-run")
    assert kept in _ok(dry) and other not in dry.stdout and "would remove 1 job(s)" in dry.stdout
    assert "OUTLAST_KEEP is not set" in dry.stderr
    as_json = json.loads(_ok(pool.cli("prune", "--dry-run", "--json", env={"OUTLAST_KEEP": "0"})))
    assert {j["id"] for j in as_json["jobs"]} == {kept, other} and as_json["dry_run"]
    assert "removed 1 job(s)" in _ok(pool.cli("prune"))
    assert [s.id for s in pool.all()] == [other]
    bad = pool.cli("prune", env={"OUTLAST_KEEP": "a while"})
    assert bad.returncode == 2 and "OUTLAST_KEEP" in bad.stderr


@pytest.mark.timeout(60)
def test_the_maintainer_applies_retention(pool: Harness) -> None:
    short = _ok(pool.cli("run", "--keep", "0.5s", "--", "true")).strip()
    forever = _ok(pool.cli("run", "--", "true")).strip()
    for job in (short, forever):
        pool.wait_for(job, {Status.SUCCEEDED}, 30)
    time.sleep(0.6)
    pool.worker(env={"OUTLAST_KEEP": "1h"})  # the job's own keep wins over OUTLAST_KEEP
    until(lambda: [s.id for s in pool.all()] == [forever], 20, "the short-lived job's removal")
    # its files go right after the row's removal commits (the maintainer is not done yet)
    until(lambda: not pool.store.log_path(short).exists(), 10, "the short-lived job's log gone")
