"""``Store.list(name=, id_prefix=)`` on every adapter: a name search is a case-insensitive
substring (casefolded, so every store agrees), an id prefix is exact, every filter given must
hold, the ``before`` cursor pages a search, the SQL stores' fast paths give what their
fallbacks give, and bad input is refused before any query."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest

from outlast import cron
from outlast.errors import InvalidInput
from outlast.model import Kind
from outlast.store import Store, _sqllist
from outlast.store.query import MAX_NAME_SEARCH


def _names(states: list[Any]) -> list[str]:
    return [s.name for s in states]


def _ids(states: list[Any]) -> list[str]:
    return [s.id for s in states]


@pytest.fixture
def jobs(store: Store) -> dict[str, list[str]]:
    """Jobs of a few names (newest last in each list), some labeled, one finished."""
    made: dict[str, list[str]] = {}
    for name, labels in [
        ("images.Resize", {"team": "media"}),
        ("mail.send_digest", {"team": "growth"}),
        ("images.Resize", {"team": "media"}),
        ("Straße.Räumen", {}),
        ("reports.monthly", {"team": "media"}),
        ("images.Resize", {"team": "growth"}),
    ]:
        made.setdefault(name, []).append(store.create(kind="function", name=name, labels=labels).id)
    made["pg_dump"] = [store.create(kind="command", command=["pg_dump", "shop"]).id]
    done = store.open(made["images.Resize"][0])
    done.start()
    done.succeed(1)
    return made


def test_a_name_search_is_a_substring_of_any_case(store: Store, jobs: dict[str, list[str]]) -> None:
    resize = jobs["images.Resize"][::-1]  # newest first
    assert _ids(store.list(name="resize")) == resize
    assert _ids(store.list(name="IMAGES.RES")) == resize
    assert _ids(store.list(name="es.Re")) == resize
    assert _names(store.list(name="_digest")) == ["mail.send_digest"]  # no wildcards
    assert _names(store.list(name="%")) == [] and _names(store.list(name="*")) == []
    assert _names(store.list(name="dump")) == ["pg_dump"]  # a command's name: its argv[0]
    assert _names(store.list(name="nosuchname")) == []
    # casefolded, on every store: "STRASSE" finds "Straße"
    assert _names(store.list(name="STRASSE")) == ["Straße.Räumen"]
    assert _names(store.list(name="räumen")) == ["Straße.Räumen"]
    # a substring of several names: newest first across them
    both = store.list(name=".")
    assert {s.name for s in both} == {
        "images.Resize",
        "mail.send_digest",
        "Straße.Räumen",
        "reports.monthly",
    }
    assert _ids(both) == [s.id for s in store.list() if s.id in set(_ids(both))]


def test_an_id_prefix_is_exact(store: Store, jobs: dict[str, list[str]]) -> None:
    every = store.list()
    one = every[2].id
    assert _ids(store.list(id_prefix=one)) == [one]
    assert _ids(store.list(id_prefix=one[:-1])) == [
        s.id for s in every if s.id.startswith(one[:-1])
    ]
    assert _ids(store.list(id_prefix=one[:3])) == [s.id for s in every if s.id.startswith(one[:3])]
    assert store.list(id_prefix=one.upper() if one.upper() != one else "Z" + one) == []
    assert store.list(id_prefix=one + "0") == []
    # '_', '.' and '-' are characters of ids, not wildcards (a schedule's jobs' ids start
    # with its name)
    template = cron.template(Kind.FUNCTION, "odd")
    odd = []
    for name in ("a_b", "axb", "a-b"):
        store.add_schedule(cron.new_schedule(name, template, every=3600.0))
        odd.append(store.run_schedule_now(name).id)
    assert _ids(store.list(id_prefix="a_b")) == [odd[0]]
    assert _ids(store.list(id_prefix="a-")) == [odd[2]]
    assert _ids(store.list(id_prefix="a")) == odd[::-1]
    assert _ids(store.list(id_prefix="a_b.")) == [odd[0]]


def test_a_long_name_is_searched_in_its_first_500_characters(store: Store) -> None:
    """(PostgreSQL refuses an index entry over 8 KiB: a name of 10,000 letters that do not
    compress would otherwise make its job impossible to create.)"""
    letters = "".join(random.Random(5).choices(string.ascii_lowercase, k=10_000))
    long = store.create(kind="function", name=f"Head.{letters}.tail").id
    assert _ids(store.list(name="head." + letters[:50])) == [long]
    assert _ids(store.list(name=letters[200 : 200 + MAX_NAME_SEARCH])) == [long]
    assert store.list(name=letters[600:700]) == [] and store.list(name=".tail") == []
    assert store.get(long).name.endswith(".tail")  # the name itself is kept whole


def test_every_filter_must_hold(store: Store, jobs: dict[str, list[str]]) -> None:
    resize = jobs["images.Resize"]
    assert _ids(store.list(name="resize", label="team=media")) == resize[1::-1]
    assert _ids(store.list(name="resize", label="team=growth")) == [resize[2]]
    assert _ids(store.list(name="resize", status="succeeded")) == [resize[0]]
    assert _ids(store.list(name="resize", status="pending", label={"team": "media"})) == [resize[1]]
    assert store.list(name="digest", label="team=media") == []
    assert _ids(store.list(name="resize", id_prefix=resize[2])) == [resize[2]]
    assert store.list(name="digest", id_prefix=resize[2]) == []
    assert _ids(store.list(id_prefix=resize[2], status="pending")) == [resize[2]]


def test_a_search_pages_by_the_before_cursor(store: Store) -> None:
    made = [store.create(kind="function", name=f"batch.Page{i % 3}").id for i in range(25)]
    other = [store.create(kind="function", name="elsewhere").id for _ in range(5)]
    pages, cursor = [], None
    while True:
        page = store.list(name="page", limit=7, before=cursor)
        pages.append(_ids(page))
        if len(page) < 7:
            break
        cursor = page[-1].id
    assert [len(p) for p in pages] == [7, 7, 7, 4]
    assert [job for page in pages for job in page] == made[::-1]
    assert not set(other) & {job for page in pages for job in page}
    page1 = store.list(name="page1", limit=3)
    assert _ids(page1) == [j for i, j in enumerate(made) if i % 3 == 1][::-1][:3]
    later = store.list(name="page1", limit=3, before=page1[-1].id)
    assert _ids(later) == [j for i, j in enumerate(made) if i % 3 == 1][::-1][3:6]


def test_the_fast_paths_give_what_the_scans_give(
    store: Store, jobs: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQL stores read a name search through its distinct names and an id prefix
    through its ids; past their limits they scan. Both ways find the same jobs."""
    for i in range(6):
        store.create(kind="function", name=f"many.name{i}", labels={"n": str(i)})
    every = store.list()
    prefix = every[0].id[:10]
    queries: list[dict[str, Any]] = [
        {"name": "resize"},
        {"name": "many.name"},
        {"name": "a"},
        {"name": "nosuch"},
        {"name": "resize", "label": "team=media"},
        {"id_prefix": prefix},
        {"id_prefix": every[3].id},
        {"id_prefix": "zz"},
        {"name": "name", "id_prefix": prefix},
    ]
    fast = [_ids(store.list(limit=50, **q)) for q in queries]
    monkeypatch.setattr(_sqllist, "MAX_NAMES", 3)  # more distinct names than that: a scan
    monkeypatch.setattr(_sqllist, "MAX_PREFIXED", 1)  # an id prefix of more jobs: a filter
    scanned = [_ids(store.list(limit=50, **q)) for q in queries]
    monkeypatch.setattr(_sqllist, "MAX_NAMES", 500)
    monkeypatch.setattr(_sqllist, "MAX_BRANCHES", 1)  # a search of many names: a scan
    branched = [_ids(store.list(limit=50, **q)) for q in queries]
    assert fast == scanned == branched
    for q, found in zip(queries, fast, strict=True):
        want = [
            s.id
            for s in every
            if q.get("name", "").casefold() in s.name.casefold()
            and s.id.startswith(q.get("id_prefix", ""))
            and ("label" not in q or s.labels.get("team") == "media")
        ]
        assert found == want, q
    # and without a limit, too
    assert _ids(store.list(name="resize", limit=None)) == fast[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "empty"),
        ({"name": "x" * (MAX_NAME_SEARCH + 1)}, f"at most {MAX_NAME_SEARCH}"),
        ({"name": "a\x00b"}, "control character"),
        ({"name": "tab\there"}, "control character"),
        ({"name": 7}, "string"),
        ({"id_prefix": ""}, "empty"),
        ({"id_prefix": "a/b"}, "no job id starts with 'a/b'"),
        ({"id_prefix": "../etc"}, "no job id starts with"),
        ({"id_prefix": ".hidden"}, "start with a letter or digit"),
        ({"id_prefix": "a b"}, "only letters, digits"),
        ({"id_prefix": "a%"}, "only letters, digits"),
        ({"id_prefix": "é"}, "only letters, digits"),
        ({"id_prefix": "a\x00"}, "only letters, digits"),
        ({"id_prefix": "a" * 129}, "at most 128"),
        ({"id_prefix": ["a"]}, "string"),
    ],
)
def test_bad_search_input_is_refused(store: Store, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        store.list(**kwargs)
