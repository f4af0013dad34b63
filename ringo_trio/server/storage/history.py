"""Attempt history (protocol minor 14): every attempt's start, end, worker,
outcome and error, the newest `MAX_TASK_HISTORY` kept.

Theory of operation. The hot path -- a claim and its successful ack -- must
not pay for history, so nothing is written for an attempt that succeeds:
the claim records who leased the task and when (`leased_by`, `leased_at`,
two more columns of a row it rewrites anyway), and the attempt that is
running, or that succeeded, is built at read time from those columns and the
task's own state. Every other way an attempt ends (nack, reject, lease
expiry, cancel while leased, release by a stopping worker, a retry of a
SUCCEEDED task) already runs a statement that rewrites the row; that
statement appends one entry to the `history` column in the same SET (the
SET sees the row as it was, so `attempt`, `leased_by` and `leased_at` are
the attempt that ended), dropping the oldest beyond the bound. Both engines
store an entry as the same compact JSON array, `[attempt, worker, started
µs, ended µs, outcome, error]`, so one reader serves both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ringo_trio._contract.limits import MAX_HISTORY_ERROR_CHARS, MAX_TASK_HISTORY
from ringo_trio._proto.ringo.v1 import AttemptOutcome, Task, TaskAttempt, TaskState

from .rows import from_us, row_task

SUCCEEDED = int(AttemptOutcome.SUCCEEDED)
FAILED = int(AttemptOutcome.FAILED)
REJECTED = int(AttemptOutcome.REJECTED)
EXPIRED = int(AttemptOutcome.EXPIRED)
CANCELLED = int(AttemptOutcome.CANCELLED)
RELEASED = int(AttemptOutcome.RELEASED)
_OUTCOMES = {int(o): o for o in AttemptOutcome}


def sqlite_push(now: str, outcome: str, error: str, row: str = "") -> str:
    """SQLite: `history = <this>` appends the attempt that just ended.
    `row` qualifies the task's columns (``"tasks."`` in an UPDATE ... FROM)."""
    h = f"coalesce({row}history, '[]')"
    return f"""json_insert(
        CASE WHEN json_array_length({h}) >= {MAX_TASK_HISTORY}
            THEN json_remove({h}, '$[0]') ELSE {h} END,
        '$[#]', json_array({row}attempt, {row}leased_by, {row}leased_at, {now}, {outcome},
            substr({error}, 1, {MAX_HISTORY_ERROR_CHARS})))"""


def postgres_push(now: str, outcome: str, error: str, row: str = "") -> str:
    """PostgreSQL: `history = <this>` appends the attempt that just ended."""
    h = f"{row}history"
    return f"""(CASE WHEN jsonb_array_length({h}) >= {MAX_TASK_HISTORY}
            THEN {h} - 0 ELSE {h} END)
        || jsonb_build_array(jsonb_build_array({row}attempt, {row}leased_by, {row}leased_at,
            ({now})::bigint, {outcome}, left(({error})::text, {MAX_HISTORY_ERROR_CHARS})))"""


def attempts(task: Task, leased_at: int | None, leased_by: str, history: Any) -> list[TaskAttempt]:
    """The task's attempts, oldest first: the stored ones (`history`: the
    column as the driver returns it -- JSON text, a decoded list, or None),
    then the running or succeeded attempt built from the row."""
    stored: Sequence[Sequence[Any]]
    if history is None:
        stored = []
    elif isinstance(history, str | bytes):
        stored = json.loads(history)
    else:
        stored = history
    found = [
        TaskAttempt(
            attempt=int(number),
            worker_id=str(worker),
            started_at=from_us(started) if started is not None else None,
            ended_at=from_us(ended),
            outcome=_OUTCOMES.get(int(outcome), AttemptOutcome.UNSPECIFIED),
            error=str(error or ""),
        )
        for number, worker, started, ended, outcome, error in stored
    ]
    if leased_at is not None and task.attempt > 0:
        if task.state == TaskState.LEASED:
            found.append(
                TaskAttempt(
                    attempt=task.attempt, worker_id=leased_by, started_at=from_us(leased_at)
                )
            )
        elif task.state == TaskState.SUCCEEDED:
            found.append(
                TaskAttempt(
                    attempt=task.attempt,
                    worker_id=leased_by,
                    started_at=from_us(leased_at),
                    ended_at=task.finished_at,
                    outcome=AttemptOutcome.SUCCEEDED,
                )
            )
    return found[-MAX_TASK_HISTORY:]


# What `get(history=True)` selects after the task's columns (rows.COLS).
HISTORY_COLS = "leased_at, leased_by, history"


def with_history(row: Sequence[Any]) -> Task:
    """A row of `COLS, HISTORY_COLS` as its Task, history filled."""
    task = row_task(row[:-3])
    task.history = attempts(task, row[-3], row[-2], row[-1])
    return task
