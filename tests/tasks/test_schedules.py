"""Typed tasks with ``schedule=``: refused at decoration unless every payload
parameter has a default (or the cron or zone is bad), stored by
`TaskRegistry.apply_schedules` / the testing kit's ``run_worker``, and run
by the registry's worker at each tick, on virtual time (RingoTestEnv)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing

from ringo_trio import InvalidArgumentError, TaskContext, TaskRegistry
from ringo_trio.server.storage.schedules import tick_key
from ringo_trio.testing import RingoTestEnv

START = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.trio
async def test_a_five_minute_schedule_runs_twelve_times_an_hour(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a task declared with schedule="*/5 * * * *" is stored (by
    run_worker, before the worker starts) as the schedule of its queue named
    like the task, payload the empty arguments; over an hour of virtual
    time the registry's worker runs it exactly 12 times, once per tick,
    with its defaults; applying the schedules again (a second worker
    starting) keeps the next tick and makes no extra task."""
    tasks = TaskRegistry(queue="cron")
    ran: list[tuple[str, int, datetime]] = []

    @tasks.task(name="sweep", schedule="*/5 * * * *", schedule_timezone="UTC", priority=3)
    async def sweep(ctx: TaskContext, label: str = "sweep", n: int = 7) -> None:
        ran.append((label, n, env.now()))

    @tasks.task(name="plain")
    async def plain(x: int) -> None:
        raise AssertionError("never enqueued")

    async with RingoTestEnv.start(start=START) as env:
        assert await tasks.apply_schedules(env.client, queue="elsewhere") == []
        with trio.fail_after(3700):
            handled = await env.run_worker(tasks, until=12)
        assert handled == 12
        assert [(label, n) for label, n, _ in ran] == [("sweep", 7)] * 12
        [schedule] = await env.client.queue("cron").schedules()
        assert (schedule.name, schedule.task_type, schedule.payload) == ("sweep", "sweep", b"{}")
        assert schedule.cron == "*/5 * * * *"
        assert schedule.priority == 3
        assert schedule.fired == 12
        assert schedule.skipped == 0
        again = await tasks.apply_schedules(env.client)
        assert [s.next_fire_at for s in again] == [schedule.next_fire_at]
        ticks = [START + timedelta(minutes=5 * i) for i in range(1, 13)]
        keys = [t.unique_key async for t in env.client.queue("cron").list(page_size=100)]
        assert keys == [tick_key("sweep", t) for t in ticks]
        assert all(at >= tick for (_, _, at), tick in zip(ran, ticks, strict=True))


def test_a_scheduled_task_needs_defaults_and_a_valid_cron() -> None:
    """Property: schedule= on a function with a payload parameter without a
    default, a cron syntax error (naming field and position) or an unknown
    zone is an InvalidArgumentError at decoration, and nothing is
    registered."""
    tasks = TaskRegistry()

    with pytest.raises(InvalidArgumentError, match="parameters to need defaults"):

        @tasks.task(name="needs", schedule="* * * * *")
        async def needs(to: str, ctx: TaskContext) -> None: ...

    with pytest.raises(InvalidArgumentError, match=r"minute field \(position 1\)"):

        @tasks.task(name="bad-cron", schedule="61 * * * *")
        async def bad_cron() -> None: ...

    with pytest.raises(InvalidArgumentError, match="schedule_timezone"):

        @tasks.task(name="bad-zone", schedule="* * * * *", schedule_timezone="Mars/Base")
        async def bad_zone() -> None: ...

    assert len(tasks) == 0

    @tasks.task(name="fine", schedule="0 9 * * 1-5", schedule_timezone="Europe/Paris")
    def fine(ctx: TaskContext, verbose: bool = False) -> None: ...

    assert fine.schedule == "0 9 * * 1-5"
    assert "fine" in tasks
