"""Durations and points in time as people write them: the one parser every interface uses.

- A **duration** is a number of seconds (``90``, ``1.5``) or a number with a unit, and may
  chain units: ``90s``, ``15m``, ``12h``, ``7d``, ``2w``, ``1h30m``, ``250ms``.
- A **time** is ISO 8601 with a time zone (``2026-12-24T03:00Z``,
  ``2026-12-24T04:00:00+01:00``); a time without a zone is refused rather than guessed.

Errors are :class:`~outlast.errors.InvalidInput` naming the value and what was expected.
Standard library only: the CLI's fast path may import this.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from outlast.errors import InvalidInput

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_WHOLE = re.compile(r"(?:\s*(?:\d+(?:\.\d*)?|\.\d+)\s*(?:ms|s|m|h|d|w))+\s*", re.IGNORECASE)
#: The longest delay or duration accepted (100 years): beyond it a value is a typo.
MAX_SECONDS = 100 * 365.25 * 86400
EXAMPLES = "like 90s, 15m, 12h, 7d or 1h30m"


def parse_duration(value: object, what: str = "duration") -> float:
    """Seconds in ``value``: a number of seconds, or text like ``90s``, ``15m``, ``12h``,
    ``7d``, ``1h30m``; a :class:`~datetime.timedelta` is taken as it is. Refuses negative,
    infinite and absurd (over 100 years) values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value.strip(), what)
    else:
        raise InvalidInput(f"{what} must be a number of seconds or text {EXAMPLES}, not {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{what} must be >= 0 seconds, not {value!r}")
    if seconds > MAX_SECONDS:
        raise InvalidInput(f"{what} {value!r} is more than 100 years")
    return seconds


def _parse_text(text: str, what: str) -> float:
    try:
        return float(text)  # a bare number of seconds
    except ValueError:
        pass
    if not _WHOLE.fullmatch(text):
        if text.startswith("-"):
            raise InvalidInput(f"{what} must be >= 0, not {text!r}")
        raise InvalidInput(f"{what} is {EXAMPLES}, not {text!r}")
    return sum(float(n) * UNITS[unit.lower()] for n, unit in _PART.findall(text))


def parse_time(value: object, what: str = "time") -> datetime:
    """An aware time from ``value``: an aware :class:`~datetime.datetime`, or ISO 8601 text
    with a time zone (``Z`` or an offset). Returned in UTC."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        text = value.strip()
        if text[-1:] in ("z", "Z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(
                f"{what} must be an ISO 8601 time like 2026-12-24T03:00Z, not {value!r}"
            ) from None
    else:
        raise InvalidInput(f"{what} must be an ISO 8601 time, not {value!r}")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(
            f"{what} {value!s} has no time zone: add Z for UTC or an offset like +01:00"
        )
    return parsed.astimezone(UTC)


def due_time(
    delay: object = None, at: object = None, now: datetime | None = None
) -> tuple[datetime | None, bool]:
    """When a job given ``delay`` (a duration) or ``at`` (a time) is due, and whether ``at``
    was already past (the job then runs now: say so to the user). Both: refused."""
    if delay is not None and at is not None:
        raise InvalidInput("give a delay or a time to run at, not both")
    now = now or datetime.now(UTC)
    if delay is not None:
        seconds = parse_duration(delay, "delay")
        return (now + timedelta(seconds=seconds) if seconds > 0 else None), False
    if at is not None:
        when = parse_time(at, "the time to run at")
        if when <= now:
            return None, True
        return when, False
    return None, False


def format_duration(seconds: float) -> str:
    """A duration for people: ``45s``, ``15m``, ``2h30m``, ``3d4h``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 or seconds == int(seconds) else f"{seconds:.1f}s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            count = int(seconds // size)
            seconds -= count * size
            out += f"{count}{unit}"
            if len(out) > 3:
                break
    return out
