"""RingoTestEnv.run_worker and task_context: driving handlers in tests."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    InvalidArgumentError,
    LeaseLostError,
    RetryBackoff,
    RetryTaskError,
    Task,
    TaskContext,
    TaskState,
)
from ringo_trio._work._handlers import Handler
from ringo_trio.testing import RingoTestEnv, TestTaskContext, task_context

pytestmark = pytest.mark.trio

HOUR = timedelta(hours=1)


async def test_until_settled_waits_out_future_retries_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: run_worker(until="settled") returns only once every task is
    SUCCEEDED or DEAD, skipping (virtually) the hour-long retry delays in
    between; a task that succeeds on its third attempt is SUCCEEDED with
    attempt 3 when it returns."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        backoff = RetryBackoff(initial=HOUR, maximum=HOUR)
        flaky = await queue.enqueue(task_type="send", max_attempts=5, retry_backoff=backoff)
        doomed = await queue.enqueue(task_type="send", max_attempts=2, retry_backoff=backoff)
        begin = trio.current_time()

        async def handler(task: Task, ctx: TaskContext) -> None:
            if task.id == doomed.task.id or task.attempt < 3:
                raise RetryTaskError(f"try again ({task.attempt})")

        calls = await env.run_worker(queue, handler, until="settled")
        assert calls == 3 + 2
        flaky_task = await queue.get_by_id(flaky.task.id)
        doomed_task = await queue.get_by_id(doomed.task.id)
        assert (flaky_task.state, flaky_task.attempt) == (TaskState.SUCCEEDED, 3)
        assert (doomed_task.state, doomed_task.attempt) == (TaskState.DEAD, 2)
        assert doomed_task.last_error == "try again (2)"
        assert trio.current_time() - begin >= 2 * 3600
        assert await queue.active_count() == 0


async def test_until_idle_leaves_future_tasks_pending_without_waiting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: run_worker(until="idle") returns once nothing is due or
    running: a task scheduled a day ahead stays PENDING, unattempted, and
    the (virtual) day does not pass."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        now = await queue.enqueue(task_type="t")
        later = await queue.enqueue(task_type="t", delay=timedelta(days=1))
        begin = trio.current_time()
        ran: list[str] = []

        async def handler(task: Task, ctx: TaskContext) -> None:
            ran.append(task.id)

        assert await env.run_worker(queue, handler, until="idle") == 1
        assert ran == [now.task.id]
        left = await queue.get_by_id(later.task.id)
        assert (left.state, left.attempt) == (TaskState.PENDING, 0)
        assert trio.current_time() - begin < 24 * 3600


class _Idle(Exception):
    pass


async def test_on_idle_waits_for_scheduled_tasks_only_when_told_to(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: in virtual time, with a task scheduled a minute ahead, a
    default worker's on_idle fires only after that minute, once the task has
    run; a worker with idle_counts_scheduled=False fires before the minute,
    the task still PENDING and unattempted (the daemon's clock decides what
    is due)."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        # A minute, not more: the default worker polls every 250 ms meanwhile.
        later = await queue.enqueue(task_type="t", delay=timedelta(minutes=1))

        async def idle_after(counts_scheduled: bool) -> float:
            def on_idle() -> None:
                raise _Idle

            begin = trio.current_time()
            worker = queue.worker(
                lambda task, ctx: None, on_idle=on_idle, idle_counts_scheduled=counts_scheduled
            )
            with pytest.raises(_Idle):
                await worker.run()
            return trio.current_time() - begin

        assert await idle_after(counts_scheduled=False) < 60
        left = await queue.get_by_id(later.task.id)
        assert (left.state, left.attempt) == (TaskState.PENDING, 0)
        assert await idle_after(counts_scheduled=True) >= 50
        done = await queue.get_by_id(later.task.id)
        assert (done.state, done.attempt) == (TaskState.SUCCEEDED, 1)


async def test_until_a_count_stops_after_that_many_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: run_worker(until=n) returns after n handler calls, each
    settled; the rest of the queue is untouched (PENDING, no attempt spent)."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        for i in range(5):
            await queue.enqueue(task_type="t", payload=str(i).encode(), priority=10 - i)
        done: list[bytes] = []

        async def handler(task: Task, ctx: TaskContext) -> None:
            done.append(task.payload)

        assert await env.run_worker(queue, handler, until=2) == 2
        assert done == [b"0", b"1"]
        assert await queue.active_count() == 3


async def test_until_must_be_settled_idle_or_a_positive_count(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a misspelt or non-positive ``until`` is refused before any work."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")

        async def handler(task: Task, ctx: TaskContext) -> None:
            raise AssertionError("never runs")

        for bad in ("setled", 0, True, -1):
            with pytest.raises(InvalidArgumentError):
                await env.run_worker(queue, handler, until=bad)  # type: ignore[arg-type]


async def test_task_context_records_progress_and_honours_cancellation() -> None:
    """Property: a handler called directly with task_context() reports
    progress into ctx.progress; ctx.cancel() wakes wait_cancelled, sets
    cancelled, and a later progress report raises LeaseLostError."""
    ctx = task_context(task_type="resize", payload=b"img", attempt=2, max_attempts=4)
    assert (ctx.task.task_type, ctx.task.payload, ctx.attempt, ctx.max_attempts) == (
        "resize",
        b"img",
        2,
        4,
    )
    outcome: list[str] = []

    async def handler(task: Task, ctx: TaskContext) -> None:
        await ctx.report_progress(1, 3, "first third")
        await ctx.wait_cancelled()
        try:
            await ctx.report_progress(2, 3)
        except LeaseLostError:
            outcome.append("lease lost")

    with trio.fail_after(5):
        await run_cancelled(handler, ctx)
    assert ctx.cancelled
    assert outcome == ["lease lost"]
    assert len(ctx.progress) == 1


async def run_cancelled(handler: Handler, ctx: TestTaskContext) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, ctx.task, ctx)
        await trio.testing.wait_all_tasks_blocked()
        assert [(p.current, p.total, p.message) for p in ctx.progress] == [
            (1.0, 3.0, "first third")
        ]
        assert not ctx.cancelled
        ctx.cancel()
