"""`ringo tasks show`'s attempt history (protocol minor 14): a table for
people, a list for `--json`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .._models import Task, TaskAttempt


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def history_document(task: Task) -> list[dict[str, Any]]:
    return [
        {
            "attempt": a.attempt,
            "worker_id": a.worker_id,
            "started_at": _iso(a.started_at),
            "ended_at": _iso(a.ended_at),
            "outcome": a.outcome.value,
            "error": a.error,
        }
        for a in task.history
    ]


def _took(attempt: TaskAttempt) -> str:
    if attempt.started_at is None or attempt.ended_at is None:
        return ""
    seconds = (attempt.ended_at - attempt.started_at).total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def history_table(task: Task) -> tuple[list[str], list[list[object]]]:
    """Headers and rows: one row per attempt, its error's first line cut
    (`--json` has the whole of what the daemon keeps)."""
    rows: list[list[object]] = []
    for a in task.history:
        error = (a.error or "").splitlines()[0] if a.error else ""
        rows.append(
            [
                a.attempt,
                a.worker_id,
                "" if a.started_at is None else a.started_at.strftime("%Y-%m-%d %H:%M:%S"),
                _took(a),
                a.outcome.value,
                error if len(error) <= 60 else error[:59] + "…",
            ]
        )
    return ["attempt", "worker", "started", "took", "outcome", "error"], rows
