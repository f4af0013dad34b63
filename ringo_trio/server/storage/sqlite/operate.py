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
from typing import Any

from ..base import NotFound
from ..rows import CANCELLED, COLS, DEAD, PENDING, UINT32_MAX, describe
from .schema import FINISHED_TERM

# The lease is cleared for a stuck LEASED task (see `rows.stuck`); a
# finished task has none.
RETRY = f"""
    UPDATE tasks SET state = {PENDING}, available_at = :now, finished_at = NULL,
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
# finished_before unset: later than any time the daemon stores.
NO_CUTOFF = 2**63 - 1


# A LEASED task's lease goes with it: the worker's next command on the lease
# matches no row, and `lost` tells it why.
CANCEL = f"""
    UPDATE tasks SET state = {CANCELLED}, finished_at = :now, last_error = :error,
        worker_id = '', lease_token = '', lease_until = NULL, updated_at = :now
    WHERE seq = :seq RETURNING {COLS}
"""


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
    if (task_id is None) == (unique_key is None):
        raise ValueError("exactly one of task_id / unique_key")
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
