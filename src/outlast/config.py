"""Configuration from the environment, read when asked (never at import), with clear errors."""

from __future__ import annotations

import os

from outlast.errors import InvalidInput


def _number(name: str, default: float, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"${name} must be a number of seconds, not {raw!r}") from None
    if not value >= minimum or value == float("inf"):
        raise InvalidInput(f"${name} must be a finite number >= {minimum}, not {raw!r}")
    return value


def poll_bounds() -> tuple[float, float]:
    """``(WORKER_POLL_MIN, WORKER_POLL_MAX)``: a pool's polling backoff bounds, seconds (it
    polls only where the store cannot wake it; see :mod:`outlast.run.pool`)."""
    low = _number("WORKER_POLL_MIN", 0.05, 0.001)
    high = _number("WORKER_POLL_MAX", 2.0, 0.001)
    if high < low:
        raise InvalidInput(f"WORKER_POLL_MAX ({high}) is below WORKER_POLL_MIN ({low})")
    return low, high


def max_retries() -> int:
    """``WORKER_MAX_RETRIES``: the default attempt limit of function and pipeline jobs."""
    raw = os.environ.get("WORKER_MAX_RETRIES", "3").strip() or "3"
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidInput(f"$WORKER_MAX_RETRIES must be a whole number >= 1, not {raw!r}")
    return int(raw)


def retry_delay() -> float:
    """``OUTLAST_RETRY_DELAY``: the first retry's backoff in seconds (doubles per attempt)."""
    return _number("OUTLAST_RETRY_DELAY", 1.0)


def keep() -> float | None:
    """``OUTLAST_KEEP``: how long finished jobs are kept (a duration like ``30d``), after
    which the store's maintainer removes them with their events and logs; unset: forever.
    A job's own ``keep=`` wins over it."""
    raw = os.environ.get("OUTLAST_KEEP", "").strip()
    if not raw or raw in ("forever", "inf"):
        return None
    from outlast.when import parse_duration

    try:
        return parse_duration(raw, "$OUTLAST_KEEP")
    except InvalidInput as exc:
        raise InvalidInput(f"{exc} (or 'forever')") from None


def store_url() -> str | None:
    return os.environ.get("OUTLAST_STORE") or None


def token() -> str | None:
    return os.environ.get("OUTLAST_TOKEN") or None


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidInput(f"${name} must be a whole number >= 1, not {raw!r}")
    return int(raw)


def max_streams() -> int:
    """``OUTLAST_MAX_STREAMS``: event streams a server keeps open at once, in all."""
    return _count("OUTLAST_MAX_STREAMS", 1000)


def max_streams_per_client() -> int:
    """``OUTLAST_MAX_STREAMS_PER_CLIENT``: event streams one client address may hold open."""
    return _count("OUTLAST_MAX_STREAMS_PER_CLIENT", 100)
