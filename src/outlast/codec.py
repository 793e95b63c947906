"""The stored JSON of job documents and events: compact, exactly ``to_dict()``, fast.

Every adapter stores these bytes, and a pool hands them to its job processes, so the encoding
is on every transition's path: orjson where it can, the standard library for integers beyond
64 bits (orjson refuses to write them, and reads them back as floats: a document with a run of
19 or more digits is read by the standard library instead).
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

import orjson

from outlast.errors import CorruptJob, InvalidInput
from outlast.model import (
    Call,
    ErrorInfo,
    JobState,
    Kind,
    PipelineState,
    ProgressEvent,
    Schedule,
)


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


#: Every digit made a "0", so that a run of 19 digits (a number that may exceed 64 bits, or
#: harmlessly, a run inside a string) is found by a plain substring search: 10x faster than
#: a regular expression, and this is on every read of a document.
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19


def _loads(raw: bytes) -> Any:
    if _LONG_RUN in raw.translate(_DIGITS):
        return json.loads(raw.decode("utf-8"))  # exact integers of any size
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # the standard library's (more familiar) message; UTF-8 only, as orjson
        return json.loads(raw.decode("utf-8"))


def encode(state: JobState) -> bytes:
    """The stored document: exactly ``state.to_dict()`` as compact JSON.

    orjson writes the frozen dataclass itself (3x faster than building the dict first, and
    this is on every transition's path). It would write a time whose microsecond is 0
    without its fraction, so such a (rare) state goes through ``to_dict``, like anything
    orjson refuses, and every stored time keeps the one format.
    """
    if state.fired is not None:  # a nested time: written by to_dict, in the one format
        return _dumps(state.to_dict())
    for value in (  # the state's times (a tuple of attributes: on every write's path)
        state.run_after,
        state.pid_started_at,
        state.created_at,
        state.started_at,
        state.updated_at,
        state.finished_at,
    ):
        if value is not None and (value.microsecond == 0 or value.tzinfo is not UTC):
            return _dumps(state.to_dict())
    try:
        return orjson.dumps(state)
    except TypeError:
        return _dumps(state.to_dict())


def decode(job_id: str, raw: bytes | str | None) -> JobState:
    """Parse a stored document (of this version's shape or the first one's, see
    :func:`upgrade`); :class:`CorruptJob` names the job and says what is wrong."""
    try:
        if raw is None or len(raw) == 0:
            raise CorruptJob("the document is empty")
        data = _loads(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
        if isinstance(data, dict) and "call" not in data:
            data = upgrade(data)
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


#: What the first shape of the document (outlast 0.1.0's first sessions) kept in ``payload``,
#: by kind: the system's own keys, moved to their typed fields by :func:`upgrade`. A pipeline's
#: user could not use ``cleanup``, ``stages`` and ``finalize`` (refused then), but could use
#: ``timeout`` and ``canceling``: see :func:`upgrade`.
_LEGACY_KEYS = {
    Kind.COMMAND: ("grace",),
    Kind.FUNCTION: ("module", "args", "kwargs", "timeout"),
    Kind.PIPELINE: ("module", "cleanup", "stages", "finalize"),
}


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A document of the first shape (no ``call`` field; the system's keys in ``payload``)
    in this version's shape: each system key leaves the payload for its typed field. Only
    the keys that version wrote for the job's kind move; everything else stays the user's.

    A pipeline's ``timeout`` in the payload was both the user's (stage input) and, then, the
    kill deadline: it is copied to the field and stays. Its ``canceling`` was the system's
    only when true (a cancel in progress): only then does it move.
    """
    payload = data.get("payload")
    try:
        kind = Kind(str(data.get("kind")))
    except ValueError:
        return data  # from_dict says what is wrong
    if not isinstance(payload, dict):
        return data
    payload = dict(payload)
    system = {key: payload.pop(key) for key in _LEGACY_KEYS[kind] if key in payload}
    if kind == Kind.PIPELINE:
        if "timeout" in payload:
            system["timeout"] = payload["timeout"]
        if payload.get("canceling") is True:
            system["canceling"] = payload.pop("canceling")
    out = dict(data, payload=payload, call=None)
    for name in ("timeout", "grace"):
        value = system.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            out[name] = value
    if kind != Kind.COMMAND:
        module = system.get("module")
        args = system.get("args", []) if kind == Kind.FUNCTION else []
        kwargs = system.get("kwargs", {}) if kind == Kind.FUNCTION else {}
        out["call"] = Call(module if isinstance(module, str) else "", args, kwargs).to_dict()
    if kind == Kind.PIPELINE:
        final = system.get("finalize")
        out["pipeline"] = PipelineState.from_dict(
            {
                "cleanup": system.get("cleanup") or [],
                "stages": system.get("stages") or {},
                "finalize": ErrorInfo.from_dict(final).to_dict() if final else None,
            }
        ).to_dict()
        out["cancel_requested"] = system.get("canceling") is True
    return out


def encode_event(event: ProgressEvent) -> bytes:
    return _dumps(event.to_dict())


def decode_event(job_id: str, raw: bytes | str) -> ProgressEvent:
    """Parse a stored event; :class:`CorruptJob` names the job and says what is wrong."""
    try:
        data = _loads(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
        event = ProgressEvent.from_dict(data)
    except CorruptJob as exc:
        raise CorruptJob(f"job {job_id} has a corrupt event: {exc.message}") from exc
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptJob(f"job {job_id} has a corrupt event: {exc}") from exc
    if event.job_id != job_id:
        raise CorruptJob(f"job {job_id} has a corrupt event: it names job {event.job_id!r}")
    return event


def encode_schedule(schedule: Schedule) -> bytes:
    return _dumps(schedule.to_dict())


def decode_schedule(name: str, raw: bytes | str | None) -> Schedule:
    """Parse a stored schedule; :class:`CorruptJob` names it and says what is wrong."""
    try:
        if raw is None or len(raw) == 0:
            raise CorruptJob("the document is empty")
        data = _loads(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
        schedule = Schedule.from_dict(data)
    except CorruptJob as exc:
        raise CorruptJob(f"schedule {name} is corrupt: {exc.message}") from exc
    except (ValueError, TypeError) as exc:
        raise CorruptJob(f"schedule {name} is corrupt: {exc}") from exc
    if schedule.id != name:
        raise CorruptJob(f"schedule {name} is corrupt: the document names {schedule.id!r}")
    return schedule
