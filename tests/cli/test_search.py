"""``outlast ls --name --id-prefix`` (the store's search, with ``GET /jobs``' names) and
``outlast stats --timeline`` on both local stores; bad input is one line and exit 2."""

from __future__ import annotations

import pytest

from tests.cli.helpers import Outlast, error_lines

STORES = pytest.mark.parametrize("cli", ["sqlite", "files"], indirect=True)


@STORES
def test_ls_searches_by_name_and_id_prefix(cli: Outlast) -> None:
    store = cli.store
    resize = [store.create(kind="function", name="Images.Resize").id for _ in range(3)]
    mail = store.create(kind="function", name="mail.send", labels={"team": "growth"}).id
    dump = store.create(kind="command", command=["pg_dump", "shop"]).id

    def ids(*args: str) -> list[str]:
        return [d["id"] for d in cli("ls", *args, "--json").json()["jobs"]]

    assert ids("--name", "RESIZE") == resize[::-1]
    assert ids("--name", "dump") == [dump]
    assert ids("--name", "s", "--label", "team=growth") == [mail]
    assert ids("--id-prefix", resize[1]) == [resize[1]]
    assert ids("--id-prefix", resize[1], "--name", "mail") == []
    assert ids("--name", "resize", "--limit", "2") == resize[:0:-1]
    page = cli("ls", "--name", "resize", "--limit", "2", "--json").json()
    assert page["next"] == resize[1]
    later = cli("ls", "--name", "resize", "--limit", "2", "--before", page["next"], "--json")
    assert [d["id"] for d in later.json()["jobs"]] == [resize[0]]
    table = cli("ls", "--name", "mail").ok().out
    assert mail in table and resize[0] not in table


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--id-prefix", "a/b"), "no job id starts with 'a/b'"),
        (("--id-prefix", ""), "the id prefix is empty"),
        (("--id-prefix", "x" * 200), "at most 128"),
        (("--name", ""), "the name search is empty"),
        (("--name", "x" * 201), "at most 200"),
        (("--name", "a\tb"), "control character"),
    ],
)
def test_bad_search_input_is_one_line_and_exit_2(
    cli: Outlast, args: tuple[str, ...], says: str
) -> None:
    cli.store.create(kind="function", name="there")
    result = cli("ls", *args)
    assert result.code == 2, result
    [line] = error_lines(result.err)
    assert line.startswith("outlast: error: ") and says in line, line
    assert result.out == ""


@STORES
def test_stats_timeline(cli: Outlast) -> None:
    for ok in (True, False):
        task = cli.store.create(kind="function", name="t")
        task.start()
        if ok:
            task.succeed(1)
        else:
            task.fail("boom", retry=False)
    doc = cli("stats", "--timeline", "--json").json()
    assert (doc["window_seconds"], doc["step_seconds"], len(doc["times"])) == (3600, 60, 60)
    assert sum(doc["finished"]["succeeded"]) == 1 and sum(doc["finished"]["failed"]) == 1
    short = cli("stats", "--timeline", "--window", "10m", "--step", "1m").ok().out.splitlines()
    assert short[0].split()[:3] == ["STEP", "(UTC)", "SUCCEEDED"] and len(short) == 11
    bad = cli("stats", "--timeline", "--step", "2h")
    assert bad.code == 2 and "longer than the window" in bad.err, bad
