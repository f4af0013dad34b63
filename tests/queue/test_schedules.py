"""Schedules through the SDK and the in-process daemon's schedule loop, on
virtual time (RingoTestEnv): a month of a daily schedule, intervals, pause
and resume, misfire after an outage, validation, minor < 13."""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    IncompatibleVersionError,
    InvalidArgumentError,
    NotFoundError,
    Ringo,
    Schedule,
)
from ringo_trio._contract import versions
from ringo_trio.server.daemon import DaemonConfig
from ringo_trio.server.storage.schedules import tick_key
from ringo_trio.testing import DaemonProcess, RingoTestEnv, spawn_daemon
from ringo_trio.testing import _env as testing_env

pytestmark = pytest.mark.trio

START = datetime(2030, 1, 1, tzinfo=UTC)


async def _keys(env: RingoTestEnv, queue: str = "q") -> list[str]:
    return [t.unique_key async for t in env.client.queue(queue).list(page_size=1000)]


async def test_daily_schedule_for_a_month(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a daily schedule left to the daemon for 30 simulated days
    makes exactly 30 tasks, one per day at the wall time in its zone."""
    # The lease reaper's 5 s backstop sweep (nothing to do with schedules)
    # would be half a million wake-ups over a simulated month.
    monkeypatch.setattr(
        testing_env, "DaemonConfig", functools.partial(DaemonConfig, reaper_backstop=3600.0)
    )
    async with RingoTestEnv.start(start=START) as env:
        queue = env.client.queue("q")
        stored = await queue.put_schedule(
            "daily", "report", cron="0 9 * * *", timezone="Europe/Berlin", payload=b"{}"
        )
        assert isinstance(stored, Schedule)
        assert stored.next_fire_at == datetime(2030, 1, 1, 8, tzinfo=UTC)
        await env.sleep(days=30)
        expected = [tick_key("daily", datetime(2030, 1, d, 8, tzinfo=UTC)) for d in range(1, 31)]
        assert await _keys(env) == expected
        [listed] = await queue.schedules()
        assert listed.fired == 30
        assert listed.skipped == 0
        assert listed.last_task_id is not None
        task = await queue.get_by_id(listed.last_task_id)
        assert (task.task_type, task.payload) == ("report", b"{}")


async def test_every_interval(autojump_clock: trio.testing.MockClock) -> None:
    """Property: every=10 min makes a task every 10 minutes from the schedule's creation."""
    async with RingoTestEnv.start(start=START) as env:
        queue = env.client.queue("q")
        await queue.put_schedule("tick", "t", every=timedelta(minutes=10))
        await env.sleep(hours=1, seconds=1)
        assert await _keys(env) == [
            tick_key("tick", START + timedelta(minutes=10 * i)) for i in range(1, 7)
        ]


async def test_pause_resume_without_burst(autojump_clock: trio.testing.MockClock) -> None:
    """Property: nothing fires while paused, and resuming fires no missed tick
    (catch_up or not): the next tick after the resume is the first."""
    async with RingoTestEnv.start(start=START) as env:
        queue = env.client.queue("q")
        await queue.put_schedule("m", "t", cron="* * * * *", misfire="catch_up", catch_up=50)
        await env.sleep(minutes=2, seconds=30)
        paused = await queue.pause_schedule("m")
        assert paused.paused
        assert paused.next_fire_at is None
        await env.sleep(hours=1)
        assert len(await _keys(env)) == 2
        resumed = await queue.resume_schedule("m")
        assert resumed.next_fire_at == START + timedelta(hours=1, minutes=3)
        await env.sleep(minutes=1)
        assert len(await _keys(env)) == 3
        assert await queue.delete_schedule("m") is True
        assert await queue.delete_schedule("m") is False
        with pytest.raises(NotFoundError):
            await queue.pause_schedule("m")


async def test_put_validates_before_sending(autojump_clock: trio.testing.MockClock) -> None:
    """Property: a bad schedule is InvalidArgumentError naming what is wrong
    (a cron error names field and position); nothing is stored."""
    async with RingoTestEnv.start(start=START) as env:
        queue = env.client.queue("q")
        with pytest.raises(InvalidArgumentError, match=r"minute field \(position 1\)"):
            await queue.put_schedule("s", "t", cron="61 * * * *")
        with pytest.raises(InvalidArgumentError, match="exactly one"):
            await queue.put_schedule("s", "t", cron="* * * * *", every=timedelta(minutes=1))
        with pytest.raises(InvalidArgumentError, match="timezone"):
            await queue.put_schedule("s", "t", cron="* * * * *", timezone="Mars/Olympus")
        with pytest.raises(InvalidArgumentError, match="misfire"):
            await queue.put_schedule("s", "t", every=timedelta(1), misfire="later")
        assert await queue.schedules() == []


@pytest.fixture
def daemon_process(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "data") as d:
        yield d


async def test_schedules_need_minor_13(
    daemon_process: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: an SDK session below minor 13 refuses the schedule calls
    before sending anything (IncompatibleVersionError)."""
    monkeypatch.setattr(versions, "MINOR", versions.FEATURES[versions.Feature.SCHEDULES] - 1)
    with trio.fail_after(30):
        async with Ringo.connect(daemon_process.endpoint) as client:
            queue = client.queue("q")
            with pytest.raises(IncompatibleVersionError, match="minor 13"):
                await queue.put_schedule("s", "t", every=timedelta(minutes=1))
            with pytest.raises(IncompatibleVersionError, match="minor 13"):
                await queue.schedules()
