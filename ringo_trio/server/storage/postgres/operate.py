"""Operator writes and lookups: get, retry (one, or the oldest DEAD tasks of
a queue, each given the longer retry schedule its new attempts need),
cancel, and the purge (DeleteTasks and retention).

Concurrency (READ COMMITTED):

* cancel -- the row is locked (`SELECT ... FOR UPDATE`), checked and made
  CANCELLED with its lease cleared in one transaction: a lease operation
  racing it either committed first (the cancel then sees SUCCEEDED/DEAD or a
  new PENDING) or re-evaluates its guard on the CANCELLED row and misses.
* bulk retry (`retry_dead`) -- one `UPDATE ... WHERE seq IN (SELECT ...
  ORDER BY finished_at LIMIT n FOR UPDATE SKIP LOCKED)`, notifying the queue
  once in the same statement; then, in the same transaction, each retried
  task gets the longer retry schedule its new attempts need (`retry_delays`).
* purge and retention (`delete_finished`) -- one `DELETE` of the rows a
  sub-select picked `FOR UPDATE SKIP LOCKED`, the oldest finished of each
  asked state of each queue by an ordered walk of `tasks_finished_queue`
  (retention: of every queue with finished tasks, found by seeks of the
  same index): daemons purging at once, or a purge meeting a
  retry, skip each other's rows instead of waiting; a row retried after the
  snapshot fails the state re-check of the lock and stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._proto.ringo.v1 import Task

from .. import history
from ..base import FailedPrecondition, NotFound
from ..history import HISTORY_COLS, postgres_push, with_history
from ..rows import (
    CANCELLED,
    COLS,
    DEAD,
    LEASED,
    PENDING,
    STATES,
    SUCCEEDED,
    UINT32_MAX,
    cancelled_text,
    cutoff_us,
    describe,
    finished_states,
    one_lookup,
    row_task,
    stuck,
    to_us,
)
from .schema import FINISHED_TERM, delays_text, schedule_of
from .sql import Spelling, type_list, types_filter


class OperateSql:
    """The operator's statements for one engine."""

    def __init__(self, s: Spelling) -> None:
        t = s.tasks
        note = s.note
        self.get_by_id = f"SELECT {COLS} FROM {t} WHERE queue = $1 AND id = $2"
        self.get_by_key = (
            f"SELECT {COLS} FROM {t} WHERE queue = $1 AND unique_key = $2 AND unique_key <> ''"
        )
        self.history_by_id = f"SELECT {COLS}, {HISTORY_COLS} FROM {t} WHERE queue = $1 AND id = $2"
        self.history_by_key = (
            f"SELECT {COLS}, {HISTORY_COLS} FROM {t} WHERE queue = $1 AND unique_key = $2"
            " AND unique_key <> ''"
        )
        locked = (
            "seq, state, available_at, lease_until, attempt, base_max_attempts,"
            " backoff_initial_us, backoff_max_us, backoff_multiplier"
        )
        self.lock_by_id = f"SELECT {locked} FROM {t} WHERE queue = $1 AND id = $2 FOR UPDATE"
        self.lock_by_key = (
            f"SELECT {locked} FROM {t} WHERE queue = $1 AND unique_key = $2"
            " AND unique_key <> '' FOR UPDATE"
        )
        self.retry = f"""
            WITH r AS (
                UPDATE {t} SET history = CASE WHEN state = {SUCCEEDED} AND leased_at IS NOT NULL
                        THEN {postgres_push("finished_at", str(history.SUCCEEDED), "''")}
                        ELSE history END,
                    state = {PENDING}, available_at = $2, finished_at = NULL,
                    max_attempts = least(attempt + base_max_attempts, {UINT32_MAX}),
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $2,
                    result = NULL, retry_delays_us = $3
                WHERE seq = $1 RETURNING {COLS}
            )
            SELECT r.*, {note("r.queue")} FROM r
        """

        # A LEASED task's lease goes with it: the worker's next command on
        # it matches no row, and `cancelled_of` tells it why.
        self.cancel = f"""
            UPDATE {t} SET history = CASE WHEN state = {LEASED}
                    THEN {postgres_push("$2", str(history.CANCELLED), "$3")} ELSE history END,
                state = {CANCELLED}, finished_at = $2, last_error = $3,
                worker_id = '', lease_token = '', lease_until = NULL, updated_at = $2
            WHERE seq = $1 RETURNING {COLS}, {s.notify_ended()} AS waited
        """
        # Bulk by filter (minor 14): the ids were picked by a listing walk.
        self.cancel_ids = f"""
            UPDATE {t} SET history = CASE WHEN state = {LEASED}
                    THEN {postgres_push("$2", str(history.CANCELLED), "$3")} ELSE history END,
                state = {CANCELLED}, finished_at = $2, last_error = $3,
                worker_id = '', lease_token = '', lease_until = NULL, updated_at = $2
            WHERE queue = $1 AND id = ANY($4::text[]) AND state IN ({PENDING}, {LEASED})
            RETURNING id, limit_key, {s.notify_ended()} AS waited
        """
        self.delete_ids = f"""
            WITH gone AS (
                DELETE FROM {t}
                WHERE queue = $1 AND id = ANY($2::text[]) AND state = ANY($3::smallint[])
                RETURNING 1)
            SELECT count(*) FROM gone
        """
        self.by_seq = f"SELECT {COLS} FROM {t} WHERE seq = $1"
        # The $3 oldest DEAD tasks of queue $1 finished before $2 back to
        # PENDING at $4, as `retry` does for one; the walk follows the
        # finished-task index. One notification for the queue if any changed,
        # and what `retry_delays` needs to give each its longer schedule.
        self.retry_dead = f"""
            WITH r AS (
                UPDATE {t} SET state = {PENDING}, available_at = $4, finished_at = NULL,
                    max_attempts = least(attempt + base_max_attempts, {UINT32_MAX}),
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $4,
                    result = NULL
                WHERE seq IN (
                    SELECT seq FROM {t}
                    WHERE queue = $1 AND state = {DEAD} AND finished_at < $2
                        {types_filter(5)}
                    ORDER BY finished_at, seq LIMIT $3
                    FOR UPDATE SKIP LOCKED)
                RETURNING seq, backoff_initial_us, backoff_max_us, backoff_multiplier,
                    max_attempts
            ), n AS (SELECT count(*) AS changed FROM r)
            SELECT n.changed, CASE WHEN n.changed > 0 THEN {note("$1")} END,
                (SELECT array_agg(ARRAY[seq, backoff_initial_us, backoff_max_us,
                    max_attempts] ORDER BY seq) FROM r),
                (SELECT array_agg(backoff_multiplier ORDER BY seq) FROM r)
            FROM n
        """
        # Schedules ($2, as `delays_text`) for the tasks $1.
        self.retry_delays = f"""
            UPDATE {t} k SET retry_delays_us = u.delays::bigint[]
            FROM unnest($1::bigint[], $2::text[]) AS u(seq, delays) WHERE k.seq = u.seq
        """

        def delete_finished(queues: str, queue: str) -> str:
            """Delete the $3 oldest tasks finished before $2 of the states
            $1 in the queues `queues` (a CTE of `q`): each (queue, state)'s
            oldest by a walk of `tasks_finished_queue`, merged. SKIP
            LOCKED: a row another daemon is deleting (or retrying) now is
            left to it, so purging daemons never wait for each other."""
            return f"""
                WITH RECURSIVE {queues}, picked AS (
                    SELECT c.seq FROM queues
                    CROSS JOIN unnest($1::smallint[]) AS s(state) CROSS JOIN LATERAL (
                        SELECT seq, finished_at FROM {t}
                        WHERE {FINISHED_TERM} AND queue = {queue} AND state = s.state
                            AND finished_at < $2
                        ORDER BY finished_at, seq LIMIT $3
                        FOR UPDATE SKIP LOCKED) c
                    ORDER BY c.finished_at, c.seq LIMIT $3
                ), gone AS (
                    -- An array, not a join: the rows are found by the primary
                    -- key however many the planner expects the walk to pick.
                    DELETE FROM {t} WHERE seq = ANY(ARRAY(SELECT seq FROM picked)) RETURNING 1
                )
                SELECT count(*) FROM gone
            """

        # Retention names no queue: the queues with finished tasks, one
        # seek each (a recursive walk of the same index), so its batches
        # seek as a queue's purge does, whatever the statistics say.
        self.delete_finished = delete_finished(
            f"""queues(q) AS (
                (SELECT queue FROM {t} WHERE {FINISHED_TERM} ORDER BY queue LIMIT 1)
                UNION ALL
                SELECT (SELECT queue FROM {t} WHERE {FINISHED_TERM} AND queue > queues.q
                        ORDER BY queue LIMIT 1)
                FROM queues WHERE queues.q IS NOT NULL
            )""",
            "queues.q",
        )
        self.delete_finished_queue = delete_finished("queues(q) AS (SELECT $4::text)", "$4")


class PostgresOperations:
    """`Storage`'s lookup and operator methods for `PostgresEngine` (which
    provides the rest): get, retry, cancel, bulk retry and cancel, delete,
    purge and retention."""

    _sql: Any

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        raise NotImplementedError

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        raise NotImplementedError

    # -- lookups and retry (GetTask, RetryTask) ------------------------------

    async def get(
        self,
        queue: str,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
        history: bool = False,
    ) -> Task:
        one_lookup(task_id, unique_key)
        sql = self._sql.operate
        if task_id is not None:
            row = await self._fetchrow(
                sql.history_by_id if history else sql.get_by_id, queue, task_id
            )
        else:
            row = await self._fetchrow(
                sql.history_by_key if history else sql.get_by_key, queue, unique_key
            )
        if row is None:
            raise NotFound(describe(queue, task_id, unique_key))
        return with_history(row) if history else row_task(row)

    async def _lock(
        self, conn: asyncpg.Connection, queue: str, task_id: str | None, unique_key: str | None
    ) -> Any:
        """The task named by exactly one of id / unique key, its row locked
        for the rest of the transaction (seq, state, available_at,
        lease_until); NotFound."""
        one_lookup(task_id, unique_key)
        if task_id is not None:
            found = await conn.fetchrow(self._sql.operate.lock_by_id, queue, task_id)
        else:
            found = await conn.fetchrow(self._sql.operate.lock_by_key, queue, unique_key)
        if found is None:
            raise NotFound(describe(queue, task_id, unique_key))
        return found

    async def retry(
        self,
        queue: str,
        now: datetime,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
    ) -> Task:
        now_us = to_us(now)
        async with self._conn() as conn, conn.transaction():
            found = await self._lock(conn, queue, task_id, unique_key)
            if found[1] not in (SUCCEEDED, DEAD, CANCELLED) and not stuck(found[2], found[3]):
                raise FailedPrecondition(
                    f"{describe(queue, task_id, unique_key)} is {STATES[found[1]].name};"
                    " only SUCCEEDED, DEAD or CANCELLED tasks (or stuck ones) can be retried"
                )
            # The attempts retry adds need their delays too.
            max_attempts = min(found[4] + found[5], UINT32_MAX)
            delays = schedule_of(found[6], found[7], found[8], max_attempts)
            return row_task(await conn.fetchrow(self._sql.operate.retry, found[0], now_us, delays))

    # -- operations (CancelTask, RetryTasks) ---------------------------------

    async def cancel(
        self,
        queue: str,
        reason: str,
        now: datetime,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
    ) -> Task:
        async with self._conn() as conn, conn.transaction():
            # Locked, so a claim or settlement racing the cancel either ran
            # before (and the cancel sees its outcome) or waits and then
            # matches no row.
            found = await self._lock(conn, queue, task_id, unique_key)
            seq, state = found[0], found[1]
            if state == CANCELLED:
                return row_task(await conn.fetchrow(self._sql.operate.by_seq, seq))
            if state not in (PENDING, LEASED):
                raise FailedPrecondition(
                    f"{describe(queue, task_id, unique_key)} is {STATES[state].name};"
                    " only PENDING or LEASED tasks can be cancelled"
                )
            row = await conn.fetchrow(
                self._sql.operate.cancel, seq, to_us(now), cancelled_text(reason)
            )
            return row_task(row)

    async def cancel_ids(
        self, queue: str, task_ids: Sequence[str], reason: str, now: datetime
    ) -> list[tuple[str, str]]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                self._sql.operate.cancel_ids,
                queue,
                to_us(now),
                cancelled_text(reason),
                list(task_ids),
            )
        return [(row[0], row[1]) for row in rows]

    async def delete_ids(self, queue: str, task_ids: Sequence[str], states: Sequence[int]) -> int:
        async with self._conn() as conn:
            count: int = await conn.fetchval(
                self._sql.operate.delete_ids, queue, list(task_ids), list(states)
            )
        return count

    async def retry_dead(
        self,
        queue: str,
        task_types: Sequence[str],
        finished_before: datetime | None,
        limit: int,
        now: datetime,
    ) -> int:
        if limit <= 0:
            return 0
        before = cutoff_us(finished_before)
        async with self._conn() as conn, conn.transaction():
            row = await conn.fetchrow(
                self._sql.operate.retry_dead,
                queue,
                before,
                limit,
                to_us(now),
                type_list(task_types),
            )
            if row[0]:
                # The attempts retry added need their delays too.
                schedules: dict[tuple[Any, ...], str] = {}
                seqs = []
                delays = []
                for (seq, initial, maximum, max_attempts), multiplier in zip(
                    row[2], row[3], strict=True
                ):
                    kind = (initial, maximum, multiplier, max_attempts)
                    if kind not in schedules:
                        schedules[kind] = delays_text(schedule_of(*kind))
                    seqs.append(seq)
                    delays.append(schedules[kind])
                await conn.execute(self._sql.operate.retry_delays, seqs, delays)
        return int(row[0])

    # -- purge and retention (DeleteTasks, ringod --retain-*) ----------------

    async def delete_finished(
        self,
        queue: str | None,
        states: Sequence[int],
        finished_before: datetime | None,
        limit: int,
    ) -> int:
        wanted = finished_states(states)
        if limit <= 0 or not wanted:
            return 0
        before = cutoff_us(finished_before)
        if queue is None:
            row = await self._fetchrow(self._sql.operate.delete_finished, wanted, before, limit)
        else:
            row = await self._fetchrow(
                self._sql.operate.delete_finished_queue, wanted, before, limit, queue
            )
        return int(row[0])
