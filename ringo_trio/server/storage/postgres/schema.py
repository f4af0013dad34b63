"""The PostgreSQL schema: its migrations (`migrations(schema)[i]` takes it
from version i to i + 1), run by `migrate` under an advisory lock.

Schema: tables live in `schema` (created when missing). `ringo_schema`
holds the version; `migrations(schema)[i]` takes it from i to i + 1. `open`
migrates in one transaction under `pg_advisory_xact_lock`, so daemons
starting together migrate exactly once, and refuses (`SchemaTooNew`) a
database written by newer code.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable

import asyncpg  # type: ignore[import-untyped]

from ..base import SchemaTooNew
from ..retry import schedule
from ..rows import CANCELLED, DEAD, FINISHED, LEASED, PENDING, SUCCEEDED

Step = Callable[[asyncpg.Connection], Awaitable[None]]
"""A migration step that is Python, not a statement (it gets the connection)."""

LONGEST_SCHEDULE = 65_536
"""Entries a task's schedule holds at most: only a policy that has not
settled by then (a hand-written one, or a multiplier a hair above 1 on a task
retried that often) is cut, and its later attempts wait the last entry."""


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def lock_key(schema: str) -> int:
    """The advisory lock migrations of `schema` run under (a signed bigint)."""
    digest = hashlib.sha256(f"ringo_trio schema {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Spelled in the partial indexes and in their queries alike: a generic plan
# cannot prove `state = $n` implies the index's predicate, this literal term can.
LIMIT_PENDING = f"state = {PENDING} AND limit_key <> ''"
LIMIT_LEASED = f"state = {LEASED} AND limit_key <> ''"
FINISHED_TERM = f"state IN ({', '.join(map(str, FINISHED))})"
# The predicates of `tasks_active_type` and `tasks_finished` since schema 14
# (see there): a statement can only use them by comparing `task_type`.
ACTIVE_TYPED = f"state IN ({PENDING}, {LEASED}) AND task_type IS NOT NULL"
FINISHED_TYPED = f"{FINISHED_TERM} AND task_type IS NOT NULL"
# How the statements of some task types spell PENDING (`tasks_pending_type`,
# schema 15). No stored state is below PENDING, so this admits PENDING
# alone, but unlike `state = PENDING` it implies neither `tasks_pending`'s
# predicate nor `tasks_active_type`'s `state IN (PENDING, LEASED)`: those
# statements have one index to seek whatever the statistics say (with
# none, the shorter `tasks_active_type` won the tie and the claim read and
# sorted every active task of its types). `task_type IS NOT NULL` keeps
# the untyped statements, whose `state = PENDING` does imply this, off it.
PENDING_BY_TYPE = f"state <= {PENDING}"
PENDING_TYPED = f"{PENDING_BY_TYPE} AND task_type IS NOT NULL"
# How a limited claim spells the tasks without a key (`tasks_pending_unkeyed`,
# schema 16): `state <= PENDING` again, so these statements have that index
# alone to seek (`tasks_pending` would walk the keys' tasks ahead of them;
# their type filter passes NULL, so it never proves `tasks_pending_type`'s).
UNKEYED_PENDING = f"{PENDING_BY_TYPE} AND limit_key = ''"
# How the statements of some task types on a queue with keyed limits spell
# PENDING (schema 17: `tasks_pending_unkeyed_type`, `tasks_limit_pending_type`):
# `state::integer = PENDING`, a term from which PostgreSQL proves none of
# the other indexes' predicates (`state <= PENDING`, `state = PENDING`, ...:
# it compares `state`, not an expression of it), so these statements have
# their index alone to seek, whatever the statistics. Spelled `state <=
# PENDING`, an analyzed table's generic plan took `tasks_pending_type` for a
# key's tasks of one type, a walk of that type's tasks of every key; spelled
# `state = PENDING`, `tasks_limit_pending` to find the keys of one type, a
# walk of every key's tasks (10 ms a claim behind one key's 25,000 tasks of
# another type).
PENDING_TYPED_LIMITED = f"state::integer = {PENDING}"
UNKEYED_BY_TYPE = f"{PENDING_TYPED_LIMITED} AND limit_key = ''"
LIMIT_PENDING_BY_TYPE = f"{PENDING_TYPED_LIMITED} AND limit_key <> ''"
# How a statement that finds a lease by its task id spells LEASED: a term
# from which `tasks_leased`'s predicate cannot be proven, so the lookup is
# one `tasks_id` descent whatever the statistics. Spelled `state = LEASED`,
# a small table never analyzed whose tasks were all leased had every ack,
# renewal and group commit walk `tasks_leased` (`lease_until > now` passes
# every live lease): 250 µs of PostgreSQL CPU per ack at 640 leases against
# ~35, on each connection whose plan was made then, until an ANALYZE.
LEASED_BY_ID = f"state::integer = {LEASED}"
# Their predicates: typed, so no untyped statement can take them either.
UNKEYED_TYPED = f"{UNKEYED_BY_TYPE} AND task_type IS NOT NULL"
LIMIT_TYPED = f"{LIMIT_PENDING_BY_TYPE} AND task_type IS NOT NULL"


def count_function(s: str, name: str, changes: str) -> str:
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


def activity_functions(s: str) -> tuple[str, str]:
    """GetQueueActivity's counts as the current schema answers them (the
    engine reads `task_counts` instead of `ringo_activity` since 2026-12-07;
    the function stays for daemons of earlier releases on the same
    database, and `ringo_due_activity` is still the due-only count): up to
    `cap` PENDING and LEASED tasks of queue `q` (`ringo_due_activity`:
    leaving out PENDING tasks not due at `due`, microseconds as
    `available_at`). Without types, one capped count per state on its own
    index (`tasks_pending`, `tasks_leased`); with types, a seek per type on
    `tasks_active_type`, which only a statement naming types can use
    (`ACTIVE_TYPED`), so it never walks a backlog of other types. The
    EXECUTE plans each count for the very values given: a generic plan
    cannot tell an empty queue from a deep one and, under a LIMIT, would
    scan the whole table."""

    def function(name: str, due: bool) -> str:
        # Parameters of every count: $1 queue, $2 cap, $3 types, $4 due.
        due_arg, using = (", due bigint", "q, cap, types, due") if due else ("", "q, cap, types")
        pending_due = " AND available_at <= $4" if due else ""
        typed_due = f" AND (state = {LEASED} OR available_at <= $4)" if due else ""
        tasks = f"SELECT 1 FROM {s}.tasks WHERE queue = $1 AND state"
        return f"""
            CREATE OR REPLACE FUNCTION {s}.{name}(
                q text, types text[], cap integer{due_arg})
            RETURNS bigint LANGUAGE plpgsql STABLE AS $$
            DECLARE
                n bigint;
            BEGIN
                IF types IS NULL THEN
                    EXECUTE 'SELECT (SELECT count(*) FROM
                            ({tasks} = {PENDING}{pending_due} LIMIT $2) p)
                        + (SELECT count(*) FROM ({tasks} = {LEASED} LIMIT $2) l)'
                        INTO n USING {using};
                    RETURN least(n, cap);
                END IF;
                EXECUTE 'SELECT count(*) FROM ({tasks} IN ({PENDING}, {LEASED})
                        AND task_type = ANY($3){typed_due} LIMIT $2) a'
                    INTO n USING {using};
                RETURN n;
            END
            $$
        """

    return function("ringo_activity", due=False), function("ringo_due_activity", due=True)


def migrations(s: str) -> tuple[tuple[str | Step, ...], ...]:
    """The schema steps for schema `s` (already quoted): statements, and
    steps computed in Python (`Step`)."""
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
        # statement triggers as append-only deltas that `fold_counts` sums into
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
            count_function(
                s, "ringo_count_insert", "SELECT queue, task_type, state, 1 FROM new_rows"
            ),
            count_function(
                s, "ringo_count_delete", "SELECT queue, task_type, state, -1 FROM old_rows"
            ),
            count_function(
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
            f" WHERE {FINISHED_TERM}",
            f"CREATE INDEX tasks_finished_queue ON {s}.tasks (queue, state, finished_at, seq)"
            f" WHERE {FINISHED_TERM}",
        ),
        # Each task's retry delays as `retry.schedule` computes them, so no
        # statement works out a backoff (before: the PL/pgSQL function
        # ringo_backoff_us, a second copy of the policy, which fresh schemas
        # no longer create).
        (
            f"ALTER TABLE {s}.tasks ADD COLUMN retry_delays_us bigint[]",
            functools.partial(fill_retry_delays, schema=s),
            f"ALTER TABLE {s}.tasks ALTER COLUMN retry_delays_us SET NOT NULL",
            f"DROP FUNCTION IF EXISTS {s}.ringo_backoff_us("
            "bigint, bigint, double precision, bigint)",
        ),
        # Minor 12, WaitTask across daemons: the ids daemons wait on
        # (`register_waits`), and statement triggers notifying the terminal
        # updates and deletions of those ids, whichever statement of
        # whichever daemon made them (settle, expiry, cancel, purge); the
        # UPDATE one is gone again in schema 9.
        (
            f"""
            CREATE TABLE {s}.task_waits (
                task_id     text        NOT NULL,
                instance    text        NOT NULL,
                since       timestamptz NOT NULL DEFAULT now(),
                PRIMARY KEY (task_id, instance)
            )
            """,
            wait_function(s, "ringo_wait_update", "new_rows", f"AND c.{FINISHED_TERM}"),
            wait_function(s, "ringo_wait_delete", "old_rows", ""),
            f"CREATE TRIGGER task_waits_update AFTER UPDATE ON {s}.tasks"
            " REFERENCING NEW TABLE AS new_rows"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.ringo_wait_update()",
            f"CREATE TRIGGER task_waits_delete AFTER DELETE ON {s}.tasks"
            " REFERENCING OLD TABLE AS old_rows"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {s}.ringo_wait_delete()",
        ),
        # The statements that end tasks notify waited ids themselves
        # (`sql.Spelling.notify_ended`): the UPDATE trigger of schema 8 cost
        # every write statement a PL/pgSQL call and an SPI query (~16 µs of
        # server CPU, bench/results.md "WaitTask"). Deletions keep theirs.
        (
            f"DROP TRIGGER IF EXISTS task_waits_update ON {s}.tasks",
            f"DROP FUNCTION IF EXISTS {s}.ringo_wait_update()",
        ),
        # Minor 13, paused queues: a row per paused queue (resuming deletes
        # it), shared by every daemon of the database, read whole into each
        # daemon's cache; the claim never reads it.
        (
            f"""
            CREATE TABLE {s}.paused_queues (
                queue       text    PRIMARY KEY,
                paused_at   bigint  NOT NULL
            )
            """,
        ),
        # Minor 13, schedules (storage/schedules.py): one row per (queue,
        # name); next_fire_at is NULL while paused, so the firing's index
        # holds the active ones only.
        (
            f"""
            CREATE TABLE {s}.schedules (
                queue           text     NOT NULL,
                name            text     NOT NULL,
                task_type       text     NOT NULL,
                cron            text     NOT NULL,
                every_us        bigint,
                payload         bytea    NOT NULL,
                timezone        text     NOT NULL,
                misfire         smallint NOT NULL,
                catch_up        bigint   NOT NULL,
                paused          boolean  NOT NULL,
                priority        integer  NOT NULL,
                max_attempts    bigint   NOT NULL,
                next_fire_at    bigint,
                last_fired_at   bigint,
                last_task_id    text     NOT NULL,
                fired           bigint   NOT NULL,
                skipped         bigint   NOT NULL,
                created_at      bigint   NOT NULL,
                updated_at      bigint   NOT NULL,
                PRIMARY KEY (queue, name)
            )
            """,
            f"CREATE INDEX schedules_due ON {s}.schedules (next_fire_at)"
            " WHERE next_fire_at IS NOT NULL",
        ),
        # Minor 13, keyed limits (docs/limits.md): each task's key (a
        # constant default: no table rewrite); the rules of each queue; each
        # limited key's GCRA state, whose row a claim locks to serialize the
        # key's claims across daemons. The partial indexes hold keyed tasks
        # only, so a task without a key adds no entry.
        (
            f"ALTER TABLE {s}.tasks ADD COLUMN limit_key text NOT NULL DEFAULT ''",
            f"CREATE INDEX tasks_limit_pending ON {s}.tasks"
            f" (queue, limit_key, priority DESC, available_at, seq) WHERE {LIMIT_PENDING}",
            f"CREATE INDEX tasks_limit_leased ON {s}.tasks (queue, limit_key) WHERE {LIMIT_LEASED}",
            f"""
            CREATE TABLE {s}.limit_rules (
                queue       text             NOT NULL,
                prefix      text             NOT NULL,
                rate        double precision NOT NULL,
                per_us      bigint           NOT NULL,
                burst       bigint           NOT NULL,
                concurrency bigint           NOT NULL,
                PRIMARY KEY (queue, prefix)
            )
            """,
            f"""
            CREATE TABLE {s}.limit_keys (
                queue       text    NOT NULL,
                key         text    NOT NULL,
                tat_us      bigint  NOT NULL,
                PRIMARY KEY (queue, key)
            )
            """,
        ),
        # Minor 14, attempt history (storage/history.py): who holds or last
        # held the lease and since when (written by the claim, so a
        # successful attempt needs no write of its own), and the ended
        # attempts. Constant defaults: no table rewrite.
        (
            f"ALTER TABLE {s}.tasks ADD COLUMN leased_at bigint,"
            " ADD COLUMN leased_by text NOT NULL DEFAULT '',"
            " ADD COLUMN history jsonb NOT NULL DEFAULT '[]'",
        ),
        # Plans that do not depend on the statistics (docs/deployment.md,
        # the section of that name). On a table never analyzed, or analyzed
        # while the queue was drained, every partial index looks empty, and
        # the generic plan the daemon makes once per connection could take
        # any index whose predicate the statement implies: the queue-led
        # `tasks_active_type`, sorted, for a claim, a wake-up or an expiry
        # (every active task of the queue read; a 40,000-task backlog: 27 ms
        # a claim, a third of the throughput); `tasks_finished` for a purge
        # or a bulk retry, `tasks_finished_queue` for retention (every
        # finished task read and sorted); `tasks_finished_age` for a queue's
        # purge (every other queue's old tasks walked). `task_type IS NOT
        # NULL` is true of every row, but only a statement comparing
        # `task_type` (a strict operator) proves it: the two typed indexes
        # now serve the statements that name types (listing, activity by
        # type) and no other; activity counts without types take the
        # state-specific indexes, one capped count each. `tasks_finished_age`
        # is gone (one index entry fewer per ack): retention walks
        # `tasks_finished_queue` queue by queue
        # (`operate.OperateSql.delete_finished`). Two indexes rebuilt, one
        # pass each while writes wait.
        (
            f"DROP INDEX {s}.tasks_active_type",
            f"CREATE INDEX tasks_active_type ON {s}.tasks (queue, task_type, seq)"
            f" WHERE {ACTIVE_TYPED}",
            f"DROP INDEX {s}.tasks_finished",
            f"CREATE INDEX tasks_finished ON {s}.tasks (queue, task_type, state, seq)"
            f" WHERE {FINISHED_TYPED}",
            f"DROP INDEX {s}.tasks_finished_age",
            *activity_functions(s),
        ),
        # The claim order of each task type: a worker of some types (every
        # registry's worker) claims and finds its wake-up by one seek per
        # type (`claim.ClaimSql.claim_typed`), not by a walk of
        # `tasks_pending` through the tasks of other types ahead of its own.
        # Typed (`PENDING_TYPED`, as schema 14's indexes): only a statement
        # comparing `task_type` can use it, so the untyped claim keeps
        # `tasks_pending` whatever the statistics say.
        (
            f"CREATE INDEX tasks_pending_type ON {s}.tasks"
            f" (queue, task_type, priority DESC, available_at, seq) WHERE {PENDING_TYPED}",
        ),
        # The claim order of the tasks without a limit key: a claim on a
        # queue with keyed limits reads them apart from its keys'
        # (`limits.LimitSql.unkeyed`), not by a walk of `tasks_pending`
        # through every keyed task ahead of them — a key's backlog held by
        # its rule was read on every claim and wake-up of its queue. One
        # entry per unkeyed task while PENDING.
        (
            f"CREATE INDEX tasks_pending_unkeyed ON {s}.tasks"
            f" (queue, priority DESC, available_at, seq) WHERE {UNKEYED_PENDING}",
        ),
        # The claim order of each task type, with a limit key and without: a
        # worker of some types on a queue with keyed limits finds the tasks
        # without a key (`limits.LimitSql.unkeyed_typed`), the keys with
        # tasks of its types (`keys_typed`) and each key's tasks
        # (`heads_typed`, `key_heads_typed`) by seeks per type, not by a
        # walk of `tasks_pending_unkeyed` or of the keys' tasks through the
        # tasks of other types ahead of its own. Typed (`task_type IS NOT
        # NULL`), so the untyped walks keep their indexes. One entry more
        # per task while PENDING.
        (
            f"CREATE INDEX tasks_pending_unkeyed_type ON {s}.tasks"
            f" (queue, task_type, priority DESC, available_at, seq) WHERE {UNKEYED_TYPED}",
            f"CREATE INDEX tasks_limit_pending_type ON {s}.tasks"
            f" (queue, task_type, limit_key, priority DESC, available_at, seq)"
            f" WHERE {LIMIT_TYPED}",
        ),
    )


WAIT_CHANNEL_PREFIX = "ringo_wait:"
"""A waited task's notifications go to this plus the tasks table's oid
(`wait_channel`): one channel per schema, short whatever its name."""


def wait_channel(s: str) -> str:
    """The SQL expression of schema `s`'s (quoted) wait channel."""
    return f"{literal(WAIT_CHANNEL_PREFIX)} || '{s}.tasks'::regclass::oid::text"


def wait_function(s: str, name: str, rows: str, condition: str) -> str:
    """A statement trigger's function notifying every id of the transition
    table `rows` (meeting `condition` on its alias ``c``) that a daemon
    waits on; the payload is the task id."""
    return f"""
        CREATE FUNCTION {s}.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM {s}.task_waits) THEN
                PERFORM pg_notify({literal(WAIT_CHANNEL_PREFIX)} || TG_RELID::text, c.id)
                FROM {rows} c
                WHERE EXISTS (SELECT 1 FROM {s}.task_waits w WHERE w.task_id = c.id)
                    {condition};
            END IF;
            RETURN NULL;
        END
        $$
    """


def schedule_of(initial_us: int, max_us: int, multiplier: float, max_attempts: int) -> list[int]:
    """A task's `retry.schedule`: the delays of every attempt it may retry
    after, before retry gives it more (then it gets a longer one)."""
    return schedule(initial_us, max_us, multiplier, min(max_attempts, LONGEST_SCHEDULE))


def delays_text(delays: list[int]) -> str:
    """A schedule as a bigint[] literal: a batch's schedules travel as one
    text[] (an array of arrays must be rectangular)."""
    return "{" + ",".join(map(str, delays)) + "}"


async def fill_retry_delays(conn: asyncpg.Connection, schema: str) -> None:
    """Migration 7's step: every stored task's schedule, one UPDATE per
    distinct (policy, max_attempts)."""
    kinds = await conn.fetch(
        "SELECT DISTINCT backoff_initial_us, backoff_max_us, backoff_multiplier, max_attempts"
        f" FROM {schema}.tasks"
    )
    await conn.executemany(
        f"UPDATE {schema}.tasks SET retry_delays_us = $5 WHERE backoff_initial_us = $1"
        " AND backoff_max_us = $2 AND backoff_multiplier = $3 AND max_attempts = $4",
        [(*kind, schedule_of(*kind)) for kind in kinds],
    )


SCHEMA_VERSION = len(migrations('"x"'))


async def migrate(conn: asyncpg.Connection, schema: str) -> None:
    """Create the schema if missing and bring it to SCHEMA_VERSION, in one
    transaction under an advisory lock: concurrent opens migrate once."""
    s = ident(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(schema))
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
        for statements in migrations(s)[version:]:
            for statement in statements:
                if isinstance(statement, str):
                    await conn.execute(statement)
                else:
                    await statement(conn)
        if version != SCHEMA_VERSION:
            await conn.execute(f"UPDATE {s}.ringo_schema SET version = $1", SCHEMA_VERSION)
