"""The SQLite side of inspection (ListTasks, GetQueueStats, ListQueues;
the shared rules are in `..listing`) and of pausing queues.

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

import contextlib
import functools
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ringo_trio._contract.limits import MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import QueueStats, Task

from .. import listing
from ..base import TaskFilter, TaskPage
from ..rows import C_SEQ, COLS, row_task, to_us
from .claim import soonest_pending
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
# Its PENDING and LEASED tasks, exactly (GetQueueActivity); the engine
# appends a task-type filter of named parameters (`claim.types_filter`).
ACTIVE_COUNT = f"SELECT sum(n) FROM task_counts WHERE queue = :queue AND {ACTIVE}"


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


class SQLiteListing:
    """`Storage`'s inspection and pausing methods for `SQLiteEngine`
    (which provides the rest): reads in one snapshot each, off the write
    lock but for pausing."""

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    async def list_tasks(
        self,
        queue: str,
        where: TaskFilter,
        *,
        newest_first: bool,
        after: int | None,
        limit: int,
    ) -> TaskPage:
        after = listing.first_after(after, newest_first)
        db = self._conn()
        # A read transaction: the walk and the rows it picked are one snapshot.
        db.execute("BEGIN")
        try:
            arms, residual = listing.arms(db.execute(PRESENT, (queue,)), where)
            if not arms:
                return TaskPage([], None, [])
            args: dict[str, Any] = {"queue": queue, "after": after}
            args.update(arm_params(arms))
            if residual is None:
                args["limit"] = limit + 1
                rows = db.execute(list_sql(LIST_COLS, arms, newest_first), args).fetchall()
                next_after = rows[limit - 1][C_SEQ] if len(rows) > limit else None
                rows = rows[:limit]
            else:
                budget = listing.scan_budget(limit)
                args["limit"] = budget
                walked = db.execute(list_sql(WALK_COLS, arms, newest_first), args).fetchall()
                seqs, next_after = listing.pick(residual, walked, limit, budget)
                rows = []
                if seqs:
                    marks = ", ".join("?" * len(seqs))
                    rows = db.execute(
                        f"SELECT {LIST_COLS} FROM tasks WHERE seq IN ({marks})"
                        f" ORDER BY seq{' DESC' if newest_first else ''}",
                        seqs,
                    ).fetchall()
        finally:
            db.execute("COMMIT")
        return TaskPage([listed(r) for r in rows], next_after, [r[C_SEQ] for r in rows])

    async def queue_stats(self, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        db = self._conn()
        db.execute("BEGIN")
        try:
            return self._stats(db, queue, now, by_type=by_type)
        finally:
            db.execute("COMMIT")

    async def list_queues(self, now: datetime, *, after: str, limit: int) -> list[QueueStats]:
        db = self._conn()
        db.execute("BEGIN")
        try:
            names = {r[0] for r in db.execute(QUEUE_NAMES, (after, limit))}
            names.update(r[0] for r in db.execute(PAUSED_NAMES, (after, limit)))
            return [self._stats(db, name, now, by_type=False) for name in sorted(names)[:limit]]
        finally:
            db.execute("COMMIT")

    @staticmethod
    def _stats(db: sqlite3.Connection, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        counts = listing.by_state(db.execute(QUEUE_COUNTS, (queue,)))
        oldest = soonest_pending(db, {"queue": queue}) if counts else None
        paused = db.execute(IS_PAUSED, (queue,)).fetchone() is not None
        return listing.queue_stats(queue, counts, oldest, now, by_type=by_type, paused=paused)

    # -- pausing queues (minor 13) -------------------------------------------

    async def set_queue_paused(self, queue: str, paused: bool, now: datetime) -> bool:
        with self._write() as db:
            cursor = (
                db.execute(PAUSE, (queue, to_us(now))) if paused else db.execute(RESUME, (queue,))
            )
            return cursor.rowcount > 0

    async def paused_queues(self) -> frozenset[str]:
        return frozenset(row[0] for row in self._conn().execute(PAUSED))
