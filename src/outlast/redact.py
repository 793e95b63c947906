"""Secret redaction of text before it is stored.

The values of environment variables whose names look secret (containing ``TOKEN``, ``SECRET``,
``PASSWORD`` or ``KEY``, in any case) are replaced by ``***`` wherever they appear in error
messages and event text. Values shorter than 4 characters are left alone: they would match
too much to mean anything.
"""

from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY", re.IGNORECASE)
_cache: tuple[dict[Any, Any], tuple[str, ...]] | None = None


def secret_values() -> tuple[str, ...]:
    """The secret values of the current environment, longest first.

    Called for every message stored, so the environment is compared, not scanned: a copy
    of its raw mapping (one C-level comparison) says whether anything changed since the
    secrets were last picked out.
    """
    global _cache
    raw = getattr(os.environ, "_data", None)  # CPython's bytes mapping behind os.environ
    if _cache is not None and raw is not None and raw == _cache[0]:
        return _cache[1]
    items = [(k, v) for k, v in os.environ.items() if _SECRET_NAME.search(k)]
    values = {v for _, v in items if len(v) >= 4}
    secrets = tuple(sorted(values, key=len, reverse=True))
    _cache = (dict(raw) if raw is not None else {}, secrets) if raw is not None else None
    return secrets


def redact_text(text: str) -> str:
    for value in secret_values():
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact(value: Any) -> Any:
    """``value`` with every secret in its strings (keys and values, at any depth) masked."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact(k): redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value
