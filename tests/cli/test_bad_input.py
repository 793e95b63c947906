"""Bad input: one line on stderr (``outlast: error: …``), a non-zero exit, no traceback, and
nothing written to the store."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.helpers import OUTLAST, Outlast, error_lines

UNKNOWN = "0123456789abcdef0123"  # well-formed, in no store


@dataclass
class Jobs:
    done: str  # a succeeded job
    live: str  # a running job (no process behind it: it is only written, never supervised)


@pytest.fixture
def jobs(cli: Outlast) -> Iterator[Jobs]:
    done = cli.store.create(command=["true"], name="done")
    assert done.start()
    done.succeed({"exit_code": 0})
    live = cli.store.create(command=["sleep", "300"], name="live")
    # running and held: hold the worker lock in this process so nobody reconciles it
    live.hold_worker_lock()
    assert live.start()
    yield Jobs(done.id, live.id)
    live.release_worker_lock()


CASES: list[tuple[str, list[str], dict[str, str | None]]] = [
    ("run without a command", ["run"], {}),
    ("run with only --", ["run", "--"], {}),
    ("run --label without =", ["run", "--label", "novalue", "--", "true"], {}),
    ("run --label with no key", ["run", "--label", "=v", "--", "true"], {}),
    ("run --attempts 0", ["run", "--attempts", "0", "--", "true"], {}),
    ("run with an unknown option", ["run", "--bogus", "--", "true"], {}),
    *[
        (f"{verb} of an unknown id", [*verb.split(), UNKNOWN], {})
        for verb in ("status", "wait", "cancel", "logs", "logs -f", "rm", "watch")
    ],
    *[
        (f"{verb} of id {bad!r}", [verb, bad], {})
        for verb in ("status", "wait", "cancel", "logs", "rm")
        for bad in ("a/b", "../x")
    ],
    ("status of '.'", ["status", "."], {}),
    ("status of an overlong id", ["status", "a" * 200], {}),
    ("report without a job", ["report", "--step", "s"], {"OUTLAST_JOB_ID": None}),
    ("report to an unknown job", ["report", "--step", "s", "--job", UNKNOWN], {}),
    ("report to job a/b", ["report", "--step", "s"], {"OUTLAST_JOB_ID": "a/b"}),
    ("ls --status bogus", ["ls", "--status", "bogus"], {}),
    ("ls --label without =", ["ls", "--label", "novalue"], {}),
    ("prune --older-than soon", ["prune", "--older-than", "soon"], {}),
    ("prune --older-than -5m", ["prune", "--older-than", "-5m"], {}),
    ("an unknown verb", ["frobnicate"], {}),
]


@pytest.mark.parametrize(("argv", "env"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.timeout(30)
def test_bad_input_is_one_line_and_writes_nothing(
    cli: Outlast, jobs: Jobs, argv: list[str], env: dict[str, str | None]
) -> None:
    before = cli.snapshot()
    result = cli(*argv, env=env, timeout=15)
    _assert_one_line_error(result)
    assert cli.snapshot() == before, "a rejected call wrote to the store"


def _assert_one_line_error(result: object) -> None:
    from tests.cli.helpers import Result

    assert isinstance(result, Result)
    assert result.code != 0, result
    assert "Traceback" not in result.err + result.out, result
    lines = error_lines(result.err)
    assert len(lines) == 1, f"expected one line on stderr: {result!r}"
    assert lines[0].startswith("outlast: error: "), result
    assert len(lines[0]) > len("outlast: error: ") + 5, result
    assert result.out == "", result


@pytest.mark.parametrize("message", ["{not json", "hi", "NaN"], ids=lambda m: repr(m))
@pytest.mark.timeout(30)
def test_report_with_a_non_json_message_appends_nothing(
    cli: Outlast, jobs: Jobs, message: str
) -> None:
    events = [e.to_dict() for e in cli.store.events(jobs.live)]
    before = cli.snapshot()
    result = cli(
        "report",
        "--step",
        "s",
        "--progress",
        "10",
        "--message",
        message,
        env={"OUTLAST_JOB_ID": jobs.live},
    )
    _assert_one_line_error(result)
    assert [e.to_dict() for e in cli.store.events(jobs.live)] == events
    assert cli.snapshot() == before
    assert cli.store.get(jobs.live).progress is None


@pytest.mark.timeout(30)
def test_report_with_bad_values_appends_nothing(cli: Outlast, jobs: Jobs) -> None:
    before = cli.snapshot()
    for args in (
        ["--step", "s", "--progress", "150"],
        ["--step", "s", "--status", "bogus"],
        ["--step", "", "--message", '"x"'],
    ):
        _assert_one_line_error(cli("report", *args, env={"OUTLAST_JOB_ID": jobs.live}))
    assert cli.snapshot() == before


@pytest.mark.timeout(30)
def test_a_good_report_does_append(cli: Outlast, jobs: Jobs) -> None:
    """The control case of the tests above: the same call with valid JSON is written."""
    count = len(cli.store.events(jobs.live))
    result = cli(
        "report",
        "--step",
        "s",
        "--progress",
        "10",
        "--message",
        '{"ok": true}',
        env={"OUTLAST_JOB_ID": jobs.live},
    )
    assert result.code == 0, result
    events = cli.store.events(jobs.live)
    assert len(events) == count + 1
    assert (events[-1].step, events[-1].message) == ("s", {"ok": True})
    assert cli.store.get(jobs.live).progress == 10


@pytest.mark.timeout(30)
def test_a_report_to_a_finished_job_is_ignored(cli: Outlast, jobs: Jobs) -> None:
    before = cli.snapshot()
    result = cli("report", "--step", "late", env={"OUTLAST_JOB_ID": jobs.done})
    assert "Traceback" not in result.err
    assert len(error_lines(result.err)) == 1, result
    assert cli.snapshot() == before


@pytest.mark.parametrize("url", ["relative/path.db", "nope://x", "sqlite://relative.db"])
@pytest.mark.timeout(30)
def test_a_bad_store_url_is_one_line_and_creates_nothing(
    cli: Outlast, tmp_path: Path, url: str
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for argv, env in (
        (["status", "--store", url, UNKNOWN], {}),
        (["run", "--store", url, "--", "true"], {}),
        (["ls"], {"OUTLAST_STORE": url}),
    ):
        _assert_one_line_error(cli(*argv, env=env, cwd=cwd, timeout=15))
    assert list(cwd.iterdir()) == [], "something was created for a bad store URL"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]


@pytest.mark.timeout(60)
def test_a_store_that_fails_exits_5_and_a_users_error_2(cli: Outlast, jobs: Jobs) -> None:
    """An unreachable store is not a usage error: scripts can tell the two apart."""
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
    for argv in (["ls"], ["status", UNKNOWN], ["run", "--", "true"]):
        result = cli(*argv, env={"OUTLAST_STORE": unreachable}, timeout=30)
        _assert_one_line_error(result)
        assert result.code == 5, result
        assert "cannot connect" in result.err, result
    assert cli("status", UNKNOWN).code == 2
    assert cli("rm", jobs.live).code == 2  # refused: the job is live
    both = cli("rm", jobs.done, jobs.live)  # all or nothing: the finished one stays too
    assert both.code == 2 and "nothing was removed" in both.err, both
    assert cli("status", jobs.done).code == 0
    corrupt = cli.store.create(command=["x"], name="corrupt")
    if cli.kind == "files":
        (cli.tmp / "jobs" / f"{corrupt.id}.json").write_text('{"id": 1}')
    else:
        import sqlite3

        with sqlite3.connect(cli.tmp / "s.db") as conn:
            conn.execute("UPDATE jobs SET doc = ? WHERE id = ?", (b"{not json", corrupt.id))
    result = cli("status", corrupt.id)
    _assert_one_line_error(result)
    assert result.code == 5 and "corrupt" in result.err, result


@pytest.mark.timeout(60)
def test_commands_that_only_read_never_create_a_store(cli: Outlast, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "deeper" / "jobs.db"
    for url in (f"sqlite://{missing}", f"files://{tmp_path / 'nope' / 'dir'}"):
        for argv in (
            ["ls"],
            ["status", UNKNOWN],
            ["status", UNKNOWN, "--json"],
            ["wait", UNKNOWN],
            ["logs", UNKNOWN],
            ["cancel", UNKNOWN],
        ):
            result = cli(*argv, "--store", url, timeout=15)
            _assert_one_line_error(result)
            assert result.code == 2 and "nothing was created" in result.err, result
    assert not (tmp_path / "nope").exists()


@pytest.mark.timeout(60)
def test_a_read_only_command_creates_no_postgresql_schema(cli: Outlast) -> None:
    from tests.pg import support

    if not support.available():
        pytest.skip("no PostgreSQL server here")
    schema = f"never_{os.getpid()}"
    result = cli("ls", "--store", f"{support.BASE_URL}?schema={schema}", timeout=30)
    _assert_one_line_error(result)
    assert result.code == 2 and f"schema {schema}" in result.err, result
    with support.connect() as conn:
        row = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert row is None, "the schema was created"


@pytest.mark.timeout(60)
def test_the_sqlalchemy_spelling_is_the_same_store_and_takes_the_fast_path(
    cli: Outlast,
) -> None:
    job = cli.store.create(command=["true"], name="same")
    path = cli.url[len("sqlite://") :]
    four = f"sqlite:///{path}"  # sqlite:////abs/s.db
    assert cli("status", job.id, "--json", "--store", four).json()["name"] == "same"
    fast = cli.python(
        "import sys, runpy; sys.argv = ['outlast', 'status', sys.argv[1], '--store', sys.argv[2]];"
        " runpy.run_module('outlast', run_name='__main__')",
        job.id,
        four,
        env={"PYTHONPROFILEIMPORTTIME": "1"},
    )
    assert fast.code == 0, fast
    assert "click" not in fast.err, "the full CLI answered instead of the fast path"
    assert f"//{path}" not in cli("ls", "--store", four).err


@pytest.mark.timeout(60)
def test_folders_made_for_a_store_are_private_whatever_the_umask(
    cli: Outlast, tmp_path: Path
) -> None:
    db = tmp_path / "a" / "b" / "s.db"
    result = cli.python(
        "import os, sys, subprocess; os.umask(0);"
        " sys.exit(subprocess.run([sys.argv[1], 'run', '--store', sys.argv[2], '--', 'true'],"
        " capture_output=True).returncode)",
        OUTLAST,
        f"sqlite://{db}",
    )
    assert result.code == 0, result
    for folder in (tmp_path / "a", tmp_path / "a" / "b", Path(f"{db}.d")):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
