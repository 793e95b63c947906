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


def _duration(seconds: float) -> str:
    from outlast.when import format_duration

    return format_duration(seconds)


def _until(stamp: str, now: datetime | None = None) -> str:
    """``in 5m`` (or ``due now``) until an ISO time."""
    from datetime import UTC, datetime

    seconds = (datetime.fromisoformat(stamp) - (now or datetime.now(UTC))).total_seconds()
    return f"in {_duration(seconds)}" if seconds >= 0.5 else "due now"


def _progress(doc: dict[str, Any]) -> str:
    value = doc.get("progress")
    return "-" if value is None else f"{value:.0f}%"


def _status(doc: dict[str, Any]) -> str:
    status = str(doc["status"])
    if doc.get("max_attempts", 1) > 1 or doc.get("attempts", 0) > 1:
        status += f" (attempt {doc.get('attempts', 0)} of {doc.get('max_attempts', 1)})"
    return status


def _time_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Its times, its timeout and retention, and the schedule that made it."""
    rows = []
    if doc.get("timeout") is not None:
        rows.append(("timeout", _duration(doc["timeout"])))
    fired = doc.get("fired")
    if fired:
        why = {"catch_up": ", a catch-up", "manual": ", run by hand"}.get(fired.get("reason"), "")
        rows.append(("schedule", f"{fired.get('schedule')} (for {fired.get('fire_at')}{why})"))
    for key in ("created_at", "started_at", "finished_at"):
        if doc.get(key):
            rows.append((key.replace("_at", "").replace("_", " "), doc[key]))
    if doc.get("run_after") and doc.get("status") == "pending":
        rows.append(("runs at", f"{doc['run_after']} ({_until(doc['run_after'])})"))
    if doc.get("keep") is not None:
        rows.append(("kept for", _duration(doc["keep"]) + " after it finishes"))
    return rows


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
    if doc.get("priority"):
        rows.append(("priority", str(doc["priority"])))
    if doc.get("unique_key") is not None:
        rows.append(("unique key", doc["unique_key"]))
    if doc.get("retry_of"):
        rows.append(("retry of", doc["retry_of"]))
    if doc.get("limit_key") is not None:
        slots = f" (its own limit {doc['limit']})" if doc.get("limit") else ""
        rows.append(("limit key", f"{doc['limit_key']}{slots}"))
    if doc.get("question") is not None and doc["status"] == "paused":
        rows.append(("question", json.dumps(doc["question"], ensure_ascii=False)))
    if doc.get("answer") is not None:
        rows.append(("answer", json.dumps(doc["answer"], ensure_ascii=False)))
    rows += [(k, str(doc[k])) for k in ("pid", "worker") if doc.get(k)]
    rows += _time_rows(doc)
    rows += _outcome_rows(doc)
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)
    tb = (doc.get("error") or {}).get("traceback")
    if tb:
        text += "\n" + traceback_text(tb)
    return text


def traceback_text(tb: str, title: str = "traceback") -> str:
    """A stored traceback, indented under its title."""
    body = "\n".join("  " + line for line in tb.rstrip("\n").splitlines())
    return f"{title}:\n{body}"


def attempt_tracebacks(events: list[dict[str, Any]]) -> str:
    """Each failed attempt's traceback, from the job's failure events, oldest first."""
    parts = []
    for event in events:
        message = event.get("message")
        if event.get("status") != "failed" or not isinstance(message, dict):
            continue
        error = message.get("error") or {}
        head = (
            f"attempt {message.get('attempt', '?')}: [{error.get('code')}] {error.get('message')}"
        )
        tb = error.get("traceback")
        parts.append(traceback_text(tb, head) if tb else head)
    return "\n\n".join(parts) if parts else "no failed attempts"


def jobs_table(docs: list[dict[str, Any]]) -> str:
    """A listing, one job a line, newest first."""
    if not docs:
        return "no jobs"
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [("ID", "STATUS", "PROGRESS", "STEP", "AGE", "NAME")]
    for d in docs:
        status = d["status"]
        if status == "pending" and d.get("run_after"):
            status = f"pending ({_until(d['run_after'], now)})"
        if d.get("priority"):
            status += f" p{d['priority']:+d}"
        rows.append(
            (
                d["id"],
                status,
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


def schedules_table(docs: list[dict[str, Any]]) -> str:
    """Schedules, one a line: name, when, next fire time, the last job and its status."""
    if not docs:
        return "no schedules"
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [("NAME", "WHEN", "NEXT", "LAST JOB", "JOB")]
    for d in docs:
        when = f"cron {d['cron']}" if d.get("cron") else f"every {_duration(d['every'])}"
        if d.get("cron") and d.get("tz") not in (None, "UTC"):
            when += f" ({d['tz']})"
        nxt = "paused" if d.get("paused") else "-"
        if not d.get("paused") and d.get("next_at"):
            nxt = f"{d['next_at'][:19]}Z ({_until(d['next_at'], now)})"
        last = "-"
        if d.get("last_job"):
            last = f"{d['last_job']} {d.get('last_status') or 'deleted'}"
        job = d["job"]
        what = shlex_join(job["command"]) if job.get("command") else job["name"]
        rows.append((d["id"], when, nxt, last, what))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(f"{cell:<{widths[i]}}" for i, cell in enumerate(r[:4])) + "  " + r[4]
        for r in rows
    )


def shlex_join(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


def stats_text(doc: dict[str, Any]) -> str:
    """``outlast stats`` for a person."""
    jobs = doc["jobs"]
    lines = ["jobs:      " + "  ".join(f"{n} {status}" for status, n in jobs.items())]
    for name, queue in doc["queues"].items():
        live = "  ".join(f"{queue[s]} {s}" for s in ("pending", "running", "paused"))
        oldest = queue["oldest_due_seconds"]
        waited = f"  oldest due waited {_duration(oldest)}" if oldest else ""
        lines.append(f"queue {name}: {live}{waited}")
    recent = doc["recent"]
    finished = recent["finished"]
    total = sum(finished.values())
    outcomes = ", ".join(f"{n} {status}" for status, n in finished.items())
    window = _duration(recent["window_seconds"])
    line = f"last {window}: {total} finished" + (f" ({outcomes})" if total else "")
    if total:
        wait, run = recent["wait_seconds"], recent["run_seconds"]
        line += (
            f", {recent['per_minute']}/min; waited p50 {_seconds(wait['p50'])}"
            f" p95 {_seconds(wait['p95'])}; ran p50 {_seconds(run['p50'])}"
            f" p95 {_seconds(run['p95'])}"
        )
    lines.append(line)
    sched = doc["schedules"]
    live = ", ".join(f"{n} {kind}" for kind, n in doc.get("workers", {}).items()) or "none"
    lines.append(
        f"workers: {live}; busy {doc['busy_workers']}   schedules: {sched['total']}"
        f" ({sched['paused']} paused, {sched['due']} due)"
    )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else _duration(value)


def queues_table(docs: list[dict[str, Any]]) -> str:
    """``outlast queues`` for a person."""
    if not docs:
        return "no jobs in any queue"
    width = max(5, *(len(d["name"]) for d in docs))
    head = f"{'QUEUE':<{width}}  PENDING  RUNNING  PAUSED  OLDEST DUE WAITED  FINISHED"
    lines = [head]
    for d in docs:
        waited = _duration(d["oldest_due_seconds"]) if d["oldest_due_seconds"] else "-"
        finished = d["succeeded"] + d["failed"] + d["canceled"]
        lines.append(
            f"{d['name']:<{width}}  {d['pending']:>7}  {d['running']:>7}  {d['paused']:>6}"
            f"  {waited:>17}  {finished:>8}"
        )
    return "\n".join(lines)


def workers_table(docs: list[dict[str, Any]]) -> str:
    """``outlast workers`` for a person."""
    if not docs:
        return "no live workers"
    lines = ["KIND          NAME                       QUEUES / JOB            CONC  JOBS  SINCE"]
    for d in docs:
        what = d.get("job") or ",".join(d.get("queues") or []) or "-"
        conc = d.get("concurrency")
        lines.append(
            f"{d.get('kind', '?'):<13} {d.get('name', '?'):<26} {what:<23} "
            f"{conc if conc is not None else '-':>4}  {d.get('jobs', 0):>4}  "
            f"{str(d.get('since', ''))[:19]}"
        )
    return "\n".join(lines)


def timeline_table(doc: dict[str, Any]) -> str:
    """``outlast stats --timeline`` for a person: one line per step, oldest first."""
    from datetime import UTC, datetime

    finished, waits = doc["finished"], doc["wait_seconds"]
    lines = ["STEP (UTC)           SUCCEEDED  FAILED  CANCELED  WAIT P50  WAIT P95"]
    for i, start in enumerate(doc["times"]):
        at = datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(
            f"{at}  {finished['succeeded'][i]:>9}  {finished['failed'][i]:>6}"
            f"  {finished['canceled'][i]:>8}  {_seconds(waits['p50'][i]):>8}"
            f"  {_seconds(waits['p95'][i]):>8}"
        )
    return "\n".join(lines)
