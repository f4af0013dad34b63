"""Operator writes: retry, cancel, bulk retry of DEAD tasks, and the purge
(DeleteTasks and retention), and how a task is found by id or unique key.

Cancel: a PENDING or LEASED task becomes CANCELLED in one UPDATE that also
clears its lease, so the worker's next command on that lease matches no row.
Only then — on the miss path, never on the hot path — the engine looks
whether the ref's task is CANCELLED at that very attempt, and says so in the
`LeaseLost` (`cancelled=True`). Bulk retry of DEAD tasks (`retry_dead`)
walks the finished-task index oldest finished first and updates at most
`limit` rows in one transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .. import history
from ..base import NotFound
from ..history import sqlite_push
from ..rows import (
    CANCELLED,
    COLS,
    DEAD,
    LEASED,
    PENDING,
    SUCCEEDED,
    UINT32_MAX,
    describe,
    one_lookup,
)
from .schema import FINISHED_TERM

# The lease is cleared for a stuck LEASED task (see `rows.stuck`); a
# finished task has none.
# A SUCCEEDED attempt was never stored (`history`): it is, before it goes.
RETRY = f"""
    UPDATE tasks SET history = CASE WHEN state = {SUCCEEDED} AND leased_at IS NOT NULL
            THEN {sqlite_push("finished_at", str(history.SUCCEEDED), "''")} ELSE history END,
        state = {PENDING}, available_at = :now, finished_at = NULL,
        max_attempts = min(attempt + base_max_attempts, {UINT32_MAX}), worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now, result = NULL
    WHERE seq = :seq RETURNING {COLS}
"""

# The oldest finished tasks of one state (of one queue, or of every queue for
# retention): an ordered walk of a partial index that stops at :limit, so a
# batch costs about :limit index entries however many tasks are kept. seq
# (the rowid, the index's hidden last column) breaks ties without a sort.
OLDEST_FINISHED = (
    f"SELECT finished_at, seq FROM tasks INDEXED BY tasks_finished_age WHERE {FINISHED_TERM}"
    " AND state = :state AND finished_at < :before ORDER BY finished_at, seq LIMIT :limit"
)
OLDEST_FINISHED_QUEUE = (
    f"SELECT finished_at, seq FROM tasks INDEXED BY tasks_finished_queue WHERE {FINISHED_TERM}"
    " AND queue = :queue AND state = :state AND finished_at < :before"
    " ORDER BY finished_at, seq LIMIT :limit"
)


# A LEASED task's lease goes with it: the worker's next command on the lease
# matches no row, and `lost` tells it why.
CANCEL = f"""
    UPDATE tasks SET history = CASE WHEN state = {LEASED}
            THEN {sqlite_push(":now", str(history.CANCELLED), ":error")} ELSE history END,
        state = {CANCELLED}, finished_at = :now, last_error = :error,
        worker_id = '', lease_token = '', lease_until = NULL, updated_at = :now
    WHERE seq = :seq RETURNING {COLS}
"""


def _ids(task_ids: Sequence[str]) -> tuple[str, dict[str, str]]:
    names = [f"i{n}" for n in range(len(task_ids))]
    return ", ".join(":" + n for n in names), dict(zip(names, task_ids, strict=True))


# Named parameters per statement, far below SQLite's 32,766.
IDS_CHUNK = 500


def cancel_ids(
    db: sqlite3.Connection, queue: str, task_ids: Sequence[str], error: str, now_us: int
) -> list[tuple[str, str]]:
    """CANCEL for each of `task_ids` still PENDING or LEASED, in the
    caller's transaction."""
    cancelled: list[tuple[str, str]] = []
    for start in range(0, len(task_ids), IDS_CHUNK):
        marks, params = _ids(task_ids[start : start + IDS_CHUNK])
        cancelled += db.execute(
            f"""UPDATE tasks SET history = CASE WHEN state = {LEASED}
                    THEN {sqlite_push(":now", str(history.CANCELLED), ":error")}
                    ELSE history END,
                state = {CANCELLED}, finished_at = :now, last_error = :error,
                worker_id = '', lease_token = '', lease_until = NULL, updated_at = :now
            WHERE queue = :queue AND state IN ({PENDING}, {LEASED}) AND id IN ({marks})
            RETURNING id, limit_key""",
            {**params, "queue": queue, "now": now_us, "error": error},
        ).fetchall()
    return cancelled


def delete_ids(
    db: sqlite3.Connection, queue: str, task_ids: Sequence[str], states: Sequence[int]
) -> int:
    deleted = 0
    allowed = ", ".join(str(int(s)) for s in states)
    for start in range(0, len(task_ids), IDS_CHUNK):
        marks, params = _ids(task_ids[start : start + IDS_CHUNK])
        deleted += db.execute(
            f"DELETE FROM tasks WHERE queue = :queue AND state IN ({allowed}) AND id IN ({marks})",
            {**params, "queue": queue},
        ).rowcount
    return deleted


def retry_dead_sql(types_clause: str) -> str:
    """The oldest DEAD tasks of a queue (finished_at < :before) back to
    PENDING, as `RETRY` does for one; the walk follows the finished-task
    index."""
    return f"""
    UPDATE tasks SET state = {PENDING}, available_at = :now, finished_at = NULL,
        max_attempts = min(attempt + base_max_attempts, {UINT32_MAX}), worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now, result = NULL
    WHERE seq IN (
        SELECT seq FROM tasks
        WHERE {FINISHED_TERM} AND queue = :queue AND state = {DEAD}
            AND finished_at < :before{types_clause}
        ORDER BY finished_at, seq LIMIT :limit)
"""


def find(
    db: sqlite3.Connection,
    columns: str,
    queue: str,
    task_id: str | None,
    unique_key: str | None,
) -> Any:
    """`columns` of the task named by exactly one of task_id / unique_key;
    NotFound if the queue holds no such task."""
    one_lookup(task_id, unique_key)
    if task_id is not None:
        where, value = "id = :value", task_id
    else:
        # The literal term lets SQLite use the partial unique index; an
        # empty key names no task.
        where, value = "unique_key = :value AND unique_key != ''", unique_key or ""
    row = db.execute(
        f"SELECT {columns} FROM tasks WHERE queue = :queue AND {where}",
        {"queue": queue, "value": value},
    ).fetchone()
    if row is None:
        raise NotFound(describe(queue, task_id, unique_key))
    return row
