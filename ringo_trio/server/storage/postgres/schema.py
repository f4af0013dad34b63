"""The PostgreSQL schema: its migrations (`migrations(schema)[i]` takes it
from version i to i + 1), run by `migrate` under an advisory lock."""

from __future__ import annotations

import hashlib

import asyncpg  # type: ignore[import-untyped]

from ..base import SchemaTooNew
from ..rows import CANCELLED, DEAD, FINISHED, LEASED, PENDING, SUCCEEDED


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
FINISHED_TERM = f"state IN ({', '.join(map(str, FINISHED))})"


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


def migrations(s: str) -> tuple[tuple[str, ...], ...]:
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
                await conn.execute(statement)
        if version != SCHEMA_VERSION:
            await conn.execute(f"UPDATE {s}.ringo_schema SET version = $1", SCHEMA_VERSION)
