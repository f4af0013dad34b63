"""TaskQueue.purge against a real daemon, and the daemon's retention in virtual time."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    IncompatibleVersionError,
    InvalidArgumentError,
    NotFoundError,
    Ringo,
    RingoClient,
    TaskQueue,
    TaskState,
)
from ringo_trio._transport.memory import serving_in_memory
from ringo_trio.server import flags
from ringo_trio.server.clock import LoopClock
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.retention import RetentionPolicy
from ringo_trio.server.rpc.connections import ConnectionLimits
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.testing import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.trio

DAY = timedelta(days=1)


async def finish(queue: TaskQueue, n: int, *, dead: bool = False, key: str = "") -> list[str]:
    """Enqueue `n` tasks and settle them (ack, or reject when `dead`); their ids."""
    ids = []
    for i in range(n):
        await queue.enqueue(task_type="t", unique_key=f"{key}{i}" if key else None)
        [leased] = await queue.claim()
        await (leased.reject("no") if dead else leased.ack())
        ids.append(leased.task.id)
    return ids


async def cancelled(queue: TaskQueue) -> str:
    """Enqueue a task and cancel it; its id."""
    task = await queue.enqueue(task_type="t")
    await queue.cancel_by_id(task.task.id)
    return task.task.id


async def exists(queue: TaskQueue, task_id: str) -> bool:
    try:
        await queue.get_by_id(task_id)
    except NotFoundError:
        return False
    return True


async def test_purge_deletes_every_finished_task_in_batches(daemon: DaemonProcess) -> None:
    """purge() keeps calling DeleteTasks while the daemon says there is more, so a
    batch size smaller than the backlog still deletes all of it; it returns the
    total, leaves active tasks alone, and the deleted tasks' unique keys can be
    enqueued again as new tasks."""
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("purged")
            ok = await finish(queue, 5, key="k")
            dead = await finish(queue, 2, dead=True)
            pending = await queue.enqueue(task_type="t")
            assert await queue.purge(batch_size=3) == 7
            assert [await exists(queue, i) for i in ok + dead] == [False] * 7
            assert await exists(queue, pending.task.id)
            again = await queue.enqueue(task_type="t", unique_key="k0")
            assert again.created
            assert again.task.id != ok[0]


async def test_purge_by_state_and_age(daemon: DaemonProcess) -> None:
    """Only the asked finished states go, and with older_than only tasks that
    finished longer ago than that."""
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("aged")
            [ok] = await finish(queue, 1)
            [dead] = await finish(queue, 1, dead=True)
            assert await queue.purge(older_than=timedelta(hours=1)) == 0
            assert await queue.purge(states=[TaskState.DEAD]) == 1
            assert await exists(queue, ok)
            assert not await exists(queue, dead)
            await trio.sleep(0.01)
            assert await queue.purge(older_than=timedelta(0)) == 1


async def test_purge_refuses_bad_arguments_before_sending(daemon: DaemonProcess) -> None:
    """Active states, an empty state list, a batch outside 1..10,000 and a negative
    age are InvalidArgumentError naming the argument, and nothing is deleted."""
    refused: list[tuple[dict[str, object], str]] = [
        ({"states": [TaskState.PENDING]}, "states"),
        ({"states": [TaskState.SUCCEEDED, TaskState.LEASED]}, "states"),
        ({"states": []}, "states"),
        ({"states": TaskState.DEAD}, "states"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 10_001}, "batch_size"),
        ({"older_than": timedelta(seconds=-1)}, "older_than"),
    ]
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("refused")
            [ok] = await finish(queue, 1)
            for kwargs, match in refused:
                with pytest.raises(InvalidArgumentError, match=match):
                    await queue.purge(**kwargs)  # type: ignore[arg-type]
            assert await exists(queue, ok)


async def test_purge_needs_protocol_minor_9(tmp_path: pathlib.Path) -> None:
    """Against a daemon serving minor 8, purge raises IncompatibleVersionError
    before anything is sent, and the finished task stays."""
    with spawn_daemon(tmp_path, protocol_minor=8) as old, trio.fail_after(30):
        async with Ringo.connect(old.endpoint) as client:
            queue = client.queue("old")
            [ok] = await finish(queue, 1)
            with pytest.raises(IncompatibleVersionError, match="purge"):
                await queue.purge()
            assert await exists(queue, ok)


# -- retention in virtual time ------------------------------------------------------


def virtual_daemon(
    tmp_path: pathlib.Path, policy: RetentionPolicy
) -> Callable[[Callable[[], float]], Daemon]:
    """An in-process daemon with `policy` on the loop's (virtual) clock, whose
    periodic chores run daily: at their defaults (a lease sweep every 5 s, a
    keepalive every minute) weeks of virtual time cost minutes of real time."""
    daily = DAY.total_seconds()

    def make(loop_time: Callable[[], float]) -> Daemon:
        config = DaemonConfig(
            port=0,
            retention=policy,
            reaper_backstop=daily,
            connections=ConnectionLimits(idle_timeout=100 * daily, keepalive_interval=daily),
        )
        return Daemon(config, SQLiteEngine(tmp_path / "ringo.db"), clock=LoopClock(loop_time))

    return make


async def test_retention_deletes_finished_tasks_once_they_are_old_enough(
    autojump_clock: trio.testing.MockClock, tmp_path: pathlib.Path
) -> None:
    """With ringod's defaults (succeeded and cancelled kept 7 days, dead 30), the
    daemon's own retention, on its clock: a task that succeeded (or was
    cancelled) 7 days and an hour ago is gone and one 6 days and an hour
    old is kept; a dead task stays until
    it is 30 days old. No wall-clock time passes (the clock is virtual)."""
    defaults = flags.build_parser().parse_args([])  # ringod's, as it parses them
    policy = RetentionPolicy(
        succeeded=defaults.retain_succeeded,
        dead=defaults.retain_dead,
        cancelled=defaults.retain_cancelled,
        interval=3600.0,
    )
    async with (
        serving_in_memory(virtual_daemon(tmp_path, policy)) as (_daemon, transport, _run),
        RingoClient(transport=transport) as client,
    ):
        queue = client.queue("kept")
        [old] = await finish(queue, 1)
        [dead] = await finish(queue, 1, dead=True)
        old_cancelled = await cancelled(queue)
        await trio.sleep(DAY.total_seconds())
        [young] = await finish(queue, 1)
        young_cancelled = await cancelled(queue)
        await trio.sleep(6 * DAY.total_seconds() + 3600)  # 7 days and 1 hour after `old`
        assert not await exists(queue, old)
        assert not await exists(queue, old_cancelled)
        assert await exists(queue, young)
        assert await exists(queue, young_cancelled)
        assert await exists(queue, dead)
        await trio.sleep(23 * DAY.total_seconds())  # 30 days and 1 hour after `dead`
        assert not await exists(queue, dead)
        assert not await exists(queue, young)


async def test_retention_off_keeps_everything(
    autojump_clock: trio.testing.MockClock, tmp_path: pathlib.Path
) -> None:
    """A daemon without retention (the in-process default, or ringod with every
    --retain-* set to forever) keeps finished tasks however old they get."""
    async with (
        serving_in_memory(virtual_daemon(tmp_path, RetentionPolicy())) as (_, transport, _run),
        RingoClient(transport=transport) as client,
    ):
        queue = client.queue("kept")
        [ok] = await finish(queue, 1)
        [dead] = await finish(queue, 1, dead=True)
        await trio.sleep(400 * DAY.total_seconds())
        assert await exists(queue, ok)
        assert await exists(queue, dead)
