"""Worker properties that only wait for time, in virtual time.

Lease renewal, lease expiry, the grace period and on_idle's quiet second are
the worker's and the daemon's own logic; what a test of them waits for is the
clock. These run the daemon in process on trio's autojump clock
(`ringo_trio.testing.RingoTestEnv`): the same worker, protocol and storage
engine as against ``ringod``, but a 60 s handler or a lease running out
costs no real time. What needs a real process (a killed daemon, a cut
stream, old daemons, the local daemon's lifecycle) stays in test_worker.py.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
import trio
import trio.testing
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio import InvalidArgumentError, Task, TaskContext, TaskState
from ringo_trio.testing import RingoTestEnv
from tests._kit.processes import eventually
from tests._kit.workers import Concurrent, enqueue, running, wait_states

pytestmark = pytest.mark.trio


def steal_lease(data_dir: Path, task_id: str) -> None:
    """Make the worker's lease stale behind its back, as a clock jump would."""
    with sqlite3.connect(data_dir / "ringo.db", timeout=10) as db:
        db.execute("UPDATE tasks SET lease_token = 'stolen' WHERE id = ?", (task_id,))


async def test_a_long_handler_keeps_its_lease(autojump_clock: trio.testing.MockClock) -> None:
    """Leases are renewed before they expire: a handler running several lease
    durations finishes on its first attempt."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("long")
            [task_id] = await enqueue(queue, 1)

            async def handle(task: Task, ctx: TaskContext) -> None:
                await trio.sleep(5)  # two and a half 2 s leases

            worker = queue.worker(handle, lease_duration=timedelta(seconds=2))
            async with running(worker):
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
            assert task.attempt == 1


async def test_lease_loss_cancels_only_its_handler(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A lost lease cancels exactly the handler holding it (ctx.cancelled and
    wait_cancelled fire); the other handler runs on and acks; the lost task
    is delivered again and succeeds."""
    with trio.fail_after(40):
        async with RingoTestEnv.start(data_dir=tmp_path) as env:
            queue = env.client.queue("loss")
            [victim, bystander] = await enqueue(queue, 2)
            started: dict[str, trio.Event] = {victim: trio.Event(), bystander: trio.Event()}
            cancelled: list[tuple[str, int]] = []
            finish_bystander = trio.Event()
            attempts: dict[str, list[int]] = {victim: [], bystander: []}

            async def handle(task: Task, ctx: TaskContext) -> None:
                attempts[task.id].append(ctx.attempt)
                started[task.id].set()
                if ctx.attempt > 1:
                    return
                try:
                    if task.id == victim:
                        await ctx.wait_cancelled()
                        assert ctx.cancelled
                        await trio.sleep_forever()
                    await finish_bystander.wait()
                except trio.Cancelled:
                    cancelled.append((task.id, ctx.attempt))
                    raise

            worker = queue.worker(handle, concurrency=2, lease_duration=timedelta(seconds=3))
            async with running(worker):
                await started[victim].wait()
                await started[bystander].wait()
                steal_lease(tmp_path, victim)
                await eventually(lambda: bool(cancelled), within=10)
                assert cancelled == [(victim, 1)]
                finish_bystander.set()
                await wait_states(queue, [bystander], {TaskState.SUCCEEDED})
                # The stolen lease expires on the daemon; the task comes back.
                await wait_states(queue, [victim], {TaskState.SUCCEEDED}, within=20)
            assert attempts[bystander] == [1]
            assert attempts[victim] == [1, 2]


async def test_close_acks_handlers_that_finish_within_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Graceful close: no new work after close starts; a handler that finishes
    within the grace period is acked on the still-open stream; one that does
    not is cancelled and its task handed back (PENDING, not lost, its attempt
    not spent); when close
    returns no handler runs and no lease is renewed any more."""
    with trio.fail_after(40):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("grace")
            [quick, slow] = await enqueue(queue, 2)
            inside: set[str] = set()
            both_started = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                inside.add(task.id)
                try:
                    if len(inside) == 2:
                        both_started.set()
                    await both_started.wait()
                    await trio.sleep(0.5 if task.id == quick else 60)
                finally:
                    inside.discard(task.id)

            worker = queue.worker(
                handle,
                concurrency=2,
                grace_period=timedelta(seconds=2),
                lease_duration=timedelta(seconds=2),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await both_started.wait()
                late = await enqueue(queue, 1)
                await worker.close()
                assert inside == set()  # nothing of the worker still runs
            await worker.close()  # idempotent
            [quick_task, slow_task] = [await queue.get_by_id(t) for t in (quick, slow)]
            assert quick_task.state is TaskState.SUCCEEDED
            assert slow_task.state is TaskState.PENDING
            assert slow_task.attempt == 0  # released: stopping spends no attempt
            assert (await queue.get_by_id(late[0])).state is TaskState.PENDING
            # No renewal after close: a later look finds nothing LEASED by us.
            await env.sleep(2.5)
            for task_id in (quick, slow, late[0]):
                assert (await queue.get_by_id(task_id)).state is not TaskState.LEASED


async def test_close_returns_when_the_last_handler_finishes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a graceful close waits for the handlers still running, and
    for exactly as long as the slowest needs — not for the first to finish
    (the others would be cut short and handed back) and not for the whole
    grace period: with 0.25 s and 0.75 s handlers and a grace period of 1 s,
    both succeed and close returns 0.75 s after it was called."""
    with trio.fail_after(40):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("grace-end")
            ids = await enqueue(queue, 2)
            seconds = dict(zip(ids, (0.25, 0.75), strict=True))
            started: list[str] = []
            both_started = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.append(task.id)
                if len(started) == 2:
                    both_started.set()
                await both_started.wait()
                await trio.sleep(seconds[task.id])

            worker = queue.worker(handle, concurrency=2, grace_period=timedelta(seconds=1))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await both_started.wait()
                began = trio.current_time()
                await worker.close()
                took = trio.current_time() - began
            states = [(await queue.get_by_id(i)).state for i in ids]
    assert states == [TaskState.SUCCEEDED] * 2
    assert 0.75 <= took < 0.9


async def test_on_idle_fires_once_after_the_queue_drains(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """on_idle fires exactly once, only after every task is done and the queue
    has been idle ~1 s; the worker keeps running after it returns normally."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("idle")
            ids = await enqueue(queue, 20)
            fired: list[float] = []

            def on_idle() -> None:
                fired.append(trio.current_time())

            async def handle(task: Task, ctx: TaskContext) -> None:
                await trio.sleep(0.01)

            worker = queue.worker(handle, concurrency=4, on_idle=on_idle)
            async with running(worker):
                await eventually(lambda: bool(fired), within=15)
                tasks = [await queue.get_by_id(t) for t in ids]
                assert all(t.state is TaskState.SUCCEEDED for t in tasks)
                await env.sleep(1.5)
            assert len(fired) == 1


async def _drop_work_streams(env: RingoTestEnv) -> None:
    """The daemon ends every open Work stream UNAVAILABLE, as a storage outage
    or a dropped connection would: its leases stay with the worker (until
    they expire), whose handlers are cancelled; the worker reconnects."""

    async def drop() -> None:
        for work in list(env.daemon.queue_service.work_streams._live):
            work._end(GRPCError(Status.UNAVAILABLE, "the test dropped the stream"))

    await env._run_aio(drop())


async def test_a_slot_held_by_a_zombie_is_never_offered_to_the_next_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At most ``concurrency`` handlers run, zombies included. concurrency=1,
    and the one handler ignores its cancellation after its stream drops: the
    next stream gets no work while it runs — not even once its lease has
    expired and its own task is claimable again, nor with more tasks waiting —
    however long that takes. Once it exits, its slot is granted and every
    task is worked, one at a time."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("zombie")
            [stubborn] = await enqueue(queue, 1)
            started = trio.Event()
            may_end = trio.Event()
            handlers = Concurrent()
            seen: list[tuple[str, int]] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    seen.append((task.id, ctx.attempt))
                    if task.id == stubborn and ctx.attempt == 1:
                        started.set()
                        with trio.CancelScope(shield=True):
                            await may_end.wait()
                        return
                    await trio.sleep(0.01)

            worker = queue.worker(handle, concurrency=1, lease_duration=timedelta(seconds=2))
            async with running(worker):
                await started.wait()
                try:
                    await _drop_work_streams(env)
                    others = await enqueue(queue, 3)
                    # Long enough to reconnect, for the zombie's lease to expire
                    # (its task claimable again) and for many claims on the new stream.
                    await env.sleep(30)
                    assert handlers.peak == 1
                    assert seen == [(stubborn, 1)]
                    assert worker.running == 1  # the zombie, still holding the one slot
                    for task_id in others:
                        assert (await queue.get_by_id(task_id)).state is TaskState.PENDING
                finally:
                    may_end.set()  # a failing test must not leave it running
                await wait_states(queue, [stubborn, *others], {TaskState.SUCCEEDED}, within=30)
            assert handlers.peak == 1
            assert (stubborn, 2) in seen  # its expired lease was worked again


async def test_bad_progress_arguments_are_refused_and_the_handler_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: ``report_progress`` refuses what is not a number (a bool
    included: True is no progress figure) or a message that is not a str,
    with `InvalidArgumentError` naming the argument, before anything is
    sent; the lease is untouched, so a correct report after it is stored
    and the task succeeds."""
    bad: list[tuple[dict[str, object], str]] = [
        ({"current": True}, "current"),
        ({"current": "1"}, "current"),
        ({"current": None}, "current"),
        ({"current": 1, "total": False}, "total"),
        ({"current": 1, "total": b"2"}, "total"),
        ({"current": 1, "message": b"bytes"}, "message"),
    ]
    refused: list[str] = []
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("progress-args")
            [task_id] = await enqueue(queue, 1)

            async def handle(task: Task, ctx: TaskContext) -> None:
                for kwargs, _ in bad:
                    with pytest.raises(InvalidArgumentError) as info:
                        await ctx.report_progress(**kwargs)  # type: ignore[arg-type]
                    refused.append(str(info.value))
                await ctx.report_progress(3, 4, "fine")

            async with running(queue.worker(handle)):
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
    assert [what in text for (_, what), text in zip(bad, refused, strict=True)] == [True] * len(bad)
    assert task.progress is not None
    assert (task.progress.current, task.progress.total, task.progress.message) == (3, 4, "fine")
