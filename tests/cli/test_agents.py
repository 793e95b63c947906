"""The CLI as agents and scripts use it: a canceled job's ``wait`` returns once its
processes are gone, global options before the verb, one JSON shape for listings (the same as
``GET /jobs``), JSON options that say how to write their value, exit codes in every verb's
and group's help. (``wait`` on a paused job: tests/jobs/test_wait_paused.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from outlast.cli.app import cli as click_cli
from tests.cli.helpers import DOC_FIELDS, Outlast
from tests.http.harness import Server
from tests.waiting import alive, until


@pytest.mark.timeout(60)
def test_wait_for_a_canceled_command_returns_once_its_processes_are_gone(cli: Outlast) -> None:
    pid_file = cli.tmp / "pid"
    script = f"trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.05; done"
    job_id = cli("run", "--grace", "1.5", "--", "sh", "-c", script).ok().out.strip()
    until(pid_file.exists, 30, "the command to start")
    pid = int(pid_file.read_text())
    cli("cancel", job_id).ok()
    waited = cli("wait", job_id)
    assert waited.code == 3, waited
    assert not alive(pid), "wait returned while the canceled command (ignoring TERM) lived"


def test_global_options_before_the_verb(cli: Outlast) -> None:
    job_id = cli("run", "--", "true").ok().out.strip()
    cli("wait", job_id).ok()
    other = {"OUTLAST_STORE": None}
    page = cli("--store", cli.url, "--json", "ls", env=other).json()
    assert [d["id"] for d in page["jobs"]] == [job_id] and page["next"] is None
    # the fast path of status takes them too
    doc = cli("--json", "--store", cli.url, "status", job_id, env=other).json()
    assert doc["id"] == job_id and doc["status"] == "succeeded"
    doc = cli(f"--store={cli.url}", "status", job_id, "--json", env=other).json()
    assert doc["id"] == job_id
    # the verb's own option wins over the one before it
    wrong = f"sqlite://{cli.tmp}/nosuch.db"
    assert cli("--store", wrong, "ls", "--store", cli.url, "--json", env=other).json()["jobs"]
    refused = cli("--json", "worker", "--burst")
    assert refused.code == 2 and "prints no JSON" in refused.err, refused


def test_ls_json_pages_with_next(cli: Outlast) -> None:
    ids = [cli("run", "--", "true").ok().out.strip() for _ in range(3)]
    for job_id in ids:
        cli("wait", job_id).ok()
    first = cli("ls", "--limit", "2", "--json").json()
    assert [d["id"] for d in first["jobs"]] == ids[::-1][:2]
    assert first["next"] == ids[1]
    second = cli("ls", "--limit", "2", "--before", first["next"], "--json").json()
    assert [d["id"] for d in second["jobs"]] == [ids[0]] and second["next"] is None
    bad = cli("ls", "--before", "nosuchjob", "--json")
    assert bad.code == 2 and "--before" in bad.err and "nosuchjob" in bad.err, bad


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--job", "x", "--step", "s", "--message", "hi"],
        ["resume", "x", "--answer", "yes please"],
    ],
)
def test_json_options_say_how_to_quote_a_string(cli: Outlast, argv: list[str]) -> None:
    result = cli(*argv)
    assert result.code == 2, result
    given = argv[-1]
    assert f"to pass a string, quote it: '{json.dumps(given)}'" in result.err, result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize(
    ("option", "shape"),
    [("--args", list), ("--kwargs", dict), ("--payload", dict)],
)
@pytest.mark.parametrize("verb", [["submit", "pt.noop"], ["schedule", "add", "s", "--job", "j"]])
def test_json_options_say_how_to_write_a_list_or_an_object(
    cli: Outlast, verb: list[str], option: str, shape: type
) -> None:
    every = ["--every", "1m"] if verb[0] == "schedule" else []
    result = cli(*verb, *every, option, "hi")
    assert result.code == 2, result
    assert "not JSON" in result.err and "Traceback" not in result.err, result.err
    found = re.search(r"write it as JSON: '([^']*)'", result.err)
    assert found is not None, result.err
    assert isinstance(json.loads(found[1]), shape), result.err
    if shape is list:
        assert found[1] == '["hi"]', result.err
    else:
        assert found[1] == '{"key": "value"}', result.err


def test_the_hint_for_args_is_accepted(cli: Outlast) -> None:
    """What the hint says to write for ``--args hi`` is taken."""
    env = {"PYTHONPATH": str(Path(__file__).parents[2])}
    submit = ["submit", "pt.noop", "--import", "tests.pool.jobs_for_tests"]
    refused = cli(*submit, "--args", "hi", env=env)
    found = re.search(r"write it as JSON: '([^']*)'", refused.err)
    assert refused.code == 2 and found is not None, refused
    doc = cli(*submit, "--args", found[1], "--json", env=env).json()
    assert doc["call"]["args"] == ["hi"]


def test_every_verb_names_its_exit_codes_in_help(tmp_path: Path) -> None:
    runner = CliRunner()
    verbs: list[list[str]] = []
    for name, command in click_cli.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        verbs += [[name], *([name, sub] for sub in subs)] if subs else [[name]]
    assert ["group"] in verbs and ["schedule"] in verbs
    assert len(verbs) > 20
    for verb in verbs:
        shown = runner.invoke(click_cli, [*verb, "--help"])
        assert shown.exit_code == 0, (verb, shown.output)
        text = " ".join(shown.output.split())
        assert "Exit codes: 0" in text, verb
        assert "5 the store failed" in text, verb
    wait_help = " ".join(runner.invoke(click_cli, ["wait", "--help"]).output.split())
    assert "4 paused for an answer" in wait_help and "124 timed out" in wait_help


def test_submit_from_a_file(cli: Outlast) -> None:
    jobs = cli.tmp / "jobs.jsonl"
    jobs.write_text("".join(f'{{"args": [{i}], "labels": {{"f": "1"}}}}\n' for i in range(50)))
    env = {"PYTHONPATH": str(Path(__file__).parents[2])}
    made = cli(
        "submit", "pt.noop", "--import", "tests.pool.jobs_for_tests", "--from-file", str(jobs),
        "--json", env=env,
    ).json()  # fmt: skip
    assert made["count"] == 50
    listed = cli("ls", "--label", "f=1", "--limit", "100", "--json").json()["jobs"]
    assert {d["id"] for d in listed} == set(made["ids"])
    assert sorted(d["call"]["args"][0] for d in listed) == list(range(50))
    bad = cli.tmp / "bad.jsonl"
    bad.write_text('{"args": [1]}\n{"args": [1, 2]}\n')
    refused = cli(
        "submit", "pt.noop", "--import", "tests.pool.jobs_for_tests", "--from-file", str(bad),
        env=env,
    )  # fmt: skip
    assert refused.code == 2 and "job 2: " in refused.err, refused
    assert len(cli("ls", "--limit", "100", "--json").json()["jobs"]) == 50


def test_logs_by_pieces(cli: Outlast) -> None:
    job_id = cli("run", "--", "sh", "-c", "for i in $(seq 1 100); do echo line-$i; done").ok()
    job_id = job_id.out.strip()
    cli("wait", job_id).ok()
    assert cli("logs", job_id, "--tail", "2").ok().out == "line-99\nline-100\n"
    text, offset = "", 0
    while True:
        piece = cli("logs", job_id, "--offset", str(offset), "--limit", "100", "--json").json()
        assert piece["offset"] == offset
        text, offset = text + piece["text"], piece["next_offset"]
        if piece["done"]:
            break
    assert text.splitlines() == [f"line-{i}" for i in range(1, 101)]
    assert cli("logs", job_id, "--offset", "7").ok().out.startswith("line-2\n")
    both = cli("logs", job_id, "--tail", "1", "--offset", "0")
    assert both.code == 2 and "not both" in both.err


def test_ls_json_and_get_jobs_print_the_same_shape(cli: Outlast) -> None:
    ids = [cli("run", "--label", "same=1", "--", "true").ok().out.strip() for _ in range(3)]
    for job_id in ids:
        cli("wait", job_id).ok()
    server = Server(cli.url, cli.tmp)
    try:
        with server.client() as http:
            pages = [
                http.get("/jobs", params={"limit": 2, "label": "same=1"}),
                http.get("/jobs", params={"limit": 2, "before": ids[1]}),
            ]
        listed = [
            cli("ls", "--limit", "2", "--label", "same=1", "--json").json(),
            cli("ls", "--limit", "2", "--before", ids[1], "--json").json(),
        ]
    finally:
        server.close()
    for answer, page in zip(pages, listed, strict=True):
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert set(got) == set(page) == {"jobs", "next"}, (got, page)
        assert got["next"] == page["next"]
        assert [d["id"] for d in got["jobs"]] == [d["id"] for d in page["jobs"]]
        for over_http, on_cli in zip(got["jobs"], page["jobs"], strict=True):
            assert set(over_http) == set(on_cli), set(over_http) ^ set(on_cli)
            assert set(on_cli) >= DOC_FIELDS
    assert listed[0]["next"] == ids[1] and [d["id"] for d in listed[1]["jobs"]] == [ids[0]]
