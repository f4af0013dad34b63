"""Typed tasks end to end on an in-process daemon (virtual time): enqueue,
the router worker, awaited results and their errors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import pytest
import trio
import trio.testing

from ringo_trio import (
    InvalidArgumentError,
    RetryTaskError,
    TaskCancelledError,
    TaskContext,
    TaskFailedError,
    TaskRegistry,
    TaskState,
)
from ringo_trio._contract.limits import MAX_WAITS_PER_CONNECTION
from ringo_trio.testing import RingoTestEnv

pytestmark = pytest.mark.trio


@dataclass
class Receipt:
    message_id: str
    cost: Decimal


tasks = TaskRegistry(queue="emails")
sent: list[tuple[str, str]] = []


@tasks.task(max_attempts=5)
async def send_email(to: str, subject: str, ctx: TaskContext) -> Receipt:
    sent.append((to, subject))
    if subject == "flaky" and ctx.task.attempt < 3:
        raise RetryTaskError("smtp busy", delay=timedelta(minutes=1))
    if subject == "broken":
        raise RuntimeError("smtp says no")
    return Receipt(message_id=f"m-{ctx.task.attempt}", cost=Decimal("0.10"))


@tasks.task
def shout(text: str) -> str:
    return text.upper()


async def test_enqueue_run_and_await_a_typed_result(autojump_clock: trio.testing.MockClock) -> None:
    """Property: what a task function returns comes back from
    ``handle.result()`` decoded to its return annotation (a dataclass with a
    Decimal, exactly), for async and plain functions alike."""
    async with RingoTestEnv.start() as env:
        handle = await send_email.enqueue(env.client, to="a@example.org", subject="hi")
        plain = await shout.enqueue(env.client, "quiet")
        assert handle.created
        assert (await handle.status()).state is TaskState.PENDING
        async with trio.open_nursery() as nursery:
            worker = tasks.worker(env.client, concurrency=4)
            await nursery.start(worker.run)
            receipt = await handle.result(timeout=30)
            assert await plain.result(timeout=30) == "QUIET"
            await worker.close()
        assert receipt == Receipt(message_id="m-1", cost=Decimal("0.10"))
        assert (await handle.status()).state is TaskState.SUCCEEDED


async def test_retries_then_the_result(autojump_clock: trio.testing.MockClock) -> None:
    """Property: RetryTaskError in a typed task retries as in a raw handler;
    the awaited result is the successful attempt's."""
    async with RingoTestEnv.start() as env:
        handle = await send_email.enqueue(env.client, to="b@example.org", subject="flaky")
        assert await env.run_worker(tasks) == 3
        assert (await handle.result(timeout=0)).message_id == "m-3"


async def test_a_failed_task_raises_task_failed_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a task that ends DEAD makes ``result()`` raise
    TaskFailedError carrying the task and its last error."""
    async with RingoTestEnv.start() as env:
        handle = await send_email.configure(max_attempts=2).enqueue(
            env.client, to="c@example.org", subject="broken"
        )
        await env.run_worker(tasks)
        with pytest.raises(TaskFailedError) as caught:
            await handle.result(timeout=5)
        assert caught.value.task.state is TaskState.DEAD
        assert caught.value.task.attempt == 2
        assert "smtp says no" in (caught.value.last_error or "")


async def test_arguments_that_do_not_validate_are_dead_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a payload that is not the registry's encoding, or does not
    validate against the annotations, makes the task DEAD on its first
    attempt with the validation error as last_error — never retried, and
    the function never called."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        wrong_type = await queue.enqueue(
            task_type=send_email.name, payload=b'{"to": 5, "subject": "x"}', max_attempts=5
        )
        not_json = await queue.enqueue(task_type=send_email.name, payload=b"\xff", max_attempts=5)
        before = len(sent)
        await env.run_worker(tasks)
        for enqueued in (wrong_type, not_json):
            task = await queue.get_by_id(enqueued.task.id)
            assert (task.state, task.attempt) == (TaskState.DEAD, 1), task
            assert send_email.name in (task.last_error or ""), task.last_error
        assert "to" in (await queue.get_by_id(wrong_type.task.id)).last_error  # type: ignore[operator]
        assert len(sent) == before


async def test_the_router_takes_only_its_task_types(autojump_clock: trio.testing.MockClock) -> None:
    """Property: a registry's worker registers only its tasks' types; a task
    of another type on the same queue is never leased to it (PENDING, no
    attempt spent) and stays for another worker."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        other = await queue.enqueue(task_type="someone-else", payload=b"raw")
        mine = await shout.enqueue(env.client, "x")
        async with trio.open_nursery() as nursery:
            worker = tasks.worker(env.client)
            await nursery.start(worker.run)
            assert await mine.result(timeout=30) == "X"
            await env.sleep(minutes=5)
            await worker.close()
        untouched = await queue.get_by_id(other.task.id)
        assert (untouched.state, untouched.attempt) == (TaskState.PENDING, 0)
        assert await mine.result(timeout=0) == "X"


async def test_cancelled_and_timed_out_waits(autojump_clock: trio.testing.MockClock) -> None:
    """Property: ``result()`` raises TaskCancelledError for a cancelled
    task, and TimeoutError when the wait ends first — the task untouched
    (still PENDING, its attempt unspent)."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        waiting = await shout.enqueue(env.client, "later")
        with pytest.raises(TimeoutError):
            await waiting.result(timeout=timedelta(seconds=2))
        task = await waiting.status()
        assert (task.state, task.attempt) == (TaskState.PENDING, 0)
        await queue.cancel_by_id(waiting.task_id)
        with pytest.raises(TaskCancelledError):
            await waiting.result(timeout=1)


async def test_enqueue_many_and_unique_keys(autojump_clock: trio.testing.MockClock) -> None:
    """Property: enqueue_many gives one handle per argument set, in order;
    a unique key dedupes to the existing task's handle (created False)."""
    async with RingoTestEnv.start() as env:
        handles = await shout.enqueue_many(env.client, [{"text": f"t{i}"} for i in range(5)])
        first = await shout.configure(unique_key="once").enqueue(env.client, "a")
        again = await shout.configure(unique_key="once").enqueue(env.client, "b")
        assert (first.created, again.created, again.task_id) == (True, False, first.task_id)
        await env.run_worker(tasks)
        assert [await h.result(timeout=0) for h in handles] == [f"T{i}" for i in range(5)]
        assert await again.result(timeout=0) == "A"


async def test_two_registries_may_not_split_a_task_name_on_one_queue(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a task name on a queue means one function: a second
    registry's worker of the same client and queue with that name is
    refused; the same registry may run several workers."""
    other = TaskRegistry(queue="emails")
    other.task(name=shout.name)(shout.fn)
    async with RingoTestEnv.start() as env:
        tasks.worker(env.client)
        tasks.worker(env.client)
        with pytest.raises(InvalidArgumentError, match="another registry"):
            other.worker(env.client)


async def test_more_waits_than_the_daemon_parks_per_connection_all_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: awaiting more results at once than the daemon parks per
    connection (MAX_WAITS_PER_CONNECTION) neither fails with
    RESOURCE_EXHAUSTED nor loses an answer: the extra waits queue in the
    client until a slot frees."""
    count = MAX_WAITS_PER_CONNECTION * 2 + 5
    async with RingoTestEnv.start() as env:
        handles = await shout.enqueue_many(env.client, [{"text": f"t{i}"} for i in range(count)])
        results: dict[int, str] = {}
        all_answered = trio.Event()

        async def wait(i: int) -> None:
            results[i] = await handles[i].result(timeout=600)
            if len(results) == count:
                all_answered.set()

        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(wait, i)
            await trio.sleep(1)
            worker = tasks.worker(env.client, concurrency=16)
            await nursery.start(worker.run)
            await all_answered.wait()
            await worker.close()
        assert results == {i: f"T{i}" for i in range(count)}


async def test_a_limit_key_per_call_is_the_tasks_key(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: ``configure(limit_key=...)`` sets the enqueued task's
    limit_key, so the queue's rules apply to typed tasks too: at 1 start
    per minute on a tenant's key, its two tasks start a minute apart while
    another tenant's starts at once."""
    limited = TaskRegistry(queue="limited")
    started: dict[str, float] = {}

    @limited.task(name="record")
    async def record(text: str) -> None:
        started[text] = trio.current_time()

    async with RingoTestEnv.start() as env:
        await env.client.queue("limited").set_limit("tenant:", rate=1, per=timedelta(minutes=1))
        first = await record.configure(limit_key="tenant:a").enqueue(env.client, "a1")
        await record.configure(limit_key="tenant:a").enqueue(env.client, "a2")
        await record.configure(limit_key="tenant:b").enqueue(env.client, "b1")
        assert (await first.status()).limit_key == "tenant:a"
        await env.run_worker(limited)
    assert started["a2"] - started["a1"] >= 60 - 0.05
    assert abs(started["b1"] - started["a1"]) < 1
