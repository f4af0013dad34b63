"""The schedule RPCs (minor 13) as the daemon itself sees them: its own
validation of PutSchedule (whatever an SDK checks first), the per-queue
bound, old sessions refused; and a real ``ringod`` restarted after an outage
firing its missed ticks by the misfire policy, no burst."""

from __future__ import annotations

import itertools
import operator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio
from grpclib.const import Status

from ringo_trio import Ringo, Task
from ringo_trio._contract import limits
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    DeleteScheduleRequest,
    ListSchedulesRequest,
    MisfirePolicy,
    PutScheduleRequest,
    Schedule,
    SetSchedulePausedRequest,
)
from ringo_trio.testing import spawn_daemon
from tests._kit.grpc_client import Client, connect, expect_status, new_queue
from tests._kit.postgres import fresh_database, postgres_daemons
from tests._kit.virtual_daemon import on_virtual_time, virtual_daemon

SCHEDULES_MINOR = FEATURES[Feature.SCHEDULES]


def _schedule(queue: str, name: str = "s", **fields: Any) -> Schedule:
    fields.setdefault("task_type", "t")
    if "cron" not in fields and "every" not in fields:
        fields["every"] = timedelta(minutes=5)
    return Schedule(queue=queue, name=name, **fields)


async def _put(client: Client, schedule: Schedule) -> Any:
    return await client.stub.put_schedule(
        PutScheduleRequest(context=client.context, schedule=schedule)
    )


@on_virtual_time
async def test_the_daemon_validates_put_schedule_itself() -> None:
    """Property: the daemon refuses, with INVALID_ARGUMENT naming the field,
    an unknown time zone, both or neither of cron and every, a cron syntax
    error (the field and position named), catch_up past MAX_CATCH_UP, an
    every out of bounds, a missing schedule; nothing is stored and it keeps
    serving."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        cases: list[tuple[Schedule | None, tuple[str, ...]]] = [
            (_schedule(queue, timezone="Mars/Olympus"), ("schedule.timezone", "Mars/Olympus")),
            (
                _schedule(queue, cron="* * * * *", every=timedelta(minutes=1)),
                ("exactly one of cron and every",),
            ),
            (Schedule(queue=queue, name="s", task_type="t"), ("exactly one of cron and every",)),
            (
                _schedule(queue, cron="*/5 25 * * *"),
                ("schedule.cron", "hour field (position 5)", "25"),
            ),
            (_schedule(queue, cron="* * * *"), ("schedule.cron", "expected 5 fields", "got 4")),
            (
                _schedule(queue, misfire=MisfirePolicy.CATCH_UP, catch_up=limits.MAX_CATCH_UP + 1),
                ("schedule.catch_up", str(limits.MAX_CATCH_UP)),
            ),
            (
                _schedule(queue, every=timedelta(milliseconds=500)),
                ("schedule.every: 0.5 seconds is not from 1 second to 366 days",),
            ),
            (_schedule(queue, name=""), ("schedule.name",)),
            (None, ("schedule", "required")),
        ]
        for schedule, fragments in cases:
            request = PutScheduleRequest(context=client.context, schedule=schedule)
            await expect_status(
                client.stub.put_schedule(request), Status.INVALID_ARGUMENT, *fragments
            )
        listed = await client.stub.list_schedules(
            ListSchedulesRequest(context=client.context, queue=queue)
        )
        assert listed.schedules == []
        ok = await _put(client, _schedule(queue, misfire=MisfirePolicy.CATCH_UP, catch_up=100))
        assert ok.created
        assert ok.schedule.catch_up == limits.MAX_CATCH_UP


@on_virtual_time
async def test_schedules_per_queue_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: past MAX_SCHEDULES_PER_QUEUE a new schedule of that queue is
    FAILED_PRECONDITION; an existing one may still be replaced, another
    queue is not affected, and after a delete there is room again."""
    monkeypatch.setattr(limits, "MAX_SCHEDULES_PER_QUEUE", 2)
    queue, other = new_queue(), new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        await _put(client, _schedule(queue, "a"))
        await _put(client, _schedule(queue, "b"))
        await expect_status(
            _put(client, _schedule(queue, "c")), Status.FAILED_PRECONDITION, "schedules"
        )
        replaced = await _put(client, _schedule(queue, "a", every=timedelta(minutes=9)))
        assert not replaced.created
        assert (await _put(client, _schedule(other, "c"))).created
        await client.stub.delete_schedule(
            DeleteScheduleRequest(context=client.context, queue=queue, name="b")
        )
        assert (await _put(client, _schedule(queue, "c"))).created


@on_virtual_time
async def test_sessions_below_minor_13_are_refused() -> None:
    """Property: each of the four schedule RPCs on a session of minor 12 is
    UNIMPLEMENTED naming the minor it needs, and changes nothing."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        connect(served.daemon, minor=SCHEDULES_MINOR - 1) as old,
    ):
        await _put(client, _schedule(queue, "kept"))
        context = old.context
        calls = [
            old.stub.put_schedule(
                PutScheduleRequest(context=context, schedule=_schedule(queue, "new"))
            ),
            old.stub.list_schedules(ListSchedulesRequest(context=context, queue=queue)),
            old.stub.delete_schedule(
                DeleteScheduleRequest(context=context, queue=queue, name="kept")
            ),
            old.stub.set_schedule_paused(
                SetSchedulePausedRequest(context=context, queue=queue, name="kept", paused=True)
            ),
        ]
        for call in calls:
            await expect_status(call, Status.UNIMPLEMENTED, f"minor {SCHEDULES_MINOR}")
        listed = await client.stub.list_schedules(
            ListSchedulesRequest(context=client.context, queue=queue)
        )
        assert [(s.name, s.paused) for s in listed.schedules] == [("kept", False)]


# -- a real daemon, stopped and restarted ----------------------------------------

OUTAGE = 4.0
GUARD = 60


def _tick(task: Task) -> datetime:
    assert task.unique_key is not None
    return datetime.fromisoformat(task.unique_key.split(":", 2)[2])


@pytest.mark.trio
async def test_a_restarted_daemon_fires_missed_ticks_by_policy(tmp_path: Path) -> None:
    """Property: a daemon stopped for OUTAGE seconds under two every-1s
    schedules, then restarted on the same data, fires no burst: its first
    firing makes one task for the SKIP schedule (the latest due tick) and
    two for CATCH_UP with catch_up=2 (the two latest due ticks), all in
    that one firing; the missed ticks before them are exactly the
    schedule's skipped count; the ticks then go on, one per second, none
    missing."""
    with trio.fail_after(GUARD):
        daemon = spawn_daemon(tmp_path / "ringod")
        try:
            async with Ringo.connect(daemon.endpoint) as client:
                for queue, misfire in (("skip", "skip"), ("catch", "catch_up")):
                    await client.queue(queue).put_schedule(
                        "beat", "t", every=timedelta(seconds=1), misfire=misfire, catch_up=2
                    )
                # Polled: the ticks are real time, nothing to wait on.
                while len(await _tasks(client, "skip")) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            await trio.to_thread.run_sync(daemon.stop)
            await trio.sleep(OUTAGE)
            restarted_at = datetime.now(UTC)
            await trio.to_thread.run_sync(daemon.start)
            async with Ringo.connect(daemon.endpoint) as client:
                await trio.sleep(2.5)
                for queue, fired_at_restart in (("skip", 1), ("catch", 2)):
                    tasks = await _tasks(client, queue)
                    [schedule] = await client.queue(queue).schedules()
                    _check_restart(tasks, restarted_at, fired_at_restart, schedule.skipped)
        finally:
            daemon.stop()


async def _tasks(client: Any, queue: str) -> list[Task]:
    found = [t async for t in client.queue(queue).list(page_size=1000)]
    return sorted(found, key=_tick)


def _check_restart(
    tasks: list[Task], restarted_at: datetime, fired_at_restart: int, skipped: int
) -> None:
    ticks = [_tick(t) for t in tasks]
    second = timedelta(seconds=1)
    assert len(set(ticks)) == len(ticks)
    created = [t.created_at for t in tasks]
    assert all(c is not None for c in created)
    first_firing = min(c for c in created if c is not None and c >= restarted_at)
    group = [i for i, c in enumerate(created) if c == first_firing]
    assert len(group) == fired_at_restart, [(str(ticks[i]), str(created[i])) for i in group]
    start, end = group[0], group[-1]
    assert group == list(range(start, end + 1))
    # The latest due ticks at that firing.
    assert ticks[end] <= first_firing < ticks[end] + second
    assert all(b - a == second for a, b in itertools.pairwise(ticks[start : end + 1]))
    # One gap, before the restart's firing: the skipped ticks.
    gaps = [
        (i, round((b - a) / second) - 1)
        for i, (a, b) in enumerate(itertools.pairwise(ticks))
        if b - a != second
    ]
    assert [i for i, _ in gaps] == [start - 1]
    assert gaps[0][1] == skipped
    assert skipped >= OUTAGE - fired_at_restart - 1
    # And the ticks went on after it, one a second.
    assert len(ticks) - 1 - end >= 1
    assert operator.le(ticks[-1], datetime.now(UTC))


@pytest.mark.trio
async def test_a_schedule_put_through_one_daemon_is_fired_by_another() -> None:
    """Property: daemons sharing a PostgreSQL database hear of each other's
    schedules by looking again, at most `MAX_SCHEDULE_SLEEP` apart (no
    notification tells them): a schedule put through one daemon, which then
    stops, goes on firing from the other, whose own loop had nothing
    scheduled when the schedule was put."""
    with (
        trio.fail_after(60),
        fresh_database() as dsn,
        postgres_daemons(dsn, 2) as (first, second),
    ):
        async with Ringo.connect(first.endpoint) as client:
            await client.queue("beat").put_schedule("s", "t", every=timedelta(seconds=1))
        await trio.to_thread.run_sync(first.stop)
        async with Ringo.connect(second.endpoint) as client:
            fired_before = len(await _tasks(client, "beat"))
            # Ticks of 1 s, looked for every MAX_SCHEDULE_SLEEP: two come within
            # ~3 s; the guard is wider for a loaded machine (without the looking
            # again, none ever comes).
            with trio.fail_after(10 * limits.MAX_SCHEDULE_SLEEP):
                # Another process's firing: nothing here to wait on but the list.
                while len(await _tasks(client, "beat")) < fired_before + 2:  # noqa: ASYNC110
                    await trio.sleep(0.2)


# -- slow: three daemons on one PostgreSQL database, one killed again and again --

SOAK_TICKS = 60
SOAK_GUARD = 240


@pytest.mark.slow
@pytest.mark.trio
async def test_three_daemons_with_kills_fire_each_tick_once() -> None:
    """Property: an every-1s CATCH_UP schedule (catch_up 100) on three
    daemons sharing one PostgreSQL database, for SOAK_TICKS ticks while one
    of two daemons is SIGKILLed and restarted again and again, and once all
    three are killed at the same time for a few seconds: every tick from the
    first to the last became exactly one task (consecutive tick keys, none
    missing), the schedule's fired count equals the number of tasks (no
    firing was counted twice: the compare-and-set let one daemon per tick
    through) and nothing was skipped."""
    with trio.fail_after(SOAK_GUARD), fresh_database() as dsn:
        with postgres_daemons(dsn, 3) as daemons:
            steady, *victims = daemons
            async with Ringo.connect(steady.endpoint) as client:
                await client.queue("soak").put_schedule(
                    "beat", "t", every=timedelta(seconds=1), misfire="catch_up", catch_up=100
                )
            kills = 0
            started = trio.current_time()
            round_ = 0
            while trio.current_time() - started < SOAK_TICKS:
                round_ += 1
                down = daemons if round_ == 6 else [victims[round_ % 2]]
                for daemon in down:
                    await trio.to_thread.run_sync(daemon.kill)
                    kills += 1
                await trio.sleep(3.0 if round_ == 6 else 1.5)
                for daemon in down:
                    await trio.to_thread.run_sync(daemon.start)
                await trio.sleep(2.0)
            # Every daemon up for a moment (catch-up of the last outage), then stop ticking.
            await trio.sleep(2.0)
            async with Ringo.connect(steady.endpoint) as client:
                queue = client.queue("soak")
                await queue.pause_schedule("beat")
                tasks = await _tasks(client, "soak")
                [schedule] = await queue.schedules()
        ticks = [_tick(t) for t in tasks]
        second = timedelta(seconds=1)
        late = [
            (t.created_at - tick).total_seconds()
            for t, tick in zip(tasks, ticks, strict=True)
            if t.created_at is not None
        ]
        print(
            f"\nsoak: {len(ticks)} ticks, {kills} SIGKILLs in {round_} rounds, fired"
            f" {schedule.fired}, skipped {schedule.skipped}, firing lateness max"
            f" {max(late):.3f}s median {sorted(late)[len(late) // 2]:.3f}s"
        )
        assert len(ticks) >= SOAK_TICKS
        assert len(set(ticks)) == len(ticks)
        assert all(b - a == second for a, b in itertools.pairwise(ticks))
        assert schedule.fired == len(ticks)
        assert schedule.skipped == 0
