"""How a lease ends: ack, nack, reject, release, expiry, and the group
commit of many; every statement guarded by the live lease.

Group commit (`settle_many`): one `BEGIN IMMEDIATE ... COMMIT` for a
whole group of acks, nacks and rejects; the count rows and index pages the
group shares go to the WAL once, and no `Task` is built. When every item
names a different task (the Work stream's case), the order of the items
cannot change what they do, and the acks go as one `UPDATE ... FROM (the
group's refs) RETURNING id` (`ack_many_sql`): one statement instead of one
per ack, 14.7 -> 8.1 us of engine CPU per ack. Otherwise each item is its
own lease-guarded UPDATE, in order, so a lease listed twice misses the
second time, as in sequence.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any

from ringo_trio._proto.ringo.v1 import LeaseRef

from ..base import Ack, LeaseLost, Nack, Reject, Settlement
from ..history import EXPIRED, FAILED, REJECTED, RELEASED, sqlite_push
from ..retry import override_us
from ..rows import CANCELLED, COLS, DEAD, LEASED, PENDING, SUCCEEDED
from .claim import pieces

# The current lease, alive at :now. Every LeaseRef operation is one UPDATE
# guarded by this, so a stale ref matches no row and changes nothing.
LEASE_MATCH = (
    f"id = :id AND state = {LEASED} AND attempt = :attempt"
    " AND lease_token = :token AND lease_until > :now"
)
# SET expressions see the row as it was before the UPDATE, so `attempt`
# here is the attempt that just ended. The delay is the nack's own
# (`retry.override_us`) or the task's policy (`retry.delay_us`, registered
# as `ringo_retry_delay_us`): both capped in Python.


def ended(outcome: int) -> str:
    """The SET of a nack (FAILED) or an expiry (EXPIRED): retry or DEAD."""
    return f"""
    history = {sqlite_push(":now", str(outcome), ":error")},
    state = CASE WHEN attempt >= max_attempts THEN {DEAD} ELSE {PENDING} END,
    available_at = CASE WHEN attempt >= max_attempts THEN available_at
        ELSE :now + coalesce(:delay, ringo_retry_delay_us(
            backoff_initial_us, backoff_max_us, backoff_multiplier, attempt)) END,
    finished_at = CASE WHEN attempt >= max_attempts THEN :now ELSE NULL END,
    last_error = :error, worker_id = '', lease_token = '', lease_until = NULL,
    updated_at = :now
"""


RELEASE = ended(FAILED)
ACK_SET = f"""
    state = {SUCCEEDED}, finished_at = :now, worker_id = '', lease_token = '',
    lease_until = NULL, updated_at = :now, result = :result
"""
REJECT_SET = f"""
    history = {sqlite_push(":now", str(REJECTED), ":error")},
    state = {DEAD}, finished_at = :now, last_error = :error, worker_id = '',
    lease_token = '', lease_until = NULL, updated_at = :now
"""


def lease_update(assignments: str, returning: str) -> str:
    return f"UPDATE tasks SET {assignments} WHERE {LEASE_MATCH} RETURNING {returning}"


ACK = lease_update(ACK_SET, COLS)
NACK = lease_update(RELEASE, COLS)
REJECT = lease_update(REJECT_SET, COLS)
# Group commit: the queue is all a settled item answers (no Task is built);
# an ack also returns the task type, for its counts.
ACK_QUEUE = lease_update(ACK_SET, "queue, task_type")
NACK_QUEUE = lease_update(RELEASE, "queue")
REJECT_QUEUE = lease_update(REJECT_SET, "queue")
EXTEND = f"""
    UPDATE tasks SET lease_until = :until, updated_at = :now
    WHERE {LEASE_MATCH} RETURNING id, attempt, lease_token, worker_id, lease_until
"""
# `available_at` is kept: claim never moves it and it was due when claimed,
# so the task is claimable now and keeps its place in claim order.
RELEASE_UNSENT = f"""
    UPDATE tasks SET history = {sqlite_push(":now", str(RELEASED), "''")},
        state = {PENDING}, attempt = attempt - 1, worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now
    WHERE {LEASE_MATCH}
"""
PROGRESS = f"""
    UPDATE tasks SET progress_current = :current, progress_total = :total,
        progress_message = :message, progress_at = :now, updated_at = :now
    WHERE {LEASE_MATCH} RETURNING id
"""
# INDEXED BY: without it the planner may prefer a table scan for the
# queue-less form, and an expiry pass must only touch leased rows.
EXPIRE_ALL = (
    f"UPDATE tasks INDEXED BY tasks_leased SET {ended(EXPIRED)}"
    f" WHERE state = {LEASED} AND lease_until <= :now"
)
EXPIRE_QUEUE = f"{EXPIRE_ALL} AND queue = :queue"

# Whether a ref's attempt ended by CancelTask: the miss path of a lease
# operation only, so the hot path runs no extra statement.
CANCELLED_AT = f"SELECT 1 FROM tasks WHERE id = :id AND state = {CANCELLED} AND attempt = :attempt"


def _refs(count: int) -> str:
    """The (id, attempt, token, result) rows of `count` acks: ?1 is the time,
    then four parameters per ack."""
    rows = ", ".join(f"(?{i}, ?{i + 1}, ?{i + 2}, ?{i + 3})" for i in range(2, 4 * count, 4))
    return f"refs (id, attempt, token, result) AS (VALUES {rows})"


@functools.lru_cache(maxsize=16)
def ack_many_sql(count: int) -> str:
    """`count` acks of different tasks as one lease-guarded UPDATE
    (`_refs`). INDEXED BY: each ref is a seek of `tasks_id`, whatever the
    planner guesses."""
    assignments = ACK_SET.replace(":now", "?1").replace(":result", "refs.result")
    return f"""
        WITH {_refs(count)}
        UPDATE tasks INDEXED BY tasks_id SET {assignments}
        FROM refs
        WHERE tasks.id = refs.id AND state = {LEASED} AND tasks.attempt = refs.attempt
            AND lease_token = refs.token AND lease_until > ?1
        RETURNING tasks.id, queue, task_type
    """


@functools.lru_cache(maxsize=16)
def delete_acked_sql(count: int) -> str:
    """`count` acks of different tasks that delete them
    (`Storage.delete_succeeded`), as one lease-guarded DELETE with the
    parameters and answer of `ack_many_sql` (the results go unread). The
    counts' row trigger takes each deleted task off LEASED."""
    return f"""
        WITH {_refs(count)}
        DELETE FROM tasks INDEXED BY tasks_id
        WHERE id IN (SELECT id FROM refs) AND state = {LEASED} AND lease_until > ?1
            AND (attempt, lease_token) = (SELECT attempt, token FROM refs WHERE refs.id = tasks.id)
        RETURNING id, queue, task_type
    """


# Acks per `ack_many_sql` statement, largest first: a group is cut into
# these, so a handful of statements stay prepared in the statement cache.
ACK_CHUNKS = (256, 64, 32, 16, 8, 4, 2, 1)


def lost(db: sqlite3.Connection, ref: LeaseRef) -> LeaseLost:
    """The LeaseLost for a ref whose lease operation matched no row, telling
    whether that very attempt ended by CancelTask."""
    cancelled = (
        db.execute(CANCELLED_AT, {"id": ref.task_id, "attempt": ref.attempt}).fetchone() is not None
    )
    if cancelled:
        return LeaseLost(
            f"task {ref.task_id!r} attempt {ref.attempt}: the task was cancelled", cancelled=True
        )
    return LeaseLost(
        f"task {ref.task_id!r} attempt {ref.attempt}: not the current lease, or it has expired"
    )


def ack_together(
    db: sqlite3.Connection,
    acks: Sequence[tuple[int, Ack]],
    now_us: int,
    answers: list[str | LeaseLost | None],
    succeeded: list[tuple[str, str]],
    *,
    delete: bool = False,
) -> None:
    """Acks of different tasks by `ack_many_sql`, or by `delete_acked_sql`
    when they `delete` their tasks: each answer is its task's queue, or
    LeaseLost (the statement matched no row for it). `succeeded` gains the
    (queue, task type) of each task kept SUCCEEDED, for its counts."""
    statement = delete_acked_sql if delete else ack_many_sql
    for piece in pieces(acks, ACK_CHUNKS):
        args: list[Any] = [now_us]
        for _, item in piece:
            ref = item.ref
            args += (ref.task_id, ref.attempt, ref.lease_token, item.result)
        acked = {}
        for task_id, queue, task_type in db.execute(statement(len(piece)), args):
            acked[task_id] = queue
            if not delete:
                succeeded.append((queue, task_type))
        for i, item in piece:
            found = acked.get(item.ref.task_id)
            answers[i] = lost(db, item.ref) if found is None else found


def settle_one(
    db: sqlite3.Connection, item: Settlement, now_us: int, succeeded: list[tuple[str, str]]
) -> str | LeaseLost:
    """One lease-guarded UPDATE for `item`: its task's queue, or LeaseLost."""
    ref = item.ref
    args: dict[str, Any] = {
        "id": ref.task_id,
        "attempt": ref.attempt,
        "token": ref.lease_token,
        "now": now_us,
    }
    match item:
        case Ack(_, result):
            args["result"] = result
            row = db.execute(ACK_QUEUE, args).fetchone()
            if row is not None:
                succeeded.append((row[0], row[1]))
        case Nack(_, error, retry_delay):
            args["error"] = error
            args["delay"] = override_us(retry_delay)
            row = db.execute(NACK_QUEUE, args).fetchone()
        case Reject(_, error):
            args["error"] = error
            row = db.execute(REJECT_QUEUE, args).fetchone()
    return lost(db, ref) if row is None else str(row[0])
