"""The embedded storage engine: one SQLite database file in WAL mode.

Theory of operation
-------------------
One connection, used synchronously from the daemon's event loop. Every call
is sub-millisecond and never awaits, so a call is atomic with respect to the
other tasks of the loop; a thread pool would only add hand-offs. Every
mutation runs in one `BEGIN IMMEDIATE ... COMMIT` (the write lock is taken up
front, so reads inside see the state the writes are based on) and any
exception rolls it back: a failed call changes nothing.

Durability: WAL with `synchronous=NORMAL`. A committed transaction is in the
WAL file (the OS page cache) when COMMIT returns, so it survives `kill -9`
of the daemon; it is not fsynced on every commit, so a power loss or kernel
crash can lose the last transactions. `PRAGMA synchronous=FULL` closes that
window at the cost of one fsync per commit.

Rows: one table `tasks`; times are integer microseconds since the Unix epoch
(UTC) and are converted to aware datetimes only at this module's boundary.
`seq` (the rowid) is enqueue order. Partial indexes do the work:

* `tasks_pending (queue, priority DESC, available_at) WHERE state = PENDING`
  -- claim order. Claims walk the distinct priorities of a queue from the top
  (each step an index seek) and take the due tasks of each priority by a
  range seek, so tasks scheduled far in the future are never scanned. Past
  `_PRIORITY_PROBES` distinct priorities the rest is one ordered scan.
* `tasks_leased (queue, lease_until) WHERE state = LEASED` -- lease expiry,
  which claim runs for its queue before leasing.
* `tasks_unique_key (queue, unique_key) UNIQUE WHERE unique_key != ''` --
  dedupe, and lookup by key.
* `tasks_active_type (queue, task_type) WHERE state IN (PENDING, LEASED)` --
  activity: counting stops at `MAX_ACTIVITY_COUNT`, and a task-type filter
  is a seek per type, so the count never walks a backlog of other types.
* `tasks_finished_age (state, finished_at)` and `tasks_finished_queue (queue,
  state, finished_at)` `WHERE +state >= SUCCEEDED` (the finished states) --
  purge and retention: a batch walks one state's oldest finished tasks (of
  every queue, or of one) and stops at its limit; several states are merged
  in Python rather than sorted by SQLite.

Inspection (ListTasks, GetQueueStats, ListQueues; see `_listing`) never
scans on the loop. `task_counts (queue, task_type, state, n)` is kept exact
by three triggers (insert, delete, state change) in the writing
transaction, so every write path is counted, also ones written later (cancel,
purge); its migration counts the rows already stored. Listing merges
seq-ordered streams, one per (task type, state) pair the counts hold:
PENDING/LEASED on `tasks_active_type`, finished states on
`tasks_finished (queue, task_type, state) WHERE +state >= SUCCEEDED`; the
claim path touches neither, an ack adds one entry. (A range term, not an IN
list, which SQLite rebuilds a lookup table for at every statement: see
`_FINISHED_TERM`.)
Measured cost (engine CPU per task, shared 2-core machine): claim + ack
66.0 -> 88.0 us (index +11, triggers +11: each B-tree a commit touches is a
page more in the WAL), enqueue in 1000s 12.3 -> 16.7 us; through the daemon
+14% daemon CPU per no-op task, throughput within the noise
(docs/operations.md, "How it is stored").

Task ids are 32 hex digits: 48 bits of the enqueue time in milliseconds, then
80 random bits, so they sort roughly by creation and are unique across
restarts and databases without coordination. Lease tokens are
`secrets.token_hex(16)`, minted by a SQL function so one UPDATE leases a
whole batch.

Retry budget: a task keeps the `max_attempts` it was enqueued with as its
base; retrying a SUCCEEDED, DEAD or CANCELLED task sets `max_attempts =
attempt + base`, i.e. it gets the same number of attempts again, and `attempt`
keeps counting. `last_error` and `progress` describe the latest attempt that
set them and are kept across attempts and retries; `worker_id` and
`lease_until` exist only while LEASED; `result` only while SUCCEEDED.

Group commit (`settle_many`): one `BEGIN IMMEDIATE ... COMMIT` for a
whole group of acks, nacks and rejects; the count rows and index pages the
group shares go to the WAL once, and no `Task` is built. When every item
names a different task (the Work stream's case), the order of the items
cannot change what they do, and the acks go as one `UPDATE ... FROM (the
group's refs) RETURNING id` (`_ack_many_sql`): one statement instead of one
per ack, 14.7 -> 8.1 us of engine CPU per ack. Otherwise each item is its
own lease-guarded UPDATE, in order, so a lease listed twice misses the
second time, as in sequence.

The two hot transitions count themselves. The count trigger fires per row
and its two statements cost ~3.5 us per claimed and acked task; it skips
PENDING -> LEASED (only a claim leases) and LEASED -> SUCCEEDED (only an ack
succeeds a task), and the claim and the acks move those counts with one
statement per (queue, task type) of the transaction (`_move_counts`). Every
other write is still counted by the triggers, so a path added later is
counted unless it makes one of those two transitions.

Checkpoints: SQLite copies the WAL back into the database (and fsyncs
both) inside whichever COMMIT crosses `wal_autocheckpoint` pages: on the
event loop, a stall of 3-14 ms every ~1,600 settled tasks that every stream
waits through (`/tmp` micro-run, 40,000 claim + ack: 31-47 calls over 2 ms,
130-240 ms in all, against 0-3 without). While the daemon serves,
`maintain` does it instead: a PASSIVE checkpoint on a second connection in
a worker thread, `_CHECKPOINT_INTERVAL` after the last one when anything
was committed since. PASSIVE never blocks a writer; once it has copied
every frame, the next write starts the WAL over, so the file stays near
what an interval writes. The loop's own automatic checkpoint stays as a
backstop at `_BACKSTOP_PAGES` (a thread that cannot keep up, a stuck
disk), and goes back to SQLite's default when upkeep stops (tools and
tests that open the engine alone).

Cancel: a PENDING or LEASED task becomes CANCELLED in one UPDATE that also
clears its lease, so the worker's next command on that lease matches no row.
Only then — on the miss path, never on the hot path — the engine looks
whether the ref's task is CANCELLED at that very attempt, and says so in the
`LeaseLost` (`cancelled=True`). Bulk retry of DEAD tasks (`retry_dead`)
walks the finished-task index oldest finished first and updates at most
`limit` rows in one transaction.

Schema: `PRAGMA user_version` is the schema version; `_MIGRATIONS[i]` takes
the database from version i to i + 1. Open applies the missing migrations in
one transaction and refuses (`SchemaTooNew`) a database written by a
newer version of this code.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import logging
import math
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT, MAX_LIST_ERROR_BYTES
from ringo_trio._proto.ringo.v1 import (
    Lease,
    LeasedTask,
    LeaseRef,
    QueueStats,
    Task,
    TaskSpec,
)

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
    TaskFilter,
    TaskPage,
)
from ._push import push_rows as _push_rows
from ._rows import C_AVAILABLE as _C_AVAILABLE
from ._rows import C_PRIORITY as _C_PRIORITY
from ._rows import C_QUEUE as _C_QUEUE
from ._rows import C_SEQ as _C_SEQ
from ._rows import C_TASK_TYPE as _C_TASK_TYPE
from ._rows import CANCELLED as _CANCELLED
from ._rows import COLS as _COLS
from ._rows import DEAD as _DEAD
from ._rows import LEASE_EXPIRED as _LEASE_EXPIRED
from ._rows import LEASED as _LEASED
from ._rows import MAX_DELAY_US as _MAX_DELAY_US
from ._rows import MICRO as _MICRO
from ._rows import PENDING as _PENDING
from ._rows import STATES as _STATES
from ._rows import SUCCEEDED as _SUCCEEDED
from ._rows import UINT32_MAX as _UINT32_MAX
from ._rows import NewTasks as _NewTasks
from ._rows import cancelled_text as _cancelled_text
from ._rows import describe as _describe
from ._rows import finished_states as _finished_states
from ._rows import from_us as _from_us
from ._rows import lease as _lease
from ._rows import leased as _leased
from ._rows import row_task as _row_task
from ._rows import stuck as _stuck
from ._rows import to_us as _to_us

__all__ = ["SCHEMA_VERSION", "SQLiteEngine"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

_BUSY_TIMEOUT_MS = 5000
# WAL checkpoints (see the module docstring): how often upkeep runs one,
# the loop's automatic one while upkeep runs, and SQLite's default.
_CHECKPOINT_INTERVAL = 0.1
_BACKSTOP_PAGES = 10_000
_AUTO_CHECKPOINT_PAGES = 1000
_MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING

# A claim seeks priority by priority; a queue with more distinct priorities
# than this falls back to one ordered scan for the rest, bounding the seeks.
_PRIORITY_PROBES = 16
# SQLite's bound-parameter limit is 32766 (>= 3.32); stay far below it.
_IN_CHUNK = 500
# The files SQLite keeps next to the database (WAL mode, and a rollback
# journal left by an older daemon).
_COMPANION_SUFFIXES = ("-wal", "-shm", "-journal")

# Spelled exactly so in the index and in its queries: SQLite uses a partial
# index only for a query whose WHERE contains the index's own term.
_ACTIVE = f"state IN ({_PENDING}, {_LEASED})"
# The term of the finished-task indexes (listing, purge, retention, bulk
# retry), spelled alike in their queries. A range, not `state IN (...)`:
# SQLite evaluates a partial index's term for the old and the new row of
# every write, and an IN list of three builds a lookup table per statement
# execution (settling: about 9 us CPU less per task, docs/operations.md).
# The finished states are the highest ones (tests/storage/test_sqlite.py
# checks it). The unary `+` keeps the term out of the planner's index
# constraints, where a range on `state` would win over a query's own
# `state = ?` and sort what it finds; the index's own term carries it too,
# as SQLite matches the two terms by their spelling.
_FINISHED_TERM = f"+state >= {_SUCCEEDED}"
# The term migrations 4 and 5 created the indexes with, until migration 6.
_FINISHED_IN = f"state IN ({_SUCCEEDED}, {_DEAD}, {_CANCELLED})"

# The transitions the claim and the acks count themselves (`_move_counts`);
# the state-change trigger skips them.
_SELF_COUNTED = (
    f"NOT (old.state = {_PENDING} AND new.state = {_LEASED})"
    f" AND NOT (old.state = {_LEASED} AND new.state = {_SUCCEEDED})"
)
_COUNTS_DOWN = "UPDATE task_counts SET n = n - ? WHERE queue = ? AND task_type = ? AND state = ?"
_COUNTS_UP = (
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

_FINISHED_INDEXES = (
    ("tasks_finished", "queue, task_type, state"),
    ("tasks_finished_age", "state, finished_at"),
    ("tasks_finished_queue", "queue, state, finished_at"),
)

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
        f" WHERE state = {_PENDING}",
        f"CREATE INDEX tasks_leased ON tasks (queue, lease_until) WHERE state = {_LEASED}",
    ),
    (f"CREATE INDEX tasks_active_type ON tasks (queue, task_type) WHERE {_ACTIVE}",),
    # Minor 9: the handler's return value of a SUCCEEDED task.
    ("ALTER TABLE tasks ADD COLUMN result BLOB",),
    # Minor 9, inspection: the listing indexes, and the counts GetQueueStats
    # reads, kept exact by triggers in the writing transaction and
    # backfilled here from the tasks already stored.
    (
        f"CREATE INDEX tasks_finished ON tasks (queue, task_type, state) WHERE {_FINISHED_IN}",
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
        f"CREATE INDEX tasks_finished_age ON tasks (state, finished_at) WHERE {_FINISHED_IN}",
        "CREATE INDEX tasks_finished_queue ON tasks (queue, state, finished_at)"
        f" WHERE {_FINISHED_IN}",
    ),
    # The finished-task indexes again, with the cheaper term (see
    # `_FINISHED_TERM`); the queries spell the new term, so an index left in
    # the old form would no longer be used.
    tuple(
        statement
        for name, columns in _FINISHED_INDEXES
        for statement in (
            f"DROP INDEX {name}",
            f"CREATE INDEX {name} ON tasks ({columns}) WHERE {_FINISHED_TERM}",
        )
    ),
    # The claim and the acks count their own transitions, a statement per
    # (queue, task type) instead of two per row (see the module docstring).
    (
        "DROP TRIGGER task_counts_update",
        f"""
        CREATE TRIGGER task_counts_update AFTER UPDATE OF state ON tasks
        WHEN old.state != new.state AND {_SELF_COUNTED} BEGIN
            {_COUNT_DOWN.format(row="old")};
            {_COUNT_UP.format(row="new")};
        END
        """,
    ),
)
SCHEMA_VERSION = len(_MIGRATIONS)


# Large enough to need pages of its own (overflow pages).
_PROBE_SPEC = TaskSpec(task_type="probe", payload=bytes(16 * 1024))

_INSERT_HEAD = (
    "INSERT INTO tasks (id, queue, task_type, payload, unique_key, state, attempt,"
    " max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,"
    " backoff_multiplier, created_at, updated_at, available_at, last_error, worker_id,"
    " lease_token) VALUES "
)
_INSERT_ROW = "(?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', '', '')"
_INSERT = _INSERT_HEAD + _INSERT_ROW
# Rows per multi-row INSERT, largest first: a batch is cut into these so
# that only four statements (each prepared once, in the statement cache)
# insert any batch. One statement per row (`executemany`) cost twice as much:
# SQLite evaluated each partial index's `state IN (...)` term with a table it
# builds once per statement execution, i.e. once per row (measured: 9.9 ->
# 4.4 ms per 1,000 rows, engine alone, before schema 6 put the finished-task
# indexes on a range term).
_INSERT_CHUNKS = (512, 64, 8, 1)  # 512 rows x 16 parameters, far below 32766


@functools.cache
def _insert_rows(count: int) -> str:
    return _INSERT_HEAD + ", ".join([_INSERT_ROW] * count)


def _pieces(items: Sequence[_T], sizes: Sequence[int]) -> Iterator[Sequence[_T]]:
    """`items` in consecutive pieces of `sizes` (largest first, the last 1),
    so a batch of any length runs as a few statements, each of a size that
    stays prepared in the statement cache."""
    start = 0
    for size in sizes:
        while len(items) - start >= size:
            yield items[start : start + size]
            start += size


def _insert_all(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    for piece in _pieces(rows, _INSERT_CHUNKS):
        db.execute(_insert_rows(len(piece)), list(itertools.chain.from_iterable(piece)))


# The current lease, alive at :now. Every LeaseRef operation is one UPDATE
# guarded by this, so a stale ref matches no row and changes nothing.
_LEASE_MATCH = (
    f"id = :id AND state = {_LEASED} AND attempt = :attempt"
    " AND lease_token = :token AND lease_until > :now"
)
# SET expressions see the row as it was before the UPDATE, so `attempt`
# here is the attempt that just ended.
_RELEASE = f"""
    state = CASE WHEN attempt >= max_attempts THEN {_DEAD} ELSE {_PENDING} END,
    available_at = CASE WHEN attempt >= max_attempts THEN available_at
        ELSE :now + min(coalesce(:delay, ringo_backoff_us(
            backoff_initial_us, backoff_max_us, backoff_multiplier, attempt)),
            {_MAX_DELAY_US}) END,
    finished_at = CASE WHEN attempt >= max_attempts THEN :now ELSE NULL END,
    last_error = :error, worker_id = '', lease_token = '', lease_until = NULL,
    updated_at = :now
"""
_ACK_SET = f"""
    state = {_SUCCEEDED}, finished_at = :now, worker_id = '', lease_token = '',
    lease_until = NULL, updated_at = :now, result = :result
"""
_REJECT_SET = f"""
    state = {_DEAD}, finished_at = :now, last_error = :error, worker_id = '',
    lease_token = '', lease_until = NULL, updated_at = :now
"""


def _lease_update(assignments: str, returning: str) -> str:
    return f"UPDATE tasks SET {assignments} WHERE {_LEASE_MATCH} RETURNING {returning}"


_ACK = _lease_update(_ACK_SET, _COLS)
_NACK = _lease_update(_RELEASE, _COLS)
_REJECT = _lease_update(_REJECT_SET, _COLS)
# Group commit: the queue is all a settled item answers (no Task is built);
# an ack also returns the task type, for its counts.
_ACK_QUEUE = _lease_update(_ACK_SET, "queue, task_type")
_NACK_QUEUE = _lease_update(_RELEASE, "queue")
_REJECT_QUEUE = _lease_update(_REJECT_SET, "queue")
_EXTEND = f"""
    UPDATE tasks SET lease_until = :until, updated_at = :now
    WHERE {_LEASE_MATCH} RETURNING id, attempt, lease_token, worker_id, lease_until
"""
# `available_at` is kept: claim never moves it and it was due when claimed,
# so the task is claimable now and keeps its place in claim order.
_RELEASE_UNSENT = f"""
    UPDATE tasks SET state = {_PENDING}, attempt = attempt - 1, worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now
    WHERE {_LEASE_MATCH}
"""
_PROGRESS = f"""
    UPDATE tasks SET progress_current = :current, progress_total = :total,
        progress_message = :message, progress_at = :now, updated_at = :now
    WHERE {_LEASE_MATCH} RETURNING id
"""
# INDEXED BY: without it the planner may prefer a table scan for the
# queue-less form, and an expiry pass must only touch leased rows.
_EXPIRE_ALL = (
    f"UPDATE tasks INDEXED BY tasks_leased SET {_RELEASE}"
    f" WHERE state = {_LEASED} AND lease_until <= :now"
)
_EXPIRE_QUEUE = f"{_EXPIRE_ALL} AND queue = :queue"

_TOP_PRIORITY = f"SELECT max(priority) FROM tasks WHERE queue = ? AND state = {_PENDING}"
_NEXT_PRIORITY = (
    f"SELECT max(priority) FROM tasks WHERE queue = ? AND state = {_PENDING} AND priority < ?"
)
# The lease is cleared for a stuck LEASED task (see `_rows.stuck`); a
# finished task has none.
_RETRY = f"""
    UPDATE tasks SET state = {_PENDING}, available_at = :now, finished_at = NULL,
        max_attempts = min(attempt + base_max_attempts, {_UINT32_MAX}), worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now, result = NULL
    WHERE seq = :seq RETURNING {_COLS}
"""

# The oldest finished tasks of one state (of one queue, or of every queue for
# retention): an ordered walk of a partial index that stops at :limit, so a
# batch costs about :limit index entries however many tasks are kept. seq
# (the rowid, the index's hidden last column) breaks ties without a sort.
_OLDEST_FINISHED = (
    f"SELECT finished_at, seq FROM tasks INDEXED BY tasks_finished_age WHERE {_FINISHED_TERM}"
    " AND state = :state AND finished_at < :before ORDER BY finished_at, seq LIMIT :limit"
)
_OLDEST_FINISHED_QUEUE = (
    f"SELECT finished_at, seq FROM tasks INDEXED BY tasks_finished_queue WHERE {_FINISHED_TERM}"
    " AND queue = :queue AND state = :state AND finished_at < :before"
    " ORDER BY finished_at, seq LIMIT :limit"
)
# finished_before unset: later than any time the daemon stores.
_NO_CUTOFF = 2**63 - 1


# A LEASED task's lease goes with it: the worker's next command on the lease
# matches no row, and `_lost` tells it why.
_CANCEL = f"""
    UPDATE tasks SET state = {_CANCELLED}, finished_at = :now, last_error = :error,
        worker_id = '', lease_token = '', lease_until = NULL, updated_at = :now
    WHERE seq = :seq RETURNING {_COLS}
"""
# Whether a ref's attempt ended by CancelTask: the miss path of a lease
# operation only, so the hot path runs no extra statement.
_CANCELLED_AT = (
    f"SELECT 1 FROM tasks WHERE id = :id AND state = {_CANCELLED} AND attempt = :attempt"
)


def _retry_dead_sql(types_clause: str) -> str:
    """The oldest DEAD tasks of a queue (finished_at < :before) back to
    PENDING, as `_RETRY` does for one; the walk follows the finished-task
    index."""
    return f"""
    UPDATE tasks SET state = {_PENDING}, available_at = :now, finished_at = NULL,
        max_attempts = min(attempt + base_max_attempts, {_UINT32_MAX}), worker_id = '',
        lease_token = '', lease_until = NULL, updated_at = :now, result = NULL
    WHERE seq IN (
        SELECT seq FROM tasks
        WHERE {_FINISHED_TERM} AND queue = :queue AND state = {_DEAD}
            AND finished_at < :before{types_clause}
        ORDER BY finished_at, seq LIMIT :limit)
"""


# -- inspection ------------------------------------------------------------

# A listed task: no payload, no result, last_error cut (by characters here,
# by bytes in `_listed`), so a page never reads the large columns.
_LIST_COLS = ", ".join(
    {
        "payload": "X''",
        "last_error": f"substr(last_error, 1, {MAX_LIST_ERROR_BYTES})",
        "result": "NULL",
    }.get(c.strip(), c.strip())
    for c in _COLS.split(",")
)
_WALK_COLS = "seq, task_type, unique_key, state"
_PRESENT = "SELECT task_type, state FROM task_counts WHERE queue = ? AND n > 0"
# Queues holding a task, by name: walks the counts' primary key in order.
_QUEUE_NAMES = (
    "SELECT queue FROM task_counts WHERE queue > ? GROUP BY queue HAVING sum(n) > 0"
    " ORDER BY queue LIMIT ?"
)
_QUEUE_COUNTS = "SELECT task_type, state, n FROM task_counts WHERE queue = ?"
_OLDEST_AT = (
    f"SELECT min(available_at) FROM tasks WHERE queue = ? AND state = {_PENDING} AND priority = ?"
)
_OLDEST_REST = (
    f"SELECT min(available_at) FROM tasks WHERE queue = ? AND state = {_PENDING} AND priority <= ?"
)


def _list_sql(cols: str, arms: Sequence[_listing.Arm], newest_first: bool) -> str:
    return _list_sql_of(cols, _listing.shape(arms), newest_first)


@functools.lru_cache(maxsize=256)
def _list_sql_of(cols: str, shape: tuple[tuple[str, int | None], ...], newest_first: bool) -> str:
    """One index stream per arm past :after, merged by seq (see `_listing`).
    Each arm repeats its partial index's own term: SQLite uses a partial
    index only for a query that spells it."""
    op, order = ("<", "DESC") if newest_first else (">", "ASC")
    selects = []
    for i, (kind, state) in enumerate(shape):
        source = "tasks"
        if kind == "active":
            where = f"queue = :queue AND task_type = :a{i} AND {_ACTIVE}"
        elif kind == "finished":
            where = f"queue = :queue AND task_type = :a{i} AND state = {state}"
            where += f" AND {_FINISHED_TERM}"
        else:
            where = "queue = :queue"
            source = "tasks NOT INDEXED"
        selects.append(f"SELECT {cols} FROM {source} WHERE {where} AND seq {op} :after")
    return " UNION ALL ".join(selects) + f" ORDER BY seq {order} LIMIT :limit"


def _arm_params(arms: Sequence[_listing.Arm]) -> dict[str, Any]:
    typed = [i for i, (kind, _) in enumerate(arms) if kind != "scan"]
    return {f"a{i}": t for i, t in zip(typed, _listing.arm_types(arms), strict=True)}


def _listed(row: Sequence[Any]) -> Task:
    task = _row_task(row)
    task.last_error = _listing.cut_error(task.last_error)
    return task


def _types_clause(task_types: Sequence[str]) -> tuple[str, dict[str, str]]:
    """An `AND task_type IN (...)` filter and its named parameters."""
    if not task_types:
        return "", {}
    names = [f"t{i}" for i in range(len(task_types))]
    clause = " AND task_type IN (" + ", ".join(":" + n for n in names) + ")"
    return clause, dict(zip(names, task_types, strict=True))


@functools.lru_cache(maxsize=256)
def _claim_sql(types_clause: str, rest: bool) -> str:
    # `rest` covers every priority from :prio down in one ordered scan.
    prio = "priority <= :prio" if rest else "priority = :prio"
    order = "priority DESC, available_at, seq" if rest else "available_at, seq"
    return f"""
        UPDATE tasks SET state = {_LEASED}, attempt = attempt + 1,
            lease_token = ringo_token(), worker_id = :worker, lease_until = :until,
            updated_at = :now
        WHERE seq IN (
            SELECT seq FROM tasks
            WHERE queue = :queue AND state = {_PENDING} AND {prio}
                AND available_at <= :now{types_clause}
            ORDER BY {order} LIMIT :limit)
        RETURNING {_COLS}
    """


@functools.lru_cache(maxsize=16)
def _ack_many_sql(count: int) -> str:
    """`count` acks of different tasks as one lease-guarded UPDATE: ?1 is
    the time, then (id, attempt, token, result) per ack. INDEXED BY: each
    ref is a seek of `tasks_id`, whatever the planner guesses."""
    refs = ", ".join(f"(?{i}, ?{i + 1}, ?{i + 2}, ?{i + 3})" for i in range(2, 4 * count, 4))
    assignments = _ACK_SET.replace(":now", "?1").replace(":result", "refs.result")
    return f"""
        WITH refs (id, attempt, token, result) AS (VALUES {refs})
        UPDATE tasks INDEXED BY tasks_id SET {assignments}
        FROM refs
        WHERE tasks.id = refs.id AND state = {_LEASED} AND tasks.attempt = refs.attempt
            AND lease_token = refs.token AND lease_until > ?1
        RETURNING tasks.id, queue, task_type
    """


# Acks per `_ack_many_sql` statement, largest first: a group is cut into
# these, so a handful of statements stay prepared in the statement cache.
_ACK_CHUNKS = (256, 64, 32, 16, 8, 4, 2, 1)


def _move_counts(
    db: sqlite3.Connection, moved: Sequence[tuple[str, str]], old: int, new: int
) -> None:
    """Move `task_counts` for tasks that went from state `old` to `new`, one
    (queue, task type) pair per task: the transitions the trigger skips."""
    if not moved:
        return
    by_kind = collections.Counter(moved)
    db.executemany(_COUNTS_DOWN, [(n, q, t, old) for (q, t), n in by_kind.items()])
    db.executemany(_COUNTS_UP, [(q, t, new, n) for (q, t), n in by_kind.items()])


def _leased_rows(rows: list[Any]) -> list[LeasedTask]:
    return [_leased(r) for r in rows]


def _priority_steps(db: sqlite3.Connection, queue: str) -> Iterator[tuple[int, bool]]:
    """The distinct PENDING priorities of `queue`, highest first, one index
    seek each. After `_PRIORITY_PROBES` of them the last step has
    `rest=True`: it stands for its priority and every lower one. Stop
    iterating as soon as you have enough; the next seek runs only on demand."""
    prio = db.execute(_TOP_PRIORITY, (queue,)).fetchone()[0]
    probes = 0
    while prio is not None:
        rest = probes == _PRIORITY_PROBES
        yield prio, rest
        if rest:
            return
        probes += 1
        prio = db.execute(_NEXT_PRIORITY, (queue, prio)).fetchone()[0]


def _backoff_us(initial_us: int, max_us: int, multiplier: float, attempt: int) -> int:
    """initial * multiplier^(attempt-1), capped at max (registered as SQL)."""
    try:
        delay = initial_us * multiplier ** max(attempt - 1, 0)
    except OverflowError:
        delay = math.inf
    # `not <` also sends NaN to the cap.
    if not delay < max_us:
        return max_us
    return max(int(delay), 0)


def _delay_us(retry_delay: timedelta | None) -> int | None:
    """A nack's retry delay override in microseconds (None: the backoff)."""
    return None if retry_delay is None else max(retry_delay // _MICRO, 0)


def _new_token() -> str:
    return secrets.token_hex(16)


def _find(
    db: sqlite3.Connection,
    columns: str,
    queue: str,
    task_id: str | None,
    unique_key: str | None,
) -> Any:
    """`columns` of the task named by exactly one of task_id / unique_key;
    NotFound if the queue holds no such task."""
    if (task_id is None) == (unique_key is None):
        raise ValueError("exactly one of task_id / unique_key")
    if task_id is not None:
        where, value = "id = :value", task_id
    else:
        # The literal term lets SQLite use the partial unique index; an
        # empty key names no task.
        where, value = "unique_key = :value AND unique_key != ''", unique_key or ""
    row = db.execute(
        f"SELECT {columns} FROM tasks WHERE queue = :queue AND {where}",
        {"queue": queue, "value": value},
    ).fetchone()
    if row is None:
        raise NotFound(_describe(queue, task_id, unique_key))
    return row


def _lost(db: sqlite3.Connection, ref: LeaseRef) -> LeaseLost:
    """The LeaseLost for a ref whose lease operation matched no row, telling
    whether that very attempt ended by CancelTask."""
    cancelled = (
        db.execute(_CANCELLED_AT, {"id": ref.task_id, "attempt": ref.attempt}).fetchone()
        is not None
    )
    if cancelled:
        return LeaseLost(
            f"task {ref.task_id!r} attempt {ref.attempt}: the task was cancelled", cancelled=True
        )
    return LeaseLost(
        f"task {ref.task_id!r} attempt {ref.attempt}: not the current lease, or it has expired"
    )


def _make_private(path: Path) -> None:
    """Leave the database and its companion files readable by us only (0600).

    SQLite creates a database with mode 0644 minus the umask, and its -wal
    and -shm with the database's own mode: so the database is created (or
    tightened) 0600 before SQLite opens it, and companions left by an older
    daemon are tightened too. Payloads sit in all of them.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in _COMPANION_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)


class SQLiteEngine(Storage):
    """`Storage` on one SQLite file (`path` is the database file itself)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        # Write transactions committed: upkeep checkpoints only after one.
        self._commits = 0

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        if self._db is not None:
            return
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StorageError(
                f"SQLite {sqlite3.sqlite_version} is too old; ringo needs"
                f" {'.'.join(map(str, _MIN_SQLITE))} or newer"
            )
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _make_private(self.path)
        db = sqlite3.connect(self.path, isolation_level=None, cached_statements=256)
        try:
            db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageError(
                    f"{self.path}: SQLite refused WAL mode (got {mode!r});"
                    " the data dir must be on a local filesystem"
                )
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA cache_size = -32768")
            db.create_function("ringo_backoff_us", 4, _backoff_us, deterministic=True)
            db.create_function("ringo_token", 0, _new_token)
            _migrate(db, self.path)
        except BaseException:
            db.close()
            raise
        self._db = db

    async def close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        try:
            db.execute("PRAGMA optimize")
        finally:
            db.close()

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("SQLiteEngine is not open")
        return self._db

    async def maintain(self, interval: float = _CHECKPOINT_INTERVAL) -> None:
        """WAL checkpoints in a worker thread, off the event loop, until
        cancelled (see the module docstring)."""
        db = self._conn()
        checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA wal_autocheckpoint = {_BACKSTOP_PAGES}")
            # The commits the last successful checkpoint covers.
            covered = self._commits
            failing = False
            while True:
                await asyncio.sleep(interval)
                if self._commits == covered:
                    continue
                commits = self._commits
                try:
                    await _off_loop(checkpointer, "PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    # A full disk or an I/O error: the writes report it
                    # (StorageFull), the backstop still checkpoints, and
                    # the next pass tries again.
                    if not failing:
                        log.warning("WAL checkpoint failed (will retry): %s", exc)
                    failing = True
                else:
                    covered = commits
                    failing = False
        finally:
            if self._db is db:
                db.execute(f"PRAGMA wal_autocheckpoint = {_AUTO_CHECKPOINT_PAGES}")
            checkpointer.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """`_immediate` on the connection; SQLITE_FULL (no room for the
        database or its WAL) is `StorageFull`."""
        try:
            with _immediate(self._conn()) as db:
                yield db
            self._commits += 1
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise self._full(exc) from exc
            raise

    async def probe(self, now: datetime) -> None:
        now_us = _to_us(now)
        # Queue "" names no queue a client can use, and the row is gone again
        # before the commit makes anything visible.
        _, row = _NewTasks("", _from_us(now_us), now_us, 1, "probe").make(_PROBE_SPEC)
        with self._write() as db:
            seq = db.execute(_INSERT, row).lastrowid
            db.execute("DELETE FROM tasks WHERE seq = ?", (seq,))

    # -- submission --------------------------------------------------------

    async def enqueue(
        self, queue: str, specs: Sequence[TaskSpec], now: datetime
    ) -> list[EnqueueOutcome]:
        now_us = _to_us(now)
        # Normalised to UTC so a returned Task equals what `get` reads back.
        now = _from_us(now_us)
        new_tasks = _NewTasks(queue, now, now_us, len(specs))
        keys = {s.unique_key for s in specs if s.unique_key}
        with self._write() as db:
            existing = self._tasks_by_key(db, queue, keys) if keys else {}
            outcomes: list[EnqueueOutcome] = []
            rows: list[tuple[Any, ...]] = []
            for spec in specs:
                key = spec.unique_key
                if key:
                    found = existing.get(key)
                    if found is not None:
                        outcomes.append(EnqueueOutcome(found, created=False))
                        continue
                task, row = new_tasks.make(spec)
                if key:
                    # A later spec with the same key in this batch resolves here.
                    existing[key] = task
                rows.append(row)
                outcomes.append(EnqueueOutcome(task, created=True))
            _insert_all(db, rows)
        return outcomes

    @staticmethod
    def _tasks_by_key(db: sqlite3.Connection, queue: str, keys: set[str]) -> dict[str, Task]:
        found: dict[str, Task] = {}
        ordered = sorted(keys)
        for i in range(0, len(ordered), _IN_CHUNK):
            chunk = ordered[i : i + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            for row in db.execute(
                f"SELECT {_COLS} FROM tasks WHERE queue = ? AND unique_key != ''"
                f" AND unique_key IN ({marks})",
                (queue, *chunk),
            ):
                found[row[5]] = _row_task(row)
        return found

    async def get(
        self, queue: str, *, task_id: str | None = None, unique_key: str | None = None
    ) -> Task:
        return _row_task(_find(self._conn(), _COLS, queue, task_id, unique_key))

    async def retry(
        self,
        queue: str,
        now: datetime,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
    ) -> Task:
        now_us = _to_us(now)
        with self._write() as db:
            row = _find(db, "seq, state, available_at, lease_until", queue, task_id, unique_key)
            if row[1] not in (_SUCCEEDED, _DEAD, _CANCELLED) and not _stuck(row[2], row[3]):
                raise FailedPrecondition(
                    f"{_describe(queue, task_id, unique_key)} is {_STATES[row[1]].name};"
                    " only SUCCEEDED, DEAD or CANCELLED tasks (or stuck ones) can be retried"
                )
            updated = db.execute(_RETRY, {"seq": row[0], "now": now_us}).fetchone()
            return _row_task(updated)

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
        return self._claim(_leased_rows, queue, task_types, limit, worker_id, lease_duration, now)

    async def claim_pushes(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[Push]:
        return self._claim(_push_rows, queue, task_types, limit, worker_id, lease_duration, now)

    def _claim(
        self,
        build: Callable[[list[Any]], list[_T]],
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[_T]:
        # Never awaits: commit and return are one step of the event loop, so a
        # caller cancelled meanwhile is cancelled at its next await, answer in
        # hand, and no lease can outlive it (the rule `guard_claim` keeps for
        # engines that do suspend). Do not add an await here without it.
        if limit <= 0:
            return []
        now_us = _to_us(now)
        types_clause, params = _types_clause(task_types)
        args: dict[str, Any] = {
            **params,
            "queue": queue,
            "now": now_us,
            "worker": worker_id,
            "until": now_us + lease_duration // _MICRO,
            "delay": None,
            "error": _LEASE_EXPIRED,
        }
        rows: list[Any] = []
        with self._write() as db:
            db.execute(_EXPIRE_QUEUE, args)
            for prio, rest in _priority_steps(db, queue):
                args["prio"] = prio
                args["limit"] = limit - len(rows)
                rows += db.execute(_claim_sql(types_clause, rest), args).fetchall()
                if len(rows) >= limit:
                    break
            _move_counts(db, [(queue, r[_C_TASK_TYPE]) for r in rows], _PENDING, _LEASED)
            # RETURNING yields rows in no promised order.
            rows.sort(key=lambda r: (-r[_C_PRIORITY], r[_C_AVAILABLE], r[_C_SEQ]))
            # Built inside the transaction: a failure here must undo the leases.
            return build(rows)

    def _settle(
        self,
        sql: str,
        build: Callable[[Any], _T],
        ref: LeaseRef,
        now: datetime,
        *,
        succeeds: bool = False,
        **extra: Any,
    ) -> _T:
        """Run one lease-guarded UPDATE ... RETURNING and build the reply
        from its row, both in one transaction; LeaseLost when the ref is not
        the task's live lease (the UPDATE then matched nothing). `succeeds`:
        the UPDATE is an ack, whose counts the trigger leaves to us."""
        args = {
            "id": ref.task_id,
            "attempt": ref.attempt,
            "token": ref.lease_token,
            "now": _to_us(now),
            **extra,
        }
        with self._write() as db:
            row = db.execute(sql, args).fetchone()
            if row is None:
                raise _lost(db, ref)
            if succeeds:
                _move_counts(db, [(row[_C_QUEUE], row[_C_TASK_TYPE])], _LEASED, _SUCCEEDED)
            return build(row)

    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        return self._settle(_ACK, _row_task, ref, now, succeeds=True, result=result)

    async def nack(
        self, ref: LeaseRef, error: str, retry_delay: timedelta | None, now: datetime
    ) -> Task:
        return self._settle(_NACK, _row_task, ref, now, error=error, delay=_delay_us(retry_delay))

    async def reject(self, ref: LeaseRef, error: str, now: datetime) -> Task:
        return self._settle(_REJECT, _row_task, ref, now, error=error)

    async def settle_many(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """One `BEGIN IMMEDIATE ... COMMIT` for the group, answering each item
        with its queue or its LeaseLost, as if settled one by one in order."""
        if not settlements:
            return []
        now_us = _to_us(now)
        answers: list[str | LeaseLost | None] = [None] * len(settlements)
        succeeded: list[tuple[str, str]] = []
        with self._write() as db:
            if len({item.ref.task_id for item in settlements}) == len(settlements):
                # Different tasks: no item can change what another does, so
                # the acks go first, together.
                acks = [(i, item) for i, item in enumerate(settlements) if type(item) is Ack]
                _ack_together(db, acks, now_us, answers, succeeded)
            for i, item in enumerate(settlements):
                if answers[i] is None:
                    answers[i] = _settle_one(db, item, now_us, succeeded)
            _move_counts(db, succeeded, _LEASED, _SUCCEEDED)
        return cast(list[str | LeaseLost], answers)

    async def extend_lease(self, ref: LeaseRef, extension: timedelta, now: datetime) -> Lease:
        until = _to_us(now) + extension // _MICRO
        return self._settle(_EXTEND, _lease, ref, now, until=until)

    async def report_progress(
        self, ref: LeaseRef, current: float, total: float, message: str, now: datetime
    ) -> None:
        self._settle(
            _PROGRESS,
            lambda _row: None,
            ref,
            now,
            current=current,
            total=total,
            message=message,
        )

    async def release(self, refs: Sequence[LeaseRef], now: datetime) -> int:
        if not refs:
            return 0
        now_us = _to_us(now)
        released = 0
        with self._write() as db:
            for ref in refs:
                released += db.execute(
                    _RELEASE_UNSENT,
                    {
                        "id": ref.task_id,
                        "attempt": ref.attempt,
                        "token": ref.lease_token,
                        "now": now_us,
                    },
                ).rowcount
        return released

    async def expire_leases(self, now: datetime) -> int:
        args = {"now": _to_us(now), "delay": None, "error": _LEASE_EXPIRED}
        with self._write() as db:
            return db.execute(_EXPIRE_ALL, args).rowcount

    # -- observation -------------------------------------------------------

    async def activity(
        self, queue: str, task_types: Sequence[str], *, due_by: datetime | None = None
    ) -> int:
        types_clause, type_params = _types_clause(task_types)
        params: dict[str, str | int] = {**type_params, "queue": queue}
        due_clause = ""
        if due_by is not None:
            # Still tasks_active_type, but the scheduled tasks left out are
            # read and skipped, not counted toward the LIMIT: the walk grows
            # with the queue's scheduled backlog (until the cap is reached).
            due_clause = f" AND (state = {_LEASED} OR available_at <= :due_by)"
            params["due_by"] = _to_us(due_by)
        # tasks_active_type; the LIMIT bounds the walk (this runs on the loop).
        return int(
            self._conn()
            .execute(
                f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE queue = :queue AND {_ACTIVE}"
                f"{types_clause}{due_clause} LIMIT {MAX_ACTIVITY_COUNT})",
                params,
            )
            .fetchone()[0]
        )

    async def next_wakeup(
        self, queue: str, task_types: Sequence[str], now: datetime
    ) -> datetime | None:
        """As the interface says; a moment that has already come (a due task,
        an expired lease not yet reaped) is reported as `now`."""
        now_us = _to_us(now)
        types_clause, params = _types_clause(task_types)
        args: dict[str, Any] = {**params, "queue": queue}
        db = self._conn()
        # A read transaction, so the several queries see one snapshot.
        db.execute("BEGIN")
        try:
            soonest = db.execute(
                f"SELECT min(lease_until) FROM tasks WHERE queue = :queue"
                f" AND state = {_LEASED}{types_clause}",
                args,
            ).fetchone()[0]
            for prio, rest in _priority_steps(db, queue):
                args["prio"] = prio
                cond = "priority <= :prio" if rest else "priority = :prio"
                first = db.execute(
                    f"SELECT min(available_at) FROM tasks WHERE queue = :queue"
                    f" AND state = {_PENDING} AND {cond}{types_clause}",
                    args,
                ).fetchone()[0]
                if first is not None and (soonest is None or first < soonest):
                    soonest = first
                if soonest is not None and soonest <= now_us:
                    break
        finally:
            db.execute("COMMIT")
        if soonest is None:
            return None
        return _from_us(max(soonest, now_us))

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
        db = self._conn()
        # A read transaction: the walk and the rows it picked are one snapshot.
        db.execute("BEGIN")
        try:
            arms, residual = _listing.arms(db.execute(_PRESENT, (queue,)), where)
            if not arms:
                return TaskPage([], None, [])
            args: dict[str, Any] = {"queue": queue, "after": after}
            args.update(_arm_params(arms))
            if residual is None:
                args["limit"] = limit + 1
                rows = db.execute(_list_sql(_LIST_COLS, arms, newest_first), args).fetchall()
                next_after = rows[limit - 1][_C_SEQ] if len(rows) > limit else None
                rows = rows[:limit]
            else:
                budget = _listing.scan_budget(limit)
                args["limit"] = budget
                walked = db.execute(_list_sql(_WALK_COLS, arms, newest_first), args).fetchall()
                seqs, next_after = _listing.pick(residual, walked, limit, budget)
                rows = []
                if seqs:
                    marks = ", ".join("?" * len(seqs))
                    rows = db.execute(
                        f"SELECT {_LIST_COLS} FROM tasks WHERE seq IN ({marks})"
                        f" ORDER BY seq{' DESC' if newest_first else ''}",
                        seqs,
                    ).fetchall()
        finally:
            db.execute("COMMIT")
        return TaskPage([_listed(r) for r in rows], next_after, [r[_C_SEQ] for r in rows])

    async def queue_stats(self, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        db = self._conn()
        db.execute("BEGIN")
        try:
            return self._stats(db, queue, now, by_type=by_type)
        finally:
            db.execute("COMMIT")

    async def list_queues(self, now: datetime, *, after: str, limit: int) -> list[QueueStats]:
        db = self._conn()
        db.execute("BEGIN")
        try:
            names = [r[0] for r in db.execute(_QUEUE_NAMES, (after, limit))]
            return [self._stats(db, name, now, by_type=False) for name in names]
        finally:
            db.execute("COMMIT")

    @staticmethod
    def _stats(db: sqlite3.Connection, queue: str, now: datetime, *, by_type: bool) -> QueueStats:
        counts = _listing.by_state(db.execute(_QUEUE_COUNTS, (queue,)))
        oldest: int | None = None
        if counts:
            for prio, rest in _priority_steps(db, queue):
                first = db.execute(_OLDEST_REST if rest else _OLDEST_AT, (queue, prio)).fetchone()[
                    0
                ]
                if first is not None and (oldest is None or first < oldest):
                    oldest = first
        return _listing.queue_stats(queue, counts, oldest, now, by_type=by_type)

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
        now_us = _to_us(now)
        with self._write() as db:
            seq, state = _find(db, "seq, state", queue, task_id, unique_key)
            if state == _CANCELLED:
                return _row_task(
                    db.execute(f"SELECT {_COLS} FROM tasks WHERE seq = ?", (seq,)).fetchone()
                )
            if state not in (_PENDING, _LEASED):
                raise FailedPrecondition(
                    f"{_describe(queue, task_id, unique_key)} is {_STATES[state].name};"
                    " only PENDING or LEASED tasks can be cancelled"
                )
            args = {"seq": seq, "now": now_us, "error": _cancelled_text(reason)}
            return _row_task(db.execute(_CANCEL, args).fetchone())

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
        types_clause, params = _types_clause(task_types)
        sql = _retry_dead_sql(types_clause)
        args: dict[str, Any] = {
            **params,
            "queue": queue,
            "now": _to_us(now),
            "before": _NO_CUTOFF if finished_before is None else _to_us(finished_before),
            "limit": limit,
        }
        with self._write() as db:
            return int(db.execute(sql, args).rowcount)

    # -- purge and retention (DeleteTasks, ringod --retain-*) ----------------

    async def delete_finished(
        self,
        queue: str | None,
        states: Sequence[int],
        finished_before: datetime | None,
        limit: int,
    ) -> int:
        wanted = _finished_states(states)
        if limit <= 0 or not wanted:
            return 0
        args: dict[str, Any] = {
            "queue": queue,
            "before": _NO_CUTOFF if finished_before is None else _to_us(finished_before),
            "limit": limit,
        }
        sql = _OLDEST_FINISHED if queue is None else _OLDEST_FINISHED_QUEUE
        with self._write() as db:
            # Each state's oldest by an ordered index walk, merged here: one
            # ORDER BY over several states would sort them all (a temp b-tree).
            oldest = heapq.merge(
                *(db.execute(sql, {**args, "state": s}).fetchall() for s in wanted)
            )
            doomed = [(seq,) for _, seq in itertools.islice(oldest, limit)]
            db.executemany("DELETE FROM tasks WHERE seq = ?", doomed)
        return len(doomed)


def _ack_together(
    db: sqlite3.Connection,
    acks: Sequence[tuple[int, Ack]],
    now_us: int,
    answers: list[str | LeaseLost | None],
    succeeded: list[tuple[str, str]],
) -> None:
    """Acks of different tasks by `_ack_many_sql`: each answer is its
    task's queue, or LeaseLost (the statement matched no row for it)."""
    for piece in _pieces(acks, _ACK_CHUNKS):
        args: list[Any] = [now_us]
        for _, item in piece:
            ref = item.ref
            args += (ref.task_id, ref.attempt, ref.lease_token, item.result)
        acked = {
            task_id: (queue, task_type)
            for task_id, queue, task_type in db.execute(_ack_many_sql(len(piece)), args)
        }
        for i, item in piece:
            found = acked.get(item.ref.task_id)
            if found is None:
                answers[i] = _lost(db, item.ref)
            else:
                answers[i] = found[0]
                succeeded.append(found)


def _settle_one(
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
            row = db.execute(_ACK_QUEUE, args).fetchone()
            if row is not None:
                succeeded.append((row[0], row[1]))
        case Nack(_, error, retry_delay):
            args["error"] = error
            args["delay"] = _delay_us(retry_delay)
            row = db.execute(_NACK_QUEUE, args).fetchone()
        case Reject(_, error):
            args["error"] = error
            row = db.execute(_REJECT_QUEUE, args).fetchone()
    return _lost(db, ref) if row is None else str(row[0])


def _fetch_all(db: sqlite3.Connection, sql: str) -> list[Any]:
    return db.execute(sql).fetchall()


async def _off_loop(db: sqlite3.Connection, sql: str) -> None:
    """Run `sql` on `db` in a worker thread. Cancelled, the statement is
    interrupted and awaited: the thread never outlives the call, so the
    caller may close `db` afterwards."""
    done = asyncio.get_running_loop().run_in_executor(None, _fetch_all, db, sql)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        db.interrupt()
        with contextlib.suppress(sqlite3.Error):
            await done
        raise


@contextlib.contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
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


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the schema to SCHEMA_VERSION in one transaction."""
    with _immediate(db):
        # Read under the write lock: another process may have migrated.
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{path}: database schema version {version} is newer than this"
                f" ringo_trio understands ({SCHEMA_VERSION}); upgrade ringo_trio or"
                " use another data dir"
            )
        for statements in _MIGRATIONS[version:]:
            for statement in statements:
                db.execute(statement)
        if version != SCHEMA_VERSION:
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
