"""The daemon's schedule loop (`server/schedules.py`) on its own, against a
store that records when it is asked to fire, on virtual time. What a firing
does (exactly once, catch-up, misfires) is the storage's and is held in
tests/server/storage/test_schedules.py; schedules through a daemon in
tests/server/rpc/test_schedules.py and tests/queue/test_schedules.py."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ringo_trio._contract import limits
from ringo_trio.server.clock import LoopClock
from ringo_trio.server.schedules import ScheduleLoop
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.schedules import FiringReport
from tests._kit.virtual_daemon import in_background, now, on_virtual_time


class _Store:
    """Due moments, each one task of its queue; fires them as
    `Storage.fire_schedules` does (at most `limit`, `more` when the limit
    stopped it), recording each call's virtual time and limit."""

    def __init__(self, clock: LoopClock, *, shared: bool = False) -> None:
        self._clock = clock
        self.shared_store = shared
        self.due: list[tuple[datetime, str]] = []
        self.calls: list[tuple[float, int]] = []
        self.failures = 0

    def add(self, seconds: float, queue: str = "q") -> None:
        self.due.append((self._clock.now() + timedelta(seconds=seconds), queue))
        self.due.sort()

    async def fire_schedules(self, at: datetime, limit: int) -> FiringReport:
        self.calls.append((now(), limit))
        if self.failures:
            self.failures -= 1
            raise OSError("the database is away")
        ready = [d for d in self.due if d[0] <= at]
        fired = ready[:limit]
        del self.due[: len(fired)]  # the ready ones lead: `due` is sorted
        return FiringReport(
            created=[cast(Any, SimpleNamespace(queue=queue)) for _, queue in fired],
            next_due=self.due[0][0] if self.due else None,
            more=len(ready) > limit,
        )


class _Loop:
    """A `ScheduleLoop` against `_Store`, with what it wakes and reports."""

    def __init__(self, *, shared: bool = False) -> None:
        self.clock = LoopClock(asyncio.get_running_loop().time)
        self.store = _Store(self.clock, shared=shared)
        self.woken: list[str] = []
        self.reports: list[FiringReport] = []
        self.loop = ScheduleLoop(cast(Storage, self.store), self.clock, self.woken.append)
        self.loop.fired_listener = self.reports.append
        self.start = now()

    def at(self) -> list[float]:
        return [round(at - self.start, 6) for at, _ in self.store.calls]


@on_virtual_time
async def test_a_round_fires_everything_due_in_batches_without_pausing() -> None:
    """Property: one round fires every due schedule, 100 per storage call
    (one bounded transaction each), the batches back to back; each batch
    wakes the queues it gave tasks and is reported (the metrics)."""
    scheduled = _Loop()
    for i in range(250):
        scheduled.store.add(0, queue=f"q{i % 2}")
    scheduled.store.add(3600)
    report = await scheduled.loop.fire_due()
    assert scheduled.store.calls == [(scheduled.start, 100)] * 3
    assert [len(r.created) for r in scheduled.reports] == [100, 100, 50]
    assert report is scheduled.reports[-1]
    assert not report.more
    # Sorted by moment then queue: q0 q0, then q0 q1 in the second batch, then q1.
    assert sorted(scheduled.woken) == ["q0", "q0", "q1", "q1"]


@on_virtual_time
async def test_the_loop_sleeps_until_the_next_tick_and_a_poke_wakes_it() -> None:
    """Property: on a store no other daemon writes, the loop looks again
    just past the next due moment (never before it: a round that finds
    nothing due would spin) and, with nothing scheduled, not at all until a
    put or a resume on this daemon pokes it: an idle daemon never wakes."""
    scheduled = _Loop()
    async with in_background(scheduled.loop.run()):
        scheduled.store.add(10)
        await asyncio.sleep(500)
        scheduled.store.add(0)
        scheduled.loop.poke()
        await asyncio.sleep(1)
    assert scheduled.at() == [0.0, 10.001, 500.0]
    assert [len(r.created) for r in scheduled.reports] == [0, 1, 1]


@on_virtual_time
async def test_on_a_shared_store_the_loop_looks_every_max_sleep() -> None:
    """Property: on a database other daemons share, a schedule put through
    another daemon is found within `MAX_SCHEDULE_SLEEP` (1 s) however far
    the next tick this daemon knows of is."""
    scheduled = _Loop(shared=True)
    async with in_background(scheduled.loop.run()):
        scheduled.store.add(3600)
        await asyncio.sleep(3.5 * limits.MAX_SCHEDULE_SLEEP)
    assert scheduled.at() == [i * limits.MAX_SCHEDULE_SLEEP for i in range(4)]


@on_virtual_time
async def test_a_failed_round_is_logged_and_tried_again_a_second_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: a round that fails (the database away) never ends the
    daemon: it is logged and tried again after 1 s, and the schedules due
    meanwhile fire then."""
    scheduled = _Loop()
    async with in_background(scheduled.loop.run()):
        scheduled.store.add(0)
        scheduled.store.failures = 2
        with caplog.at_level(logging.ERROR, logger="ringo_trio.server"):
            await asyncio.sleep(5)
    assert scheduled.at() == [0.0, 1.0, 2.0]
    assert [len(r.created) for r in scheduled.reports] == [1]
    assert len(caplog.records) == 2
