"""The SQLite side of inspection (ListTasks, GetQueueStats, ListQueues;
the shared rules are in `..listing`).

Inspection (ListTasks, GetQueueStats, ListQueues; see `listing`) never
scans on the loop. `task_counts (queue, task_type, state, n)` is kept exact
by three triggers (insert, delete, state change) in the writing
transaction, so every write path is counted, also ones written later (cancel,
purge); its migration counts the rows already stored. Listing merges
seq-ordered streams, one per (task type, state) pair the counts hold:
PENDING/LEASED on `tasks_active_type`, finished states on
`tasks_finished (queue, task_type, state) WHERE +state >= SUCCEEDED`; the
claim path touches neither, an ack adds one entry. (A range term, not an IN
list, which SQLite rebuilds a lookup table for at every statement: see
`FINISHED_TERM`.)
Measured cost (engine CPU per task, shared 2-core machine): claim + ack
66.0 -> 88.0 us (index +11, triggers +11: each B-tree a commit touches is a
page more in the WAL), enqueue in 1000s 12.3 -> 16.7 us; through the daemon
+14% daemon CPU per no-op task, throughput within the noise
(docs/operations.md, "How it is stored").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ringo_trio._contract.limits import MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import Task

from .. import listing
from ..rows import COLS, row_task
from .schema import ACTIVE, FINISHED_TERM

# -- inspection ------------------------------------------------------------

# A listed task: no payload, no result, last_error cut (by characters here,
# by bytes in `listed`), so a page never reads the large columns.
LIST_COLS = ", ".join(
    {
        "payload": "X''",
        "last_error": f"substr(last_error, 1, {MAX_LIST_ERROR_BYTES})",
        "result": "NULL",
    }.get(c.strip(), c.strip())
    for c in COLS.split(",")
)
WALK_COLS = "seq, task_type, unique_key, state"
PRESENT = "SELECT task_type, state FROM task_counts WHERE queue = ? AND n > 0"
# Queues holding a task, by name: walks the counts' primary key in order.
QUEUE_NAMES = (
    "SELECT queue FROM task_counts WHERE queue > ? GROUP BY queue HAVING sum(n) > 0"
    " ORDER BY queue LIMIT ?"
)
# The paused ones, which may hold none (paused ahead of time): merged with
# the above by the engine (in SQL the union would sort).
PAUSED_NAMES = "SELECT queue FROM paused_queues WHERE queue > ? ORDER BY queue LIMIT ?"
IS_PAUSED = "SELECT 1 FROM paused_queues WHERE queue = ?"
PAUSE = "INSERT INTO paused_queues (queue, paused_at) VALUES (?, ?) ON CONFLICT DO NOTHING"
RESUME = "DELETE FROM paused_queues WHERE queue = ?"
PAUSED = "SELECT queue FROM paused_queues"
QUEUE_COUNTS = "SELECT task_type, state, n FROM task_counts WHERE queue = ?"


def list_sql(cols: str, arms: Sequence[listing.Arm], newest_first: bool) -> str:
    return _list_sql_of(cols, listing.shape(arms), newest_first)


@functools.lru_cache(maxsize=256)
def _list_sql_of(cols: str, shape: tuple[tuple[str, int | None], ...], newest_first: bool) -> str:
    """One index stream per arm past :after, merged by seq (see `listing`).
    Each arm repeats its partial index's own term: SQLite uses a partial
    index only for a query that spells it."""
    op, order = ("<", "DESC") if newest_first else (">", "ASC")
    selects = []
    for i, (kind, state) in enumerate(shape):
        source = "tasks"
        if kind == "active":
            where = f"queue = :queue AND task_type = :a{i} AND {ACTIVE}"
        elif kind == "finished":
            where = f"queue = :queue AND task_type = :a{i} AND state = {state}"
            where += f" AND {FINISHED_TERM}"
        else:
            where = "queue = :queue"
            source = "tasks NOT INDEXED"
        selects.append(f"SELECT {cols} FROM {source} WHERE {where} AND seq {op} :after")
    return " UNION ALL ".join(selects) + f" ORDER BY seq {order} LIMIT :limit"


def arm_params(arms: Sequence[listing.Arm]) -> dict[str, Any]:
    typed = [i for i, (kind, _) in enumerate(arms) if kind != "scan"]
    return {f"a{i}": t for i, t in zip(typed, listing.arm_types(arms), strict=True)}


def listed(row: Sequence[Any]) -> Task:
    task = row_task(row)
    task.last_error = listing.cut_error(task.last_error)
    return task
