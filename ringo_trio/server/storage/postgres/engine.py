"""The shared storage engine: one PostgreSQL database (schema), any number of daemons.

Theory of operation
-------------------
Same table, same state machine and same rules as the SQLite engine (see
`_base`); what changes is that several daemons on several machines call into
one database at once, so every rule has to hold against concurrent writers,
not just against the other tasks of one event loop.

Driver: asyncpg on a connection pool (`pool_size`). bench/pg_driver.py
measured it against psycopg 3 + psycopg_pool on uvloop: claim+ack round
trips are a tie (the server bounds them: one commit each), a 1000-row
enqueue is ~2x faster on asyncpg. Every statement is prepared once per
connection (asyncpg's statement cache) and runs its generic plan
(`plan_cache_mode`: re-planning the claim's CTE per call cost ~30% of a
claim), and every hot operation is ONE statement, hence one round trip and
its own implicit transaction. The pool runs no reset query on release (an
extra round trip each call), which is safe because the engine never leaves
session state behind: no SET, no session advisory lock, no LISTEN on pooled
connections.

Concurrency, operation by operation (READ COMMITTED):

* claim -- `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)`: a row
  another daemon is leasing right now is skipped rather than waited for, and
  a row another daemon leased after our snapshot fails the state re-check of
  the row lock, so no two daemons ever lease the same task. The candidate
  walk seeks the distinct PENDING priorities of the queue from the top (a
  recursive CTE, one index seek per priority) and takes the due tasks of
  each by `available_at`, so tasks scheduled far ahead are never scanned.
  The same statement first expires the queue's overdue leases; when it did
  expire any, it leases nothing and the claim runs again, so a task whose
  expiry made it due at once is leased in order, exactly as in SQLite.
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
* cancel -- the row is locked (`SELECT ... FOR UPDATE`), checked and made
  CANCELLED with its lease cleared in one transaction: a lease operation
  racing it either committed first (the cancel then sees SUCCEEDED/DEAD or a
  new PENDING) or re-evaluates its guard on the CANCELLED row and misses.
* bulk retry (`retry_dead`) -- one `UPDATE ... WHERE seq IN (SELECT ...
  ORDER BY finished_at LIMIT n FOR UPDATE SKIP LOCKED)`, notifying the queue
  once in the same statement.
* enqueue -- one `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`
  (dedupe against a racing daemon is the unique index's), then a lookup of
  the keys that conflicted; deadlocks between two overlapping keyed batches
  are retried. A key whose task was deleted (purge, retention) between the
  two is free: its task is inserted again.
* purge and retention (`delete_finished`) -- one `DELETE` of the rows a
  sub-select picked `FOR UPDATE SKIP LOCKED`, the oldest finished of each
  asked state by an ordered walk of `tasks_finished_age` or `tasks_finished_queue`: daemons
  purging at once, or a purge meeting a retry, skip each other's rows
  instead of waiting; a row retried after the snapshot fails the state
  re-check of the lock and stays.

Inspection (ListTasks, GetQueueStats, ListQueues; see `_listing`). Counts
must be exact and cheap at a million tasks, but one counter row per (queue,
type, state) updated by every claim, ack and nack of every daemon would
queue concurrent transactions on its row lock, and a claim (PENDING row,
then LEASED) against a nack (LEASED, then PENDING) would deadlock. So
statement triggers only INSERT each statement's net changes into
`task_count_deltas` (inserts never wait on each other), and `_fold` moves
them into `task_counts` -- under an advisory lock, so folders never meet --
before every stats read and on `watch`'s beat. A read sums `task_counts`
and the deltas committed since the fold, in one snapshot: exact. An
index-only count of the queue's index entries was measured first and
dropped: 0.7 s at 1,000,000 tasks. Pages are a Merge Append of index scans
on partial indexes (as in SQLite): `tasks_active_type (queue, task_type,
seq)` for PENDING/LEASED, `tasks_finished (queue, task_type, state, seq)`
for the finished states. A non-HOT UPDATE adds an entry to every index
whose predicate the new row meets, so a claim adds none to them and an ack
one, where full listing indexes cost two each. The inspection statements run
in a read-only snapshot that turns sequential scans, bitmap scans and sorts
off for its own transaction, so no plan reads every row of a big queue.

Time: the caller's `now` (microseconds, as in SQLite); never the database's
clock. A lease token is `gen_random_uuid()` without dashes: 32 hex digits,
122 random bits, minted in the claiming statement.

Cross-daemon wake-ups: every mutation that may make a task claimable
(enqueue that created tasks, nack back to PENDING, retry and bulk retry,
release, expiry back to PENDING) calls `pg_notify(channel, "<engine id> <queue>")` inside its
own transaction, so the notification is delivered at commit and never for a
rolled-back change. `watch` LISTENs on a dedicated connection and skips the
engine's own notifications. One channel per schema (`ringo:<schema>`), so
two deployments in one database do not wake each other.

Connection loss: any connection-level failure (refused, reset, terminated
backend, server shutting down or starting up) is `StorageUnavailable`; the
broken connection leaves the pool and the next call connects afresh, so the
engine recovers by itself once the server is back. Each such failure is
reported to `unavailable_listener`; `ping` (the daemon's reachability probe)
runs ``SELECT 1`` on a connection of its own, outside the pool, so a pool
saturated by work never looks like an unreachable server, and reconnects it
when it was lost.

Schema: tables live in `schema` (created when missing). `ringo_schema`
holds the version; `_migrations(schema)[i]` takes it from i to i + 1. `open`
migrates in one transaction under `pg_advisory_xact_lock`, so daemons
starting together migrate exactly once, and refuses (`SchemaTooNew`) a
database written by newer code.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT, MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import Lease, LeasedTask, LeaseRef, QueueStats, Task, TaskSpec

from . import _listing
from ._base import (
    Ack,
    EnqueueOutcome,
    FailedPrecondition,
    LeaseLost,
    Nack,
    NotFound,
    Push,
    Reject,
    SchemaTooNew,
    Settlement,
    Storage,
    StorageError,
    StorageUnavailable,
    TaskFilter,
    TaskPage,
    guard_claim,
)
from ._push import push_rows
from ._rows import (
    C_ATTEMPT,
    C_AVAILABLE,
    C_ID,
    C_PRIORITY,
    C_SEQ,
    C_TOKEN,
    CANCELLED,
    COLS,
    DEAD,
    FINISHED,
    LEASE_EXPIRED,
    LEASED,
    MAX_DELAY_US,
    MICRO,
    PENDING,
    STATES,
    SUCCEEDED,
    UINT32_MAX,
    NewTasks,
    cancelled_text,
    describe,
    finished_states,
    from_us,
    lease,
    leased,
    row_task,
    stuck,
    to_us,
)

__all__ = ["SCHEMA_VERSION", "PostgresEngine"]

log = logging.getLogger("ringo_trio.server")

_T = TypeVar("_T")

_CONNECT_TIMEOUT = 10.0
_CLOSE_TIMEOUT = 5.0
# watch(): reconnect backoff, and how often an idle listener proves its
# connection is alive (a silently dropped TCP connection delivers nothing).
_WATCH_RETRY_INITIAL = 0.1
_WATCH_RETRY_MAX = 5.0
_WATCH_PING = 15.0
# A claim that expired leases runs again; bounded so a pathological stream
# of leases expiring under it cannot keep it busy.
_CLAIM_ROUNDS = 4
_DEADLOCK_RETRIES = 3
# An enqueue whose conflicting unique keys were deleted before it could read
# them inserts those tasks again, this many times at most.
_VANISHED_RETRIES = 3
# pg_notify refuses payloads of 8000 bytes or more; queue names are far
# shorter (MAX_NAME_BYTES), this only keeps a bad one from failing a write.
_MAX_NOTIFY_QUEUE_BYTES = 7000

# Connection-level failures: the server cannot be reached or dropped us.
# Class 08 (connection exception), 57 (operator intervention: admin/crash
# shutdown, cannot connect now), 53300 (too many connections); OSError and
# TimeoutError from connecting.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    # A FATAL that reached an idle connection a moment before its EOF leaves
    # the protocol in an error state; the next use reports it this way.
    asyncpg.exceptions.InternalClientError,
    # "database does not allow connections" / "is being shut down" at connect.
    asyncpg.exceptions.ObjectNotInPrerequisiteStateError,
)
# finished_before unset: later than any time the daemon stores.
_NO_CUTOFF = 2**63 - 1
# A group commit's item kinds (the $4 of its statement).
_ACK, _NACK, _REJECT = 0, 1, 2
_TRANSIENT = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)
# Random, so TOAST cannot compress it: large enough to need pages of its own.
_PROBE_SPEC = TaskSpec(task_type="probe", payload=secrets.token_bytes(16 * 1024))


def _unavailable(exc: BaseException) -> StorageUnavailable:
    return StorageUnavailable(f"PostgreSQL unavailable: {type(exc).__name__}: {exc}")


def _lost(storage: Storage, exc: BaseException) -> StorageUnavailable:
    """`_unavailable` for an operation's failure, told to the listener."""
    unavailable = _unavailable(exc)
    if storage.unavailable_listener is not None:
        storage.unavailable_listener(unavailable)
    return unavailable


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _channel(schema: str) -> str:
    """One LISTEN channel per schema; names over 63 bytes (PostgreSQL's
    identifier limit) are hashed."""
    name = f"ringo:{schema}"
    if len(name.encode()) <= 63:
        return name
    return "ringo:" + hashlib.sha256(schema.encode()).hexdigest()[:40]


def _lock_key(schema: str) -> int:
    """The advisory lock migrations of `schema` run under (a signed bigint)."""
    digest = hashlib.sha256(f"ringo_trio schema {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Spelled in the partial indexes and in their queries alike: a generic plan
# cannot prove `state = $n` implies the index's predicate, this literal term can.
_FINISHED_TERM = f"state IN ({', '.join(map(str, FINISHED))})"


def _count_function(s: str, name: str, changes: str) -> str:
    """A statement trigger's function appending the statement's net count
    changes (`changes`: queue, task_type, state, +-1 rows) as deltas: an
    INSERT only, so concurrent writers never wait on each other here."""
    return f"""
        CREATE FUNCTION {s}.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {s}.task_count_deltas (queue, task_type, state, d)
            SELECT queue, task_type, state, sum(d)
            FROM ({changes}) AS c(queue, task_type, state, d)
            GROUP BY queue, task_type, state HAVING sum(d) <> 0;
            RETURN NULL;
        END
        $$
    """


def _migrations(s: str) -> tuple[tuple[str, ...], ...]:
    """The schema steps for schema `s` (already quoted)."""
    return (
        (
            f"""
            CREATE TABLE {s}.tasks (
                seq                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id                  text             NOT NULL,
                queue               text             NOT NULL,
                task_type           text             NOT NULL,
                payload             bytea            NOT NULL,
                unique_key          text             NOT NULL,
                state               smallint         NOT NULL,
                attempt             bigint           NOT NULL,
                max_attempts        bigint           NOT NULL,
                base_max_attempts   bigint           NOT NULL,
                priority            integer          NOT NULL,
                backoff_initial_us  bigint           NOT NULL,
                backoff_max_us      bigint           NOT NULL,
                backoff_multiplier  double precision NOT NULL,
                created_at          bigint           NOT NULL,
                updated_at          bigint           NOT NULL,
                available_at        bigint           NOT NULL,
                finished_at         bigint,
                last_error          text             NOT NULL,
                progress_current    double precision,
                progress_total      double precision,
                progress_message    text,
                progress_at         bigint,
                worker_id           text             NOT NULL,
                lease_token         text             NOT NULL,
                lease_until         bigint
            )
            """,
            f"CREATE UNIQUE INDEX tasks_id ON {s}.tasks (id)",
            f"CREATE UNIQUE INDEX tasks_unique_key ON {s}.tasks (queue, unique_key)"
            " WHERE unique_key <> ''",
            f"CREATE INDEX tasks_pending ON {s}.tasks (queue, priority DESC, available_at, seq)"
            f" WHERE state = {PENDING}",
            f"CREATE INDEX tasks_leased ON {s}.tasks (queue, lease_until) WHERE state = {LEASED}",
            # The SQLite engine's _backoff_us, float for float: C pow() and
            # IEEE products on both sides. An overflow (Python: OverflowError
            # -> inf) caps at the maximum; the exception block is entered
            # only when an overflow is possible at all.
            f"""
            CREATE FUNCTION {s}.ringo_backoff_us(
                initial bigint, maximum bigint, multiplier double precision, attempt bigint
            ) RETURNS bigint LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
            DECLARE
                n double precision := greatest(attempt - 1, 0);
                d double precision;
            BEGIN
                IF n = 0 OR multiplier = 1 OR (multiplier > 1 AND n * ln(multiplier) < 650) THEN
                    d := initial * power(multiplier, n);
                ELSE
                    BEGIN
                        d := initial * power(multiplier, n);
                    EXCEPTION WHEN numeric_value_out_of_range THEN
                        -- Overflow caps; an underflow (|multiplier| < 1) is 0.
                        IF abs(multiplier) > 1 THEN RETURN maximum; END IF;
                        d := 0;
                    END;
                END IF;
                -- NOT <: NaN goes to the cap as well.
                IF NOT d < maximum THEN RETURN maximum; END IF;
                RETURN greatest(trunc(d)::bigint, 0);
            END
            $$
            """,
        ),
        # activity: counting stops at `cap`, and a task-type filter is a seek
        # per type, so the count never walks a backlog of other types. The
        # EXECUTE plans the count for the very values given: the generic plan
        # the engine's prepared statements run cannot tell an empty queue
        # from a deep one and, under a LIMIT, would scan the whole table.
        (
            f"CREATE INDEX tasks_active_type ON {s}.tasks (queue, task_type)"
            f" WHERE state IN ({PENDING}, {LEASED})",
            f"""
            CREATE FUNCTION {s}.ringo_activity(q text, types text[], cap integer)
            RETURNS bigint LANGUAGE plpgsql STABLE AS $$
            DECLARE
                n bigint;
            BEGIN
                IF types IS NULL THEN
                    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM {s}.tasks
                        WHERE queue = $1 AND state IN ({PENDING}, {LEASED}) LIMIT $2) a'
                        INTO n USING q, cap;
                ELSE
                    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM {s}.tasks
                        WHERE queue = $1 AND state IN ({PENDING}, {LEASED})
                            AND task_type = ANY($3) LIMIT $2) a'
                        INTO n USING q, cap, types;
                END IF;
                RETURN n;
            END
            $$
            """,
        ),
        # activity leaving out scheduled tasks (`due` is microseconds, as
        # available_at): the same index and cap, and the same per-call plan.
        # Scheduled tasks are read and skipped, so the walk grows with the
        # queue's scheduled backlog until the cap is reached.
        (
            f"""
            CREATE FUNCTION {s}.ringo_due_activity(
                q text, types text[], cap integer, due bigint)
            RETURNS bigint LANGUAGE plpgsql STABLE AS $$
            DECLARE
                n bigint;
            BEGIN
                IF types IS NULL THEN
                    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM {s}.tasks
                        WHERE queue = $1 AND state IN ({PENDING}, {LEASED})
                            AND (state = {LEASED} OR available_at <= $3) LIMIT $2) a'
                        INTO n USING q, cap, due;
                ELSE
                    EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM {s}.tasks
                        WHERE queue = $1 AND state IN ({PENDING}, {LEASED})
                            AND (state = {LEASED} OR available_at <= $3)
                            AND task_type = ANY($4) LIMIT $2) a'
                        INTO n USING q, cap, due, types;
                END IF;
                RETURN n;
            END
            $$
            """,
        ),
        # Minor 9: the handler's return value of a SUCCEEDED task.
        (f"ALTER TABLE {s}.tasks ADD COLUMN result bytea",),
        # Minor 9, inspection: the listing indexes, and exact counts kept by
        # statement triggers as append-only deltas that `_fold` sums into
        # task_counts (see the module docstring). The triggers are created
        # before the backfill: CREATE TRIGGER locks out writers until the
        # migration commits, so no change is counted twice or missed.
        (
            # Listing streams, partial so the claim path adds no entry: an
            # UPDATE that is not HOT (none of the hot path is) adds an entry
            # to every index whose predicate the new row version meets.
            # tasks_active_type gains `seq`, so one type's active tasks come
            # in enqueue order; activity counting reads it as before.
            f"DROP INDEX {s}.tasks_active_type",
            f"CREATE INDEX tasks_active_type ON {s}.tasks (queue, task_type, seq)"
            f" WHERE state IN ({PENDING}, {LEASED})",
            f"CREATE INDEX tasks_finished ON {s}.tasks (queue, task_type, state, seq)"
            f" WHERE state IN ({SUCCEEDED}, {DEAD}, {CANCELLED})",
            f"""
            CREATE TABLE {s}.task_counts (
                queue       text    NOT NULL,
                task_type   text    NOT NULL,
                state       integer NOT NULL,
                n           bigint  NOT NULL,
                PRIMARY KEY (queue, task_type, state)
            )
            """,
            f"""
            CREATE TABLE {s}.task_count_deltas (
                queue       text    NOT NULL,
                task_type   text    NOT NULL,
                state       integer NOT NULL,
                d           bigint  NOT NULL
            )
            """,
            _count_function(
                s, "ringo_count_insert", "SELECT queue, task_type, state, 1 FROM new_rows"
            ),
            _count_function(
                s, "ringo_count_delete", "SELECT queue, task_type, state, -1 FROM old_rows"
            ),
            _count_function(
                s,
                "ringo_count_update",
                "SELECT queue, task_type, state, 1 FROM new_rows"
                " UNION ALL SELECT queue, task_type, state, -1 FROM old_rows",
            ),
            f"CREATE TRIGGER task_counts_insert AFTER INSERT ON {s}.tasks"
            " REFERENCING NEW TABLE AS new_rows"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.ringo_count_insert()",
            f"CREATE TRIGGER task_counts_delete AFTER DELETE ON {s}.tasks"
            " REFERENCING OLD TABLE AS old_rows"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.ringo_count_delete()",
            f"CREATE TRIGGER task_counts_update AFTER UPDATE ON {s}.tasks"
            " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.ringo_count_update()",
            f"""
            INSERT INTO {s}.task_counts (queue, task_type, state, n)
            SELECT queue, task_type, state, count(*) FROM {s}.tasks
            GROUP BY queue, task_type, state
            """,
        ),
        # Purge and retention: the oldest finished tasks of one state, of one
        # queue (DeleteTasks) or of every queue (retention), by index seek.
        (
            f"CREATE INDEX tasks_finished_age ON {s}.tasks (state, finished_at, seq)"
            f" WHERE {_FINISHED_TERM}",
            f"CREATE INDEX tasks_finished_queue ON {s}.tasks (queue, state, finished_at, seq)"
            f" WHERE {_FINISHED_TERM}",
        ),
    )


SCHEMA_VERSION = len(_migrations('"x"'))


class _Sql:
    """The engine's statements, spelled for one schema, channel and engine id."""

    def __init__(self, schema: str, channel: str, instance: str) -> None:
        t = f"{_ident(schema)}.tasks"
        self.tasks = t
        backoff = f"{_ident(schema)}.ringo_backoff_us"

        def note(queue: str) -> str:
            """pg_notify naming `queue` (an SQL expression) and this engine."""
            return (
                f"pg_notify({_literal(channel)}, {_literal(instance + ' ')} ||"
                f" CASE WHEN octet_length({queue}) <= {_MAX_NOTIFY_QUEUE_BYTES}"
                f" THEN {queue} ELSE '' END)"
            )

        # The live lease at $4. Every LeaseRef operation is one UPDATE guarded
        # by this, so a stale ref matches no row and changes nothing.
        match = (
            f"id = $1 AND state = {LEASED} AND attempt = $2 AND lease_token = $3"
            " AND lease_until > $4"
        )

        def retry_at(now: str, delay: str) -> str:
            """When a nacked or expired attempt runs again: the override
            `delay` or the task's backoff, capped."""
            return f"""{now} + least(coalesce({delay}, {backoff}(
                backoff_initial_us, backoff_max_us, backoff_multiplier, attempt)),
                {MAX_DELAY_US})"""

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
                UPDATE {t} SET {release(now, _literal(LEASE_EXPIRED), "NULL::bigint")}
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
                    last_error, worker_id, lease_token)
                SELECT u.id, $1, u.task_type, u.payload, u.unique_key, {PENDING}, 0,
                    u.max_attempts, u.max_attempts, u.priority, u.initial_us, u.max_us,
                    u.multiplier, $2, $2, u.available_at, '', '', ''
                FROM unnest($3::text[], $4::text[], $5::bytea[], $6::text[], $7::bigint[],
                    $8::integer[], $9::bigint[], $10::bigint[], $11::float8[], $12::bigint[])
                    WITH ORDINALITY AS u(id, task_type, payload, unique_key, max_attempts,
                        priority, initial_us, max_us, multiplier, available_at, ord)
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
        # `NewTasks`'s INSERT row, as it is ($1..$15).
        self.probe_insert = f"""
            INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,
                backoff_multiplier, created_at, updated_at, available_at, last_error,
                worker_id, lease_token)
            VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                '', '', '')
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
        locked = "seq, state, available_at, lease_until"
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
                    result = NULL
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
        # finished-task index. One notification for the queue if any changed.
        self.retry_dead = f"""
            WITH r AS (
                UPDATE {t} SET state = {PENDING}, available_at = $4, finished_at = NULL,
                    max_attempts = least(attempt + base_max_attempts, {UINT32_MAX}),
                    worker_id = '', lease_token = '', lease_until = NULL, updated_at = $4,
                    result = NULL
                WHERE seq IN (
                    SELECT seq FROM {t}
                    WHERE queue = $1 AND state = {DEAD} AND finished_at < $2
                        {_types_filter(5)}
                    ORDER BY finished_at, seq LIMIT $3
                    FOR UPDATE SKIP LOCKED)
                RETURNING seq
            ), n AS (SELECT count(*) AS changed FROM r)
            SELECT n.changed, CASE WHEN n.changed > 0 THEN {note("$1")} END FROM n
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
        # lease the first $3 due tasks in claim order. Always one row out:
        # (leased columns or NULLs, number of leases expired).
        types = _types_filter(6)
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
            ), claimed AS (
                UPDATE {t} k SET state = {LEASED}, attempt = k.attempt + 1,
                    lease_token = replace(gen_random_uuid()::text, '-', ''),
                    worker_id = $4, lease_until = $5, updated_at = $2
                FROM picked WHERE k.seq = picked.seq
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
            _ACK: ack("queue"),
            _NACK: nack("queue, state"),
            _REJECT: reject("queue"),
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
        again = f"l.kind = {_NACK} AND k.attempt < k.max_attempts"
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
                    state = CASE WHEN l.kind = {_ACK} THEN {SUCCEEDED}
                        WHEN {again} THEN {PENDING} ELSE {DEAD} END,
                    available_at = CASE WHEN {again}
                        THEN {retry_at("$8", "l.delay")} ELSE k.available_at END,
                    finished_at = CASE WHEN {again} THEN NULL ELSE $8 END,
                    last_error = CASE WHEN l.kind = {_ACK} THEN k.last_error ELSE l.error END,
                    result = CASE WHEN l.kind = {_ACK} THEN l.result ELSE k.result END,
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
                        WHERE {_FINISHED_TERM} AND state = s.state
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
            f"SELECT {_ident(schema)}.ringo_activity($1, $2::text[], {MAX_ACTIVITY_COUNT})"
        )
        self.due_activity = (
            f"SELECT {_ident(schema)}.ringo_due_activity($1, $2::text[], {MAX_ACTIVITY_COUNT}, $3)"
        )
        types = _types_filter(2)
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
        counts = f"{_ident(schema)}.task_counts"
        deltas = f"{_ident(schema)}.task_count_deltas"
        # Folds the committed deltas into task_counts. Only folders write
        # task_counts, one at a time (the advisory lock), so its row locks
        # never meet the write path's.
        self.fold_lock = f"SELECT pg_advisory_xact_lock({_lock_key(schema + ' counts')})"
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
            f"SELECT {_LIST_COLS} FROM {t} WHERE seq = ANY($1::bigint[]) ORDER BY seq"
        )


# -- inspection ------------------------------------------------------------

# A listed task: no payload, no result, last_error cut (by characters here,
# by bytes in `_listed`), so a page never reads the large columns.
_LIST_COLS = ", ".join(
    {
        "payload": "''::bytea",
        "last_error": f"left(last_error, {MAX_LIST_ERROR_BYTES})",
        "result": "NULL::bytea",
    }.get(c.strip(), c.strip())
    for c in COLS.split(",")
)
_WALK_COLS = "seq, task_type, unique_key, state"


def _list_sql(tasks: str, cols: str, arms: Sequence[_listing.Arm], newest_first: bool) -> str:
    return _list_sql_of(tasks, cols, _listing.shape(arms), newest_first)


@functools.lru_cache(maxsize=256)
def _list_sql_of(
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


def _listed(row: Any) -> Task:
    task = row_task(row)
    task.last_error = _listing.cut_error(task.last_error)
    return task


@contextlib.asynccontextmanager
async def _inspect_transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
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


def _types_filter(n: int) -> str:
    """The task-type filter on parameter $n: NULL (no types asked) passes all."""
    return f"AND (${n}::text[] IS NULL OR task_type = ANY(${n}::text[]))"


def _types(task_types: Sequence[str]) -> list[str] | None:
    return list(task_types) if task_types else None


class PostgresEngine(Storage):
    """`Storage` on a PostgreSQL database: the tables live in `schema`
    (created if missing); up to `pool_size` connections at once, plus one
    while `watch` runs and one for `ping`."""

    can_be_unreachable = True

    def __init__(self, dsn: str, *, schema: str = "public", pool_size: int = 10) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        if not schema:
            raise ValueError("schema must not be empty")
        self.dsn = dsn
        self.schema = schema
        self.pool_size = pool_size
        # Names this engine in its notifications, so `watch` skips its own.
        self.instance = secrets.token_hex(8)
        self.channel = _channel(schema)
        self._sql = _Sql(schema, self.channel, self.instance)
        self._pool: asyncpg.Pool | None = None
        self._ping_conn: asyncpg.Connection | None = None

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                reset=_keep_session,
                timeout=_CONNECT_TIMEOUT,
                server_settings=_SERVER_SETTINGS,
            )
        except _UNAVAILABLE as exc:
            raise _unavailable(exc) from exc
        try:
            async with pool.acquire() as conn:
                await _migrate(conn, self.schema)
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool

    async def close(self) -> None:
        ping, self._ping_conn = self._ping_conn, None
        if ping is not None:
            # Not awaited: a graceful close can hang on a dead peer.
            ping.terminate()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
        except (Exception, asyncio.CancelledError):
            # A server that is gone cannot be said goodbye to.
            pool.terminate()
            raise

    def _live_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresEngine is not open")
        return self._pool

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; a connection-level failure is StorageUnavailable
        and the connection is thrown away, so the next call gets a fresh one."""
        pool = self._live_pool()
        try:
            async with pool.acquire() as conn:
                try:
                    yield conn
                except _UNAVAILABLE:
                    self._discard(conn)
                    raise
        except _UNAVAILABLE as exc:
            raise _lost(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise self._full(exc) from exc

    @staticmethod
    def _discard(conn: asyncpg.Connection) -> None:
        """`conn` failed at the connection level: never reuse it. (A FATAL
        read a moment before the EOF leaves a connection open but broken.)"""
        # asyncpg may already have returned a connection it saw die.
        with contextlib.suppress(asyncpg.InterfaceError):
            conn.terminate()

    # The hot path: the same as `_conn`, without a generator per call.

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        pool = self._live_pool()
        try:
            async with pool.acquire() as conn:
                try:
                    return await conn.fetch(sql, *args)  # type: ignore[no-any-return]
                except _UNAVAILABLE:
                    self._discard(conn)
                    raise
        except _UNAVAILABLE as exc:
            raise _lost(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise self._full(exc) from exc

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        pool = self._live_pool()
        try:
            async with pool.acquire() as conn:
                try:
                    return await conn.fetchrow(sql, *args)
                except _UNAVAILABLE:
                    self._discard(conn)
                    raise
        except _UNAVAILABLE as exc:
            raise _lost(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise self._full(exc) from exc

    async def ping(self) -> None:
        conn = self._ping_conn
        try:
            if conn is None or conn.is_closed():
                conn = self._ping_conn = None
                conn = await asyncpg.connect(
                    self.dsn, timeout=_CONNECT_TIMEOUT, server_settings=_SERVER_SETTINGS
                )
                self._ping_conn = conn
            await conn.fetchval("SELECT 1")
        except BaseException as exc:
            # Failed, timed out or cut short midway: the connection's state is
            # unknown, so the next ping starts on a fresh one.
            self._ping_conn = None
            if conn is not None:
                conn.terminate()
            if isinstance(exc, _UNAVAILABLE):
                raise _unavailable(exc) from exc
            raise

    async def probe(self, now: datetime) -> None:
        now_us = to_us(now)
        # Queue "" names no queue a client can use, and the row is gone again
        # before the commit makes anything visible.
        _, row = NewTasks("", from_us(now_us), now_us, 1, "probe").make(_PROBE_SPEC)
        async with self._conn() as conn, conn.transaction():
            seq = await conn.fetchval(self._sql.probe_insert, *row)
            await conn.execute(self._sql.probe_delete, seq)

    # -- submission --------------------------------------------------------

    async def enqueue(
        self, queue: str, specs: Sequence[TaskSpec], now: datetime
    ) -> list[EnqueueOutcome]:
        if not specs:
            return []
        now_us = to_us(now)
        # Normalised to UTC so a returned Task equals what `get` reads back.
        now = from_us(now_us)
        new_tasks = NewTasks(queue, now, now_us, len(specs))
        # In-batch dedupe first: `first[i]` is the index of the spec whose
        # task spec i resolves to.
        first: list[int] = []
        by_key: dict[str, int] = {}
        new: list[tuple[Task, tuple[Any, ...]]] = []
        candidate: dict[int, int] = {}  # spec index -> index into `new`
        for i, spec in enumerate(specs):
            key = spec.unique_key
            if key and key in by_key:
                first.append(by_key[key])
                continue
            if key:
                by_key[key] = i
            first.append(i)
            candidate[i] = len(new)
            new.append(new_tasks.make(spec))
        inserted_keys = await self._insert(queue, now_us, [row for _, row in new])
        conflicted = [k for k in by_key if k not in inserted_keys]
        existing: dict[str, Task] = {}
        for _ in range(_VANISHED_RETRIES):
            if not conflicted:
                break
            # A new statement: it sees the rows that won the conflict, even
            # those another daemon committed a moment ago.
            for found in await self._fetch(self._sql.by_keys, queue, conflicted):
                existing[found[5]] = row_task(found)
            # A task that won the conflict may have been deleted since
            # (DeleteTasks, retention): its key is free, so ours takes it.
            vanished = [k for k in conflicted if k not in existing]
            if vanished:
                retried = [new[candidate[by_key[k]]][1] for k in vanished]
                inserted_keys |= await self._insert(queue, now_us, retried)
            conflicted = [k for k in vanished if k not in inserted_keys]
        if conflicted:
            raise StorageError(
                f"queue {queue!r}: unique keys kept being taken and deleted under this enqueue"
            )
        outcomes: list[EnqueueOutcome] = []
        for i, spec in enumerate(specs):
            if first[i] != i:
                prior = outcomes[first[i]]
                outcomes.append(EnqueueOutcome(prior.task, created=False))
            elif spec.unique_key in existing:
                outcomes.append(EnqueueOutcome(existing[spec.unique_key], created=False))
            else:
                outcomes.append(EnqueueOutcome(new[candidate[i]][0], created=True))
        return outcomes

    async def _insert(self, queue: str, now_us: int, rows: list[tuple[Any, ...]]) -> set[str]:
        """Insert `NewTasks` rows, skipping taken unique keys; the keys inserted."""
        columns = _columns(rows)
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                row = await self._fetchrow(self._sql.insert, queue, now_us, *columns)
                break
            except _TRANSIENT:
                if attempt == _DEADLOCK_RETRIES - 1:
                    raise
        return set(row[0] or ())

    async def get(
        self, queue: str, *, task_id: str | None = None, unique_key: str | None = None
    ) -> Task:
        _one_lookup(task_id, unique_key)
        if task_id is not None:
            row = await self._fetchrow(self._sql.get_by_id, queue, task_id)
        else:
            row = await self._fetchrow(self._sql.get_by_key, queue, unique_key)
        if row is None:
            raise NotFound(describe(queue, task_id, unique_key))
        return row_task(row)

    async def _lock(
        self, conn: asyncpg.Connection, queue: str, task_id: str | None, unique_key: str | None
    ) -> Any:
        """The task named by exactly one of id / unique key, its row locked
        for the rest of the transaction (seq, state, available_at,
        lease_until); NotFound."""
        _one_lookup(task_id, unique_key)
        if task_id is not None:
            found = await conn.fetchrow(self._sql.lock_by_id, queue, task_id)
        else:
            found = await conn.fetchrow(self._sql.lock_by_key, queue, unique_key)
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
            return row_task(await conn.fetchrow(self._sql.retry, found[0], now_us))

    # -- leases ------------------------------------------------------------

    async def claim(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[LeasedTask]:
        return await guard_claim(
            self,
            self._claim(queue, task_types, limit, worker_id, lease_duration, now),
            _claimed_refs,
            _leased_rows,
            queue,
            now,
        )

    async def claim_pushes(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[Push]:
        return await guard_claim(
            self,
            self._claim(queue, task_types, limit, worker_id, lease_duration, now),
            _claimed_refs,
            push_rows,
            queue,
            now,
        )

    async def _claim(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[Any]:
        """The claimed rows, in claim order. Committed before they are read,
        so only through `guard_claim`: a caller cancelled while the statement
        is in flight must not take the answer with it."""
        if limit <= 0:
            return []
        now_us = to_us(now)
        until = now_us + lease_duration // MICRO
        types = _types(task_types)
        rows: list[Any] = []
        for _ in range(_CLAIM_ROUNDS):
            rows = await self._fetch(self._sql.claim, queue, now_us, limit, worker_id, until, types)
            if not rows[0][-1]:
                break
        rows = [r for r in rows if r[C_SEQ] is not None]
        # RETURNING yields rows in no promised order.
        rows.sort(key=lambda r: (-r[C_PRIORITY], r[C_AVAILABLE], r[C_SEQ]))
        return rows

    async def _settle(
        self, sql: str, build: Callable[[Any], _T], ref: LeaseRef, now: datetime, *extra: Any
    ) -> _T:
        """Run one lease-guarded UPDATE ... RETURNING; LeaseLost when the ref
        is not the task's live lease (the UPDATE then matched nothing)."""
        row = await self._fetchrow(
            sql, ref.task_id, ref.attempt, ref.lease_token, to_us(now), *extra
        )
        if row is None:
            raise await self._lost(ref)
        return build(row)

    async def _lost(self, ref: LeaseRef) -> LeaseLost:
        """The LeaseLost for a ref whose lease operation matched no row,
        telling whether that very attempt ended by CancelTask (one more
        statement, on the miss path only)."""
        found = await self._fetch(self._sql.cancelled_of, [ref.task_id], [ref.attempt])
        return _lease_lost(ref, cancelled=bool(found))

    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        return await self._settle(self._sql.ack, row_task, ref, now, result)

    async def nack(
        self, ref: LeaseRef, error: str, retry_delay: timedelta | None, now: datetime
    ) -> Task:
        return await self._settle(self._sql.nack, row_task, ref, now, error, _delay_us(retry_delay))

    async def reject(self, ref: LeaseRef, error: str, now: datetime) -> Task:
        return await self._settle(self._sql.reject, row_task, ref, now, error)

    async def settle_many(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """One statement (one implicit transaction) for the group; only for
        the items that missed, a second one asks which were cancelled."""
        if not settlements:
            return []
        rows = [_settlement_row(item) for item in settlements]
        if len(rows) == 1:
            return [await self._settle_one(rows[0], now)]
        cols = [list(col) for col in zip(*rows, strict=True)]
        ids, attempts = cols[0], cols[1]
        async with self._conn() as conn:
            row = await conn.fetchrow(self._sql.settle_many, *cols, to_us(now))
            # Positions are 1-based (WITH ORDINALITY).
            settled = dict(zip(row[0] or (), row[1] or (), strict=True))
            cancelled: set[int] = set()
            if len(settled) < len(settlements):
                missed = [i for i in range(1, len(settlements) + 1) if i not in settled]
                cancelled = {
                    missed[r[0] - 1]
                    for r in await conn.fetch(
                        self._sql.cancelled_of,
                        [ids[i - 1] for i in missed],
                        [attempts[i - 1] for i in missed],
                    )
                }
        return [
            settled[i] if i in settled else _lease_lost(item.ref, cancelled=i in cancelled)
            for i, item in enumerate(settlements, 1)
        ]

    async def _settle_one(self, row: tuple[Any, ...], now: datetime) -> str | LeaseLost:
        """A group of one (a `_settlement_row`): its single statement."""
        task_id, attempt, token, kind, result, error, delay = row
        extra = {_ACK: (result,), _NACK: (error, delay), _REJECT: (error,)}[kind]
        found = await self._fetchrow(
            self._sql.settle_one[kind], task_id, attempt, token, to_us(now), *extra
        )
        if found is None:
            return await self._lost(LeaseRef(task_id=task_id, attempt=attempt, lease_token=token))
        return str(found[0])

    async def extend_lease(self, ref: LeaseRef, extension: timedelta, now: datetime) -> Lease:
        until = to_us(now) + extension // MICRO
        return await self._settle(self._sql.extend, lease, ref, now, until)

    async def report_progress(
        self, ref: LeaseRef, current: float, total: float, message: str, now: datetime
    ) -> None:
        await self._settle(
            self._sql.progress,
            lambda _row: None,
            ref,
            now,
            float(current),
            float(total),
            message,
        )

    async def release(self, refs: Sequence[LeaseRef], now: datetime) -> int:
        if not refs:
            return 0
        row = await self._fetchrow(
            self._sql.release,
            [r.task_id for r in refs],
            [r.attempt for r in refs],
            [r.lease_token for r in refs],
            to_us(now),
        )
        return int(row[0])

    async def expire_leases(self, now: datetime) -> int:
        row = await self._fetchrow(self._sql.expire_all, to_us(now))
        return int(row[0])

    # -- observation -------------------------------------------------------

    async def activity(
        self, queue: str, task_types: Sequence[str], *, due_by: datetime | None = None
    ) -> int:
        if due_by is None:
            row = await self._fetchrow(self._sql.activity, queue, _types(task_types))
        else:
            row = await self._fetchrow(
                self._sql.due_activity, queue, _types(task_types), to_us(due_by)
            )
        return int(row[0])

    async def next_wakeup(
        self, queue: str, task_types: Sequence[str], now: datetime
    ) -> datetime | None:
        """As the interface says; a moment that has already come (a due task,
        an expired lease not yet reaped) is reported as `now`."""
        now_us = to_us(now)
        row = await self._fetchrow(self._sql.next_wakeup, queue, _types(task_types))
        soonest = row[0]
        if soonest is None:
            return None
        return from_us(max(soonest, now_us))

    # -- cross-daemon wake-ups ----------------------------------------------

    async def watch(self, notify: Callable[[str | None], None]) -> None:
        """LISTEN on the schema's channel over a connection of its own (see
        the interface). After a loss it waits `delay` before reconnecting;
        the delay doubles up to a cap while attempts keep failing and starts
        over once a listener was up."""
        delay = _WATCH_RETRY_INITIAL
        while True:
            try:
                await self._listen(notify)
            except asyncio.CancelledError:
                raise
            except _Listened as exc:
                delay = _WATCH_RETRY_INITIAL
                log.warning("storage watch lost its PostgreSQL connection: %s", exc.__cause__)
            except Exception as exc:
                log.warning("storage watch cannot listen on PostgreSQL: %s", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _WATCH_RETRY_MAX)

    async def _listen(self, notify: Callable[[str | None], None]) -> None:
        """One listening connection's life; raises when it is lost
        (`_Listened` once it had been listening)."""
        lost = asyncio.Event()

        def on_note(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            sender, _, queue = payload.partition(" ")
            if sender != self.instance:
                notify(queue or None)

        conn: asyncpg.Connection = await asyncpg.connect(
            self.dsn, timeout=_CONNECT_TIMEOUT, server_settings=_SERVER_SETTINGS
        )
        try:
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(self.channel, on_note)
            notify(None)
            try:
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), _WATCH_PING)
                    # A silently dropped connection delivers nothing: prove
                    # it alive now and then.
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1", timeout=_WATCH_PING)
                        # Housekeeping on the same beat: count deltas must not
                        # pile up while nobody reads stats. A failure here is
                        # the pool's, not the listener's.
                        with contextlib.suppress(StorageError):
                            await self._fold()
                raise StorageUnavailable("the listening connection closed")
            except Exception as exc:
                raise _Listened from exc
        finally:
            # Not awaited: a graceful close can hang on a dead peer.
            conn.terminate()

    # -- inspection (ListTasks, GetQueueStats, ListQueues) -------------------

    async def list_tasks(
        self,
        queue: str,
        where: TaskFilter,
        *,
        newest_first: bool,
        after: int | None,
        limit: int,
    ) -> TaskPage:
        if after is None:
            after = _listing.SEQ_MAX if newest_first else -1
        async with self._conn() as conn, _inspect_transaction(conn):
            pairs = [(r[0], r[1]) for r in await conn.fetch(self._sql.present, queue)]
            arms, residual = _listing.arms(pairs, where)
            types = _listing.arm_types(arms)
            if not arms:
                return TaskPage([], None, [])
            if residual is None:
                sql = _list_sql(self._sql.tasks, _LIST_COLS, arms, newest_first)
                rows = await conn.fetch(sql, queue, after, limit + 1, *types)
                next_after = rows[limit - 1][C_SEQ] if len(rows) > limit else None
                rows = rows[:limit]
            else:
                budget = _listing.scan_budget(limit)
                sql = _list_sql(self._sql.tasks, _WALK_COLS, arms, newest_first)
                walked = await conn.fetch(sql, queue, after, budget, *types)
                seqs, next_after = _listing.pick(residual, walked, limit, budget)
                rows = []
                if seqs:
                    rows = await conn.fetch(self._sql.listed_by_seq, seqs)
                    if newest_first:
                        rows.reverse()
        return TaskPage([_listed(r) for r in rows], next_after, [r[C_SEQ] for r in rows])

    async def queue_stats(self, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        [stats] = await self._queues_stats([queue], now, by_type=by_type)
        return stats

    async def list_queues(self, now: datetime, *, after: str, limit: int) -> list[QueueStats]:
        await self._fold()
        async with self._conn() as conn:
            names = [r[0] for r in await conn.fetch(self._sql.queue_names, after, limit)]
        return await self._queues_stats(names, now, by_type=False, fold=False)

    async def _queues_stats(
        self, names: list[str], now: datetime, *, by_type: bool, fold: bool = True
    ) -> list[QueueStats]:
        if not names:
            return []
        if fold:
            await self._fold()
        rows: dict[str, list[Any]] = {name: [] for name in names}
        async with self._conn() as conn, _inspect_transaction(conn):
            for queue, task_type, state, n in await conn.fetch(self._sql.queues_counts, names):
                rows[queue].append((task_type, state, n))
            oldest = dict(list(r) for r in await conn.fetch(self._sql.queues_oldest, names))
        return [
            _listing.queue_stats(
                name, _listing.by_state(rows[name]), oldest[name], now, by_type=by_type
            )
            for name in names
        ]

    async def _fold(self) -> None:
        """Sum the committed count deltas into task_counts (`watch` does it
        too, so they do not pile up while nobody reads stats)."""
        async with self._conn() as conn, conn.transaction():
            await conn.execute(self._sql.fold_lock)
            await conn.execute(self._sql.fold)

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
                return row_task(await conn.fetchrow(self._sql.by_seq, seq))
            if state not in (PENDING, LEASED):
                raise FailedPrecondition(
                    f"{describe(queue, task_id, unique_key)} is {STATES[state].name};"
                    " only PENDING or LEASED tasks can be cancelled"
                )
            row = await conn.fetchrow(self._sql.cancel, seq, to_us(now), cancelled_text(reason))
            return row_task(row)

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
        before = _NO_CUTOFF if finished_before is None else to_us(finished_before)
        row = await self._fetchrow(
            self._sql.retry_dead, queue, before, limit, to_us(now), _types(task_types)
        )
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
        before = _NO_CUTOFF if finished_before is None else to_us(finished_before)
        if queue is None:
            row = await self._fetchrow(self._sql.delete_finished, wanted, before, limit)
        else:
            row = await self._fetchrow(
                self._sql.delete_finished_queue, wanted, before, limit, queue
            )
        return int(row[0])


class _Listened(Exception):
    """A listener that had been up lost its connection (the cause)."""


_SERVER_SETTINGS = {
    "application_name": "ringod",
    # Small OLTP statements: a JIT compile would cost more than the query.
    "jit": "off",
    "plan_cache_mode": "force_generic_plan",
}


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """The pool's reset hook, doing nothing: the default runs a reset query
    on every release (a round trip per call) to undo session state this
    engine never creates. An open transaction is still rolled back by asyncpg
    before this runs."""


def _claimed_refs(rows: Sequence[Any]) -> list[LeaseRef]:
    return [LeaseRef(task_id=r[C_ID], attempt=r[C_ATTEMPT], lease_token=r[C_TOKEN]) for r in rows]


def _leased_rows(rows: Sequence[Any]) -> list[LeasedTask]:
    return [leased(r) for r in rows]


def _delay_us(retry_delay: timedelta | None) -> int | None:
    """A nack's retry delay override in microseconds (None: the backoff)."""
    return None if retry_delay is None else max(retry_delay // MICRO, 0)


def _settlement_row(item: Settlement) -> tuple[Any, ...]:
    """The item as a row of the group statement's columns ($1..$7): task id,
    attempt, token, kind, result, error, delay."""
    ref = item.ref
    match item:
        case Ack(_, result):
            return (ref.task_id, ref.attempt, ref.lease_token, _ACK, result, None, None)
        case Nack(_, error, retry_delay):
            delay = _delay_us(retry_delay)
            return (ref.task_id, ref.attempt, ref.lease_token, _NACK, None, error, delay)
        case Reject(_, error):
            return (ref.task_id, ref.attempt, ref.lease_token, _REJECT, None, error, None)


def _lease_lost(ref: LeaseRef, *, cancelled: bool) -> LeaseLost:
    if cancelled:
        return LeaseLost(
            f"task {ref.task_id!r} attempt {ref.attempt}: the task was cancelled", cancelled=True
        )
    return LeaseLost(
        f"task {ref.task_id!r} attempt {ref.attempt}: not the current lease, or it has expired"
    )


def _one_lookup(task_id: str | None, unique_key: str | None) -> None:
    if (task_id is None) == (unique_key is None):
        raise ValueError("exactly one of task_id / unique_key")


def _columns(rows: Any) -> list[list[Any]]:
    """INSERT rows (as `NewTasks` builds them) as the insert statement's
    column arrays ($3..$12)."""
    cols: list[list[Any]] = [[] for _ in range(10)]
    (ids, types, payloads, keys, attempts, prios, initials, maxima, mults, avail) = cols
    for r in rows:
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
    return cols


async def _migrate(conn: asyncpg.Connection, schema: str) -> None:
    """Create the schema if missing and bring it to SCHEMA_VERSION, in one
    transaction under an advisory lock: concurrent opens migrate once."""
    s = _ident(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _lock_key(schema))
        # Checked before CREATE SCHEMA: that needs the CREATE privilege on
        # the database even when the schema exists.
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f"CREATE SCHEMA {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.ringo_schema (version integer NOT NULL)"
        )
        version = await conn.fetchval(f"SELECT max(version) FROM {s}.ringo_schema")
        if version is None:
            await conn.execute(f"INSERT INTO {s}.ringo_schema (version) VALUES (0)")
            version = 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"PostgreSQL schema {schema!r}: version {version} is newer than this"
                f" ringo_trio understands ({SCHEMA_VERSION}); upgrade ringo_trio or"
                " use another schema"
            )
        for statements in _migrations(s)[version:]:
            for statement in statements:
                await conn.execute(statement)
        if version != SCHEMA_VERSION:
            await conn.execute(f"UPDATE {s}.ringo_schema SET version = $1", SCHEMA_VERSION)
