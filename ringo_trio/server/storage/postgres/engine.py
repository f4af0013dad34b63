"""The shared storage engine: one PostgreSQL database (schema), any number of daemons.

Theory of operation
-------------------
Same table, same state machine and same rules as the SQLite engine (see
`base`); what changes is that several daemons on several machines call into
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

Concurrency, operation by operation (READ COMMITTED), is told where each
operation's statements are.

Each concern has its module, and its part of this story there: `claim`,
`settle`, `operate`, `listing` (inspection: exact counts from deltas,
pages merged from index streams), `limits` and `paused` hold the statements;
`listen` the cross-daemon wake-ups, `pool` connection loss, `schema` the
migrations. The operator's, inspection's, keyed limits' and schedules'
`Storage` methods are mixins beside their statements (`PostgresOperations`,
`PostgresListing`, `PostgresLimits`, `PostgresSchedules`), as the SQLite
engine's are; this module holds the pool, submission, leases, observation
and the cross-daemon wake-ups.

Time: the caller's `now` (microseconds, as in SQLite); never the database's
clock. A lease token is minted by `rows.new_lease_tokens` (32 lowercase hex digits,
128 random bits), as in SQLite: the claim passes one per task it may lease
and the statement hands the n-th picked task the n-th token, so leasing a
batch stays one statement.

"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT
from ringo_trio._proto.ringo.v1 import Lease, LeasedTask, LeaseRef, Task, TaskSpec
from ringo_trio._wire.rows import TaskRow

from ..base import (
    EnqueueOutcome,
    LeaseLost,
    PausedChanged,
    Push,
    Settlement,
    Storage,
    StorageError,
    storage_full,
)
from ..handback import guard_claim
from ..limits import RuleCache
from ..retry import override_us
from ..rows import (
    C_SEQ,
    MICRO,
    NewTasks,
    from_us,
    lease,
    new_lease_tokens,
    row_task,
    task_row,
    to_us,
)
from . import limits, listen
from .claim import ClaimSql, claimed_refs, insert_columns, leased_rows, pushes
from .limits import LimitSql, PostgresLimits
from .listen import channel
from .listing import ListingSql, PostgresListing
from .operate import OperateSql, PostgresOperations
from .paused import PausedSql
from .pool import (
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    SERVER_SETTINGS,
    UNAVAILABLE,
    keep_session,
    reported,
    unreachable,
)
from .schedules import PostgresSchedules
from .schema import migrate, schedule_of
from .settle import ACK, NACK, REJECT, SettleSql, lease_lost, settlement_row
from .sql import Spelling, type_list
from .waits import STALE_WAITS, WaitSql

__all__ = ["PostgresEngine"]

log = logging.getLogger("ringo_trio.server")

_T = TypeVar("_T")

# A claim that expired leases runs again; bounded so a pathological stream
# of leases expiring under it cannot keep it busy.
_CLAIM_ROUNDS = 4
_DEADLOCK_RETRIES = 3
# An enqueue whose conflicting unique keys were deleted before it could read
# them inserts those tasks again, this many times at most.
_VANISHED_RETRIES = 3
_TRANSIENT = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)
# Random, so TOAST cannot compress it: large enough to need pages of its own.
_PROBE_SPEC = TaskSpec(task_type="probe", payload=secrets.token_bytes(16 * 1024))


class Sql:
    """The engine's statements by concern, spelled for one schema, channel
    and engine id."""

    def __init__(self, schema: str, channel: str, instance: str) -> None:
        s = Spelling(schema, channel, instance)
        self.tasks = s.tasks
        self.claim = ClaimSql(s)
        self.settle = SettleSql(s)
        self.operate = OperateSql(s)
        self.listing = ListingSql(s)
        self.waits = WaitSql(schema)
        self.paused = PausedSql(schema, channel, instance)
        self.limits = LimitSql(s)


class PostgresEngine(
    PostgresSchedules, PostgresLimits, PostgresListing, PostgresOperations, Storage
):
    """`Storage` on a PostgreSQL database: the tables live in `schema`
    (created if missing); up to `pool_size` connections at once, plus one
    while `watch` runs and one for `ping`."""

    can_be_unreachable = True
    shared_store = True

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
        self.channel = channel(schema)
        self._sql = Sql(schema, self.channel, self.instance)
        self._pool: asyncpg.Pool | None = None
        self._ping_conn: asyncpg.Connection | None = None
        self._rules = RuleCache()
        # Rule changes, told to every daemon of the schema (`storage.limits`).
        self.limits_channel = "ringo_limits:" + self.channel.removeprefix("ringo:")[:40]

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                reset=keep_session,
                timeout=CONNECT_TIMEOUT,
                server_settings=SERVER_SETTINGS,
            )
        except UNAVAILABLE as exc:
            raise unreachable(exc) from exc
        try:
            async with pool.acquire() as conn:
                await migrate(conn, self.schema)
                await conn.execute(self._sql.waits.stale, STALE_WAITS)
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
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT)
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
                except UNAVAILABLE:
                    self._discard(conn)
                    raise
        except UNAVAILABLE as exc:
            raise reported(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise storage_full(self, exc) from exc

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
                except UNAVAILABLE:
                    self._discard(conn)
                    raise
        except UNAVAILABLE as exc:
            raise reported(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise storage_full(self, exc) from exc

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        pool = self._live_pool()
        try:
            async with pool.acquire() as conn:
                try:
                    return await conn.fetchrow(sql, *args)
                except UNAVAILABLE:
                    self._discard(conn)
                    raise
        except UNAVAILABLE as exc:
            raise reported(self, exc) from exc
        except asyncpg.exceptions.DiskFullError as exc:
            raise storage_full(self, exc) from exc

    async def ping(self) -> None:
        conn = self._ping_conn
        try:
            if conn is None or conn.is_closed():
                conn = self._ping_conn = None
                conn = await asyncpg.connect(
                    self.dsn, timeout=CONNECT_TIMEOUT, server_settings=SERVER_SETTINGS
                )
                self._ping_conn = conn
            await conn.fetchval("SELECT 1")
        except BaseException as exc:
            # Failed, timed out or cut short midway: the connection's state is
            # unknown, so the next ping starts on a fresh one.
            self._ping_conn = None
            if conn is not None:
                conn.terminate()
            if isinstance(exc, UNAVAILABLE):
                raise unreachable(exc) from exc
            raise

    async def probe(self, now: datetime) -> None:
        now_us = to_us(now)
        # Queue "" names no queue a client can use, and the row is gone again
        # before the commit makes anything visible.
        _, row = NewTasks("", from_us(now_us), now_us, 1, "probe").make(_PROBE_SPEC)
        async with self._conn() as conn, conn.transaction():
            delays = schedule_of(row[9], row[10], row[11], row[6])
            seq = await conn.fetchval(self._sql.claim.probe_insert, *row, delays)
            await conn.execute(self._sql.claim.probe_delete, seq)

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
            for found in await self._fetch(self._sql.claim.by_keys, queue, conflicted):
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
        columns = insert_columns(rows)
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                row = await self._fetchrow(self._sql.claim.insert, queue, now_us, *columns)
                break
            except _TRANSIENT:
                if attempt == _DEADLOCK_RETRIES - 1:
                    raise
        return set(row[0] or ())

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
            claimed_refs,
            leased_rows,
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
            claimed_refs,
            pushes,
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
    ) -> list[TaskRow]:
        """The claimed rows, in claim order. Committed before they are read,
        so only through `guard_claim`: a caller cancelled while the statement
        is in flight must not take the answer with it."""
        if limit <= 0:
            return []
        now_us = to_us(now)
        until = now_us + lease_duration // MICRO
        types = type_list(task_types)
        rows: list[Any] = []
        rules = await self.limit_rules(queue, now_us)
        if rules:
            for _ in range(_CLAIM_ROUNDS):
                async with self._conn() as conn:
                    rows, expired = await limits.claim(
                        conn,
                        self._sql.limits,
                        rules,
                        queue,
                        types,
                        limit,
                        worker_id,
                        now_us,
                        until,
                        new_lease_tokens(limit),
                    )
                if not expired:
                    break
            claimed = [task_row(r) for r in rows]
            claimed.sort(key=lambda r: (-r.priority, r.available_at, r.seq))
            return claimed
        claim, typed = (
            (self._sql.claim.claim_typed, (types,)) if types else (self._sql.claim.claim, ())
        )
        for _ in range(_CLAIM_ROUNDS):
            tokens = new_lease_tokens(limit)
            rows = await self._fetch(claim, queue, now_us, limit, worker_id, until, tokens, *typed)
            if not rows[0][-1]:
                break
        # The last column is the expiry count; a claim that leased nothing
        # answers one row of NULLs.
        claimed = [task_row(r[:-1]) for r in rows if r[C_SEQ] is not None]
        # RETURNING yields rows in no promised order.
        claimed.sort(key=lambda r: (-r.priority, r.available_at, r.seq))
        return claimed

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
        found = await self._fetch(self._sql.settle.cancelled_of, [ref.task_id], [ref.attempt])
        return lease_lost(ref, cancelled=bool(found))

    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        return await self._settle(self._sql.settle.ack, row_task, ref, now, result)

    async def nack(
        self, ref: LeaseRef, error: str, retry_delay: timedelta | None, now: datetime
    ) -> Task:
        return await self._settle(
            self._sql.settle.nack, row_task, ref, now, error, override_us(retry_delay)
        )

    async def reject(self, ref: LeaseRef, error: str, now: datetime) -> Task:
        return await self._settle(self._sql.settle.reject, row_task, ref, now, error)

    async def settle_many(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """One statement (one implicit transaction) for the group; only for
        the items that missed, a second one asks which were cancelled."""
        if not settlements:
            return []
        rows = [settlement_row(item) for item in settlements]
        deleting = self.delete_succeeded
        # A lone ack that may delete takes the group statement, which alone
        # deletes; the other lone items their single statements.
        if len(rows) == 1 and not (deleting and rows[0][3] == ACK):
            return [await self._settle_one(rows[0], now)]
        cols = [list(col) for col in zip(*rows, strict=True)]
        ids, attempts = cols[0], cols[1]
        sql = self._sql.settle
        async with self._conn() as conn:
            if deleting:
                waited = [task_id for task_id in ids if task_id in self.waited]
                row = await conn.fetchrow(sql.settle_many_deleting, *cols, to_us(now), waited)
            else:
                row = await conn.fetchrow(sql.settle_many, *cols, to_us(now))
            # Positions are 1-based (WITH ORDINALITY).
            settled = dict(zip(row[0] or (), row[1] or (), strict=True))
            cancelled: set[int] = set()
            if len(settled) < len(settlements):
                missed = [i for i in range(1, len(settlements) + 1) if i not in settled]
                cancelled = {
                    missed[r[0] - 1]
                    for r in await conn.fetch(
                        self._sql.settle.cancelled_of,
                        [ids[i - 1] for i in missed],
                        [attempts[i - 1] for i in missed],
                    )
                }
        return [
            settled[i] if i in settled else lease_lost(item.ref, cancelled=i in cancelled)
            for i, item in enumerate(settlements, 1)
        ]

    async def _settle_one(self, row: tuple[Any, ...], now: datetime) -> str | LeaseLost:
        """A group of one (a `settlement_row`): its single statement."""
        task_id, attempt, token, kind, result, error, delay = row
        extra = {ACK: (result,), NACK: (error, delay), REJECT: (error,)}[kind]
        found = await self._fetchrow(
            self._sql.settle.settle_one[kind], task_id, attempt, token, to_us(now), *extra
        )
        if found is None:
            return await self._lost(LeaseRef(task_id=task_id, attempt=attempt, lease_token=token))
        return str(found[0])

    async def extend_lease(self, ref: LeaseRef, extension: timedelta, now: datetime) -> Lease:
        until = to_us(now) + extension // MICRO
        return await self._settle(self._sql.settle.extend, lease, ref, now, until)

    async def report_progress(
        self, ref: LeaseRef, current: float, total: float, message: str, now: datetime
    ) -> None:
        await self._settle(
            self._sql.settle.progress,
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
            self._sql.settle.release,
            [r.task_id for r in refs],
            [r.attempt for r in refs],
            [r.lease_token for r in refs],
            to_us(now),
        )
        return int(row[0])

    async def expire_leases(self, now: datetime) -> int:
        row = await self._fetchrow(self._sql.settle.expire_all, to_us(now))
        return int(row[0])

    # -- observation -------------------------------------------------------

    async def activity(
        self, queue: str, task_types: Sequence[str], *, due_by: datetime | None = None
    ) -> int:
        if due_by is None:
            row = await self._fetchrow(self._sql.listing.active, queue, type_list(task_types))
            return min(int(row[0]), MAX_ACTIVITY_COUNT)
        row = await self._fetchrow(
            self._sql.claim.due_activity, queue, type_list(task_types), to_us(due_by)
        )
        return int(row[0])

    async def next_wakeup(
        self, queue: str, task_types: Sequence[str], now: datetime
    ) -> datetime | None:
        """As the interface says; a moment that has already come (a due task,
        an expired lease not yet reaped) is reported as `now`."""
        now_us = to_us(now)
        rules = await self.limit_rules(queue, now_us)
        if rules:
            async with self._conn() as conn:
                soonest = await limits.next_wakeup(
                    conn, self._sql.limits, rules, queue, type_list(task_types), now_us
                )
            return None if soonest is None else from_us(max(soonest, now_us))
        if task_types:
            row = await self._fetchrow(self._sql.claim.next_wakeup_typed, queue, list(task_types))
        else:
            row = await self._fetchrow(self._sql.claim.next_wakeup, queue)
        soonest = row[0]
        if soonest is None:
            return None
        return from_us(max(soonest, now_us))

    # -- cross-daemon wake-ups ----------------------------------------------

    # WaitTask (`waits`); the listener runs only while the daemon has waiters.
    waits_across_processes = True

    async def task_states(self, task_ids: Sequence[str]) -> dict[str, int]:
        return dict(await self._fetch(self._sql.waits.task_states, list(task_ids)))

    async def register_waits(self, *, add: Sequence[str], remove: Sequence[str]) -> None:
        await self._fetch(self._sql.waits.update, list(add), list(remove), self.instance)

    async def watch_settled(
        self, notify: Callable[[str | None], None], ready: Callable[[], None]
    ) -> None:
        await listen.watch_settled(self.dsn, self._sql.waits.channel, notify, ready)

    async def watch(
        self, notify: Callable[[str | None], None], paused_changed: PausedChanged | None = None
    ) -> None:
        """LISTEN on the schema's channel over a connection of its own (see
        the interface and `listen.watch`)."""
        await listen.watch(
            self.dsn,
            self.channel,
            self.instance,
            notify,
            self.fold_counts,
            paused_changed,
            (self.limits_channel, lambda queue: self._rules_changed(queue, notify)),
        )

    def _rules_changed(self, queue: str, notify: Callable[[str | None], None]) -> None:
        self._rules.invalidate()
        if queue:
            # Its dispatchers claim again under the new rule.
            notify(queue)
