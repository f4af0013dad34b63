"""Long-poll Claim wake-ups and the lease reaper, over gRPC, on virtual time.

Each test runs an in-process daemon on trio's MockClock (`tests/_kit/virtual_daemon.py`), so
*when* a waiter returns is exact: one woken by an event returns at that
event's virtual instant (within `PROMPT`), one woken by a timer at the
timer's deadline and never before, and a waiter that is *not* woken would
only return at its wait_timeout, far later, which fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

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
from tests._kit.grpc_client import Client, connect, expect_status, new_queue, ref
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, quiet, virtual_daemon

LONG = timedelta(seconds=20)


def _claim_in_background(
    client: Client, queue: str, results: list[tuple[float, list[LeasedTask]]], **kwargs: object
) -> asyncio.Task[None]:
    """A long-polling claim; it appends (virtual time it returned, its tasks)."""

    async def claim() -> None:
        got = await client.claim(queue, wait_timeout=LONG, **kwargs)  # type: ignore[arg-type]
        results.append((now(), got))

    return asyncio.create_task(claim())


@on_virtual_time
async def test_enqueue_wakes_a_waiting_claim_immediately() -> None:
    """Property: an enqueue reaches a long-polling Claim at once (no polling
    interval): the claim returns the new task at the enqueue's instant."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as producer,
    ):
        claim = _claim_in_background(waiter, queue, results)
        await quiet()  # the claim is waiting
        assert results == []
        enqueued_at = now()
        task = await producer.enqueue(queue)
        await claim
        [(returned_at, got)] = results
        assert [g.task.id for g in got if g.task] == [task.id]
        assert returned_at - enqueued_at < PROMPT


@on_virtual_time
async def test_claim_without_work_returns_empty_after_wait_timeout() -> None:
    """Property: with nothing to claim, Claim answers an empty list once
    wait_timeout has passed — not before — (and at once for a zero/unset
    wait)."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        started = now()
        assert await client.claim(queue, wait_timeout=timedelta(milliseconds=400)) == []
        assert 0.4 <= now() - started < 0.4 + PROMPT
        started = now()
        assert await client.claim(queue) == []
        assert now() - started < PROMPT


@on_virtual_time
async def test_nack_wakes_a_waiting_claim() -> None:
    """Property: a nack that makes a task claimable again wakes a waiter, which
    receives the next attempt at the nack's instant."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as holder,
        connect(served.daemon) as waiter,
    ):
        task = await holder.enqueue(queue)
        [held] = await holder.claim(queue)
        claim = _claim_in_background(waiter, queue, results)
        await quiet()
        nacked_at = now()
        await holder.stub.nack(
            NackRequest(context=holder.context, lease=ref(held), retry_delay_override=timedelta(0))
        )
        await claim
        [(returned_at, [got])] = results
        assert got.task is not None
        assert got.task.id == task.id
        assert got.lease is not None
        assert got.lease.attempt == 2
        assert returned_at - nacked_at < PROMPT


@on_virtual_time
async def test_waiting_claim_wakes_when_a_delayed_task_becomes_due() -> None:
    """Property: a waiter sleeps until the queue's next scheduled moment — a
    delayed task (or backoff) becoming due produces no event, yet is claimed
    as soon as it is due, and never before."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        task = await client.enqueue(queue, delay=timedelta(milliseconds=600))
        started = now()
        [got] = await client.claim(queue, wait_timeout=LONG)
        assert got.task is not None
        assert got.task.id == task.id
        assert 0.6 <= now() - started < 0.6 + PROMPT


@on_virtual_time
async def test_waiting_claim_recomputes_its_wakeup_when_an_earlier_task_is_scheduled() -> None:
    """Property: a waiter already asleep (nothing scheduled) learns of a task
    enqueued with a short delay and claims it when due, not at its timeout
    (and not before it is due)."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as producer,
    ):
        claim = _claim_in_background(waiter, queue, results)
        await quiet()
        enqueued_at = now()
        await producer.enqueue(queue, delay=timedelta(milliseconds=400))
        await claim
        [(returned_at, [got])] = results
        assert got.task is not None
        assert 0.4 <= returned_at - enqueued_at < 0.4 + PROMPT


@on_virtual_time
async def test_waiting_claim_takes_over_an_expired_lease() -> None:
    """Property: when a lease expires, a waiting claimer gets the task — at
    the expiry, not before — with the next attempt number and a fresh token,
    and the old ref is dead."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as holder,
        connect(served.daemon) as waiter,
    ):
        # No backoff, so the expiry moment is the moment it is claimable.
        await holder.enqueue(queue, retry_backoff=RetryBackoff(initial=timedelta(0)))
        [held] = await holder.claim(queue, lease_duration=timedelta(milliseconds=500))
        started = now()
        [got] = await waiter.claim(queue, wait_timeout=LONG, worker_id="w2")
        assert 0.5 <= now() - started < 0.5 + PROMPT
        assert got.lease is not None
        assert held.lease is not None
        assert got.lease.attempt == 2
        assert got.lease.lease_token != held.lease.lease_token
        assert got.lease.worker_id == "w2"
        await expect_status(
            holder.stub.ack(AckRequest(context=holder.context, lease=ref(held))),
            Status.ABORTED,
        )


@on_virtual_time
async def test_waiter_ignores_other_task_types_and_other_queues() -> None:
    """Property: a waiter filtered on task type "a" is not handed a "b" task or
    a task of another queue; it keeps waiting and takes the "a" task."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as producer,
    ):
        claim = _claim_in_background(waiter, queue, results, task_types=["a"])
        await quiet()
        await producer.enqueue(queue, task_type="b")
        await producer.enqueue(new_queue(), task_type="a")
        await quiet()
        assert results == []
        wanted = await producer.enqueue(queue, task_type="a")
        await claim
        [(_, [got])] = results
        assert got.task is not None
        assert got.task.id == wanted.id
        assert await producer.activity(queue, "b") == 1


@on_virtual_time
async def test_concurrent_waiters_each_get_distinct_tasks() -> None:
    """Property: several waiters woken by one batch share it out: every task
    is leased to exactly one waiter."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with virtual_daemon() as served, contextlib.AsyncExitStack() as stack:
        producer = await stack.enter_async_context(connect(served.daemon))
        waiters = [await stack.enter_async_context(connect(served.daemon)) for _ in range(3)]
        claims = [_claim_in_background(waiter, queue, results) for waiter in waiters]
        await quiet()
        await producer.stub.enqueue_many(
            EnqueueManyRequest(
                context=producer.context,
                queue=queue,
                tasks=[TaskSpec(task_type="t") for _ in range(3)],
            )
        )
        await asyncio.gather(*claims)
        ids = [g.task.id for _, got in results for g in got if g.task]
        assert len(ids) == 3
        assert len(set(ids)) == 3


@on_virtual_time
async def test_cancelled_long_poll_leaves_the_daemon_serving() -> None:
    """Property: a client abandoning a long-poll (deadline / disconnect) does
    not disturb the daemon: the claim leases nothing, even given time to, and
    later calls work."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.claim(queue, wait_timeout=LONG)
        task = await client.enqueue(queue)
        await quiet()
        assert (await client.get(queue, task.id)).state is TaskState.PENDING
        [got] = await client.claim(queue)
        assert got.task is not None
        assert got.task.id == task.id


@on_virtual_time
async def test_reaper_expires_each_lease_at_its_deadline_with_nobody_claiming() -> None:
    """Property: an expired lease returns its task to PENDING at its own
    deadline — still LEASED just before it, PENDING just after — although no
    claim runs on the queue: leases ending 0.4 s, 0.8 s (shortened by
    ExtendLease) and 1.3 s after the claim each flip on time, which neither a
    periodic sweep nor the other deadlines could do."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        clock = served.daemon.clock
        deadlines: dict[str, timedelta] = {}
        for lease in (timedelta(milliseconds=400), timedelta(milliseconds=1300)):
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue, lease_duration=lease)
            assert leased.lease is not None
            assert leased.lease.until is not None
            deadlines[task.id] = leased.lease.until - clock.now()
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
        deadlines[task.id] = extended.lease.until - clock.now()
        started = now()
        for task_id, left in sorted(deadlines.items(), key=lambda item: item[1]):
            await asyncio.sleep(started + left.total_seconds() - 0.05 - now())
            assert (await client.get(queue, task_id)).state is TaskState.LEASED
            await asyncio.sleep(0.05 + PROMPT)
            state = await client.get(queue, task_id)
            assert state.state is TaskState.PENDING, f"not expired {PROMPT} s after its deadline"
            assert state.attempt == 1
            assert state.lease_until is None


@on_virtual_time
async def test_retry_wakes_a_waiting_claim() -> None:
    """Property: RetryTask makes a finished task claimable and wakes a waiter
    at the retry's instant."""
    queue = new_queue()
    results: list[tuple[float, list[LeasedTask]]] = []
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as admin,
    ):
        task = await admin.enqueue(queue)
        [held] = await admin.claim(queue)
        await admin.stub.reject(RejectRequest(context=admin.context, lease=ref(held)))
        claim = _claim_in_background(waiter, queue, results)
        await quiet()
        retried_at = now()
        await admin.stub.retry_task(
            RetryTaskRequest(context=admin.context, queue=queue, task_id=task.id)
        )
        await claim
        [(returned_at, [got])] = results
        assert got.task is not None
        assert got.task.id == task.id
        assert returned_at - retried_at < PROMPT


@on_virtual_time
async def test_long_poll_answers_before_the_client_deadline() -> None:
    """Property: a client deadline shorter than wait_timeout shortens the wait:
    the claim answers an empty list just before the deadline instead of being
    cut off with DEADLINE_EXCEEDED."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        started = now()
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
        assert response.tasks == []
        assert 0.5 <= now() - started < 1.0


@on_virtual_time
async def test_shutdown_lets_an_in_flight_long_poll_finish() -> None:
    """Property: shutdown (what ringod's SIGTERM starts; test_cli checks the
    signals) wakes a long-polling Claim, which completes normally — an empty
    answer, not an error or a dropped call — at the shutdown's instant, and
    the daemon stops then too, not at the claim's wait_timeout."""
    results: list[tuple[float, list[LeasedTask]]] = []
    async with virtual_daemon() as served, connect(served.daemon) as client:
        claim = _claim_in_background(client, new_queue(), results)
        await quiet()  # the claim is waiting
        stopped_at = now()
        served.stop.set()
        await claim
        await served.serving  # stopped, without an error
        assert now() - stopped_at < PROMPT
    [(returned_at, got)] = results
    assert got == []
    assert returned_at - stopped_at < PROMPT
