"""The SQLite engine's schedules (storage/schedules.py tells the firing's
story; here it runs in one ``BEGIN IMMEDIATE`` transaction, whose write lock
makes the compare-and-set trivially true for one daemon)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime

from ringo_trio._proto.ringo.v1 import Schedule, TaskSpec

from ..base import EnqueueOutcome, FailedPrecondition, NotFound
from ..rows import from_us, opt_from_us, to_us
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

__all__ = ["SQLiteSchedules"]


class SQLiteSchedules:
    """`Storage`'s schedule methods for `SQLiteEngine` (which provides the rest)."""

    schedule_fault: Callable[[str], None] | None

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _enqueue_in(
        self,
        db: sqlite3.Connection,
        queue: str,
        specs: Sequence[TaskSpec],
        now: datetime,
        now_us: int,
    ) -> list[EnqueueOutcome]:
        raise NotImplementedError

    async def put_schedule(
        self, schedule: Schedule, now: datetime, *, max_per_queue: int
    ) -> tuple[Schedule, bool]:
        with self._write() as db:
            row = db.execute(
                f"SELECT {SCHEDULE_COLS} FROM schedules WHERE queue = ? AND name = ?",
                (schedule.queue, schedule.name),
            ).fetchone()
            old = None if row is None else row_schedule(row)
            if old is None:
                (count,) = db.execute(
                    "SELECT count(*) FROM schedules WHERE queue = ?", (schedule.queue,)
                ).fetchone()
                if count >= max_per_queue:
                    raise FailedPrecondition(
                        f"queue {schedule.queue!r} holds {count} schedules, the most it may"
                    )
            stored = replacement(schedule, old, now)
            marks = ", ".join("?" * 19)
            db.execute(
                f"INSERT OR REPLACE INTO schedules ({SCHEDULE_COLS}) VALUES ({marks})",
                schedule_row(stored),
            )
        return stored, old is None

    async def list_schedules(self, queue: str | None, limit: int | None = None) -> list[Schedule]:
        db = self._conn()
        # LIMIT -1: no limit.
        bound = -1 if limit is None else limit
        if queue is None:
            rows = db.execute(
                f"SELECT {SCHEDULE_COLS} FROM schedules ORDER BY queue, name LIMIT ?", (bound,)
            )
        else:
            rows = db.execute(
                f"SELECT {SCHEDULE_COLS} FROM schedules WHERE queue = ? ORDER BY name LIMIT ?",
                (queue, bound),
            )
        return [row_schedule(row) for row in rows]

    async def delete_schedule(self, queue: str, name: str) -> bool:
        with self._write() as db:
            cur = db.execute("DELETE FROM schedules WHERE queue = ? AND name = ?", (queue, name))
            return cur.rowcount > 0

    async def set_schedule_paused(
        self, queue: str, name: str, paused: bool, now: datetime
    ) -> Schedule:
        with self._write() as db:
            row = db.execute(
                f"SELECT {SCHEDULE_COLS} FROM schedules WHERE queue = ? AND name = ?",
                (queue, name),
            ).fetchone()
            if row is None:
                raise NotFound(f"schedule {name!r} in queue {queue!r}")
            stored = resumed(row_schedule(row), paused, now)
            db.execute(
                "UPDATE schedules SET paused = ?, next_fire_at = ?, updated_at = ?"
                " WHERE queue = ? AND name = ?",
                (
                    stored.paused,
                    None if stored.next_fire_at is None else to_us(stored.next_fire_at),
                    to_us(stored.updated_at or now),
                    queue,
                    name,
                ),
            )
        return stored

    async def fire_schedules(self, now: datetime, limit: int) -> FiringReport:
        now_us = to_us(now)
        now = from_us(now_us)
        report = FiringReport()
        fault = self.schedule_fault
        with self._write() as db:
            due = [
                row_schedule(row)
                for row in db.execute(
                    f"SELECT {SCHEDULE_COLS} FROM schedules"
                    " WHERE next_fire_at IS NOT NULL AND next_fire_at <= ?"
                    " ORDER BY next_fire_at LIMIT ?",
                    (now_us, limit + 1),
                )
            ]
            report.more = len(due) > limit
            if fault is not None:
                fault("read")
            for schedule in due[:limit]:
                assert schedule.next_fire_at is not None
                plan = plan_firing(schedule, schedule.next_fire_at, now)
                # The compare-and-set: a row another firing moved is left alone.
                moved = db.execute(
                    "UPDATE schedules SET next_fire_at = ?, fired = fired + ?,"
                    " skipped = skipped + ?, updated_at = ?"
                    " WHERE queue = ? AND name = ? AND next_fire_at = ?",
                    (
                        to_us(plan.next_fire_at),
                        len(plan.fire),
                        plan.skipped,
                        now_us,
                        schedule.queue,
                        schedule.name,
                        to_us(schedule.next_fire_at),
                    ),
                ).rowcount
                if fault is not None:
                    fault("cas")
                if not moved:
                    continue
                key = (schedule.queue, schedule.name)
                report.skipped[key] = plan.skipped
                report.fired[key] = len(plan.fire)
                if not plan.fire:
                    continue
                specs = [tick_spec(schedule, tick) for tick in plan.fire]
                outcomes = self._enqueue_in(db, schedule.queue, specs, now, now_us)
                if fault is not None:
                    fault("insert")
                report.created.extend(o.task for o in outcomes if o.created)
                db.execute(
                    "UPDATE schedules SET last_fired_at = ?, last_task_id = ?"
                    " WHERE queue = ? AND name = ?",
                    (now_us, outcomes[-1].task.id, schedule.queue, schedule.name),
                )
            (next_us,) = db.execute(
                "SELECT min(next_fire_at) FROM schedules WHERE next_fire_at IS NOT NULL"
            ).fetchone()
            report.next_due = opt_from_us(next_us)
            if fault is not None:
                fault("commit")
        return report
