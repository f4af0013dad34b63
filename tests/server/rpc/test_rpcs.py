"""Unary RPC semantics of a real daemon (DESIGN.md §3, docs/protocol.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    EnqueueManyRequest,
    ExtendLeaseRequest,
    GetTaskRequest,
    LeaseRef,
    NackRequest,
    RejectRequest,
    ReportProgressRequest,
    RetryBackoff,
    RetryTaskRequest,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import connect, expect_status, new_queue, ref

pytestmark = pytest.mark.anyio


async def test_enqueue_fills_daemon_defaults_and_get_finds_by_id_and_key(
    daemon: DaemonProcess,
) -> None:
    """Property: an enqueued task is PENDING with the protocol defaults
    (max_attempts 5, backoff 1s x2 up to 5min) and is found by id and key."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            task = await client.enqueue(queue, payload=b"p", unique_key="k1", priority=3)
            assert task.state is TaskState.PENDING
            assert (task.queue, task.task_type, task.payload) == (queue, "t", b"p")
            assert task.attempt == 0
            assert task.max_attempts == limits.DEFAULT_MAX_ATTEMPTS
            assert task.retry_backoff == RetryBackoff(
                initial=limits.DEFAULT_BACKOFF_INITIAL,
                maximum=limits.DEFAULT_BACKOFF_MAX,
                multiplier=limits.DEFAULT_BACKOFF_MULTIPLIER,
            )
            by_id = await client.get(queue, task.id)
            by_key = await client.stub.get_task(
                GetTaskRequest(context=client.context, queue=queue, unique_key="k1")
            )
            assert by_id.id == task.id
            assert by_key.task is not None
            assert by_key.task.id == task.id
            # Task ids are scoped by queue: the same id in another queue is unknown.
            await expect_status(client.get(new_queue(), task.id), Status.NOT_FOUND)


async def test_duplicate_unique_key_returns_existing_task_and_changes_nothing(
    daemon: DaemonProcess,
) -> None:
    """Property: (queue, unique_key) dedupes; a duplicate is created=false with
    the existing task, never an error, and the stored task is untouched."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            first = await client.enqueue(queue, payload=b"first", unique_key="same")
            result = await client.enqueue_spec(
                queue, TaskSpec(task_type="t", payload=b"2nd", unique_key="same")
            )
            assert result.created is False
            assert result.task is not None
            assert result.task.id == first.id
            assert (await client.get(queue, first.id)).payload == b"first"
            assert await client.activity(queue) == 1
            # The same key in another queue is a different task.
            other = await client.enqueue(new_queue(), unique_key="same")
            assert other.id != first.id


async def test_enqueue_many_reports_created_and_duplicates_in_order(
    daemon: DaemonProcess,
) -> None:
    """Property: EnqueueMany answers one result per spec, in order; duplicates
    within the batch and against stored tasks resolve to the first task."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            stored = await client.enqueue(queue, unique_key="old")
            response = await client.stub.enqueue_many(
                EnqueueManyRequest(
                    context=client.context,
                    queue=queue,
                    tasks=[
                        TaskSpec(task_type="t", unique_key="a"),
                        TaskSpec(task_type="t", unique_key="old"),
                        TaskSpec(task_type="t"),
                        TaskSpec(task_type="t", unique_key="a"),
                    ],
                )
            )
            assert [r.created for r in response.results] == [True, False, True, False]
            assert (response.created_count, response.duplicate_count) == (2, 2)
            ids = [r.task.id for r in response.results if r.task is not None]
            assert ids[1] == stored.id
            assert ids[3] == ids[0]
            assert await client.activity(queue) == 3


async def test_delay_and_not_before_schedule_the_task(daemon: DaemonProcess) -> None:
    """Property: a delayed task is PENDING with a future available_at, counted
    as active, and not claimable before it is due."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            before = datetime.now(UTC)
            delayed = await client.enqueue(queue, delay=timedelta(seconds=30))
            at = datetime(2100, 1, 1, tzinfo=UTC)
            pinned = await client.enqueue(queue, not_before=at)
            assert delayed.available_at is not None
            assert delayed.available_at - before >= timedelta(seconds=29)
            assert pinned.available_at == at
            assert await client.claim(queue, limit=10) == []
            assert await client.activity(queue) == 2


async def test_claim_orders_by_priority_and_honours_limit_and_types(
    daemon: DaemonProcess,
) -> None:
    """Property: Claim leases highest priority first, then enqueue order, at
    most `limit`, only of the requested task types; every lease is attempt 1
    with a fresh token."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            low = await client.enqueue(queue, priority=0)
            high = await client.enqueue(queue, priority=5)
            low2 = await client.enqueue(queue, priority=0)
            other = await client.enqueue(queue, task_type="other", priority=9)
            got = await client.claim(queue, limit=2, task_types=["t"])
            assert [g.task.id for g in got if g.task] == [high.id, low.id]
            leases = [g.lease for g in got if g.lease]
            assert [lease.attempt for lease in leases] == [1, 1]
            assert len({lease.lease_token for lease in leases}) == 2
            assert all(lease.worker_id == "w1" for lease in leases)
            rest = await client.claim(queue, limit=10)
            assert [g.task.id for g in rest if g.task] == [other.id, low2.id]
            assert await client.claim(queue, limit=10) == []


async def test_ack_nack_reject_drive_the_lifecycle(daemon: DaemonProcess) -> None:
    """Property: ack -> SUCCEEDED; nack -> PENDING again (the override replaces
    the backoff) and the next lease is attempt 2; reject -> DEAD with the error;
    a nack of the last attempt -> DEAD."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            a = await client.enqueue(queue, unique_key="a")
            [leased] = await client.claim(queue)
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
            done = await client.get(queue, a.id)
            assert done.state is TaskState.SUCCEEDED
            assert done.finished_at is not None

            b = await client.enqueue(queue, unique_key="b")
            [leased] = await client.claim(queue)
            await client.stub.nack(
                NackRequest(
                    context=client.context,
                    lease=ref(leased),
                    error="flaky",
                    retry_delay_override=timedelta(0),
                )
            )
            again = await client.get(queue, b.id)
            assert (again.state, again.attempt, again.last_error) == (
                TaskState.PENDING,
                1,
                "flaky",
            )
            [leased2] = await client.claim(queue)
            assert leased2.lease is not None
            assert leased2.lease.attempt == 2
            await client.stub.reject(
                RejectRequest(context=client.context, lease=ref(leased2), error="bad input")
            )
            dead = await client.get(queue, b.id)
            assert (dead.state, dead.last_error) == (TaskState.DEAD, "bad input")

            c = await client.enqueue(queue, max_attempts=1)
            [leased3] = await client.claim(queue)
            await client.stub.nack(
                NackRequest(context=client.context, lease=ref(leased3), error="once")
            )
            assert (await client.get(queue, c.id)).state is TaskState.DEAD
            assert await client.activity(queue) == 0


async def test_stale_lease_ref_is_aborted_and_changes_nothing(daemon: DaemonProcess) -> None:
    """Property: a LeaseRef that is not the task's current lease (old attempt,
    wrong token, finished task, unknown task) is ABORTED on every lease RPC and
    the task stays exactly as it was."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            task = await client.enqueue(queue)
            [first] = await client.claim(queue)
            await client.stub.nack(
                NackRequest(
                    context=client.context, lease=ref(first), retry_delay_override=timedelta(0)
                )
            )
            [current] = await client.claim(queue)
            snapshot = await client.get(queue, task.id)
            assert snapshot.state is TaskState.LEASED
            assert snapshot.attempt == 2
            cur = ref(current)
            stale_refs = [
                ref(first),
                LeaseRef(task_id=cur.task_id, attempt=cur.attempt, lease_token="not-it"),
                LeaseRef(task_id=cur.task_id, attempt=3, lease_token=cur.lease_token),
                LeaseRef(task_id="no-such-task", attempt=1, lease_token=cur.lease_token),
            ]
            ctx = client.context
            for stale in stale_refs:
                for call in (
                    client.stub.ack(AckRequest(context=ctx, lease=stale)),
                    client.stub.nack(NackRequest(context=ctx, lease=stale)),
                    client.stub.reject(RejectRequest(context=ctx, lease=stale)),
                    client.stub.extend_lease(
                        ExtendLeaseRequest(context=ctx, lease=stale, extension=timedelta(seconds=1))
                    ),
                    client.stub.report_progress(
                        ReportProgressRequest(context=ctx, lease=stale, current=1, total=2)
                    ),
                ):
                    await expect_status(call, Status.ABORTED)
            assert await client.get(queue, task.id) == snapshot
            # The current lease still works; afterwards it is stale as well.
            await client.stub.ack(AckRequest(context=ctx, lease=cur))
            await expect_status(client.stub.ack(AckRequest(context=ctx, lease=cur)), Status.ABORTED)


async def test_extend_lease_is_an_absolute_reset_from_server_now(
    daemon: DaemonProcess,
) -> None:
    """Property: ExtendLease sets until = server now + extension (it can
    shorten a lease), returns the lease, and the task shows the new deadline."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue, lease_duration=timedelta(minutes=10))
            before = datetime.now(UTC)
            response = await client.stub.extend_lease(
                ExtendLeaseRequest(
                    context=client.context, lease=ref(leased), extension=timedelta(seconds=30)
                )
            )
            after = datetime.now(UTC)
            lease = response.lease
            assert lease is not None
            assert lease.until is not None
            assert before + timedelta(seconds=30) <= lease.until <= after + timedelta(seconds=31)
            assert (lease.attempt, lease.lease_token) == (1, ref(leased).lease_token)
            assert (await client.get(queue, task.id)).lease_until == lease.until


async def test_report_progress_is_stored_on_the_task(daemon: DaemonProcess) -> None:
    """Property: progress reported under the current lease shows on the task."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue)
            await client.stub.report_progress(
                ReportProgressRequest(
                    context=client.context, lease=ref(leased), current=3, total=8, message="3/8"
                )
            )
            progress = (await client.get(queue, task.id)).progress
            assert progress is not None
            assert (progress.current, progress.total, progress.message) == (3, 8, "3/8")


async def test_retry_reactivates_finished_tasks_and_refuses_active_ones(
    daemon: DaemonProcess,
) -> None:
    """Property: RetryTask turns SUCCEEDED/DEAD into PENDING (by id or key);
    on a PENDING or LEASED task it is FAILED_PRECONDITION and changes nothing;
    an unknown id or key is NOT_FOUND."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            ctx = client.context
            task = await client.enqueue(queue, unique_key="r")
            pending = await client.get(queue, task.id)
            await expect_status(
                client.stub.retry_task(RetryTaskRequest(context=ctx, queue=queue, task_id=task.id)),
                Status.FAILED_PRECONDITION,
            )
            assert await client.get(queue, task.id) == pending
            [leased] = await client.claim(queue)
            await expect_status(
                client.stub.retry_task(RetryTaskRequest(context=ctx, queue=queue, unique_key="r")),
                Status.FAILED_PRECONDITION,
            )
            await client.stub.reject(RejectRequest(context=ctx, lease=ref(leased), error="x"))
            response = await client.stub.retry_task(
                RetryTaskRequest(context=ctx, queue=queue, unique_key="r")
            )
            assert response.task is not None
            assert response.task.state is TaskState.PENDING
            [again] = await client.claim(queue)
            assert again.lease is not None
            assert again.lease.attempt == 2
            for lookup in ({"task_id": "nope"}, {"unique_key": "nope"}):
                await expect_status(
                    client.stub.retry_task(RetryTaskRequest(context=ctx, queue=queue, **lookup)),
                    Status.NOT_FOUND,
                )
                await expect_status(
                    client.stub.get_task(GetTaskRequest(context=ctx, queue=queue, **lookup)),
                    Status.NOT_FOUND,
                )


async def test_queue_activity_counts_pending_scheduled_and_leased(
    daemon: DaemonProcess,
) -> None:
    """Property: GetQueueActivity = pending + scheduled + leased of the queue
    (filtered by task types); finished tasks do not count."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            assert await client.activity(queue) == 0
            await client.enqueue(queue, task_type="a")
            await client.enqueue(queue, task_type="a", delay=timedelta(hours=1))
            await client.enqueue(queue, task_type="b")
            done = await client.enqueue(queue, task_type="c")
            [leased] = await client.claim(queue, task_types=["c"])
            assert leased.task is not None
            assert leased.task.id == done.id
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
            [_held] = await client.claim(queue, task_types=["b"])
            assert await client.activity(queue) == 3
            assert await client.activity(queue, "a") == 2
            assert await client.activity(queue, "b", "c") == 1
            assert await client.activity(new_queue()) == 0
