"""Looking at jobs: ``status``, ``ls``, the fast path, ``logs`` (and ``-f``) and ``watch``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import DOC_FIELDS, STORES, Lines, Outlast


@STORES
@pytest.mark.timeout(60)
def test_status_and_ls_print_the_job_document(cli: Outlast) -> None:
    ok = cli.start("true", opts=["--name", "ok", "--label", "team=a", "--label", "env=ci"])
    bad = cli.start("sh", "-c", "exit 2", opts=["--name", "bad", "--label", "team=b"])
    live = cli.start("sleep", "300", opts=["--name", "live", "--label", "team=a", "--grace", "0"])
    assert cli.wait(ok).code == 0
    assert cli.wait(bad).code == 1
    cli.running_with_pid(live)

    doc = cli.status(ok)
    assert set(doc) >= DOC_FIELDS, DOC_FIELDS - set(doc)
    assert doc["id"] == ok
    assert doc["kind"] == "command"
    assert doc["name"] == "ok"
    assert doc["command"] == ["true"]
    assert doc["labels"] == {"team": "a", "env": "ci"}
    assert doc["queue"] == "default"
    assert doc["status"] == "succeeded"
    assert doc["attempts"] == doc["max_attempts"] == 1
    assert doc["created_at"] <= doc["started_at"] <= doc["finished_at"]
    assert doc["worker"] and doc["pid"]

    everything = cli("ls", "--json").json()["jobs"]
    assert [d["id"] for d in everything] == [live, bad, ok], "ls is newest first"
    for listed in everything:
        assert set(listed) >= DOC_FIELDS
    assert {d["id"]: d["status"] for d in everything} == {
        ok: "succeeded",
        bad: "failed",
        live: "running",
    }

    def ids(*args: str) -> list[str]:
        return [d["id"] for d in cli("ls", *args, "--json").json()["jobs"]]

    assert ids("--status", "succeeded") == [ok]
    assert ids("--status", "running") == [live]
    assert ids("--status", "canceled") == []
    assert ids("--label", "team=a") == [live, ok]
    assert ids("--label", "team=a", "--status", "succeeded") == [ok]
    assert ids("--label", "team=zzz") == []
    assert ids("--limit", "2") == [live, bad]
    assert ids("--limit", "1", "--label", "team=a") == [live]

    table = cli("ls").ok().out
    for job_id in (ok, bad, live):
        assert job_id in table
    assert len(table.splitlines()) == 4  # a header and three jobs

    text = cli("status", bad).ok().out
    assert bad in text and "failed" in text and "code 2" in text
    cli("cancel", live).ok()


#: In one process: every ``status`` call through the fast path alone, then through the full
#: click path; prints ``{call: [fast path's exit code, its output, the full path's output]}``.
_COMPARE = """
import contextlib, io, json, sys
from outlast.cli import fast

calls = [json.loads(arg) for arg in sys.argv[1:]]
seen = {}
for argv in calls:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = fast.status(argv)
    seen[json.dumps(argv)] = [code, out.getvalue()]
from outlast.cli.app import run_cli
for argv in calls:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            run_cli(argv)
        except SystemExit as exc:
            assert not exc.code, (argv, exc.code)
    seen[json.dumps(argv)].append(out.getvalue())
print(json.dumps(seen))
"""


@STORES
@pytest.mark.timeout(60)
def test_the_fast_path_prints_exactly_what_the_full_path_prints(cli: Outlast) -> None:
    ok = cli.start(
        "sh",
        "-c",
        "outlast report --step fetch --progress 42.5 --message '{\"n\": 1}'",
        opts=["--name", "bäck ✓", "--label", "k=v w", "--label", "a=b"],
    )
    bad = cli.start("sh", "-c", "exit 7", opts=["--attempts", "1"])
    live = cli.start("sleep", "300", opts=["--grace", "0", "--attempts", "3"])
    assert cli.finish(ok, 0)["progress"] == 100
    assert cli.finish(bad, 1)["error"]["hint"]
    cli.running_with_pid(live)
    pending = cli.store.create(command=["true"], name="never", labels={"x": "y"}).id

    calls = [
        ["status", job_id, *flags]
        for job_id in (ok, bad, live, pending)
        for flags in ((), ("--json",))
    ]
    calls += [["status", ok, "--store", cli.url], ["status", bad, f"--store={cli.url}", "--json"]]
    seen = cli.python(_COMPARE, *(json.dumps(c) for c in calls)).json()
    assert len(seen) == len(calls)
    for call, (code, fast, full) in seen.items():
        assert code == 0, f"the fast path declined {call}"
        assert json.loads(call)[1] in full, f"the full path printed no job for {call}"
        assert fast == full, f"{call}\nfast path:\n{fast}\nfull path:\n{full}"
    # and the console script (main: fast path first) prints the same
    for argv in (["status", ok], ["status", live, "--json"]):
        script = cli(*argv).ok()
        assert script.err == ""
        assert script.out == seen[json.dumps(argv)][2]
    cli("cancel", live).ok()


_HEAVY = ("rich", "fastapi", "starlette", "pydantic", "uvicorn", "psycopg", "psycopg_pool")
_PROBE = """
import json, sys
from outlast.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stdout.flush()
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), file=sys.stderr)
"""


@pytest.mark.timeout(30)
def test_status_ls_and_wait_import_nothing_heavy(cli: Outlast) -> None:
    done = cli.start("true")
    live = cli.start("sleep", "300", opts=["--grace", "0"])
    cli.running_with_pid(live)
    assert cli.wait(done).code == 0

    for args in (("status", done), ("status", live, "--json")):
        loaded = set(json.loads(cli.python(_PROBE, *args).ok().err.splitlines()[-1]))
        # the fast path's promise (cli/fast.py): stdlib and outlast alone
        assert not loaded & {*_HEAVY, "click", "psutil"}, (args, loaded & {*_HEAVY, "click"})
    for args in (("ls",), ("wait", done)):
        loaded = set(json.loads(cli.python(_PROBE, *args).ok().err.splitlines()[-1]))
        assert not loaded & set(_HEAVY), (args, loaded & set(_HEAVY))
    cli("cancel", live).ok()


@STORES
@pytest.mark.timeout(30)
def test_logs_interleave_stdout_and_stderr_in_order(cli: Outlast) -> None:
    script = "echo o1; echo e1 >&2; echo o2; echo e2 >&2; printf 'no newline'"
    job_id = cli.start("sh", "-c", script)
    many = cli.start("seq", "1", "20000")
    assert cli.wait(job_id).code == 0
    assert cli("logs", job_id).ok().out == "o1\ne1\no2\ne2\nno newline"
    assert cli.wait(many).code == 0
    assert cli("logs", many).ok().out == "".join(f"{i}\n" for i in range(1, 20001))


@pytest.mark.timeout(30)
def test_logs_follow_prints_lines_as_they_come_and_ends_with_the_job(
    cli: Outlast, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = 'echo first; while [ ! -e "$GO" ]; do sleep 0.02; done; echo second >&2; echo third'
    job_id = cli.start("sh", "-c", script, env={"GO": str(go)})
    follower = cli.popen("logs", "-f", job_id)
    assert follower.stdout is not None
    lines = Lines(follower.stdout)
    assert lines.line(timeout=15) == "first"
    assert cli.status(job_id)["status"] == "running"  # printed while the job still runs
    go.touch()
    assert lines.rest(timeout=15) == "second\nthird\n"
    assert follower.wait(timeout=10) == 0

    # a finished job: everything, then exit at once
    assert cli("logs", "-f", job_id, timeout=10).ok().out == "first\nsecond\nthird\n"


@pytest.mark.timeout(30)
def test_logs_follow_ends_when_the_job_is_canceled(cli: Outlast) -> None:
    job_id = cli.start("sh", "-c", "echo up; exec sleep 300", opts=["--grace", "0"])
    follower = cli.popen("logs", "-f", job_id)
    assert follower.stdout is not None
    lines = Lines(follower.stdout)
    assert lines.line(timeout=15) == "up"
    cli("cancel", job_id).ok()
    lines.rest(timeout=15)
    assert follower.wait(timeout=10) == 0


@STORES
@pytest.mark.timeout(30)
def test_watch_prints_plain_event_lines_when_not_a_terminal(cli: Outlast, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        'while [ ! -e "$GO" ]; do sleep 0.02; done; '
        "outlast report --step build --progress 50 --message '\"half way\"'; "
        "outlast report --step build --status completed --progress 100"
    )
    job_id = cli.start("sh", "-c", script, env={"GO": str(go)})
    watcher = cli.popen("watch", job_id)
    assert watcher.stdout is not None
    lines = Lines(watcher.stdout)
    first = lines.line(timeout=15)  # the job's start, while it waits for us
    assert "started" in first, first
    go.touch()
    rest = lines.rest(timeout=15).splitlines()
    assert watcher.wait(timeout=10) == 0
    output = [first, *rest]
    assert "\x1b" not in "".join(output), "escape codes on a pipe"
    assert output[-1] == f"{job_id} succeeded"
    events = output[:-1]
    assert any("build" in line and "progress" in line and "half way" in line for line in events)
    assert any("build" in line and "completed" in line for line in events)
    assert "job" in events[-1] and "completed" in events[-1]
    assert len(events) == len(cli.store.events(job_id)), "one line per event, no duplicates"


@pytest.mark.timeout(30)
def test_watch_exit_code_follows_the_outcome(cli: Outlast) -> None:
    ok = cli.start("true")
    bad = cli.start("false")
    assert cli.wait(bad).code == 1
    good = cli("watch", ok)
    assert good.code == 0, good
    assert good.out.splitlines()[-1] == f"{ok} succeeded"
    failed = cli("watch", bad)
    assert failed.code == 1, failed
    assert failed.out.splitlines()[-1] == f"{bad} failed"


#: ~3.5 KB of output in many small writes.
CHATTY = 'i=1; while [ $i -le 400 ]; do echo "line $i"; i=$((i + 1)); done'
CHATTY_OUT = "".join(f"line {i}\n" for i in range(1, 401))


@pytest.mark.timeout(30)
def test_the_log_is_capped_and_keeps_the_latest_output(cli: Outlast) -> None:
    """DESIGN: rotation at $OUTLAST_LOG_MAX_BYTES; never more than twice the cap on disk, the
    most recent output kept (run/logs.py)."""
    cap = 1024
    job_id = cli.start("sh", "-c", CHATTY, env={"OUTLAST_LOG_MAX_BYTES": str(cap)})
    cli.finish(job_id, 0)
    log = cli.log_path(job_id)
    files = sorted(log.parent.glob(f"{job_id}.log*"))
    sizes = {p.name: p.stat().st_size for p in files}
    assert all(size <= cap for size in sizes.values()), f"a log file is over the cap: {sizes}"
    shown = cli("logs", job_id).ok().out
    assert shown.endswith("line 400\n")
    assert CHATTY_OUT.endswith(shown), "the log is not the latest output, in order"
    assert len(shown.encode()) <= 2 * cap


#: Five bursts of 700 bytes, apart: the supervisor reads them one by one, so the log rotates.
BURSTS = "for i in 1 2 3 4 5; do head -c 699 /dev/zero | tr '\\0' x; echo; sleep 0.2; done"


@pytest.mark.timeout(30)
def test_rm_removes_rotated_logs_too(cli: Outlast) -> None:
    job_id = cli.start("sh", "-c", BURSTS, env={"OUTLAST_LOG_MAX_BYTES": "1024"})
    cli.finish(job_id, 0)
    logs = cli.log_path(job_id).parent
    assert len(cli("logs", job_id).ok().out) <= 2048
    rotated = sorted(p.name for p in logs.glob(f"{job_id}.log*"))
    assert rotated == [f"{job_id}.log", f"{job_id}.log.1"], rotated
    cli("rm", job_id).ok()
    left = sorted(p.name for p in logs.glob(f"{job_id}*"))
    assert left == [], f"rm left log files behind: {left}"


@pytest.mark.timeout(30)
def test_a_bad_log_cap_is_refused_or_fails_the_job_but_never_hangs_it(cli: Outlast) -> None:
    before = cli.snapshot()
    result = cli("run", "--", "true", env={"OUTLAST_LOG_MAX_BYTES": "abc"})
    if result.code != 0:  # refused up front: one line, nothing written
        lines = [line for line in result.err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("outlast: error:"), result
        assert cli.snapshot() == before
        return
    job_id = result.out.strip()
    waited = cli.wait(job_id, "--timeout", "5")
    assert waited.code != 124, f"the job hangs {cli.status(job_id)['status']} forever: {waited!r}"
    assert waited.code == 1
