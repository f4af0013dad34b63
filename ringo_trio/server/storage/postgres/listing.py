"""The PostgreSQL side of inspection (ListTasks, GetQueueStats, ListQueues;
the shared rules are in `..listing`): the counts folded from their deltas,
and pages merged from index streams in a snapshot that can only walk
indexes.

Counts must be exact and cheap at a million tasks, but one counter row per
(queue, type, state) updated by every claim, ack and nack of every daemon
would queue concurrent transactions on its row lock, and a claim (PENDING
row, then LEASED) against a nack (LEASED, then PENDING) would deadlock. So
statement triggers only INSERT each statement's net changes into
`task_count_deltas` (inserts never wait on each other), and `fold_counts`
moves them into `task_counts` -- under an advisory lock, so folders never
meet, and skipped by whoever finds it taken -- before every stats read and
on `watch`'s beat. A read sums `task_counts` and the deltas committed since
the fold, in one snapshot: exact. An index-only count of the queue's index
entries was measured first and dropped: 0.7 s at 1,000,000 tasks. Pages are
a Merge Append of index scans on partial indexes (as in SQLite):
`tasks_active_type (queue, task_type, seq)` for PENDING/LEASED (usable by a
statement naming types only, `schema.ACTIVE_TYPED`), `tasks_finished (queue,
task_type, state, seq)` for the finished states. A non-HOT UPDATE adds an
entry to every index whose predicate the new row meets, so a claim adds none
to them and an ack one, where full listing indexes cost two each. The
inspection statements run in a read-only snapshot that turns sequential
scans, bitmap scans and sorts off for its own transaction, so no plan reads
every row of a big queue.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._contract.limits import MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import QueueStats, Task

from .. import listing
from ..base import TaskFilter, TaskPage
from ..rows import C_SEQ, COLS, LEASED, PENDING, row_task, to_us
from .schema import ident, lock_key
from .sql import Spelling, types_filter


class ListingSql:
    """The inspection statements for one engine."""

    def __init__(self, s: Spelling) -> None:
        t = s.tasks
        counts = f"{ident(s.schema)}.task_counts"
        deltas = f"{ident(s.schema)}.task_count_deltas"
        # Folds the committed deltas into task_counts, in one statement.
        # Only folders write task_counts, so its row locks never meet the
        # write path's; and one at a time (the advisory lock, taken before
        # the DELETE reads a row), so two folders' upserts never meet in a
        # cycle. A folder that finds the lock taken folds nothing rather than
        # wait: reads are exact either way, and a stats read behind a stuck
        # folder would wait with it. A row another folder moved after this
        # statement's snapshot is skipped by the DELETE's re-check, and the
        # upsert adds to the committed count, so no delta counts twice.
        self.fold = f"""
            WITH mine AS (SELECT pg_try_advisory_xact_lock({lock_key(s.schema + " counts")}) AS got
            ), moved AS (
                DELETE FROM {deltas} WHERE (SELECT got FROM mine)
                RETURNING queue, task_type, state, d
            )
            INSERT INTO {counts} AS c (queue, task_type, state, n)
            SELECT queue, task_type, state, sum(d) FROM moved GROUP BY queue, task_type, state
            ON CONFLICT (queue, task_type, state) DO UPDATE SET n = c.n + excluded.n
        """

        def counted(cols: str, where: str) -> str:
            """(`cols`, n) of the counts matching `where` at one snapshot:
            the folded rows and the deltas committed since the fold (few:
            every stats read and the listener's beat fold), so exact."""
            return f"""SELECT {cols}, n FROM {counts} WHERE {where}
                UNION ALL
                SELECT {cols}, d FROM {deltas} WHERE {where}"""

        # Counts of the queues $1.
        self.queues_counts = f"""
            SELECT queue, task_type, state, sum(n) FROM (
                {counted("queue, task_type, state", "queue = ANY($1::text[])")}
            ) c GROUP BY queue, task_type, state
        """
        # PENDING and LEASED tasks of queue $1 ($2: of these types; NULL:
        # all): what GetQueueActivity answers without walking the index
        # entries a drained queue keeps.
        active = f"queue = $1 AND state IN ({PENDING}, {LEASED}) {types_filter(2)}"
        self.active = f"SELECT coalesce(sum(n), 0) FROM ({counted('queue', active)}) c"
        oldest_of = s.prios.replace("$1", "n.name")
        self.queues_oldest = f"""
            SELECT n.name, (
                WITH RECURSIVE {oldest_of}
                SELECT min(f.available_at) FROM prios CROSS JOIN LATERAL (
                    SELECT available_at FROM {t}
                    WHERE queue = n.name AND state = {PENDING} AND priority = prios.p
                    ORDER BY available_at LIMIT 1) f)
            FROM unnest($1::text[]) AS n(name)
        """
        # The (task type, state) pairs of queue $1 holding tasks: the
        # listing's streams.
        self.present = f"""
            SELECT task_type, state FROM ({counted("task_type, state", "queue = $1")}) c
            GROUP BY task_type, state HAVING sum(n) > 0
        """
        # The queues after $1 holding a task, by the counts as
        # `queues_counts` reads them, and the paused ones, which may hold
        # none (paused ahead of time).
        paused = f"{ident(s.schema)}.paused_queues"
        self.queue_names = f"""
            SELECT queue FROM ({counted("queue", "queue > $1")}) c
            GROUP BY queue HAVING sum(n) > 0
            UNION SELECT queue FROM {paused} WHERE queue > $1
            ORDER BY queue LIMIT $2
        """
        self.listed_by_seq = (
            f"SELECT {LIST_COLS} FROM {t} WHERE seq = ANY($1::bigint[]) ORDER BY seq"
        )


# A listed task: no payload, no result, last_error cut (by characters here,
# by bytes in `listed`), so a page never reads the large columns.
LIST_COLS = ", ".join(
    {
        "payload": "''::bytea",
        "last_error": f"left(last_error, {MAX_LIST_ERROR_BYTES})",
        "result": "NULL::bytea",
    }.get(c.strip(), c.strip())
    for c in COLS.split(",")
)
WALK_COLS = "seq, task_type, unique_key, state"


def list_sql(tasks: str, cols: str, arms: Sequence[listing.Arm], newest_first: bool) -> str:
    return list_sql_of(tasks, cols, listing.shape(arms), newest_first)


@functools.lru_cache(maxsize=256)
def list_sql_of(
    tasks: str, cols: str, shape: tuple[tuple[str, int | None], ...], newest_first: bool
) -> str:
    """One index stream per arm past $2, merged by seq (a Merge Append, see
    `listing`); $1 queue, $3 limit, $4... the arms' task types. Each arm
    names its partial index's states, so the planner can use it."""
    op, order = ("<", "DESC") if newest_first else (">", "ASC")
    selects = []
    param = 4
    for kind, state in shape:
        if kind == "active":
            where = f"task_type = ${param} AND state IN ({PENDING}, {LEASED})"
        elif kind == "finished":
            where = f"task_type = ${param} AND state = {state}"
        else:
            where = "true"
        if kind != "scan":
            param += 1
        selects.append(
            f"(SELECT {cols} FROM {tasks} WHERE queue = $1 AND {where}"
            f" AND seq {op} $2 ORDER BY seq {order})"
        )
    # In FROM and each arm ordered: only so does the planner merge the arms'
    # index scans (Merge Append); a plain UNION ALL is appended, then sorted.
    return "SELECT * FROM (" + " UNION ALL ".join(selects) + f") u ORDER BY seq {order} LIMIT $3"


def listed(row: Any) -> Task:
    task = row_task(row)
    task.last_error = listing.cut_error(task.last_error)
    return task


@contextlib.asynccontextmanager
async def inspect_transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """A read-only snapshot whose plans can only be index walks: counts are
    index-only scans and a page is a Merge Append of index scans. On a queue
    that is most of the table (or a small one) the planner would otherwise
    pick a sequential scan of the rows, payloads and all, or sort every
    matching row to return the first page. The settings end with the
    transaction."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        await conn.execute(
            "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;"
            " SET LOCAL enable_sort = off"
        )
        yield


class PostgresListing:
    """`Storage`'s inspection and pausing methods for `PostgresEngine`
    (which provides the rest), and the fold of the count deltas
    (`fold_counts`), which `watch` runs on its beat too."""

    _sql: Any

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        raise NotImplementedError

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
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
        async with self._conn() as conn, inspect_transaction(conn):
            pairs = [(r[0], r[1]) for r in await conn.fetch(self._sql.listing.present, queue)]
            arms, residual = listing.arms(pairs, where)
            types = listing.arm_types(arms)
            if not arms:
                return TaskPage([], None, [])
            if residual is None:
                sql = list_sql(self._sql.tasks, LIST_COLS, arms, newest_first)
                rows = await conn.fetch(sql, queue, after, limit + 1, *types)
                next_after = rows[limit - 1][C_SEQ] if len(rows) > limit else None
                rows = rows[:limit]
            else:
                budget = listing.scan_budget(limit)
                sql = list_sql(self._sql.tasks, WALK_COLS, arms, newest_first)
                walked = await conn.fetch(sql, queue, after, budget, *types)
                seqs, next_after = listing.pick(residual, walked, limit, budget)
                rows = []
                if seqs:
                    rows = await conn.fetch(self._sql.listing.listed_by_seq, seqs)
                    if newest_first:
                        rows.reverse()
        return TaskPage([listed(r) for r in rows], next_after, [r[C_SEQ] for r in rows])

    async def queue_stats(self, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        [stats] = await self._queues_stats([queue], now, by_type=by_type)
        return stats

    async def list_queues(self, now: datetime, *, after: str, limit: int) -> list[QueueStats]:
        await self.fold_counts()
        async with self._conn() as conn:
            names = [r[0] for r in await conn.fetch(self._sql.listing.queue_names, after, limit)]
        return await self._queues_stats(names, now, by_type=False, fold=False)

    async def _queues_stats(
        self, names: list[str], now: datetime, *, by_type: bool, fold: bool = True
    ) -> list[QueueStats]:
        if not names:
            return []
        if fold:
            await self.fold_counts()
        rows: dict[str, list[Any]] = {name: [] for name in names}
        async with self._conn() as conn, inspect_transaction(conn):
            for queue, task_type, state, n in await conn.fetch(
                self._sql.listing.queues_counts, names
            ):
                rows[queue].append((task_type, state, n))
            oldest = dict(list(r) for r in await conn.fetch(self._sql.listing.queues_oldest, names))
            paused = {r[0] for r in await conn.fetch(self._sql.paused.among, names)}
        return [
            listing.queue_stats(
                n, listing.by_state(rows[n]), oldest[n], now, by_type=by_type, paused=n in paused
            )
            for n in names
        ]

    async def set_queue_paused(self, queue: str, paused: bool, now: datetime) -> bool:
        async with self._conn() as conn:
            return bool(await self._sql.paused.set(conn, queue, paused, to_us(now)))

    async def paused_queues(self) -> frozenset[str]:
        return frozenset(row[0] for row in await self._fetch(self._sql.paused.all))

    async def fold_counts(self) -> None:
        """Sum the committed count deltas into task_counts, unless another
        folder is at it (`watch` does it too, so they do not pile up while
        nobody reads stats)."""
        async with self._conn() as conn:
            await conn.execute(self._sql.listing.fold)
