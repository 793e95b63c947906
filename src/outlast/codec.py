"""The stored JSON of job documents and events: compact, exactly ``to_dict()``, fast.

Every adapter stores these bytes, and a pool hands them to its job processes, so the encoding
is on every transition's path: orjson where it can, the standard library for integers beyond
64 bits (orjson refuses to write them, and reads them back as floats: a document with a run of
19 or more digits is read by the standard library instead).
"""

from __future__ import annotations

import json
import re
from datetime import UTC
from typing import Any

import orjson

from outlast.errors import CorruptJob, InvalidInput
from outlast.model import JobState, ProgressEvent


def _dumps(value: Any) -> bytes:
    """Compact JSON; orjson when it can (several times faster, on every transition's path),
    the standard library for what orjson refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        pass
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:  # check_json keeps such values out: a last guard
        raise InvalidInput(f"cannot be stored as JSON: {exc}") from None


_LONG_NUMBER = re.compile(r"\d{19}")  # may exceed 64 bits (or sit in a string: harmless)


def _loads(text: str) -> Any:
    if _LONG_NUMBER.search(text):
        return json.loads(text)  # exact integers of any size
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)  # raises the standard library's (more familiar) message


_TIMES = ("run_after", "pid_started_at", "created_at", "started_at", "updated_at", "finished_at")


def encode(state: JobState) -> bytes:
    """The stored document: exactly ``state.to_dict()`` as compact JSON.

    orjson writes the frozen dataclass itself (3x faster than building the dict first, and
    this is on every transition's path). It would write a time whose microsecond is 0
    without its fraction, so such a (rare) state goes through ``to_dict``, like anything
    orjson refuses, and every stored time keeps the one format.
    """
    for name in _TIMES:
        value = getattr(state, name)
        if value is not None and (value.microsecond == 0 or value.tzinfo is not UTC):
            return _dumps(state.to_dict())
    try:
        return orjson.dumps(state)
    except TypeError:
        return _dumps(state.to_dict())


def decode(job_id: str, raw: bytes | str | None) -> JobState:
    """Parse a stored document; :class:`CorruptJob` names the job and says what is wrong."""
    try:
        if raw is None or len(raw) == 0:
            raise CorruptJob("the document is empty")
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        data = _loads(text)
        state = JobState.from_dict(data)
    except CorruptJob as exc:
        raise CorruptJob(f"job {job_id} is corrupt: {exc.message}") from exc
    except UnicodeDecodeError as exc:
        raise CorruptJob(f"job {job_id} is corrupt: not valid UTF-8 ({exc.reason})") from exc
    except ValueError as exc:
        raise CorruptJob(f"job {job_id} is corrupt: not valid JSON ({exc})") from exc
    except TypeError as exc:
        raise CorruptJob(f"job {job_id} is corrupt: {exc}") from exc
    if state.id != job_id:
        raise CorruptJob(f"job {job_id} is corrupt: the document names job {state.id!r}")
    return state


def encode_event(event: ProgressEvent) -> bytes:
    return _dumps(event.to_dict())
