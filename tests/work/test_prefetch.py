"""A worker's ``prefetch``: leases held beyond ``concurrency``, waiting for a slot.

Real daemons and streams; each test names the property a user relies on and
runs under a ``fail_after`` guard.
"""

from __future__ import annotations

import pathlib
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    AdaptiveConcurrency,
    InvalidArgumentError,
    Ringo,
    Task,
    TaskContext,
    TaskQueue,
    TaskState,
    TaskTimeouts,
)
from ringo_trio._contract.versions import MINOR
from ringo_trio._contract.work.client import GRANT_CAP, PREFETCH_GRANT_CAP
from ringo_trio.testing import RingoTestEnv
from tests._kit.processes import eventually
from tests._kit.workers import Concurrent, enqueue, running, wait_states

pytestmark = pytest.mark.trio


async def _leased(queue: TaskQueue, ids: list[str]) -> int:
    return sum([(await queue.get_by_id(i)).state is TaskState.LEASED for i in ids])


async def _until_leased(queue: TaskQueue, ids: list[str], n: int) -> None:
    with trio.fail_after(10):
        while True:
            if await _leased(queue, ids) >= n:
                return
            await trio.sleep(0.05)


async def test_prefetched_tasks_wait_for_a_slot_and_run_exactly_once(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """The daemon leases ``concurrency + prefetch`` tasks to the worker, but
    never more than ``concurrency`` handlers run at once; every task runs
    exactly once, on its first attempt (no task lost or run twice, the bound
    holds)."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("prefetch")
            ids = await enqueue(queue, 30)
            gate = trio.Event()
            seen: list[tuple[str, int]] = []
            handlers = Concurrent()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    seen.append((task.id, ctx.attempt))
                    await gate.wait()

            async with running(queue.worker(handle, concurrency=2, prefetch=3)):
                await eventually(lambda: handlers.now == 2, within=10)
                # Two run, three more wait here leased: five leases in all.
                await _until_leased(queue, ids, 5)
                await trio.sleep(0.2)
                assert await _leased(queue, ids) == 5
                assert handlers.now == 2
                gate.set()
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=40)
            assert handlers.peak == 2
            assert sorted(seen) == sorted((i, 1) for i in ids)


async def test_a_stopping_worker_hands_prefetched_tasks_back_at_once(
    tmp_path: pathlib.Path,
) -> None:
    """Closing hands the tasks still waiting for a slot back unrun at once —
    PENDING again while the running handler's grace period goes on — and
    their attempt is not spent: the next worker runs them as attempt 1."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("handback")
            ids = await enqueue(queue, 4)
            gate = trio.Event()
            started: list[str] = []

            async def slow(task: Task, ctx: TaskContext) -> None:
                started.append(task.id)
                await gate.wait()

            worker = queue.worker(
                slow, concurrency=1, prefetch=3, grace_period=timedelta(seconds=30)
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await _until_leased(queue, ids, 4)
                assert len(started) == 1
                nursery.start_soon(worker.close)
                waiting = [i for i in ids if i not in started]
                # Well within the 30 s grace: the running handler still runs.
                await wait_states(queue, waiting, {TaskState.PENDING}, within=5)
                assert not gate.is_set()
                assert (await queue.get_by_id(started[0])).state is TaskState.LEASED
                gate.set()
            assert (await queue.get_by_id(started[0])).state is TaskState.SUCCEEDED

            attempts: dict[str, int] = {}

            async def record(task: Task, ctx: TaskContext) -> None:
                attempts[task.id] = ctx.attempt

            async with running(queue.worker(record, concurrency=4)):
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=20)
            assert attempts == {i: 1 for i in waiting}


async def test_prefetch_arguments_are_checked(tmp_path: pathlib.Path) -> None:
    """A negative or non-integer prefetch, or one with a shared controller
    (whose permits count running handlers only), is refused when the worker
    is made, naming the argument."""

    async def handle(task: Task, ctx: TaskContext) -> None:
        return None

    with trio.fail_after(20):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("args")
            for bad in (-1, True, 1.5, "2"):
                with pytest.raises(InvalidArgumentError, match="prefetch"):
                    queue.worker(handle, prefetch=bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError, match="prefetch"):
                queue.worker(handle, concurrency=AdaptiveConcurrency(max=8), prefetch=2)
            with pytest.raises(InvalidArgumentError, match="concurrency"):
                queue.worker(handle, concurrency=2**31 - 2, prefetch=2)


async def test_a_prefetching_worker_grants_credit_in_larger_batches(
    tmp_path: pathlib.Path,
) -> None:
    """A worker that prefetches asks for freed slots PREFETCH_GRANT_CAP at a
    time (its waiting tasks keep the slots busy meanwhile), one that does
    not GRANT_CAP at a time (a freed slot must not idle): the cap each
    worker's Work session is made with."""

    async def handle(task: Task, ctx: TaskContext) -> None:
        return None

    with trio.fail_after(20):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("grants")
            plain = queue.worker(handle, concurrency=64)
            prefetching = queue.worker(handle, concurrency=64, prefetch=64)
            assert plain._new_session(MINOR, 64).grant_cap == GRANT_CAP
            assert prefetching._new_session(MINOR, 128).grant_cap == PREFETCH_GRANT_CAP
            assert PREFETCH_GRANT_CAP > GRANT_CAP


async def test_a_cancelled_run_hands_every_lease_back_unspent(tmp_path: pathlib.Path) -> None:
    """A cancel scope around ``run`` (what a terminal's Ctrl-C or a parent's
    cancellation does) while tasks wait for a slot and one runs: every lease
    goes back at once — the running one and the prefetched ones — PENDING,
    no attempt spent (the next worker sees attempt 1 for all of them)."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("cancelled")
            ids = await enqueue(queue, 4)
            started = trio.Event()

            async def stuck(task: Task, ctx: TaskContext) -> None:
                started.set()
                await trio.sleep_forever()

            worker = queue.worker(stuck, concurrency=1, prefetch=3)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    await started.wait()
                    await _until_leased(queue, ids, 4)
                    scope.cancel()
            await wait_states(queue, ids, {TaskState.PENDING}, within=5)

            attempts: dict[str, int] = {}

            async def record(task: Task, ctx: TaskContext) -> None:
                attempts[task.id] = ctx.attempt

            async with running(queue.worker(record, concurrency=4)):
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=20)
            assert attempts == {i: 1 for i in ids}


async def test_raising_concurrency_starts_waiting_tasks_at_once(tmp_path: pathlib.Path) -> None:
    """``set_concurrency`` on a prefetching worker whose slots are all busy:
    the tasks already waiting start at once, up to the new bound, without
    any running handler having to finish first (and never beyond it)."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("resize")
            ids = await enqueue(queue, 5)
            gate = trio.Event()
            handlers = Concurrent()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    await gate.wait()

            worker = queue.worker(handle, concurrency=1, prefetch=4)
            async with running(worker):
                await _until_leased(queue, ids, 5)
                assert handlers.now == 1
                await worker.set_concurrency(3)
                await eventually(lambda: handlers.now == 3, within=10)
                await trio.sleep(0.2)
                assert handlers.now == 3
                gate.set()
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=40)
            assert handlers.peak == 3


async def test_a_waiting_task_cancelled_by_an_operator_never_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancelling a task whose lease waits in a prefetching worker for a
    slot: its handler never starts (not even once the slot frees), the task
    stays CANCELLED with its one attempt, and the place it held is free
    again — the task behind it, pushed later, runs (no slot, credit or
    memory of it kept, no task lost)."""
    lease = timedelta(seconds=9)
    with trio.fail_after(100):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-waiting")
            first = (await queue.enqueue(task_type="t", unique_key="first")).task.id
            waiting = (await queue.enqueue(task_type="t", unique_key="waiting")).task.id
            gate = trio.Event()
            started: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.append(task.id)
                if task.id == first:
                    await gate.wait()

            worker = queue.worker(handle, concurrency=1, prefetch=1, lease_duration=lease)
            async with running(worker):
                await _until_leased(queue, [first, waiting], 2)
                await queue.cancel("waiting", reason="not needed")
                # The lease's next renewal tells the worker; long past it:
                await trio.sleep(3 * lease.total_seconds())
                slots = worker._handlers.slots
                assert slots is not None
                assert not slots.queue  # nothing kept of the cancelled task
                later = (await queue.enqueue(task_type="t", unique_key="later")).task.id
                await _until_leased(queue, [later], 1)
                gate.set()
                await wait_states(queue, [first, later], {TaskState.SUCCEEDED}, within=60)
            stored = await queue.get_by_id(waiting)
    assert started == [first, later]
    assert stored.state is TaskState.CANCELLED
    assert stored.attempt == 1


async def test_a_task_that_waited_for_its_slot_then_runs_like_any_other(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a prefetched task that waited for its slot far longer than
    ``no_start`` starts and succeeds — no_start counts from the slot, so a
    prefetch never fences the worker — and once started it is a running
    handler like any other: a stop cancels it and hands its lease back
    unspent (red when the wait counts toward no_start, or when a started
    task is still taken for a waiting one)."""
    with trio.fail_after(100):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("slot-wait")
            ids = await enqueue(queue, 3)
            started: list[str] = []
            last_started = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.append(task.id)
                if len(started) < 3:
                    await trio.sleep(5)  # the tasks behind it wait 5 s, then 10 s
                    return
                last_started.set()
                await trio.sleep_forever()

            worker = queue.worker(
                handle,
                concurrency=1,
                prefetch=2,
                task_timeouts=TaskTimeouts(no_start=timedelta(seconds=1)),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await last_started.wait()
                await worker.stop()
            done = [await queue.get_by_id(i) for i in started]
    assert sorted(started) == sorted(ids)
    assert [(t.state, t.attempt) for t in done] == [
        (TaskState.SUCCEEDED, 1),
        (TaskState.SUCCEEDED, 1),
        (TaskState.PENDING, 0),  # released: its attempt not spent
    ]
