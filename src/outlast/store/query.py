"""What a listing (``Store.list``) may filter on, checked once for every adapter: status,
labels, a name search and an id prefix.

**Name search**: a case-insensitive substring of the job's name (``resize`` finds
``images.resize`` and ``Resize-All``), what a user typing in a search box expects; names are
compared casefolded (:func:`fold`), so every store agrees on non-ASCII names too, and only
their first 500 characters are searched. The SQL
stores keep each job's casefolded name in a column of its own (``jobs.name_key``) beside the
time-ordered index the listing reads, so a search costs a walk of that index, not a parse of
documents (BENCHMARKS.md measures it at 100,000 jobs).

**Id prefix**: the ids that start with it, exactly (ids are case-sensitive); a prefix holds
only what an id can (letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from outlast.errors import InvalidInput, InvalidJobId
from outlast.ids import MAX_ID_LENGTH, check_id
from outlast.model import Status
from outlast.store.common import parse_label

#: The longest name search taken (longer names are still found by a part of them).
MAX_NAME_SEARCH = 200
#: How much of a name the search looks at (an index entry has a size limit).
SEARCHED = 500


def fold(name: str) -> str:
    """A name as the search compares it: casefolded, its first :data:`SEARCHED`
    characters."""
    return name.casefold()[:SEARCHED]


class Listed(Protocol):
    """What a filter looks at: a job's state, or an index entry of one."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def labels(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Filter:
    """A listing's filter, checked: every condition must hold."""

    status: Status | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: The name search, casefolded (None: any name).
    name: str | None = None
    id_prefix: str | None = None

    def matches(self, job: Listed) -> bool:
        """Whether ``job`` passes (the files store filters in Python; the SQL stores in SQL)."""
        return (
            (self.status is None or job.status == self.status)
            and (self.id_prefix is None or job.id.startswith(self.id_prefix))
            and (self.name is None or self.name in fold(job.name))
            and all(job.labels.get(k) == v for k, v in self.labels.items())
        )


def make_filter(
    status: Status | str | None = None,
    label: str | Mapping[str, str] | None = None,
    name: str | None = None,
    id_prefix: str | None = None,
) -> Filter:
    """The filter of a listing, or :class:`InvalidInput` saying what is wrong."""
    if status is not None:
        try:
            status = Status(status)
        except ValueError:
            known = ", ".join(s.value for s in Status)
            raise InvalidInput(f"unknown status {status!r}; one of {known}") from None
    return Filter(status, parse_label(label), _name(name), _id_prefix(id_prefix))


def _name(name: object) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidInput(f"a name search is a string, not {type(name).__name__}")
    if not name:
        raise InvalidInput("the name search is empty (leave it out to list every name)")
    if len(name) > MAX_NAME_SEARCH:
        raise InvalidInput(
            f"the name search is {len(name)} characters long; at most {MAX_NAME_SEARCH}"
        )
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise InvalidInput(f"the name search {name[:40]!r} holds a control character")
    return fold(name)


def _id_prefix(prefix: object) -> str | None:
    if prefix is None:
        return None
    if not isinstance(prefix, str):
        raise InvalidInput(f"an id prefix is a string, not {type(prefix).__name__}")
    if not prefix:
        raise InvalidInput("the id prefix is empty (leave it out to list every id)")
    if len(prefix) > MAX_ID_LENGTH:
        raise InvalidInput(
            f"the id prefix is {len(prefix)} characters long; ids have at most {MAX_ID_LENGTH}"
        )
    try:
        check_id(prefix)  # every prefix of an id is itself shaped like one
    except InvalidJobId:
        shown = prefix if len(prefix) <= 40 else prefix[:40] + "…"
        raise InvalidInput(
            f"no job id starts with {shown!r}: ids hold only letters, digits, '.', '_' and "
            "'-', and start with a letter or digit"
        ) from None
    return prefix
