"""Tasks in and out: the enqueue INSERT, the claim (expiry of the queue's
overdue leases, then the due tasks in claim order, each with a lease token
minted in Python), and what the claim path reads (activity, next wakeup).

Concurrency (READ COMMITTED):

* claim -- `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)`: a row
  another daemon is leasing right now is skipped rather than waited for, and
  a row another daemon leased after our snapshot fails the state re-check of
  the row lock, so no two daemons ever lease the same task. The candidate
  walk seeks the distinct PENDING priorities of the queue from the top (a
  recursive CTE, one index seek per priority) and takes the due tasks of
  each by `available_at`, so tasks scheduled far ahead are never scanned.
  A claim of some task types (`claim_typed`) walks each type's own tasks
  the same way (`tasks_pending_type`: one seek per type and priority) and
  takes the first of those, so tasks of other types ahead cost it nothing.
  The same statement first expires the queue's overdue leases; when it did
  expire any, it leases nothing and the claim runs again, so a task whose
  expiry made it due at once is leased in order, exactly as in SQLite.

* enqueue -- one `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`
  (dedupe against a racing daemon is the unique index's), then a lookup of
  the keys that conflicted; deadlocks between two overlapping keyed batches
  are retried. A key whose task was deleted (purge, retention) between the
  two is free: its task is inserted again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT
from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef
from ringo_trio._wire.rows import Push, TaskRow, push_rows

from ..rows import C_ATTEMPT, C_ID, C_TOKEN, COLS, LEASED, PENDING, leased, reference_push
from .schema import PENDING_BY_TYPE, delays_text, ident, schedule_of
from .settle import expire
from .sql import Spelling, types_filter


class ClaimSql:
    """The claim path's statements for one engine."""

    def __init__(self, s: Spelling) -> None:
        t = s.tasks
        note = s.note
        # $1..$15 per column; unnest keeps array order and ORDER BY ord makes
        # `seq` (identity) follow it: seq is enqueue order.
        self.insert = f"""
            WITH ins AS (
                INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                    max_attempts, base_max_attempts, priority, backoff_initial_us,
                    backoff_max_us, backoff_multiplier, created_at, updated_at, available_at,
                    last_error, worker_id, lease_token, retry_delays_us, limit_key)
                SELECT u.id, $1, u.task_type, u.payload, u.unique_key, {PENDING}, 0,
                    u.max_attempts, u.max_attempts, u.priority, u.initial_us, u.max_us,
                    u.multiplier, $2, $2, u.available_at, '', '', '', u.delays::bigint[],
                    u.limit_key
                FROM unnest($3::text[], $4::text[], $5::bytea[], $6::text[], $7::bigint[],
                    $8::integer[], $9::bigint[], $10::bigint[], $11::float8[], $12::bigint[],
                    $13::text[], $14::text[])
                    WITH ORDINALITY AS u(id, task_type, payload, unique_key, max_attempts,
                        priority, initial_us, max_us, multiplier, available_at, delays,
                        limit_key, ord)
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
        # `NewTasks`'s INSERT row, as it is ($1..$16), and its schedule ($17).
        self.probe_insert = f"""
            INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,
                backoff_multiplier, created_at, updated_at, available_at, last_error,
                worker_id, lease_token, limit_key, retry_delays_us)
            VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                '', '', '', $16, $17)
            RETURNING seq
        """
        self.probe_delete = f"DELETE FROM {t} WHERE seq = $1"
        self.by_keys = (
            f"SELECT {COLS} FROM {t} WHERE queue = $1 AND unique_key <> ''"
            " AND unique_key = ANY($2::text[])"
        )
        # The claim: expire the queue's overdue leases; when none were,
        # lease the first $3 due tasks in claim order, the n-th picked one
        # with the n-th of the $6 lease tokens (minted in Python, as SQLite's
        # are: `rows.new_lease_tokens`). Always one row out: (leased columns
        # or NULLs, number of leases expired). `claim_typed` takes only
        # tasks of the types $7, each type walked on its own
        # (`tasks_pending_type`): the first $3 of each type, then the first
        # $3 of those.
        self.claim = self._claim(s, typed=False)
        self.claim_typed = self._claim(s, typed=True)
        self.due_activity = (
            f"SELECT {ident(s.schema)}.ringo_due_activity($1, $2::text[], {MAX_ACTIVITY_COUNT}, $3)"
        )
        # The soonest lease deadline, and the soonest available_at of each
        # distinct PENDING priority (one index seek each; `next_wakeup_typed`:
        # of the types $2, one seek per type).
        self.next_wakeup = self._next_wakeup(s, typed=False)
        self.next_wakeup_typed = self._next_wakeup(s, typed=True)

    @staticmethod
    def _claim(s: Spelling, *, typed: bool) -> str:
        t = s.tasks
        due = "queue = $1 AND priority = prios.p AND available_at <= $2"
        if typed:
            walk = f"""SELECT d.seq FROM claimed_types CROSS JOIN LATERAL (
                    SELECT seq, available_at FROM {t}
                    WHERE {due} AND {PENDING_BY_TYPE} AND task_type = claimed_types.t
                    ORDER BY available_at, seq LIMIT $3
                    FOR UPDATE SKIP LOCKED) d
                ORDER BY d.available_at, d.seq LIMIT $3"""
        else:
            walk = f"""SELECT seq FROM {t} WHERE {due} AND state = {PENDING}
                ORDER BY available_at, seq LIMIT $3
                FOR UPDATE SKIP LOCKED"""
        return f"""
            WITH RECURSIVE expired AS ({expire(s, "$2", " AND queue = $1")}
            ), expired_n AS (
                SELECT count(*) AS n, {s.notify_pending("expired")} AS notified,
                    count(waited) AS waited FROM expired
            ), {s.typed_prios(7) if typed else s.prios}, picked AS MATERIALIZED (
                SELECT c.seq FROM prios CROSS JOIN LATERAL ({walk}) c
                WHERE NOT EXISTS (SELECT 1 FROM expired)
                LIMIT $3
            ), numbered AS (
                SELECT seq, row_number() OVER () AS n FROM picked
            ), claimed AS (
                UPDATE {t} k SET state = {LEASED}, attempt = k.attempt + 1,
                    lease_token = tokens.token,
                    worker_id = $4, lease_until = $5, updated_at = $2,
                    leased_at = $2, leased_by = $4
                FROM numbered JOIN unnest($6::text[]) WITH ORDINALITY AS tokens(token, n)
                    ON tokens.n = numbered.n
                WHERE k.seq = numbered.seq
                RETURNING k.*
            )
            SELECT {", ".join("c." + c.strip() for c in COLS.split(","))}, e.n
            FROM expired_n e LEFT JOIN claimed c ON true
        """

    @staticmethod
    def _next_wakeup(s: Spelling, *, typed: bool) -> str:
        t = s.tasks
        pending = "queue = $1 AND priority = prios.p"
        if typed:
            # The queue's leases are few (its workers' slots): `tasks_leased`,
            # read whole. The filter passes NULL, so it proves nothing about
            # `task_type` and the plan cannot take `tasks_active_type`, a
            # walk of the types' whole backlog, instead.
            leased = f"queue = $1 AND state = {LEASED} {types_filter(2)}"
            first = f"""SELECT min(d.available_at) AS available_at
                FROM claimed_types CROSS JOIN LATERAL (
                    SELECT available_at FROM {t} WHERE {pending} AND {PENDING_BY_TYPE}
                        AND task_type = claimed_types.t
                    ORDER BY available_at LIMIT 1) d"""
        else:
            leased = f"queue = $1 AND state = {LEASED}"
            first = (
                f"SELECT available_at FROM {t} WHERE {pending} AND state = {PENDING}"
                " ORDER BY available_at LIMIT 1"
            )
        return f"""
            WITH RECURSIVE {s.typed_prios(2) if typed else s.prios}
            SELECT least(
                (SELECT min(lease_until) FROM {t} WHERE {leased}),
                (SELECT min(f.available_at) FROM prios CROSS JOIN LATERAL ({first}) f))
        """


def pushes(rows: list[TaskRow]) -> list[Push]:
    return push_rows(rows, reference_push)


def claimed_refs(rows: Sequence[Any]) -> list[LeaseRef]:
    return [LeaseRef(task_id=r[C_ID], attempt=r[C_ATTEMPT], lease_token=r[C_TOKEN]) for r in rows]


def leased_rows(rows: Sequence[Any]) -> list[LeasedTask]:
    return [leased(r) for r in rows]


def insert_columns(rows: Any) -> list[list[Any]]:
    """INSERT rows (as `NewTasks` builds them) as the insert statement's
    column arrays ($3..$14: each task's schedule, then its limit key)."""
    cols: list[list[Any]] = [[] for _ in range(12)]
    (ids, types, payloads, keys, attempts, prios, initials, maxima, mults, avail, delays, lk) = cols
    # A batch shares a handful of policies (most often one).
    schedules: dict[tuple[Any, ...], str] = {}
    for r in rows:
        kind = (r[9], r[10], r[11], r[6])
        schedule = schedules.get(kind)
        if schedule is None:
            schedule = schedules[kind] = delays_text(schedule_of(*kind))
        delays.append(schedule)
        ids.append(r[0])
        types.append(r[2])
        payloads.append(r[3])
        keys.append(r[4])
        attempts.append(r[6])
        prios.append(r[8])
        initials.append(r[9])
        maxima.append(r[10])
        mults.append(r[11])
        avail.append(r[14])
        lk.append(r[15])
    return cols
