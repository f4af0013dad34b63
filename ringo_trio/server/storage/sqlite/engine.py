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
  `PRIORITY_PROBES` distinct priorities the rest is one ordered scan.
* `tasks_pending_type (queue, task_type, priority DESC, available_at) WHERE
  state = PENDING` -- the same order per task type: a claim naming types
  walks each type's own tasks (one seek per type and priority) and takes
  the first of those, so a backlog of other types costs it nothing.
* `tasks_pending_unkeyed (queue, priority DESC, available_at) WHERE state
  <= PENDING AND limit_key = ''` -- the same order of the tasks without a
  limit key: a claim on a queue with keyed limits walks them apart from its
  keys' (`tasks_limit_pending`, one walk per key), so a key's backlog held
  by its rule costs the queue's claims and wake-ups nothing.
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

Task ids are 32 hex digits: 48 bits of the enqueue time in milliseconds, then
80 random bits, so they sort roughly by creation and are unique across
restarts and databases without coordination. Lease tokens are
`rows.new_lease_token` (as on PostgreSQL), registered as a SQL function so
one UPDATE leases a whole batch.

Retry budget: a task keeps the `max_attempts` it was enqueued with as its
base; retrying a SUCCEEDED, DEAD or CANCELLED task sets `max_attempts =
attempt + base`, i.e. it gets the same number of attempts again, and `attempt`
keeps counting. `last_error` and `progress` describe the latest attempt that
set them and are kept across attempts and retries; `worker_id` and
`lease_until` exist only while LEASED; `result` only while SUCCEEDED.

Each concern has its module, and its part of this story there: `schema`
(migrations), `claim` (inserts, claims, and the counts the hot transitions
move themselves), `settle` (lease ends, group commit), `listing`
(inspection and pausing: `SQLiteListing`), `limits` (keyed limits:
`SQLiteLimits`), `schedules` (`SQLiteSchedules`), `operate` (cancel,
retry, purge), `upkeep` (checkpoints); the mixins are the engine's methods
of their concern.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT
from ringo_trio._proto.ringo.v1 import (
    Lease,
    LeasedTask,
    LeaseRef,
    Task,
    TaskSpec,
)
from ringo_trio._wire.rows import TaskRow, push_rows

from ..base import (
    Ack,
    EnqueueOutcome,
    FailedPrecondition,
    LeaseLost,
    Push,
    Settlement,
    Storage,
    StorageError,
    storage_full,
)
from ..history import HISTORY_COLS, with_history
from ..limits import RuleCache
from ..retry import delay_us, override_us
from ..rows import (
    C_QUEUE,
    C_TASK_TYPE,
    CANCELLED,
    COLS,
    DEAD,
    LEASE_EXPIRED,
    LEASED,
    MICRO,
    PENDING,
    STATES,
    SUCCEEDED,
    NewTasks,
    cancelled_text,
    cutoff_us,
    describe,
    finished_states,
    from_us,
    lease,
    new_lease_token,
    reference_push,
    row_task,
    stuck,
    task_row,
    to_us,
)
from . import limits, operate
from .claim import (
    INSERT,
    claim_sql,
    insert_all,
    leased_rows,
    move_counts,
    soonest_pending,
    take_in_steps,
    types_filter,
)
from .limits import SQLiteLimits
from .listing import ACTIVE_COUNT, SQLiteListing
from .operate import (
    CANCEL,
    OLDEST_FINISHED,
    OLDEST_FINISHED_QUEUE,
    RETRY,
    find,
    retry_dead_sql,
)
from .schedules import SQLiteSchedules
from .schema import ACTIVE, immediate, migrate
from .settle import (
    ACK,
    EXPIRE_ALL,
    EXPIRE_QUEUE,
    EXTEND,
    NACK,
    PROGRESS,
    REJECT,
    RELEASE_UNSENT,
    ack_together,
    lost,
    settle_one,
)
from .upkeep import AUTO_CHECKPOINT_PAGES, BACKSTOP_PAGES, CHECKPOINT_INTERVAL, off_loop

__all__ = ["SQLiteEngine"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

_BUSY_TIMEOUT_MS = 5000
_MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING

# SQLite's bound-parameter limit is 32766 (>= 3.32); stay far below it.
IN_CHUNK = 500
# The files SQLite keeps next to the database (WAL mode, and a rollback
# journal left by an older daemon).
_COMPANION_SUFFIXES = ("-wal", "-shm", "-journal")


# Large enough to need pages of its own (overflow pages).
_PROBE_SPEC = TaskSpec(task_type="probe", payload=bytes(16 * 1024))


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


class SQLiteEngine(SQLiteSchedules, SQLiteLimits, SQLiteListing, Storage):
    """`Storage` on one SQLite file (`path` is the database file itself)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        # Set by each committed write transaction: upkeep waits for it, so an
        # idle daemon's upkeep sleeps instead of polling (`maintain`).
        self._committed = asyncio.Event()
        self._rules = RuleCache()

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
            db.create_function("ringo_retry_delay_us", 4, delay_us, deterministic=True)
            db.create_function("ringo_token", 0, new_lease_token)
            migrate(db, self.path)
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

    async def maintain(self, interval: float = CHECKPOINT_INTERVAL) -> None:
        """WAL checkpoints in a worker thread, off the event loop, until
        cancelled (see the module docstring): `interval` after the first
        commit since the last checkpoint, none while nothing is committed."""
        db = self._conn()
        checkpointer = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # Bound to this run's loop; what was committed before upkeep started
        # is left to the next commit's checkpoint, as SQLite would leave it.
        self._committed = committed = asyncio.Event()
        try:
            db.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
            failing = False
            while True:
                await committed.wait()
                await asyncio.sleep(interval)
                # Commits from here on are the next checkpoint's.
                committed.clear()
                try:
                    await off_loop(checkpointer, "PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    # A full disk or an I/O error: the writes report it
                    # (StorageFull), the backstop still checkpoints, and
                    # the next pass tries again.
                    if not failing:
                        log.warning("WAL checkpoint failed (will retry): %s", exc)
                    failing = True
                    committed.set()
                else:
                    failing = False
        finally:
            if self._db is db:
                db.execute(f"PRAGMA wal_autocheckpoint = {AUTO_CHECKPOINT_PAGES}")
            checkpointer.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """`immediate` on the connection; SQLITE_FULL (no room for the
        database or its WAL) is `StorageFull`."""
        try:
            with immediate(self._conn()) as db:
                yield db
            self._committed.set()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode == sqlite3.SQLITE_FULL:
                raise storage_full(self, exc) from exc
            raise

    async def probe(self, now: datetime) -> None:
        now_us = to_us(now)
        # Queue "" names no queue a client can use, and the row is gone again
        # before the commit makes anything visible.
        _, row = NewTasks("", from_us(now_us), now_us, 1, "probe").make(_PROBE_SPEC)
        with self._write() as db:
            seq = db.execute(INSERT, row).lastrowid
            db.execute("DELETE FROM tasks WHERE seq = ?", (seq,))

    # -- submission --------------------------------------------------------

    async def enqueue(
        self, queue: str, specs: Sequence[TaskSpec], now: datetime
    ) -> list[EnqueueOutcome]:
        now_us = to_us(now)
        # Normalised to UTC so a returned Task equals what `get` reads back.
        now = from_us(now_us)
        with self._write() as db:
            return self._enqueue_in(db, queue, specs, now, now_us)

    def _enqueue_in(
        self,
        db: sqlite3.Connection,
        queue: str,
        specs: Sequence[TaskSpec],
        now: datetime,
        now_us: int,
    ) -> list[EnqueueOutcome]:
        """`enqueue` within the caller's write transaction (a schedule's
        firing enqueues its ticks in its own)."""
        new_tasks = NewTasks(queue, now, now_us, len(specs))
        keys = {s.unique_key for s in specs if s.unique_key}
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
        insert_all(db, rows)
        return outcomes

    @staticmethod
    def _tasks_by_key(db: sqlite3.Connection, queue: str, keys: set[str]) -> dict[str, Task]:
        found: dict[str, Task] = {}
        ordered = sorted(keys)
        for i in range(0, len(ordered), IN_CHUNK):
            chunk = ordered[i : i + IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            for row in db.execute(
                f"SELECT {COLS} FROM tasks WHERE queue = ? AND unique_key != ''"
                f" AND unique_key IN ({marks})",
                (queue, *chunk),
            ):
                found[row[5]] = row_task(row)
        return found

    async def get(
        self,
        queue: str,
        *,
        task_id: str | None = None,
        unique_key: str | None = None,
        history: bool = False,
    ) -> Task:
        if not history:
            return row_task(find(self._conn(), COLS, queue, task_id, unique_key))
        row = find(self._conn(), f"{COLS}, {HISTORY_COLS}", queue, task_id, unique_key)
        return with_history(row)

    async def task_states(self, task_ids: Sequence[str]) -> dict[str, int]:
        db = self._conn()
        found: dict[str, int] = {}
        # Within SQLite's bound on host parameters; one tasks_id probe each.
        for start in range(0, len(task_ids), 500):
            chunk = task_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for task_id, state in db.execute(
                f"SELECT id, state FROM tasks WHERE id IN ({marks})", chunk
            ):
                found[task_id] = state
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
        with self._write() as db:
            row = find(db, "seq, state, available_at, lease_until", queue, task_id, unique_key)
            if row[1] not in (SUCCEEDED, DEAD, CANCELLED) and not stuck(row[2], row[3]):
                raise FailedPrecondition(
                    f"{describe(queue, task_id, unique_key)} is {STATES[row[1]].name};"
                    " only SUCCEEDED, DEAD or CANCELLED tasks (or stuck ones) can be retried"
                )
            updated = db.execute(RETRY, {"seq": row[0], "now": now_us}).fetchone()
            return row_task(updated)

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
        return self._claim(leased_rows, queue, task_types, limit, worker_id, lease_duration, now)

    async def claim_pushes(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[Push]:
        return self._claim(_pushes, queue, task_types, limit, worker_id, lease_duration, now)

    def _claim(
        self,
        build: Callable[[list[TaskRow]], list[_T]],
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
        now_us = to_us(now)
        _, params = types_filter(task_types)
        args: dict[str, Any] = {
            **params,
            "queue": queue,
            "now": now_us,
            "worker": worker_id,
            "until": now_us + lease_duration // MICRO,
            "delay": None,
            "error": LEASE_EXPIRED,
        }
        rows: list[TaskRow] = []
        rules = self.limit_rules(queue, now_us)
        with self._write() as db:
            db.execute(EXPIRE_QUEUE, args)
            if rules:
                claimed = limits.claim(db, rules, len(params), args, limit)
                rows = list(map(task_row, claimed))
            else:
                types = len(params)
                step_sql = functools.partial(claim_sql, types)
                rows = list(map(task_row, take_in_steps(db, args, limit, step_sql, types)))
            move_counts(db, [(queue, r.task_type) for r in rows], PENDING, LEASED)
            # RETURNING yields rows in no promised order.
            rows.sort(key=lambda r: (-r.priority, r.available_at, r.seq))
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
            "now": to_us(now),
            **extra,
        }
        with self._write() as db:
            row = db.execute(sql, args).fetchone()
            if row is None:
                raise lost(db, ref)
            if succeeds:
                move_counts(db, [(row[C_QUEUE], row[C_TASK_TYPE])], LEASED, SUCCEEDED)
            return build(row)

    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        return self._settle(ACK, row_task, ref, now, succeeds=True, result=result)

    async def nack(
        self, ref: LeaseRef, error: str, retry_delay: timedelta | None, now: datetime
    ) -> Task:
        return self._settle(NACK, row_task, ref, now, error=error, delay=override_us(retry_delay))

    async def reject(self, ref: LeaseRef, error: str, now: datetime) -> Task:
        return self._settle(REJECT, row_task, ref, now, error=error)

    async def settle_many(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """One `BEGIN IMMEDIATE ... COMMIT` for the group, answering each item
        with its queue or its LeaseLost, as if settled one by one in order."""
        if not settlements:
            return []
        now_us = to_us(now)
        answers: list[str | LeaseLost | None] = [None] * len(settlements)
        succeeded: list[tuple[str, str]] = []
        with self._write() as db:
            if len({item.ref.task_id for item in settlements}) == len(settlements):
                # Different tasks: no item can change what another does, so
                # the acks go first, together.
                acks = [(i, item) for i, item in enumerate(settlements) if type(item) is Ack]
                if self.delete_succeeded:
                    # A task a WaitTask waits on is kept for it to read.
                    kept: list[tuple[int, Ack]] = []
                    gone: list[tuple[int, Ack]] = []
                    for ack in acks:
                        (kept if ack[1].ref.task_id in self.waited else gone).append(ack)
                    ack_together(db, gone, now_us, answers, succeeded, delete=True)
                    acks = kept
                ack_together(db, acks, now_us, answers, succeeded)
            for i, item in enumerate(settlements):
                if answers[i] is None:
                    answers[i] = settle_one(db, item, now_us, succeeded)
            move_counts(db, succeeded, LEASED, SUCCEEDED)
        return cast(list[str | LeaseLost], answers)

    async def extend_lease(self, ref: LeaseRef, extension: timedelta, now: datetime) -> Lease:
        until = to_us(now) + extension // MICRO
        return self._settle(EXTEND, lease, ref, now, until=until)

    async def report_progress(
        self, ref: LeaseRef, current: float, total: float, message: str, now: datetime
    ) -> None:
        self._settle(
            PROGRESS,
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
        now_us = to_us(now)
        released = 0
        with self._write() as db:
            for ref in refs:
                released += db.execute(
                    RELEASE_UNSENT,
                    {
                        "id": ref.task_id,
                        "attempt": ref.attempt,
                        "token": ref.lease_token,
                        "now": now_us,
                    },
                ).rowcount
        return released

    async def expire_leases(self, now: datetime) -> int:
        args = {"now": to_us(now), "delay": None, "error": LEASE_EXPIRED}
        with self._write() as db:
            return db.execute(EXPIRE_ALL, args).rowcount

    # -- observation -------------------------------------------------------

    async def activity(
        self, queue: str, task_types: Sequence[str], *, due_by: datetime | None = None
    ) -> int:
        types_clause, type_params = types_filter(task_types)
        params: dict[str, str | int] = {**type_params, "queue": queue}
        if due_by is None:
            # The exact counts, a row per task type: no walk past the
            # tasks a drained queue's index still lists.
            total = self._conn().execute(ACTIVE_COUNT + types_clause, params).fetchone()[0]
            return min(int(total or 0), MAX_ACTIVITY_COUNT)
        # Still tasks_active_type, but the scheduled tasks left out are read
        # and skipped, not counted toward the LIMIT: the walk grows with the
        # queue's scheduled backlog (until the cap is reached).
        params["due_by"] = to_us(due_by)
        # The LIMIT bounds the walk (this runs on the loop).
        return int(
            self._conn()
            .execute(
                f"SELECT count(*) FROM (SELECT 1 FROM tasks WHERE queue = :queue AND {ACTIVE}"
                f"{types_clause} AND (state = {LEASED} OR available_at <= :due_by)"
                f" LIMIT {MAX_ACTIVITY_COUNT})",
                params,
            )
            .fetchone()[0]
        )

    async def next_wakeup(
        self, queue: str, task_types: Sequence[str], now: datetime
    ) -> datetime | None:
        """As the interface says; a moment that has already come (a due task,
        an expired lease not yet reaped) is reported as `now`."""
        now_us = to_us(now)
        types_clause, params = types_filter(task_types)
        args: dict[str, Any] = {**params, "queue": queue}
        db = self._conn()
        rules = self.limit_rules(queue, now_us)
        # A read transaction, so the several queries see one snapshot.
        db.execute("BEGIN")
        try:
            if rules:
                soonest = limits.next_wakeup(
                    db, rules, len(params), types_clause, {**args, "now": now_us}
                )
                return None if soonest is None else from_us(max(soonest, now_us))
            soonest = db.execute(
                f"SELECT min(lease_until) FROM tasks WHERE queue = :queue"
                f" AND state = {LEASED}{types_clause}",
                args,
            ).fetchone()[0]
            soonest = soonest_pending(db, args, len(params), soonest=soonest, enough=now_us)
        finally:
            db.execute("COMMIT")
        if soonest is None:
            return None
        return from_us(max(soonest, now_us))

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
        now_us = to_us(now)
        with self._write() as db:
            seq, state = find(db, "seq, state", queue, task_id, unique_key)
            if state == CANCELLED:
                return row_task(
                    db.execute(f"SELECT {COLS} FROM tasks WHERE seq = ?", (seq,)).fetchone()
                )
            if state not in (PENDING, LEASED):
                raise FailedPrecondition(
                    f"{describe(queue, task_id, unique_key)} is {STATES[state].name};"
                    " only PENDING or LEASED tasks can be cancelled"
                )
            args = {"seq": seq, "now": now_us, "error": cancelled_text(reason)}
            return row_task(db.execute(CANCEL, args).fetchone())

    async def cancel_ids(
        self, queue: str, task_ids: Sequence[str], reason: str, now: datetime
    ) -> list[tuple[str, str]]:
        with self._write() as db:
            return operate.cancel_ids(db, queue, task_ids, cancelled_text(reason), to_us(now))

    async def delete_ids(self, queue: str, task_ids: Sequence[str], states: Sequence[int]) -> int:
        with self._write() as db:
            return operate.delete_ids(db, queue, task_ids, states)

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
        types_clause, params = types_filter(task_types)
        sql = retry_dead_sql(types_clause)
        args: dict[str, Any] = {
            **params,
            "queue": queue,
            "now": to_us(now),
            "before": cutoff_us(finished_before),
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
        wanted = finished_states(states)
        if limit <= 0 or not wanted:
            return 0
        args: dict[str, Any] = {
            "queue": queue,
            "before": cutoff_us(finished_before),
            "limit": limit,
        }
        sql = OLDEST_FINISHED if queue is None else OLDEST_FINISHED_QUEUE
        with self._write() as db:
            # Each state's oldest by an ordered index walk, merged here: one
            # ORDER BY over several states would sort them all (a temp b-tree).
            oldest = heapq.merge(
                *(db.execute(sql, {**args, "state": s}).fetchall() for s in wanted)
            )
            doomed = [(seq,) for _, seq in itertools.islice(oldest, limit)]
            db.executemany("DELETE FROM tasks WHERE seq = ?", doomed)
        return len(doomed)


def _pushes(rows: list[TaskRow]) -> list[Push]:
    return push_rows(rows, reference_push)
