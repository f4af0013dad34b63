"""Every statement of the engine, spelled for one schema, channel and
engine id (`Sql`), and the inspection queries built per call."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT, MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import Task

from .. import listing
from ..rows import (
    CANCELLED,
    COLS,
    DEAD,
    LEASE_EXPIRED,
    LEASED,
    PENDING,
    SUCCEEDED,
    UINT32_MAX,
    row_task,
)
from .schema import FINISHED_TERM, ident, literal, lock_key

# pg_notify refuses payloads of 8000 bytes or more; queue names are far
# shorter (MAX_NAME_BYTES), this only keeps a bad one from failing a write.
MAX_NOTIFY_QUEUE_BYTES = 7000

# A group commit's item kinds (the $4 of its statement).
ACK, NACK, REJECT = 0, 1, 2


class Sql:
    """The engine's statements, spelled for one schema, channel and engine id."""

    def __init__(self, schema: str, channel: str, instance: str) -> None:
        t = f"{ident(schema)}.tasks"
        self.tasks = t

        def note(queue: str) -> str:
            """pg_notify naming `queue` (an SQL expression) and this engine."""
            return (
                f"pg_notify({literal(channel)}, {literal(instance + ' ')} ||"
                f" CASE WHEN octet_length({queue}) <= {MAX_NOTIFY_QUEUE_BYTES}"
                f" THEN {queue} ELSE '' END)"
            )

        # The live lease at $4. Every LeaseRef operation is one UPDATE guarded
        # by this, so a stale ref matches no row and changes nothing.
        match = (
            f"id = $1 AND state = {LEASED} AND attempt = $2 AND lease_token = $3"
            " AND lease_until > $4"
        )

        def retry_at(now: str, delay: str) -> str:
            """When a nacked or expired attempt runs again: after the nack's
            own `delay` (`retry.override_us`) or the entry of the attempt that
            ended in the task's `retry.schedule` (its last entry stands for
            every later attempt)."""
            return f"""{now} + coalesce({delay},
                retry_delays_us[least(attempt, cardinality(retry_delays_us))])"""

        def release(now: str, error: str, delay: str) -> str:
            # SET expressions see the row as it was before the UPDATE, so
            # `attempt` is the attempt that just ended.
            return f"""
                state = CASE WHEN attempt >= max_attempts THEN {DEAD} ELSE {PENDING} END,
                available_at = CASE WHEN attempt >= max_attempts THEN available_at
                    ELSE {retry_at(now, delay)} END,
                finished_at = CASE WHEN attempt >= max_attempts THEN {now} ELSE NULL END,
                last_error = {error}, worker_id = '', lease_token = '', lease_until = NULL,
                updated_at = {now}
            """

        def expire(now: str, queue_filter: str) -> str:
            """An UPDATE returning (queue, state) of every lease overdue at
            `now`, each locked by exactly one expiring transaction."""
            return f"""
                UPDATE {t} SET {release(now, literal(LEASE_EXPIRED), "NULL::bigint")}
                WHERE seq IN (
                    SELECT seq FROM {t}
                    WHERE state = {LEASED} AND lease_until <= {now}{queue_filter}
                    FOR UPDATE SKIP LOCKED)
                RETURNING queue, state
            """

        def notify_pending(cte: str) -> str:
            """How many distinct queues of `cte` went PENDING, notifying each."""
            return (
                f"(SELECT count(*) FROM (SELECT DISTINCT queue FROM {cte}"
                f" WHERE state = {PENDING}) q, LATERAL {note('q.queue')} n)"
            )

        # $1..$15 per column; unnest keeps array order and ORDER BY ord makes
        # `seq` (identity) follow it: seq is enqueue order.
        self.insert = f"""
            WITH ins AS (
                INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                    max_attempts, base_max_attempts, priority, backoff_initial_us,
                    backoff_max_us, backoff_multiplier, created_at, updated_at, available_at,
                    last_error, worker_id, lease_token, retry_delays_us)
                SELECT u.id, $1, u.task_type, u.payload, u.unique_key, {PENDING}, 0,
                    u.max_attempts, u.max_attempts, u.priority, u.initial_us, u.max_us,
                    u.multiplier, $2, $2, u.available_at, '', '', '', u.delays::bigint[]
                FROM unnest($3::text[], $4::text[], $5::bytea[], $6::text[], $7::bigint[],
                    $8::integer[], $9::bigint[], $10::bigint[], $11::float8[], $12::bigint[],
                    $13::text[])
                    WITH ORDINALITY AS u(id, task_type, payload, unique_key, max_attempts,
                        priority, initial_us, max_us, multiplier, available_at, delays, ord)
                ORDER BY u.ord
                ON CONFLICT (queue, unique_key) WHERE unique_key <> '' DO NOTHING
                RETURNING unique_key
            ), n AS (
                SELECT count(*) AS created,
                    array_agg(unique_key) FILTER (WHERE unique_key <> '') AS keys
                FROM ins
            )
            SELECT n.keys, CASE WHEN n.created > 0 THEN {note("$1")} END FROM n
        """
        # `NewTasks`'s INSERT row, as it is ($1..$15), and its schedule ($16).
        self.probe_insert = f"""
            INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,
                backoff_multiplier, created_at, updated_at, available_at, last_error,
                worker_id, lease_token, retry_delays_us)
            VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                '', '', '', $16)
            RETURNING seq
        """
        self.probe_delete = f"DELETE FROM {t} WHERE seq = $1"
        self.by_keys = (
            f"SELECT {COLS} FROM {t} WHERE queue = $1 AND unique_key <> ''"
            " AND unique_key = ANY($2::text[])"
        )
        self.get_by_id = f"SELECT {COLS} FROM {t} WHERE queue = $1 AND id = $2"
        self.get_by_key = (
            f"SELECT {COLS} FROM {t} WHERE queue = $1 AND unique_key = $2 AND unique_key <> ''"
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
                UPDATE {t} SET state = {PENDING}, available_at = $2, finished_at = NULL,
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
            UPDATE {t} SET state = {CANCELLED}, finished_at = $2, last_error = $3,
                worker_id = '', lease_token = '', lease_until = NULL, updated_at = $2
            WHERE seq = $1 RETURNING {COLS}
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

        # The queue's distinct PENDING priorities, highest first, one index
        # seek each (a recursive walk), so far-future tasks are never scanned.
        prios = f"""prios(p) AS (
                (SELECT priority FROM {t} WHERE queue = $1 AND state = {PENDING}
                 ORDER BY priority DESC LIMIT 1)
                UNION ALL
                SELECT (SELECT priority FROM {t} WHERE queue = $1 AND state = {PENDING}
                        AND priority < prios.p ORDER BY priority DESC LIMIT 1)
                FROM prios WHERE prios.p IS NOT NULL
            )"""

        # The claim: expire the queue's overdue leases; when none were,
        # lease the first $3 due tasks in claim order, the n-th picked one
        # with the n-th of the $7 lease tokens (minted in Python, as SQLite's
        # are: `rows.new_lease_token`). Always one row out: (leased columns
        # or NULLs, number of leases expired).
        types = types_filter(6)
        self.claim = f"""
            WITH RECURSIVE expired AS ({expire("$2", " AND queue = $1")}
            ), expired_n AS (
                SELECT count(*) AS n, {notify_pending("expired")} AS notified FROM expired
            ), {prios}, picked AS MATERIALIZED (
                SELECT c.seq FROM prios CROSS JOIN LATERAL (
                    SELECT seq FROM {t}
                    WHERE queue = $1 AND state = {PENDING} AND priority = prios.p
                        AND available_at <= $2 {types}
                    ORDER BY available_at, seq LIMIT $3
                    FOR UPDATE SKIP LOCKED) c
                WHERE NOT EXISTS (SELECT 1 FROM expired)
                LIMIT $3
            ), numbered AS (
                SELECT seq, row_number() OVER () AS n FROM picked
            ), claimed AS (
                UPDATE {t} k SET state = {LEASED}, attempt = k.attempt + 1,
                    lease_token = tokens.token,
                    worker_id = $4, lease_until = $5, updated_at = $2
                FROM numbered JOIN unnest($7::text[]) WITH ORDINALITY AS tokens(token, n)
                    ON tokens.n = numbered.n
                WHERE k.seq = numbered.seq
                RETURNING k.*
            )
            SELECT {", ".join("c." + c.strip() for c in COLS.split(","))}, e.n
            FROM expired_n e LEFT JOIN claimed c ON true
        """
        self.expire_all = f"""
            WITH expired AS ({expire("$1", "")})
            SELECT (SELECT count(*) FROM expired), {notify_pending("expired")}
        """

        def ack(returning: str) -> str:
            return f"""
                UPDATE {t} SET state = {SUCCEEDED}, finished_at = $4, worker_id = '',
                    lease_token = '', lease_until = NULL, updated_at = $4, result = $5
                WHERE {match} RETURNING {returning}
            """

        def nack(returning: str) -> str:
            return f"""
                WITH r AS (
                    UPDATE {t} SET {release("$4", "$5", "$6::bigint")}
                    WHERE {match} RETURNING {returning}
                )
                SELECT r.*, CASE WHEN r.state = {PENDING} THEN {note("r.queue")} END FROM r
            """

        def reject(returning: str) -> str:
            return f"""
                UPDATE {t} SET state = {DEAD}, finished_at = $4, last_error = $5,
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $4
                WHERE {match} RETURNING {returning}
            """

        self.ack, self.nack, self.reject = ack(COLS), nack(COLS), reject(COLS)
        # A group of one: the single statement, answering the queue only
        # (the group statement's sort, lock step and join cost a lone item
        # more than they save).
        self.settle_one = {
            ACK: ack("queue"),
            NACK: nack("queue, state"),
            REJECT: reject("queue"),
        }
        # Group commit, one statement: the group's live leases are locked in
        # task-id order (daemons whose groups meet on rows wait for each
        # other in one order, never in a cycle: the refs come sorted out of
        # DISTINCT ON, and the row lock inside the LATERAL, which the planner
        # cannot flatten, makes each lock one tasks_id lookup taken in that
        # order, whatever the table's statistics), then settled by one UPDATE
        # whose SET picks each item's outcome by its kind ($4: 0 ack, 1
        # nack, 2 reject). Identical refs are reduced to their first item, so
        # a lease listed twice is settled once (the rest then miss, as in
        # sequence); distinct refs of one task match at most one lease. One
        # row out: the settled items' positions and queues, and the
        # notifications of the queues nacks made claimable.
        again = f"l.kind = {NACK} AND k.attempt < k.max_attempts"
        self.settle_many = f"""
            WITH d AS (
                SELECT DISTINCT ON (u.id, u.attempt, u.token) u.*
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::smallint[],
                    $5::bytea[], $6::text[], $7::bigint[])
                    WITH ORDINALITY AS u(id, attempt, token, kind, result, error, delay, ord)
                ORDER BY u.id, u.attempt, u.token, u.ord
            ), live AS MATERIALIZED (
                SELECT k.seq, d.ord, d.kind, d.result, d.error, d.delay
                FROM d CROSS JOIN LATERAL (
                    SELECT seq FROM {t}
                    WHERE id = d.id AND state = {LEASED} AND attempt = d.attempt
                        AND lease_token = d.token AND lease_until > $8
                    FOR UPDATE) k
                ORDER BY d.id
            ), s AS (
                UPDATE {t} k SET
                    state = CASE WHEN l.kind = {ACK} THEN {SUCCEEDED}
                        WHEN {again} THEN {PENDING} ELSE {DEAD} END,
                    available_at = CASE WHEN {again}
                        THEN {retry_at("$8", "l.delay")} ELSE k.available_at END,
                    finished_at = CASE WHEN {again} THEN NULL ELSE $8 END,
                    last_error = CASE WHEN l.kind = {ACK} THEN k.last_error ELSE l.error END,
                    result = CASE WHEN l.kind = {ACK} THEN l.result ELSE k.result END,
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $8
                FROM live l WHERE k.seq = l.seq
                RETURNING l.ord, k.queue, k.state
            )
            SELECT array_agg(s.ord), array_agg(s.queue), {notify_pending("s")} FROM s
        """
        # The miss path of lease operations: which of these (id, attempt)
        # ended by CancelTask (their 1-based positions).
        self.cancelled_of = f"""
            SELECT u.ord
            FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(id, attempt, ord)
            WHERE EXISTS (SELECT 1 FROM {t}
                WHERE id = u.id AND state = {CANCELLED} AND attempt = u.attempt LIMIT 1)
        """
        self.extend = f"""
            UPDATE {t} SET lease_until = $5, updated_at = $4
            WHERE {match} RETURNING id, attempt, lease_token, worker_id, lease_until
        """
        self.progress = f"""
            UPDATE {t} SET progress_current = $5, progress_total = $6,
                progress_message = $7, progress_at = $4, updated_at = $4
            WHERE {match} RETURNING id
        """
        # `available_at` is kept: claim never moves it and it was due when
        # claimed, so the task is claimable now and keeps its place in order.
        # A ref listed twice matches its row once (UPDATE ... FROM).
        self.release = f"""
            WITH r AS (
                UPDATE {t} k SET state = {PENDING}, attempt = k.attempt - 1, worker_id = '',
                    lease_token = '', lease_until = NULL, updated_at = $4
                FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(id, attempt, token)
                WHERE k.id = u.id AND k.state = {LEASED} AND k.attempt = u.attempt
                    AND k.lease_token = u.token AND k.lease_until > $4
                RETURNING k.queue, k.state
            )
            SELECT (SELECT count(*) FROM r), {notify_pending("r")}
        """

        def delete_finished(queue_filter: str) -> str:
            """Delete the $3 oldest tasks finished before $2 of the states
            $1: each state's oldest by an ordered index walk, merged. SKIP
            LOCKED: a row another daemon is deleting (or retrying) now is
            left to it, so purging daemons never wait for each other."""
            return f"""
                WITH picked AS (
                    SELECT c.seq FROM unnest($1::smallint[]) AS s(state) CROSS JOIN LATERAL (
                        SELECT seq, finished_at FROM {t}
                        WHERE {FINISHED_TERM} AND state = s.state
                            AND finished_at < $2{queue_filter}
                        ORDER BY finished_at, seq LIMIT $3
                        FOR UPDATE SKIP LOCKED) c
                    ORDER BY c.finished_at, c.seq LIMIT $3
                ), gone AS (
                    DELETE FROM {t} k USING picked WHERE k.seq = picked.seq RETURNING 1
                )
                SELECT count(*) FROM gone
            """

        self.delete_finished = delete_finished("")
        self.delete_finished_queue = delete_finished(" AND queue = $4")

        self.activity = (
            f"SELECT {ident(schema)}.ringo_activity($1, $2::text[], {MAX_ACTIVITY_COUNT})"
        )
        self.due_activity = (
            f"SELECT {ident(schema)}.ringo_due_activity($1, $2::text[], {MAX_ACTIVITY_COUNT}, $3)"
        )
        types = types_filter(2)
        # The soonest lease deadline, and the soonest available_at of each
        # distinct PENDING priority (one index seek each).
        self.next_wakeup = f"""
            WITH RECURSIVE {prios}
            SELECT least(
                (SELECT min(lease_until) FROM {t}
                 WHERE queue = $1 AND state = {LEASED} {types}),
                (SELECT min(f.available_at) FROM prios CROSS JOIN LATERAL (
                    SELECT available_at FROM {t}
                    WHERE queue = $1 AND state = {PENDING} AND priority = prios.p {types}
                    ORDER BY available_at LIMIT 1) f))
        """

        # -- inspection (see `_listing`) --
        counts = f"{ident(schema)}.task_counts"
        deltas = f"{ident(schema)}.task_count_deltas"
        # Folds the committed deltas into task_counts. Only folders write
        # task_counts, one at a time (the advisory lock), so its row locks
        # never meet the write path's.
        self.fold_lock = f"SELECT pg_advisory_xact_lock({lock_key(schema + ' counts')})"
        self.fold = f"""
            WITH moved AS (DELETE FROM {deltas} RETURNING queue, task_type, state, d)
            INSERT INTO {counts} AS c (queue, task_type, state, n)
            SELECT queue, task_type, state, sum(d) FROM moved GROUP BY queue, task_type, state
            ON CONFLICT (queue, task_type, state) DO UPDATE SET n = c.n + excluded.n
        """
        # Counts of the queues $1 at one snapshot: folded counts plus the
        # deltas committed since the fold (few: the fold just ran).
        self.queues_counts = f"""
            SELECT queue, task_type, state, sum(n) FROM (
                SELECT queue, task_type, state, n FROM {counts} WHERE queue = ANY($1::text[])
                UNION ALL
                SELECT queue, task_type, state, d FROM {deltas} WHERE queue = ANY($1::text[])
            ) c GROUP BY queue, task_type, state
        """
        oldest_of = prios.replace("$1", "n.name")
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
            SELECT task_type, state FROM (
                SELECT task_type, state, n FROM {counts} WHERE queue = $1
                UNION ALL
                SELECT task_type, state, d FROM {deltas} WHERE queue = $1
            ) c GROUP BY task_type, state HAVING sum(n) > 0
        """
        # The queues after $1 holding a task, by the folded counts (a queue
        # whose first tasks came after the fold shows up in the next call).
        self.queue_names = f"""
            SELECT queue FROM {counts} WHERE queue > $1
            GROUP BY queue HAVING sum(n) > 0 ORDER BY queue LIMIT $2
        """
        self.listed_by_seq = (
            f"SELECT {LIST_COLS} FROM {t} WHERE seq = ANY($1::bigint[]) ORDER BY seq"
        )


# -- inspection ------------------------------------------------------------

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
    `_listing`); $1 queue, $3 limit, $4... the arms' task types. Each arm
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


def types_filter(n: int) -> str:
    """The task-type filter on parameter $n: NULL (no types asked) passes all."""
    return f"AND (${n}::text[] IS NULL OR task_type = ANY(${n}::text[]))"


def type_list(task_types: Sequence[str]) -> list[str] | None:
    return list(task_types) if task_types else None
