"""The SQLite schema: its migrations, and the index terms the queries spell alike.

Schema: `PRAGMA user_version` is the schema version; `MIGRATIONS[i]` takes
the database from version i to i + 1. Open applies the missing migrations in
one transaction and refuses (`SchemaTooNew`) a database written by a
newer version of this code.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from ..base import SchemaTooNew
from ..rows import CANCELLED, DEAD, LEASED, PENDING, SUCCEEDED

# Spelled exactly so in the index and in its queries: SQLite uses a partial
# index only for a query whose WHERE contains the index's own term.
ACTIVE = f"state IN ({PENDING}, {LEASED})"
# The term of the finished-task indexes (listing, purge, retention, bulk
# retry), spelled alike in their queries. A range, not `state IN (...)`:
# SQLite evaluates a partial index's term for the old and the new row of
# every write, and an IN list of three builds a lookup table per statement
# execution (settling: about 9 us CPU less per task, docs/operations.md).
# The finished states are the highest ones (tests/server/storage/test_sqlite.py
# checks it). The unary `+` keeps the term out of the planner's index
# constraints, where a range on `state` would win over a query's own
# `state = ?` and sort what it finds; the index's own term carries it too,
# as SQLite matches the two terms by their spelling.
FINISHED_TERM = f"+state >= {SUCCEEDED}"
# The term migrations 4 and 5 created the indexes with, until migration 6.
FINISHED_IN = f"state IN ({SUCCEEDED}, {DEAD}, {CANCELLED})"

# The transitions the claim and the acks count themselves (`move_counts`);
# the state-change trigger skips them.
SELF_COUNTED = (
    f"NOT (old.state = {PENDING} AND new.state = {LEASED})"
    f" AND NOT (old.state = {LEASED} AND new.state = {SUCCEEDED})"
)
COUNTS_DOWN = "UPDATE task_counts SET n = n - ? WHERE queue = ? AND task_type = ? AND state = ?"
COUNTS_UP = (
    "INSERT INTO task_counts (queue, task_type, state, n) VALUES (?, ?, ?, ?)"
    " ON CONFLICT DO UPDATE SET n = n + excluded.n"
)

# The counts' trigger steps; a row of zeros stays (the next task of that
# type and state reuses it) and is left out of every answer.
_COUNT_UP = (
    "INSERT INTO task_counts (queue, task_type, state, n)"
    " VALUES ({row}.queue, {row}.task_type, {row}.state, 1)"
    " ON CONFLICT DO UPDATE SET n = n + 1"
)
_COUNT_DOWN = (
    "UPDATE task_counts SET n = n - 1"
    " WHERE queue = {row}.queue AND task_type = {row}.task_type AND state = {row}.state"
)

# The keyed-limit index terms, spelled alike in their queries.
LIMIT_PENDING = f"state = {PENDING} AND limit_key != ''"
LIMIT_LEASED = f"state = {LEASED} AND limit_key != ''"
# The unkeyed tasks a limited claim walks (`tasks_pending_unkeyed`, schema
# 16). No stored state is below PENDING, so this admits PENDING alone; spelled
# `<=`, it does not imply `tasks_pending`'s `state = PENDING`, so only this
# index serves the statements that spell it, whatever the statistics say.
UNKEYED_PENDING = f"state <= {PENDING} AND limit_key = ''"

FINISHED_INDEXES = (
    ("tasks_finished", "queue, task_type, state"),
    ("tasks_finished_age", "state, finished_at"),
    ("tasks_finished_queue", "queue, state, finished_at"),
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE tasks (
            seq                 INTEGER PRIMARY KEY,
            id                  TEXT    NOT NULL,
            queue               TEXT    NOT NULL,
            task_type           TEXT    NOT NULL,
            payload             BLOB    NOT NULL,
            unique_key          TEXT    NOT NULL,
            state               INTEGER NOT NULL,
            attempt             INTEGER NOT NULL,
            max_attempts        INTEGER NOT NULL,
            base_max_attempts   INTEGER NOT NULL,
            priority            INTEGER NOT NULL,
            backoff_initial_us  INTEGER NOT NULL,
            backoff_max_us      INTEGER NOT NULL,
            backoff_multiplier  REAL    NOT NULL,
            created_at          INTEGER NOT NULL,
            updated_at          INTEGER NOT NULL,
            available_at        INTEGER NOT NULL,
            finished_at         INTEGER,
            last_error          TEXT    NOT NULL,
            progress_current    REAL,
            progress_total      REAL,
            progress_message    TEXT,
            progress_at         INTEGER,
            worker_id           TEXT    NOT NULL,
            lease_token         TEXT    NOT NULL,
            lease_until         INTEGER
        )
        """,
        "CREATE UNIQUE INDEX tasks_id ON tasks (id)",
        "CREATE UNIQUE INDEX tasks_unique_key ON tasks (queue, unique_key) WHERE unique_key != ''",
        "CREATE INDEX tasks_pending ON tasks (queue, priority DESC, available_at)"
        f" WHERE state = {PENDING}",
        f"CREATE INDEX tasks_leased ON tasks (queue, lease_until) WHERE state = {LEASED}",
    ),
    (f"CREATE INDEX tasks_active_type ON tasks (queue, task_type) WHERE {ACTIVE}",),
    # Minor 9: the handler's return value of a SUCCEEDED task.
    ("ALTER TABLE tasks ADD COLUMN result BLOB",),
    # Minor 9, inspection: the listing indexes, and the counts GetQueueStats
    # reads, kept exact by triggers in the writing transaction and
    # backfilled here from the tasks already stored.
    (
        f"CREATE INDEX tasks_finished ON tasks (queue, task_type, state) WHERE {FINISHED_IN}",
        """
        CREATE TABLE task_counts (
            queue       TEXT    NOT NULL,
            task_type   TEXT    NOT NULL,
            state       INTEGER NOT NULL,
            n           INTEGER NOT NULL,
            PRIMARY KEY (queue, task_type, state)
        ) WITHOUT ROWID
        """,
        """
        INSERT INTO task_counts (queue, task_type, state, n)
        SELECT queue, task_type, state, count(*) FROM tasks GROUP BY queue, task_type, state
        """,
        f"""
        CREATE TRIGGER task_counts_insert AFTER INSERT ON tasks BEGIN
            {_COUNT_UP.format(row="new")};
        END
        """,
        f"""
        CREATE TRIGGER task_counts_delete AFTER DELETE ON tasks BEGIN
            {_COUNT_DOWN.format(row="old")};
        END
        """,
        f"""
        CREATE TRIGGER task_counts_update AFTER UPDATE OF state ON tasks
        WHEN old.state != new.state BEGIN
            {_COUNT_DOWN.format(row="old")};
            {_COUNT_UP.format(row="new")};
        END
        """,
    ),
    # Purge and retention: the oldest finished tasks of one state, of one
    # queue (DeleteTasks) or of every queue (retention), by index seek.
    (
        f"CREATE INDEX tasks_finished_age ON tasks (state, finished_at) WHERE {FINISHED_IN}",
        "CREATE INDEX tasks_finished_queue ON tasks (queue, state, finished_at)"
        f" WHERE {FINISHED_IN}",
    ),
    # The finished-task indexes again, with the cheaper term (see
    # `FINISHED_TERM`); the queries spell the new term, so an index left in
    # the old form would no longer be used.
    tuple(
        statement
        for name, columns in FINISHED_INDEXES
        for statement in (
            f"DROP INDEX {name}",
            f"CREATE INDEX {name} ON tasks ({columns}) WHERE {FINISHED_TERM}",
        )
    ),
    # The claim and the acks count their own transitions, a statement per
    # (queue, task type) instead of two per row (see the module docstring).
    (
        "DROP TRIGGER task_counts_update",
        f"""
        CREATE TRIGGER task_counts_update AFTER UPDATE OF state ON tasks
        WHEN old.state != new.state AND {SELF_COUNTED} BEGIN
            {_COUNT_DOWN.format(row="old")};
            {_COUNT_UP.format(row="new")};
        END
        """,
    ),
    # Minor 13, paused queues: a row per paused queue (resuming deletes
    # it), read whole into the daemon's cache; the claim never reads it.
    (
        """
        CREATE TABLE IF NOT EXISTS paused_queues (
            queue       TEXT    PRIMARY KEY,
            paused_at   INTEGER NOT NULL
        ) WITHOUT ROWID
        """,
    ),
    # Minor 13, schedules (storage/schedules.py): one row per (queue, name);
    # next_fire_at is NULL while paused, so the firing's index holds the
    # active ones only.
    (
        """
        CREATE TABLE IF NOT EXISTS schedules (
            queue           TEXT    NOT NULL,
            name            TEXT    NOT NULL,
            task_type       TEXT    NOT NULL,
            cron            TEXT    NOT NULL,
            every_us        INTEGER,
            payload         BLOB    NOT NULL,
            timezone        TEXT    NOT NULL,
            misfire         INTEGER NOT NULL,
            catch_up        INTEGER NOT NULL,
            paused          INTEGER NOT NULL,
            priority        INTEGER NOT NULL,
            max_attempts    INTEGER NOT NULL,
            next_fire_at    INTEGER,
            last_fired_at   INTEGER,
            last_task_id    TEXT    NOT NULL,
            fired           INTEGER NOT NULL,
            skipped         INTEGER NOT NULL,
            created_at      INTEGER NOT NULL,
            updated_at      INTEGER NOT NULL,
            PRIMARY KEY (queue, name)
        ) WITHOUT ROWID
        """,
        "CREATE INDEX IF NOT EXISTS schedules_due ON schedules (next_fire_at)"
        " WHERE next_fire_at IS NOT NULL",
    ),
    # Minor 13, keyed limits (docs/limits.md): each task's key; the rules of
    # each queue; each limited key's GCRA state. The two partial indexes
    # hold keyed tasks only, so a task without a key adds no entry: the
    # claim walks the keys with waiting tasks and counts a key's leases.
    (
        "ALTER TABLE tasks ADD COLUMN limit_key TEXT NOT NULL DEFAULT ''",
        f"CREATE INDEX tasks_limit_pending ON tasks (queue, limit_key, priority DESC,"
        f" available_at) WHERE {LIMIT_PENDING}",
        f"CREATE INDEX tasks_limit_leased ON tasks (queue, limit_key) WHERE {LIMIT_LEASED}",
        """
        CREATE TABLE limit_rules (
            queue       TEXT    NOT NULL,
            prefix      TEXT    NOT NULL,
            rate        REAL    NOT NULL,
            per_us      INTEGER NOT NULL,
            burst       INTEGER NOT NULL,
            concurrency INTEGER NOT NULL,
            PRIMARY KEY (queue, prefix)
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE limit_keys (
            queue       TEXT    NOT NULL,
            key         TEXT    NOT NULL,
            tat_us      INTEGER NOT NULL,
            PRIMARY KEY (queue, key)
        ) WITHOUT ROWID
        """,
    ),
    # Minor 14, attempt history (storage/history.py): who holds or last held
    # the lease and since when (written by the claim, so a successful attempt
    # needs no write of its own), and the ended attempts as JSON (NULL: none).
    (
        "ALTER TABLE tasks ADD COLUMN leased_at INTEGER",
        "ALTER TABLE tasks ADD COLUMN leased_by TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE tasks ADD COLUMN history TEXT",
    ),
    # The claim order of each task type: a worker of some types (every
    # registry's worker) claims and finds its wake-up by one seek per type
    # (`claim.each_type`), not by a walk of `tasks_pending` through the
    # tasks of other types ahead of its own.
    (
        "CREATE INDEX tasks_pending_type ON tasks (queue, task_type, priority DESC,"
        f" available_at) WHERE state = {PENDING}",
    ),
    # The claim order of the tasks without a limit key: a claim on a queue
    # with keyed limits reads them apart from its keys' (`limits.claim`),
    # not by a walk of `tasks_pending` through every keyed task ahead of
    # them — a key's backlog held by its rule was read on every claim and
    # wake-up of its queue. One entry per unkeyed task while PENDING.
    (
        "CREATE INDEX tasks_pending_unkeyed ON tasks (queue, priority DESC, available_at)"
        f" WHERE {UNKEYED_PENDING}",
    ),
    # The claim order of each task type, with a limit key and without: a
    # worker of some types on a queue with keyed limits finds the tasks
    # without a key (`limits.unkeyed_heads`), the keys with tasks of its
    # types (`limits.keys_cte`) and each key's tasks (`heads_sql`) by seeks
    # per type, not by a walk of `tasks_pending_unkeyed` or of the keys'
    # tasks through the tasks of other types ahead of its own. One entry
    # more per task while PENDING.
    (
        "CREATE INDEX tasks_pending_unkeyed_type ON tasks"
        f" (queue, task_type, priority DESC, available_at) WHERE {UNKEYED_PENDING}",
        "CREATE INDEX tasks_limit_pending_type ON tasks"
        f" (queue, task_type, limit_key, priority DESC, available_at) WHERE {LIMIT_PENDING}",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


@contextlib.contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, the write lock taken up front; any exception
    rolls it back."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        # SQLite rolls some errors back by itself; ROLLBACK then has
        # nothing to undo and would raise over the real error.
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to SCHEMA_VERSION in one transaction."""
    with immediate(db):
        # Read under the write lock: another process may have migrated.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{path}: database schema version {version} is newer than this"
                f" ringo_trio understands ({SCHEMA_VERSION}); upgrade ringo_trio or"
                " use another data dir"
            )
        for statements in MIGRATIONS[version:]:
            for statement in statements:
                db.execute(statement)
        if version != SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
