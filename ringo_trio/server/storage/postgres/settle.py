"""How a lease ends: ack, nack, reject (one at a time, or a group in one
statement), renewal and progress, release of unsent pushes, and expiry;
every statement guarded by the live lease.

Concurrency (READ COMMITTED):

* expiry (`expire_leases`, and the step above) -- `UPDATE ... WHERE seq IN
  (SELECT ... WHERE state = LEASED AND lease_until <= now FOR UPDATE SKIP
  LOCKED)`. Two daemons expiring at once: each overdue row is locked by
  one; the other either skips it (still locked) or re-checks it after the
  commit and finds it no longer LEASED. Each expired lease is processed
  once: one attempt ended, one backoff applied.
* lease operations -- one `UPDATE ... WHERE <the live lease>`; a concurrent
  change to the row makes the guard be re-evaluated on the new version, so a
  stale ref matches nothing (LeaseLost), whoever won. Only on that miss a
  second statement looks whether the ref's attempt ended by CancelTask
  (`LeaseLost(cancelled=True)`), so the hot path pays nothing for it.
* group commit (`settle_many`) -- one statement: the group's live leases
  are locked one `tasks_id` lookup each, in task-id order, then settled by
  one `UPDATE ... FROM` of the locked rows. Groups of two daemons that meet
  on rows (a worker's stale refs after it moved) queue on the lowest id
  first, so they never deadlock; a row that changed meanwhile fails the
  lease re-check of its lock and its item misses, as a single ack would.
"""

from __future__ import annotations

from typing import Any

from ringo_trio._proto.ringo.v1 import LeaseRef

from ..base import Ack, LeaseLost, Nack, Reject, Settlement
from ..history import EXPIRED, FAILED, REJECTED, RELEASED, postgres_push
from ..retry import override_us
from ..rows import CANCELLED, COLS, DEAD, LEASE_EXPIRED, LEASED, PENDING, SUCCEEDED
from .schema import LEASED_BY_ID, literal
from .sql import Spelling

# A group commit's item kinds (the $4 of its statement).
ACK, NACK, REJECT = 0, 1, 2

# The live lease at $4. Every LeaseRef operation is one UPDATE guarded
# by this, so a stale ref matches no row and changes nothing.
MATCH = f"id = $1 AND {LEASED_BY_ID} AND attempt = $2 AND lease_token = $3 AND lease_until > $4"


def retry_at(now: str, delay: str) -> str:
    """When a nacked or expired attempt runs again: after the nack's
    own `delay` (`retry.override_us`) or the entry of the attempt that
    ended in the task's `retry.schedule` (its last entry stands for
    every later attempt)."""
    return f"""{now} + coalesce({delay},
        retry_delays_us[least(attempt, cardinality(retry_delays_us))])"""


def release(now: str, error: str, delay: str, outcome: int = FAILED) -> str:
    # SET expressions see the row as it was before the UPDATE, so
    # `attempt` is the attempt that just ended.
    return f"""
        history = {postgres_push(now, str(outcome), error)},
        state = CASE WHEN attempt >= max_attempts THEN {DEAD} ELSE {PENDING} END,
        available_at = CASE WHEN attempt >= max_attempts THEN available_at
            ELSE {retry_at(now, delay)} END,
        finished_at = CASE WHEN attempt >= max_attempts THEN {now} ELSE NULL END,
        last_error = {error}, worker_id = '', lease_token = '', lease_until = NULL,
        updated_at = {now}
    """


def expire(s: Spelling, now: str, queue_filter: str) -> str:
    """An UPDATE returning (queue, state, waited) of every lease overdue at
    `now`, each locked by exactly one expiring transaction (`waited`: the
    WaitTask notification of one gone DEAD, `Spelling.notify_ended`)."""
    t = s.tasks
    return f"""
        UPDATE {t} SET {release(now, literal(LEASE_EXPIRED), "NULL::bigint", EXPIRED)}
        WHERE seq IN (
            SELECT seq FROM {t}
            WHERE state = {LEASED} AND lease_until <= {now}{queue_filter}
            FOR UPDATE SKIP LOCKED)
        RETURNING queue, state, {s.notify_ended()} AS waited
    """


class SettleSql:
    """The settling statements for one engine."""

    def __init__(self, s: Spelling) -> None:
        t = s.tasks
        note = s.note
        notify_pending = s.notify_pending
        # Every statement that may end tasks notifies the waited ones among
        # them in a RETURNING column (`Spelling.notify_ended`), read by the
        # statement itself, so no planner ever leaves it uncomputed.
        ended = s.notify_ended()
        self.expire_all = f"""
            WITH expired AS ({expire(s, "$1", "")})
            SELECT (SELECT count(*) FROM expired), {notify_pending("expired")},
                (SELECT count(waited) FROM expired)
        """

        def ack(returning: str) -> str:
            return f"""
                UPDATE {t} SET state = {SUCCEEDED}, finished_at = $4, worker_id = '',
                    lease_token = '', lease_until = NULL, updated_at = $4, result = $5
                WHERE {MATCH} RETURNING {returning}, {ended} AS waited
            """

        def nack(returning: str) -> str:
            return f"""
                WITH r AS (
                    UPDATE {t} SET {release("$4", "$5", "$6::bigint")}
                    WHERE {MATCH} RETURNING {returning}, {ended} AS waited
                )
                SELECT r.*, CASE WHEN r.state = {PENDING} THEN {note("r.queue")} END FROM r
            """

        def reject(returning: str) -> str:
            return f"""
                UPDATE {t} SET history = {postgres_push("$4", str(REJECTED), "$5")},
                    state = {DEAD}, finished_at = $4, last_error = $5,
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $4
                WHERE {MATCH} RETURNING {returning}, {ended} AS waited
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

        def group(delete_acked: bool) -> str:
            # `delete_acked` (`Storage.delete_succeeded`): the acks of tasks
            # no daemon waits on are deleted (`gone`), by a DELETE beside the
            # UPDATE; $9 names the ids this daemon's own calls wait on, whose
            # registration may not have committed yet. A deleted row writes
            # no index entry where an update writes five (bench/results.md,
            # "Levers").
            if delete_acked:
                waited = f"EXISTS (SELECT 1 FROM {s.task_waits} w WHERE w.task_id = d.id)"
                gone = f"d.kind = {ACK} AND NOT d.id = ANY($9::text[]) AND NOT {waited}"
                delete = f"""gone AS (
                DELETE FROM {t} k USING live l WHERE k.seq = l.seq AND l.gone
                RETURNING l.ord, k.queue
            ), """
                also = f" UNION ALL SELECT ord, queue, {SUCCEEDED}, false FROM gone"
            else:
                gone, delete, also = "false", "", ""
            return f"""
            WITH d AS (
                SELECT DISTINCT ON (u.id, u.attempt, u.token) u.*
                FROM unnest($1::text[], $2::bigint[], $3::text[], $4::smallint[],
                    $5::bytea[], $6::text[], $7::bigint[])
                    WITH ORDINALITY AS u(id, attempt, token, kind, result, error, delay, ord)
                ORDER BY u.id, u.attempt, u.token, u.ord
            ), live AS MATERIALIZED (
                SELECT k.seq, d.ord, d.kind, d.result, d.error, d.delay, {gone} AS gone
                FROM d CROSS JOIN LATERAL (
                    SELECT seq FROM {t}
                    WHERE id = d.id AND {LEASED_BY_ID} AND attempt = d.attempt
                        AND lease_token = d.token AND lease_until > $8
                    FOR UPDATE) k
                ORDER BY d.id
            ), s AS (
                UPDATE {t} k SET
                    history = CASE WHEN l.kind = {ACK} THEN k.history ELSE {
                postgres_push(
                    "$8",
                    f"CASE WHEN l.kind = {NACK} THEN {FAILED} ELSE {REJECTED} END",
                    "l.error",
                    "k.",
                )
            } END,
                    state = CASE WHEN l.kind = {ACK} THEN {SUCCEEDED}
                        WHEN {again} THEN {PENDING} ELSE {DEAD} END,
                    available_at = CASE WHEN {again}
                        THEN {retry_at("$8", "l.delay")} ELSE k.available_at END,
                    finished_at = CASE WHEN {again} THEN NULL ELSE $8 END,
                    last_error = CASE WHEN l.kind = {ACK} THEN k.last_error ELSE l.error END,
                    result = CASE WHEN l.kind = {ACK} THEN l.result ELSE k.result END,
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $8
                FROM live l WHERE k.seq = l.seq AND NOT l.gone
                RETURNING l.ord, k.queue, k.state, {s.notify_ended("k.")} IS NOT NULL AS waited
            ), {delete}a (ord, queue, state, waited) AS (SELECT * FROM s{also})
            SELECT array_agg(a.ord), array_agg(a.queue), {notify_pending("a")},
                count(*) FILTER (WHERE a.waited) FROM a
        """

        self.settle_many = group(delete_acked=False)
        self.settle_many_deleting = group(delete_acked=True)
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
            WHERE {MATCH} RETURNING id, attempt, lease_token, worker_id, lease_until
        """
        self.progress = f"""
            UPDATE {t} SET progress_current = $5, progress_total = $6,
                progress_message = $7, progress_at = $4, updated_at = $4
            WHERE {MATCH} RETURNING id
        """
        # `available_at` is kept: claim never moves it and it was due when
        # claimed, so the task is claimable now and keeps its place in order.
        # A ref listed twice matches its row once (UPDATE ... FROM).
        self.release = f"""
            WITH r AS (
                UPDATE {t} k SET history = {postgres_push("$4", str(RELEASED), "''", "k.")},
                    state = {PENDING}, attempt = k.attempt - 1, worker_id = '',
                    lease_token = '', lease_until = NULL, updated_at = $4
                FROM unnest($1::text[], $2::bigint[], $3::text[]) AS u(id, attempt, token)
                WHERE k.id = u.id AND k.state = {LEASED} AND k.attempt = u.attempt
                    AND k.lease_token = u.token AND k.lease_until > $4
                RETURNING k.queue, k.state
            )
            SELECT (SELECT count(*) FROM r), {notify_pending("r")}
        """


def settlement_row(item: Settlement) -> tuple[Any, ...]:
    """The item as a row of the group statement's columns ($1..$7): task id,
    attempt, token, kind, result, error, delay."""
    ref = item.ref
    match item:
        case Ack(_, result):
            return (ref.task_id, ref.attempt, ref.lease_token, ACK, result, None, None)
        case Nack(_, error, retry_delay):
            delay = override_us(retry_delay)
            return (ref.task_id, ref.attempt, ref.lease_token, NACK, None, error, delay)
        case Reject(_, error):
            return (ref.task_id, ref.attempt, ref.lease_token, REJECT, None, error, None)


def lease_lost(ref: LeaseRef, *, cancelled: bool) -> LeaseLost:
    if cancelled:
        return LeaseLost(
            f"task {ref.task_id!r} attempt {ref.attempt}: the task was cancelled", cancelled=True
        )
    return LeaseLost(
        f"task {ref.task_id!r} attempt {ref.attempt}: not the current lease, or it has expired"
    )
