"""`TaskQueue.worker`'s arguments: each check at its edge, and what a worker
does on its defaults and its fixed bounds (one slot, no prefetch, 30 s of
grace, a 5 s stop timeout, three failed recoveries before ``run`` gives up).

A refused argument fails at once, before the worker exists (nothing is
registered with the connection, so the client's close has nothing of it to
drain); an accepted one at the edge of its range makes a worker. Every
test runs the daemon in process on trio's autojump clock, so "30 seconds
of grace" is measured on the clock the worker runs on, at no real cost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
import trio
import trio.testing

from ringo_trio import (
    AdaptiveConcurrency,
    InvalidArgumentError,
    Task,
    TaskContext,
    TaskState,
    TaskTimeouts,
    UnavailableError,
)
from ringo_trio._contract import limits
from ringo_trio._transport.base import StreamChannels
from ringo_trio.testing import RingoTestEnv
from tests._kit.workers import enqueue, wait_states

pytestmark = pytest.mark.trio

MAX_CONCURRENCY = 2**31 - 1


def _ok(task: Task, ctx: TaskContext) -> None:
    return None


REFUSED: list[dict[str, Any]] = [
    {"lease_duration": limits.MAX_LEASE + timedelta(microseconds=1)},
    {"lease_duration": 60},
    {"grace_period": 30},
    {"stop_timeout": timedelta(0)},
    {"stop_timeout": timedelta(seconds=-1)},
    {"stop_timeout": 5},
    {"prefetch": -1},
    {"prefetch": True},
    {"prefetch": 1.5},
    {"prefetch": 1, "concurrency": AdaptiveConcurrency(min=1, max=4)},
    {"prefetch": 1, "concurrency": MAX_CONCURRENCY},
    {"weight": True},
    {"weight": 1.5},
    {"idle_counts_scheduled": 1},
]

ACCEPTED: list[dict[str, Any]] = [
    {"lease_duration": limits.MAX_LEASE},
    {"lease_duration": timedelta(0)},
    {"grace_period": timedelta(0)},
    {"stop_timeout": timedelta(microseconds=1)},
    {"prefetch": 0, "concurrency": AdaptiveConcurrency(min=1, max=4)},
    {"prefetch": 5, "concurrency": 1},
    {"prefetch": 1, "concurrency": MAX_CONCURRENCY - 1},
    {"concurrency": MAX_CONCURRENCY},
    {"weight": 1},
]


@pytest.mark.parametrize("kwargs", REFUSED, ids=repr)
async def test_an_argument_past_its_edge_is_refused(
    kwargs: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    """Property: a lease longer than the daemon's maximum (by a microsecond),
    a stop timeout of zero, a negative or non-integer prefetch, a prefetch
    with a shared controller or one that takes the handlers past 2**31-1,
    and durations or flags of the wrong type, are each an
    InvalidArgumentError when the worker is made."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            with pytest.raises(InvalidArgumentError):
                env.client.queue("args").worker(_ok, **kwargs)


@pytest.mark.parametrize("kwargs", ACCEPTED, ids=repr)
async def test_an_argument_at_its_edge_makes_a_worker(
    kwargs: dict[str, Any], autojump_clock: trio.testing.MockClock
) -> None:
    """Property: the edges themselves are in range: a lease of exactly the
    daemon's maximum or of zero (the daemon's default), no grace period, the
    shortest stop timeout, a prefetch beyond a concurrency of one, and a
    concurrency plus prefetch of exactly 2**31-1."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            worker = env.client.queue("args").worker(_ok, **kwargs)
            if isinstance(kwargs.get("concurrency"), int):
                assert worker.concurrency == kwargs["concurrency"]


async def test_a_worker_on_its_defaults(autojump_clock: trio.testing.MockClock) -> None:
    """Property: a worker made with only a handler has a concurrency and a
    weight of one, holds one lease at a time (no prefetch: the other tasks
    stay PENDING while its handler runs), and when closed gives its running
    handler exactly 30 seconds before cancelling it — whose task then goes
    back PENDING with its attempt kept."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("defaults")
            ids = await enqueue(queue, 3)
            started = trio.Event()
            cancelled_at: list[float] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.set()
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    cancelled_at.append(trio.current_time())
                    raise

            worker = queue.worker(handle)
            assert (worker.concurrency, worker.weight) == (1, 1)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait()
                # Long enough for a prefetching worker's second claim to land.
                await trio.sleep(5)
                states = [(await queue.get_by_id(i)).state for i in ids]
                assert sorted(states, key=lambda s: s.name) == [
                    TaskState.LEASED,
                    TaskState.PENDING,
                    TaskState.PENDING,
                ]
                closing_at = trio.current_time()
                await worker.close()
            assert cancelled_at == [closing_at + 30]
            tasks = [await queue.get_by_id(i) for i in ids]
            assert all(t.state is TaskState.PENDING for t in tasks)
            assert sorted(t.attempt for t in tasks) == [0, 0, 0]


async def test_a_stop_waits_five_seconds_for_a_handler_that_ignores_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: on the default ``stop_timeout``, `Worker.stop` returns
    exactly 5 seconds after it began when a handler ignores its cancellation,
    while ``run`` goes on until that handler exits."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("stop-timeout")
            await enqueue(queue, 1)
            started = trio.Event()

            async def stubborn(task: Task, ctx: TaskContext) -> None:
                started.set()
                with trio.CancelScope(shield=True):
                    await trio.sleep(60)

            worker = queue.worker(stubborn)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait()
                began = trio.current_time()
                await worker.stop()
                assert trio.current_time() == began + 5
                assert worker.running == 1
            assert trio.current_time() == began + 60


async def test_run_gives_up_after_three_failed_recoveries_in_a_row(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a worker whose Work stream cannot open raises the cause from
    ``run`` after three failures in a row (not retrying forever, not giving
    up sooner), each after the connection's recovery; a stream that
    registered starts the count again: here two failures, a stream that
    registers and is then ended by the daemon, and three more failures,
    six opens in all."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            connection = env.client._connection
            open_stream = connection.open_stream
            opened: list[str] = []
            recoveries: list[bool] = []

            @asynccontextmanager
            async def flaky(method: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                opened.append(method)
                if len(opened) != 3:
                    raise UnavailableError("the daemon is away")
                # The registration goes through; then the stream ends.
                send, receive = anyio.create_memory_object_stream[Any](1)
                async with open_stream(method, *args, **kwargs) as channels, receive:

                    async def registration_only() -> None:
                        async with send:
                            await send.send(await channels.receive.receive())

                    helpers.start_soon(registration_only)
                    yield StreamChannels(channels.send, receive)

            async def recover(failed: object, *, session_rejected: bool) -> None:
                recoveries.append(session_rejected)

            monkeypatch.setattr(connection, "open_stream", flaky)
            monkeypatch.setattr(connection, "recover", recover)
            worker = env.client.queue("away").worker(_ok)
            async with trio.open_nursery() as helpers:
                with pytest.raises(UnavailableError, match="the daemon is away"):
                    await worker.run()
    assert opened == ["Work"] * 6
    assert recoveries == [False] * 6


async def test_a_worker_set_to_concurrency_zero_takes_no_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: ``set_concurrency(0)`` pauses a running worker: tasks
    enqueued while it is at zero stay PENDING, unleased (none is held back
    in the worker either); raising it again runs every one of them."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("paused-worker")
            seen: list[str] = []
            all_seen = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                seen.append(task.id)
                if len(seen) == 3:
                    all_seen.set()

            worker = queue.worker(handle)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await worker.set_concurrency(0)
                ids = await enqueue(queue, 3)
                await trio.sleep(10)
                assert seen == []
                tasks = [await queue.get_by_id(i) for i in ids]
                assert [t.state for t in tasks] == [TaskState.PENDING] * 3
                await worker.set_concurrency(2)
                await all_seen.wait()
                await worker.close()
            assert sorted(seen) == sorted(ids)


async def test_on_idle_waits_for_a_handler_the_daemon_no_longer_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: ``on_idle`` never fires while a handler still runs, even one
    whose task the daemon no longer counts as active (cancelled by an
    operator, its handler slow to exit): it fires only after that handler
    has exited and the queue then stayed quiet."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("idle-lingering")
            await enqueue(queue, 1, unique_key="job")
            started, idle = trio.Event(), trio.Event()
            exited_at: list[float] = []
            idle_at: list[float] = []

            async def lingering(task: Task, ctx: TaskContext) -> None:
                started.set()
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(30)
                    exited_at.append(trio.current_time())

            def on_idle() -> None:
                idle_at.append(trio.current_time())
                idle.set()

            worker = queue.worker(lingering, on_idle=on_idle)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait()
                await queue.cancel("job", reason="not needed")
                assert await queue.active_count() == 0
                await idle.wait()
                await worker.close()
    [exited] = exited_at
    [fired] = idle_at
    assert exited < fired


async def test_no_start_counts_from_the_push_not_from_the_clocks_origin(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a task pushed to a worker with a ``no_start`` limit, long
    after the worker's clock began, starts at once and succeeds: the wait
    is measured from the push's arrival (a worker that measured it from
    anywhere earlier would hand every task back and fence itself)."""
    with trio.fail_after(600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("no-start")
            seen: list[str] = []
            worker = queue.worker(
                lambda task, ctx: seen.append(task.id),
                task_timeouts=TaskTimeouts(no_start=timedelta(seconds=5)),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await trio.sleep(100)
                ids = await enqueue(queue, 2)
                await wait_states(queue, ids, {TaskState.SUCCEEDED})
                await worker.close()
    assert sorted(seen) == sorted(ids)
