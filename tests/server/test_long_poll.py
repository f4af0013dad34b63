"""Long-poll Claim wake-ups and the lease reaper, against a real daemon.

Timing bounds are generous on the slow side (a loaded 2-core CI box) but
always far below the wait_timeout, so a waiter that is *not* woken and only
returns at its timeout fails the test.
"""

from __future__ import annotations

import functools
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ClaimRequest,
    EnqueueManyRequest,
    ExtendLeaseRequest,
    LeasedTask,
    NackRequest,
    RejectRequest,
    RetryBackoff,
    RetryTaskRequest,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess

from ._client import Client, connect, expect_status, new_queue, ref

pytestmark = pytest.mark.anyio

LONG = timedelta(seconds=20)
# A woken waiter must return this much sooner than its wait_timeout.
PROMPT = 2.0


async def _claim_in_background(
    client: Client, queue: str, results: list[tuple[float, list[LeasedTask]]], **kwargs: object
) -> None:
    got = await client.claim(queue, wait_timeout=LONG, **kwargs)  # type: ignore[arg-type]
    results.append((time.monotonic(), got))


async def test_enqueue_wakes_a_waiting_claim_immediately(daemon: DaemonProcess) -> None:
    """Property: an enqueue reaches a long-polling Claim at once (no polling
    interval): the claim returns the new task right after the enqueue."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with connect(daemon) as waiter, connect(daemon) as producer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_claim_in_background, waiter, queue, results)
                await anyio.sleep(0.3)  # let the claim reach its wait
                assert results == []
                enqueued_at = time.monotonic()
                task = await producer.enqueue(queue)
            [(returned_at, got)] = results
            assert [g.task.id for g in got if g.task] == [task.id]
            assert returned_at - enqueued_at < 0.5


async def test_claim_without_work_returns_empty_after_wait_timeout(
    daemon: DaemonProcess,
) -> None:
    """Property: with nothing to claim, Claim answers an empty list once
    wait_timeout has passed (and at once for a zero/unset wait)."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            started = time.monotonic()
            assert await client.claim(queue, wait_timeout=timedelta(milliseconds=400)) == []
            elapsed = time.monotonic() - started
            assert 0.35 <= elapsed < PROMPT
            started = time.monotonic()
            assert await client.claim(queue) == []
            assert time.monotonic() - started < 0.5


async def test_nack_wakes_a_waiting_claim(daemon: DaemonProcess) -> None:
    """Property: a nack that makes a task claimable again wakes a waiter, which
    receives the next attempt."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with connect(daemon) as holder, connect(daemon) as waiter:
            task = await holder.enqueue(queue)
            [held] = await holder.claim(queue)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_claim_in_background, waiter, queue, results)
                await anyio.sleep(0.3)
                nacked_at = time.monotonic()
                await holder.stub.nack(
                    NackRequest(
                        context=holder.context, lease=ref(held), retry_delay_override=timedelta(0)
                    )
                )
            [(returned_at, [got])] = results
            assert got.task is not None
            assert got.task.id == task.id
            assert got.lease is not None
            assert got.lease.attempt == 2
            assert returned_at - nacked_at < PROMPT


async def test_waiting_claim_wakes_when_a_delayed_task_becomes_due(
    daemon: DaemonProcess,
) -> None:
    """Property: a waiter sleeps until the queue's next scheduled moment — a
    delayed task (or backoff) becoming due produces no event, yet is claimed
    as soon as it is due, and never before."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            task = await client.enqueue(queue, delay=timedelta(milliseconds=600))
            started = time.monotonic()
            [got] = await client.claim(queue, wait_timeout=LONG)
            elapsed = time.monotonic() - started
            assert got.task is not None
            assert got.task.id == task.id
            assert 0.5 <= elapsed < PROMPT


async def test_waiting_claim_recomputes_its_wakeup_when_an_earlier_task_is_scheduled(
    daemon: DaemonProcess,
) -> None:
    """Property: a waiter already asleep (nothing scheduled) learns of a task
    enqueued with a short delay and claims it when due, not at its timeout."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with connect(daemon) as waiter, connect(daemon) as producer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_claim_in_background, waiter, queue, results)
                await anyio.sleep(0.3)
                enqueued_at = time.monotonic()
                await producer.enqueue(queue, delay=timedelta(milliseconds=400))
            [(returned_at, [got])] = results
            assert got.task is not None
            assert 0.35 <= returned_at - enqueued_at < PROMPT


async def test_waiting_claim_takes_over_an_expired_lease(daemon: DaemonProcess) -> None:
    """Property: when a lease expires, a waiting claimer gets the task with the
    next attempt number and a fresh token, and the old ref is dead."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as holder, connect(daemon) as waiter:
            # No backoff, so the expiry moment is the moment it is claimable.
            await holder.enqueue(queue, retry_backoff=RetryBackoff(initial=timedelta(0)))
            [held] = await holder.claim(queue, lease_duration=timedelta(milliseconds=500))
            started = time.monotonic()
            [got] = await waiter.claim(queue, wait_timeout=LONG, worker_id="w2")
            assert time.monotonic() - started < PROMPT
            assert got.lease is not None
            assert held.lease is not None
            assert got.lease.attempt == 2
            assert got.lease.lease_token != held.lease.lease_token
            assert got.lease.worker_id == "w2"
            await expect_status(
                holder.stub.ack(AckRequest(context=holder.context, lease=ref(held))),
                Status.ABORTED,
            )


async def test_waiter_ignores_other_task_types_and_other_queues(
    daemon: DaemonProcess,
) -> None:
    """Property: a waiter filtered on task type "a" is not handed a "b" task or
    a task of another queue; it keeps waiting and takes the "a" task."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with connect(daemon) as waiter, connect(daemon) as producer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    functools.partial(
                        _claim_in_background, waiter, queue, results, task_types=["a"]
                    )
                )
                await anyio.sleep(0.2)
                await producer.enqueue(queue, task_type="b")
                await producer.enqueue(new_queue(), task_type="a")
                await anyio.sleep(0.3)
                assert results == []
                wanted = await producer.enqueue(queue, task_type="a")
            [(_, [got])] = results
            assert got.task is not None
            assert got.task.id == wanted.id
            assert await producer.activity(queue, "b") == 1


async def test_concurrent_waiters_each_get_distinct_tasks(daemon: DaemonProcess) -> None:
    """Property: several waiters woken by one batch share it out: every task
    is leased to exactly one waiter."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with AsyncExitStack() as stack:
            producer = await stack.enter_async_context(connect(daemon))
            waiters = [await stack.enter_async_context(connect(daemon)) for _ in range(3)]
            async with anyio.create_task_group() as tg:
                for waiter in waiters:
                    tg.start_soon(_claim_in_background, waiter, queue, results)
                await anyio.sleep(0.3)
                await producer.stub.enqueue_many(
                    EnqueueManyRequest(
                        context=producer.context,
                        queue=queue,
                        tasks=[TaskSpec(task_type="t") for _ in range(3)],
                    )
                )
            ids = [g.task.id for _, got in results for g in got if g.task]
            assert len(ids) == 3
            assert len(set(ids)) == 3


async def test_cancelled_long_poll_leaves_the_daemon_serving(daemon: DaemonProcess) -> None:
    """Property: a client abandoning a long-poll (deadline / disconnect) does
    not disturb the daemon: the claim leases nothing and later calls work."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            with anyio.move_on_after(0.3):
                await client.claim(queue, wait_timeout=LONG)
            task = await client.enqueue(queue)
            await anyio.sleep(0.1)
            assert (await client.get(queue, task.id)).state is TaskState.PENDING
            [got] = await client.claim(queue)
            assert got.task is not None
            assert got.task.id == task.id


async def test_reaper_expires_each_lease_at_its_deadline_with_nobody_claiming(
    daemon: DaemonProcess,
) -> None:
    """Property: an expired lease returns its task to PENDING at (about) its
    own deadline although no claim runs on the queue — leases ending 0.4 s,
    0.8 s (shortened by ExtendLease) and 1.3 s after the claim each flip on
    time, which neither a periodic sweep nor the other deadlines could do."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            deadlines: dict[str, datetime] = {}
            for lease in (timedelta(milliseconds=400), timedelta(milliseconds=1300)):
                task = await client.enqueue(queue)
                [leased] = await client.claim(queue, lease_duration=lease)
                assert leased.lease is not None
                assert leased.lease.until is not None
                deadlines[task.id] = leased.lease.until
            # An extension is an absolute reset: this one moves a long lease
            # *earlier*, and the reaper must learn the new deadline.
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue, lease_duration=timedelta(minutes=5))
            extended = await client.stub.extend_lease(
                ExtendLeaseRequest(
                    context=client.context,
                    lease=ref(leased),
                    extension=timedelta(milliseconds=800),
                )
            )
            assert extended.lease is not None
            assert extended.lease.until is not None
            deadlines[task.id] = extended.lease.until
            flipped: dict[str, datetime] = {}
            while len(flipped) < len(deadlines):
                for task_id in deadlines.keys() - flipped.keys():
                    state = await client.get(queue, task_id)
                    if state.state is not TaskState.LEASED:
                        assert state.state is TaskState.PENDING
                        assert state.attempt == 1
                        assert state.lease_until is None
                        flipped[task_id] = datetime.now(UTC)
                await anyio.sleep(0.03)
            for task_id, until in deadlines.items():
                late = (flipped[task_id] - until).total_seconds()
                assert 0 <= late < 0.4, f"expired {late:.3f}s after its deadline"


async def test_retry_wakes_a_waiting_claim(daemon: DaemonProcess) -> None:
    """Property: RetryTask makes a finished task claimable and wakes a waiter."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    with anyio.fail_after(15):
        async with connect(daemon) as waiter, connect(daemon) as admin:
            task = await admin.enqueue(queue)
            [held] = await admin.claim(queue)
            await admin.stub.reject(RejectRequest(context=admin.context, lease=ref(held)))
            async with anyio.create_task_group() as tg:
                tg.start_soon(_claim_in_background, waiter, queue, results)
                await anyio.sleep(0.3)
                retried_at = time.monotonic()
                await admin.stub.retry_task(
                    RetryTaskRequest(context=admin.context, queue=queue, task_id=task.id)
                )
            [(returned_at, [got])] = results
            assert got.task is not None
            assert got.task.id == task.id
            assert returned_at - retried_at < 0.5


async def test_long_poll_answers_before_the_client_deadline(daemon: DaemonProcess) -> None:
    """Property: a client deadline shorter than wait_timeout shortens the wait:
    the claim answers an empty list just before the deadline instead of being
    cut off with DEADLINE_EXCEEDED."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            started = time.monotonic()
            response = await client.stub.claim(
                ClaimRequest(
                    context=client.context,
                    queue=queue,
                    worker_id="w",
                    limit=1,
                    wait_timeout=LONG,
                ),
                timeout=1.0,
            )
            elapsed = time.monotonic() - started
            assert response.tasks == []
            assert 0.5 <= elapsed < 1.0
