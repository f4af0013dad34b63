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

from .. import history
from ..history import HISTORY_COLS, postgres_push
from ..rows import CANCELLED, COLS, DEAD, LEASED, PENDING, SUCCEEDED, UINT32_MAX
from .schema import FINISHED_TERM
from .sql import Spelling, types_filter


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


def one_lookup(task_id: str | None, unique_key: str | None) -> None:
    if (task_id is None) == (unique_key is None):
        raise ValueError("exactly one of task_id / unique_key")
