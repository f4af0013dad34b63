"""The PostgreSQL engine's schedules (storage/schedules.py tells the firing's
story; here due rows are locked ``FOR UPDATE SKIP LOCKED``, so daemons
sharing the database fire different schedules, and the compare-and-set
stops one that read a row before another's commit)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._proto.ringo.v1 import Schedule

from ..base import FailedPrecondition, NotFound
from ..rows import NewTasks, from_us, opt_from_us, row_task, to_us
from ..schedules import (
    SCHEDULE_COLS,
    FiringReport,
    plan_firing,
    replacement,
    resumed,
    row_schedule,
    schedule_row,
    tick_spec,
)
from .claim import insert_columns
from .schema import ident

__all__ = ["PostgresSchedules"]


class PostgresSchedules:
    """`Storage`'s schedule methods for `PostgresEngine` (which provides the rest)."""

    schema: str
    schedule_fault: Callable[[str], None] | None
    _sql: Any

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        raise NotImplementedError

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def _fetchrow(self, sql: str, *args: Any) -> Any:
        raise NotImplementedError

    def _schedules(self) -> str:
        return f"{ident(self.schema)}.schedules"

    async def put_schedule(
        self, schedule: Schedule, now: datetime, *, max_per_queue: int
    ) -> tuple[Schedule, bool]:
        t = self._schedules()
        async with self._conn() as conn, conn.transaction():
            # The queue's row count is checked under a lock on the queue's
            # name, so two daemons creating the last two schedules cannot both pass.
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))", f"{t}:{schedule.queue}"
            )
            row = await conn.fetchrow(
                f"SELECT {SCHEDULE_COLS} FROM {t} WHERE queue = $1 AND name = $2 FOR UPDATE",
                schedule.queue,
                schedule.name,
            )
            old = None if row is None else row_schedule(row)
            if old is None:
                count = await conn.fetchval(
                    f"SELECT count(*) FROM {t} WHERE queue = $1", schedule.queue
                )
                if count >= max_per_queue:
                    raise FailedPrecondition(
                        f"queue {schedule.queue!r} holds {count} schedules, the most it may"
                    )
            stored = replacement(schedule, old, now)
            marks = ", ".join(f"${i}" for i in range(1, 20))
            updates = ", ".join(
                f"{c.strip()} = excluded.{c.strip()}" for c in SCHEDULE_COLS.split(",")[2:]
            )
            await conn.execute(
                f"INSERT INTO {t} ({SCHEDULE_COLS}) VALUES ({marks})"
                f" ON CONFLICT (queue, name) DO UPDATE SET {updates}",
                *schedule_row(stored),
            )
        return stored, old is None

    async def list_schedules(self, queue: str | None, limit: int | None = None) -> list[Schedule]:
        t = self._schedules()
        # LIMIT NULL: no limit.
        if queue is None:
            rows = await self._fetch(
                f"SELECT {SCHEDULE_COLS} FROM {t} ORDER BY queue, name LIMIT $1", limit
            )
        else:
            rows = await self._fetch(
                f"SELECT {SCHEDULE_COLS} FROM {t} WHERE queue = $1 ORDER BY name LIMIT $2",
                queue,
                limit,
            )
        return [row_schedule(row) for row in rows]

    async def delete_schedule(self, queue: str, name: str) -> bool:
        row = await self._fetchrow(
            f"DELETE FROM {self._schedules()} WHERE queue = $1 AND name = $2 RETURNING 1",
            queue,
            name,
        )
        return row is not None

    async def set_schedule_paused(
        self, queue: str, name: str, paused: bool, now: datetime
    ) -> Schedule:
        t = self._schedules()
        async with self._conn() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {SCHEDULE_COLS} FROM {t} WHERE queue = $1 AND name = $2 FOR UPDATE",
                queue,
                name,
            )
            if row is None:
                raise NotFound(f"schedule {name!r} in queue {queue!r}")
            stored = resumed(row_schedule(row), paused, now)
            await conn.execute(
                f"UPDATE {t} SET paused = $3, next_fire_at = $4, updated_at = $5"
                " WHERE queue = $1 AND name = $2",
                queue,
                name,
                stored.paused,
                None if stored.next_fire_at is None else to_us(stored.next_fire_at),
                to_us(stored.updated_at or now),
            )
        return stored

    async def fire_schedules(self, now: datetime, limit: int) -> FiringReport:
        t = self._schedules()
        now_us = to_us(now)
        now = from_us(now_us)
        report = FiringReport()
        fault = self.schedule_fault
        async with self._conn() as conn, conn.transaction():
            # SKIP LOCKED: a schedule another daemon is firing right now is
            # its; this firing takes the others (and the compare-and-set
            # below stops a firing that read the row before the other's commit).
            rows = await conn.fetch(
                f"SELECT {SCHEDULE_COLS} FROM {t}"
                " WHERE next_fire_at IS NOT NULL AND next_fire_at <= $1"
                " ORDER BY next_fire_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                now_us,
                limit + 1,
            )
            due = [row_schedule(row) for row in rows]
            report.more = len(due) > limit
            if fault is not None:
                fault("read")
            for schedule in due[:limit]:
                assert schedule.next_fire_at is not None
                plan = plan_firing(schedule, schedule.next_fire_at, now)
                moved = await conn.fetchrow(
                    f"UPDATE {t} SET next_fire_at = $4, fired = fired + $5,"
                    " skipped = skipped + $6, updated_at = $7"
                    " WHERE queue = $1 AND name = $2 AND next_fire_at = $3 RETURNING 1",
                    schedule.queue,
                    schedule.name,
                    to_us(schedule.next_fire_at),
                    to_us(plan.next_fire_at),
                    len(plan.fire),
                    plan.skipped,
                    now_us,
                )
                if fault is not None:
                    fault("cas")
                if moved is None:
                    continue
                key = (schedule.queue, schedule.name)
                report.skipped[key] = plan.skipped
                report.fired[key] = len(plan.fire)
                if not plan.fire:
                    continue
                new_tasks = NewTasks(schedule.queue, now, now_us, len(plan.fire))
                made = [new_tasks.make(tick_spec(schedule, tick)) for tick in plan.fire]
                # The enqueue path's own insert: unique keys dedupe, the
                # queue's workers on every daemon are notified.
                inserted = await conn.fetchrow(
                    self._sql.claim.insert,
                    schedule.queue,
                    now_us,
                    *insert_columns([row for _, row in made]),
                )
                keys = set(inserted[0] or ())
                if fault is not None:
                    fault("insert")
                report.created.extend(task for task, _ in made if task.unique_key in keys)
                last = made[-1][0]
                last_id = last.id
                if last.unique_key not in keys:
                    found = await conn.fetchrow(
                        self._sql.claim.by_keys, schedule.queue, [last.unique_key]
                    )
                    last_id = "" if found is None else row_task(found).id
                await conn.execute(
                    f"UPDATE {t} SET last_fired_at = $3, last_task_id = $4"
                    " WHERE queue = $1 AND name = $2",
                    schedule.queue,
                    schedule.name,
                    now_us,
                    last_id,
                )
            next_us = await conn.fetchval(
                f"SELECT min(next_fire_at) FROM {t} WHERE next_fire_at IS NOT NULL"
            )
            report.next_due = opt_from_us(next_us)
            if fault is not None:
                fault("commit")
        return report
