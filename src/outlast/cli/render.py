"""Plain text and JSON output of job documents and events, from their dicts.

Light on purpose (json and datetime only): both the fast path and the click commands print
through here, so a job looks the same whichever way it was read.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing is too heavy for the fast path
if TYPE_CHECKING:
    from datetime import datetime
    from typing import Any


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _age(stamp: str | None, now: datetime | None = None) -> str:
    from datetime import UTC, datetime

    if not stamp:
        return "-"
    seconds = ((now or datetime.now(UTC)) - datetime.fromisoformat(stamp)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def _progress(doc: dict[str, Any]) -> str:
    value = doc.get("progress")
    return "-" if value is None else f"{value:.0f}%"


def _status(doc: dict[str, Any]) -> str:
    status = str(doc["status"])
    if doc.get("max_attempts", 1) > 1 or doc.get("attempts", 0) > 1:
        status += f" (attempt {doc.get('attempts', 0)} of {doc.get('max_attempts', 1)})"
    return status


def _outcome_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    if doc.get("error"):
        err = doc["error"]
        rows.append(("error", f"[{err.get('code')}] {err.get('message')}"))
        if err.get("hint"):
            rows.append(("hint", err["hint"]))
    if doc.get("result") is not None:
        rows.append(("result", json.dumps(doc["result"], ensure_ascii=False)))
    return rows


def job_text(doc: dict[str, Any]) -> str:
    """A job as ``key: value`` lines for a person."""
    status = _status(doc)
    rows = [
        ("id", doc["id"]),
        ("name", doc.get("name")),
        ("kind", doc.get("kind")),
        ("status", status),
    ]
    if doc.get("step"):
        rows.append(("step", f"{doc['step']} ({doc.get('phase')})"))
    if doc.get("progress") is not None:
        rows.append(("progress", _progress(doc)))
    if doc.get("command"):
        import shlex

        rows.append(("command", shlex.join(doc["command"])))
    if doc.get("labels"):
        rows.append(("labels", " ".join(f"{k}={v}" for k, v in sorted(doc["labels"].items()))))
    if doc.get("queue", "default") != "default":
        rows.append(("queue", doc["queue"]))
    if doc.get("question") is not None and doc["status"] == "paused":
        rows.append(("question", json.dumps(doc["question"], ensure_ascii=False)))
    if doc.get("answer") is not None:
        rows.append(("answer", json.dumps(doc["answer"], ensure_ascii=False)))
    rows += [(k, str(doc[k])) for k in ("pid", "worker") if doc.get(k)]
    for key in ("created_at", "started_at", "finished_at", "run_after"):
        if doc.get(key):
            rows.append((key.replace("_at", "").replace("_", " "), doc[key]))
    rows += _outcome_rows(doc)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)


def jobs_table(docs: list[dict[str, Any]]) -> str:
    """A listing, one job a line, newest first."""
    if not docs:
        return "no jobs"
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [("ID", "STATUS", "PROGRESS", "STEP", "AGE", "NAME")]
    for d in docs:
        rows.append(
            (
                d["id"],
                d["status"],
                _progress(d),
                d.get("step") or "-",
                _age(d.get("created_at"), now),
                d.get("name") or "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join(
        "  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(r[:5])) + "  " + r[5]
        for r in rows
    )


def event_line(event: dict[str, Any]) -> str:
    message = event.get("message")
    text = (
        ""
        if message is None
        else (message if isinstance(message, str) else json.dumps(message, ensure_ascii=False))
    )
    stamp = event["at"][11:23]
    return f"{stamp}  #{event['seq']:<4} {event['step']:<16} {event['status']:<9} {text}".rstrip()
