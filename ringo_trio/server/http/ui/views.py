"""What the templates show, computed: payload previews, sparklines, ages.

Everything returned here is plain text or numbers; the templates escape it
(Jinja2 autoescape), so nothing here needs to know about HTML.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ringo_trio._contract.durations import format_duration
from ringo_trio._proto.ringo.v1 import AttemptOutcome, LimitStatus, TaskAttempt, TaskTypeStats

__all__ = [
    "BULK_STATES",
    "PREVIEW_BYTES",
    "HEX_BYTES",
    "age",
    "attempts",
    "bulk_buttons",
    "worker_row",
    "task_row",
    "scheduled",
    "moment",
    "preview",
    "sparkline",
    "timing",
]

# A payload (or result) is up to 1 MiB; a page shows its start only.
PREVIEW_BYTES = 64 * 1024
HEX_BYTES = 4 * 1024
_SPARK_WIDTH = 120
_SPARK_HEIGHT = 24


def preview(data: bytes, view: str) -> tuple[str, str]:
    """(text, note) showing `data` as text, pretty JSON or a hex dump."""
    size = len(data)
    if view == "hex":
        shown = data[:HEX_BYTES]
        lines = [
            f"{offset:08x}  {shown[offset : offset + 16].hex(' '):<47}  "
            + "".join(chr(b) if 32 <= b < 127 else "." for b in shown[offset : offset + 16])
            for offset in range(0, len(shown), 16)
        ]
        return "\n".join(lines), _cut_note(size, HEX_BYTES)
    shown = data[:PREVIEW_BYTES]
    text = shown.decode("utf-8", "replace")
    if view == "json":
        if size > PREVIEW_BYTES:
            return text, f"{size} bytes: too large to parse as JSON here; the first bytes as text"
        try:
            pretty = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            return text, "not valid JSON; shown as text"
        # A "\udcff" escape parses to a lone surrogate, which no UTF-8 page
        # can hold: it is shown as the escape it came from.
        return pretty.encode("utf-8", "backslashreplace").decode("utf-8"), ""
    return text, _cut_note(size, PREVIEW_BYTES)


def _cut_note(size: int, shown: int) -> str:
    return f"the first {shown} of {size} bytes" if size > shown else ""


def sparkline(succeeded: list[int], failed: list[int]) -> dict[str, object]:
    """Polyline points of both series on one scale, for an inline SVG."""
    key = (tuple(succeeded), tuple(failed))
    cached = _SPARKS.get(key)
    if cached is None:
        if len(_SPARKS) >= _MAX_SPARKS:
            _SPARKS.clear()
        cached = _SPARKS[key] = _sparkline(succeeded, failed)
    return cached


# Most queues of an overview draw the same (often flat) lines: formatting 120
# points per queue is most of the page's cost, so drawn lines are kept.
_SPARKS: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[str, object]] = {}
_MAX_SPARKS = 1024


def _sparkline(succeeded: list[int], failed: list[int]) -> dict[str, object]:
    top = max([*succeeded, *failed, 1])
    step = _SPARK_WIDTH / max(len(succeeded) - 1, 1)
    scale = (_SPARK_HEIGHT - 2) / top

    def points(values: list[int]) -> str:
        return " ".join(
            f"{i * step:.1f},{_SPARK_HEIGHT - 1 - v * scale:.1f}" for i, v in enumerate(values)
        )

    return {
        "width": _SPARK_WIDTH,
        "height": _SPARK_HEIGHT,
        "succeeded": points(succeeded),
        "failed": points(failed),
        "total_succeeded": sum(succeeded),
        "total_failed": sum(failed),
    }


def age(since: datetime | None, now: datetime) -> str:
    """'3m 20s' since `since` (empty for None)."""
    if since is None:
        return ""
    seconds = max(int((now - since).total_seconds()), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    return f"{hours // 24}d {hours % 24}h"


def moment(when: datetime | None) -> str:
    """'2030-01-01 02:30:00 UTC' (empty for None)."""
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def timing(cron: str, every: timedelta | None, timezone: str) -> str:
    """A schedule's ticks: '30 2 * * * (Europe/Paris)' or 'every 5m'."""
    if cron:
        return f"{cron} ({timezone or 'UTC'})"
    if every is None:
        return ""
    seconds = int(every.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "every " + ("".join(parts) or "0s")


def rate(starts: float, per: timedelta | None) -> str:
    """'10/1s': a limit rule's rate."""
    return f"{starts:g}/{format_duration(per or timedelta(seconds=1))}"


def until(moment: datetime | None, now: datetime) -> str:
    """'in 250ms' until `moment`; 'now' for None or a past moment."""
    if moment is None or moment <= now:
        return "now"
    ms = (moment - now) / timedelta(milliseconds=1)
    return f"in {ms:.0f}ms" if ms < 1000 else f"in {age(now, moment)}"


def limit_rules(statuses: Sequence[LimitStatus], now: datetime) -> list[dict[str, Any]]:
    """The limits page's rows: each rule, with the keys it holds back now
    (waiting, and over their rate or their concurrency)."""
    rules = []
    for status in statuses:
        rule = status.rule
        assert rule is not None
        held = [
            {
                "key": k.key,
                "waiting": k.waiting,
                "leased": k.leased,
                "next": until(k.next_start_at, now),
            }
            for k in status.keys
            if k.waiting
            and (
                (k.next_start_at is not None and k.next_start_at > now)
                or (rule.concurrency and k.leased >= rule.concurrency)
            )
        ]
        rules.append(
            {
                "queue": status.queue,
                "prefix": rule.prefix,
                "rate": rate(rule.rate, rule.per) if rule.rate else "",
                "burst": rule.burst if rule.rate else "",
                "concurrency": rule.concurrency or "",
                "keys": held,
            }
        )
    return rules


def attempts(history: Sequence[TaskAttempt], now: datetime) -> list[dict[str, Any]]:
    """The task page's timeline: one entry per attempt, oldest first; the
    running one's time counts up to `now`. The error's first line is the
    summary, the whole (as stored) expands."""
    shown = []
    for a in history:
        running = a.outcome == AttemptOutcome.UNSPECIFIED
        took = ""
        if a.started_at is not None:
            took = _span((a.ended_at or now) - a.started_at)
            took = f"running for {took}" if running else f"took {took}"
        first = a.error.splitlines()[0] if a.error else ""
        shown.append(
            {
                "attempt": a.attempt,
                "outcome": "running" if running else a.outcome.name.lower(),
                "worker_id": a.worker_id,
                "started": moment(a.started_at) if a.started_at else "",
                "took": took,
                "error": a.error,
                "summary": first if len(first) <= 120 else first[:119] + "…",
            }
        )
    return shown


def _span(delta: timedelta) -> str:
    """'840 ms', '12.5 s', '3 m 20 s', '2 h 5 m' (clocks never run back here,
    but a negative span reads as zero)."""
    seconds = max(delta.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs} s"
    return f"{minutes // 60} h {minutes % 60} m"


STATES = ("PENDING", "LEASED", "SUCCEEDED", "DEAD", "CANCELLED")
# The states each bulk action takes (an empty state filter means these).
BULK_STATES = {
    "retry": ["DEAD"],
    "cancel": ["PENDING", "LEASED"],
    "purge": ["SUCCEEDED", "DEAD", "CANCELLED"],
}


def bulk_buttons(
    filters: dict[str, str], counts: dict[str, int], by_type: list[TaskTypeStats]
) -> list[dict[str, Any]]:
    """The bulk actions the list's filter allows, each with the count of
    tasks it would touch: from the queue's counts (of the filtered type),
    or None ("every matching") when a key prefix narrows it further."""
    state, task_type, prefix = filters["state"], filters["type"], filters["key_prefix"]
    if task_type:
        found = next((t for t in by_type if t.task_type == task_type), None)
        counts = {s: getattr(found, s.lower()) if found else 0 for s in STATES}
    where = "".join(
        [
            f" of type {task_type}" if task_type else "",
            f" whose key starts with {prefix!r}" if prefix else "",
        ]
    )
    buttons = []
    for kind, verb in (("retry", "Retry"), ("cancel", "Cancel"), ("purge", "Purge")):
        allowed = BULK_STATES[kind]
        if state and state not in allowed:
            continue
        states = [state] if state else allowed
        count = None if prefix else sum(counts.get(s, 0) for s in states)
        shown = "every" if count is None else f"all {count:,}"
        what = "/".join(states)
        buttons.append(
            {
                "kind": kind,
                "count": count,
                "label": f"{verb} {shown} {what}{where}",
                "confirm": f"{verb} {shown} {what} task(s) of this queue{where}?"
                + (" They are deleted for good." if kind == "purge" else ""),
            }
        )
    return buttons


def worker_row(w: Any) -> dict[str, Any]:
    """A `WorkerView` as the workers page shows it."""
    return {
        "id": w.worker_id,
        "queue": w.queue,
        "host": w.host,
        "pid": w.pid or "",
        "uptime": _span(timedelta(seconds=w.connected_for)),
        "concurrency": w.concurrency,
        "credit": w.credit,
        "leases": w.leases,
        "succeeded": w.succeeded,
        "failed": w.failed,
    }


# A listed error is cut to this many characters (the task page has it all).
LISTED_ERROR_CHARS = 200


def scheduled(task: Any, now: datetime) -> str:
    """'scheduled for 2030-01-01 02:30:00 UTC (in 3 h 5 m)' for a PENDING
    task not due yet; empty otherwise."""
    at = task.available_at
    if task.state.name != "PENDING" or at is None or at <= now:
        return ""
    return f"scheduled for {moment(at)} (in {_span(at - now)})"


def task_row(task: Any, now: datetime) -> dict[str, Any]:
    """A listed task as the task list shows it."""
    error = task.last_error or ""
    first = error.splitlines()[0] if error else ""
    return {
        "id": task.id,
        "type": task.task_type,
        "key": task.unique_key,
        "state": task.state.name,
        "scheduled": scheduled(task, now),
        "priority": task.priority,
        "attempt": f"{task.attempt}/{task.max_attempts}",
        "age": age(task.created_at, now),
        # Cut here and wrapped by the stylesheet: an unbroken run (a
        # compact JSON body) must not widen the table past the window.
        "error": first if len(first) <= LISTED_ERROR_CHARS else first[:LISTED_ERROR_CHARS] + "…",
        "error_cut": len(first) > LISTED_ERROR_CHARS or first != error,
    }
