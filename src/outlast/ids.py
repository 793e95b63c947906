"""Job ids: opaque strings from the store, and the one check every id passes before use."""

from __future__ import annotations

import os
import re
import time

from outlast.errors import InvalidJobId

MAX_ID_LENGTH = 128
#: The reserved queue of spawned jobs: each has a dedicated worker, and pools never claim it.
DEDICATED = "@dedicated"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def new_id() -> str:
    """A fresh id: 12 hex digits of milliseconds then 16 random hex digits (sorts by time).

    64 random bits, because ids made in one millisecond differ only there: a ``submit_many``
    makes ~50 a millisecond, and with 32 bits two of them were the same about once in 175
    million jobs (the second refused as a duplicate, failing its whole batch). With 64 the
    chance is ~10^-16 a millisecond. (Ids of 20 characters, from before, stay valid.)"""
    return f"{int(time.time() * 1000):012x}{os.urandom(8).hex()}"


def check_queue(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name (the rule of ids; ``@…`` names are
    reserved for outlast's own), else raise :class:`InvalidInput`."""
    from outlast.errors import InvalidInput

    try:
        return check_id(queue)
    except InvalidJobId:
        raise InvalidInput(
            f"invalid queue name {queue!r}: letters, digits, '.', '_' and '-', starting with "
            "a letter or digit"
        ) from None


def check_id(job_id: object) -> str:
    """Return ``job_id`` if it is a single clean name, else raise :class:`InvalidJobId`.

    Called before an id touches a path or a query: refuses ``../x``, ``a/b``, ``.``, ``..``,
    the empty string, a NUL, and anything over 128 characters.
    """
    if not isinstance(job_id, str):
        raise InvalidJobId(f"a job id must be a string, not {type(job_id).__name__}")
    if len(job_id) > MAX_ID_LENGTH:
        raise InvalidJobId(f"job id is {len(job_id)} characters long; at most {MAX_ID_LENGTH}")
    if not _ID.fullmatch(job_id):
        shown = job_id if len(job_id) <= 40 else job_id[:40] + "…"
        raise InvalidJobId(
            f"invalid job id {shown!r}: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit"
        )
    return job_id
