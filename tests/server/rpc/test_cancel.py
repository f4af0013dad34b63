"""CancelTask, RetryTasks and result values, against real daemons (raw gRPC).

The worker's side of a cancel is the Work stream's lease-lost path: the
lease's next renewal or settlement is answered ``LEASE_LOST`` with
``metadata.reason = "cancelled"`` (unary calls: ``ABORTED`` saying so).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import limits
from ringo_trio._contract.reasons import CANCELLED as CANCELLED_REASON
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CancelTaskRequest,
    CreditUpdate,
    EnqueueManyRequest,
    ErrorCode,
    ExtendLeaseRequest,
    GetTaskRequest,
    NackRequest,
    RejectRequest,
    ReleaseRequest,
    RetryTaskRequest,
    RetryTasksRequest,
    Task,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import Client, connect, expect_status, new_queue, open_work, ref

OPERATE_MINOR = FEATURES[Feature.OPERATE]

pytestmark = pytest.mark.anyio

GUARD = 30


@pytest.fixture(params=["sqlite", "postgres"])
def any_daemon(request: pytest.FixtureRequest) -> Iterator[DaemonProcess]:
    """The shared SQLite daemon, or a daemon of its own on PostgreSQL."""
    if request.param == "sqlite":
        yield request.getfixturevalue("daemon")
        return
    dsn = request.getfixturevalue("postgres_dsn")
    with spawn_daemon(None, postgres_dsn=dsn) as process:
        yield process


async def _cancel(client: Client, queue: str, task_id: str, reason: str = "") -> Task:
    response = await client.stub.cancel_task(
        CancelTaskRequest(context=client.context, queue=queue, task_id=task_id, reason=reason)
    )
    assert response.task is not None
    return response.task


async def _dead(client: Client, queue: str, task_type: str = "t", n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        await client.enqueue(queue, task_type=task_type)
        [leased] = await client.claim(queue, task_types=[task_type])
        await client.stub.reject(RejectRequest(context=client.context, lease=ref(leased)))
        assert leased.task is not None
        ids.append(leased.task.id)
    return ids


async def test_a_worker_holding_a_cancelled_lease_is_told_cancelled(
    any_daemon: DaemonProcess,
) -> None:
    """Property (both engines): cancelling a task a Work-stream worker holds ends
    the lease at once. The worker's renewal, a release and its ack are each answered
    LEASE_LOST with metadata reason "cancelled"; the task stays CANCELLED with the
    reason as its last error (the late ack resurrects nothing); a unary ack of the
    same lease is ABORTED saying cancelled."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(any_daemon) as client, open_work(client) as work:
            await client.enqueue(queue)
            await work.register(queue)
            await work.call(credit=CreditUpdate(available=1))
            [leased] = await work.wait_tasks(1)
            assert leased.task is not None
            task = await _cancel(client, queue, leased.task.id, "wrong customer")
            assert task.state == TaskState.CANCELLED
            assert task.last_error == "cancelled: wrong customer"
            renewal = await work.call(
                extend_lease=ExtendLeaseRequest(lease=ref(leased), extension=timedelta(minutes=1))
            )
            release = await work.call(release=ReleaseRequest(lease=ref(leased)))
            ack = await work.call(ack=AckRequest(lease=ref(leased), result=b"late"))
            for answer in (renewal, release, ack):
                assert answer.error is not None
                assert answer.error.code == ErrorCode.LEASE_LOST
                assert answer.error.metadata == {"reason": CANCELLED_REASON}
            await expect_status(
                client.stub.ack(AckRequest(context=client.context, lease=ref(leased))),
                Status.ABORTED,
                "cancelled",
            )
            stored = await client.get(queue, leased.task.id)
            assert stored.state == TaskState.CANCELLED
            assert stored.result is None
            assert stored.last_error == "cancelled: wrong customer"
            # Never handed out again: a new credit pushes nothing.
            await work.call(credit=CreditUpdate(available=1))
            assert await client.claim(queue) == []


async def test_a_plain_lost_lease_has_no_cancelled_reason(daemon: DaemonProcess) -> None:
    """A lease lost for any other reason (already settled; an earlier attempt
    of a task cancelled since) is LEASE_LOST without the reason, for an ack
    and a release alike: the worker must not report an operator's cancel of
    its attempt that never was."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(daemon) as client, open_work(client) as work:
            await client.enqueue(queue)
            await work.register(queue)
            await work.call(credit=CreditUpdate(available=1))
            [leased] = await work.wait_tasks(1)
            assert (await work.call(ack=AckRequest(lease=ref(leased)))).error is None
            again = await work.call(ack=AckRequest(lease=ref(leased)))
            released = await work.call(release=ReleaseRequest(lease=ref(leased)))
            # An attempt that was nacked, then the task cancelled at its next one.
            await client.enqueue(queue)
            await work.call(credit=CreditUpdate(available=1))
            [_, first] = await work.wait_tasks(2)
            assert first.task is not None
            nack = NackRequest(lease=ref(first), retry_delay_override=timedelta(0))
            assert (await work.call(nack=nack)).error is None
            [second] = await client.claim(queue)
            assert second.lease is not None
            assert second.lease.attempt == 2
            await _cancel(client, queue, first.task.id, "later")
            earlier = await work.call(release=ReleaseRequest(lease=ref(first)))
            for answer in (again, released, earlier):
                assert answer.error is not None
                assert answer.error.code == ErrorCode.LEASE_LOST
                assert "reason" not in answer.error.metadata


async def test_cancel_task_states_and_refusals(daemon: DaemonProcess) -> None:
    """CancelTask: PENDING -> CANCELLED; again -> unchanged; SUCCEEDED ->
    FAILED_PRECONDITION; unknown -> NOT_FOUND; a reason over MAX_ERROR_BYTES or
    with a NUL, or no lookup -> INVALID_ARGUMENT naming the field; each refusal
    changes nothing."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(daemon) as client:
            pending = await client.enqueue(queue, unique_key="k")
            by_key = await client.stub.cancel_task(
                CancelTaskRequest(context=client.context, queue=queue, unique_key="k")
            )
            assert by_key.task is not None
            assert by_key.task.state == TaskState.CANCELLED
            assert by_key.task.last_error == "cancelled"
            assert await _cancel(client, queue, pending.id, "again") == by_key.task
            done = await client.enqueue(queue)
            [leased] = await client.claim(queue)
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
            await expect_status(
                client.stub.cancel_task(
                    CancelTaskRequest(context=client.context, queue=queue, task_id=done.id)
                ),
                Status.FAILED_PRECONDITION,
                "SUCCEEDED",
            )
            await expect_status(
                client.stub.cancel_task(
                    CancelTaskRequest(context=client.context, queue=queue, task_id="nope")
                ),
                Status.NOT_FOUND,
            )
            fresh = await client.enqueue(queue)
            too_long = "x" * (limits.MAX_ERROR_BYTES + 1)
            for reason, fragment in ((too_long, str(limits.MAX_ERROR_BYTES)), ("a\x00b", "NUL")):
                await expect_status(
                    client.stub.cancel_task(
                        CancelTaskRequest(
                            context=client.context, queue=queue, task_id=fresh.id, reason=reason
                        )
                    ),
                    Status.INVALID_ARGUMENT,
                    "reason",
                    fragment,
                )
            await expect_status(
                client.stub.cancel_task(CancelTaskRequest(context=client.context, queue=queue)),
                Status.INVALID_ARGUMENT,
                "lookup",
            )
            assert (await client.get(queue, fresh.id)).state == TaskState.PENDING


async def test_retry_tasks_in_batches(daemon: DaemonProcess) -> None:
    """RetryTasks reactivates DEAD tasks oldest first, at most `limit` per call;
    `more` says the call stopped at its limit; task types filter; a claim finds the
    retried tasks at once; limit over MAX_DELETE_BATCH is INVALID_ARGUMENT naming
    the limit, and 0 means MAX_DELETE_BATCH."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(daemon) as client:
            a = await _dead(client, queue, "a", 3)
            b = await _dead(client, queue, "b", 1)

            async def retry(limit: int, *types: str) -> tuple[int, bool]:
                reply = await client.stub.retry_tasks(
                    RetryTasksRequest(
                        context=client.context, queue=queue, task_types=list(types), limit=limit
                    )
                )
                return reply.retried_count, reply.more

            await expect_status(
                client.stub.retry_tasks(
                    RetryTasksRequest(
                        context=client.context, queue=queue, limit=limits.MAX_DELETE_BATCH + 1
                    )
                ),
                Status.INVALID_ARGUMENT,
                "limit",
                str(limits.MAX_DELETE_BATCH),
            )
            assert await retry(2, "a") == (2, True)
            assert [(await client.get(queue, i)).state for i in a] == [
                TaskState.PENDING,
                TaskState.PENDING,
                TaskState.DEAD,
            ]
            assert await retry(2, "a") == (1, False)
            assert (await client.get(queue, b[0])).state == TaskState.DEAD
            assert await retry(0) == (1, False)
            assert len(await client.claim(queue, limit=10)) == 4


async def test_results_are_stored_and_limited(daemon: DaemonProcess) -> None:
    """An ack's result is stored with the SUCCEEDED task and read back by GetTask;
    RetryTask clears it; a result over MAX_RESULT_BYTES is INVALID_ARGUMENT naming
    "result" and the limit (unary and Work stream), and the lease stays live."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(daemon) as client, open_work(client) as work:
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue)
            big = b"x" * (limits.MAX_RESULT_BYTES + 1)
            await expect_status(
                client.stub.ack(AckRequest(context=client.context, lease=ref(leased), result=big)),
                Status.INVALID_ARGUMENT,
                "result",
                str(limits.MAX_RESULT_BYTES),
            )
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased), result=b""))
            stored = await client.get(queue, task.id)
            assert stored.state == TaskState.SUCCEEDED
            assert stored.result == b""
            await client.stub.retry_task(
                RetryTaskRequest(context=client.context, queue=queue, task_id=task.id)
            )
            assert (await client.get(queue, task.id)).result is None

            await work.register(queue)
            await work.call(credit=CreditUpdate(available=1))
            [pushed] = await work.wait_tasks(1)
            refused = await work.call(ack=AckRequest(lease=ref(pushed), result=big))
            assert refused.error is not None
            assert refused.error.code == ErrorCode.INVALID_ARGUMENT
            assert "result" in refused.error.message
            assert str(limits.MAX_RESULT_BYTES) in refused.error.message
            assert (await work.call(ack=AckRequest(lease=ref(pushed), result=b"ok"))).error is None
            assert (await client.get(queue, task.id)).result == b"ok"


async def test_a_minor_8_session_sees_cancelled_as_dead_and_cannot_send_results(
    daemon: DaemonProcess,
) -> None:
    """A session below minor 9 has no CANCELLED state: GetTask and an enqueue's
    duplicate (Enqueue, EnqueueMany) show a cancelled task as DEAD, while a minor-9
    session sees CANCELLED. Such a session setting AckRequest.result is refused
    (UNIMPLEMENTED on a unary call, INCOMPATIBLE_VERSION on the Work stream) and
    the lease stays live; CancelTask and RetryTasks are UNIMPLEMENTED."""
    queue = new_queue()
    minor = OPERATE_MINOR - 1
    with anyio.fail_after(GUARD):
        async with connect(daemon) as new, connect(daemon, minor=minor) as old:
            task = await new.enqueue(queue, unique_key="k")
            await _cancel(new, queue, task.id)
            assert (await new.get(queue, task.id)).state == TaskState.CANCELLED
            assert (await old.get(queue, task.id)).state == TaskState.DEAD
            duplicate = await old.enqueue_spec(queue, TaskSpec(task_type="t", unique_key="k"))
            assert not duplicate.created
            assert duplicate.task is not None
            assert duplicate.task.state == TaskState.DEAD
            many = await old.stub.enqueue_many(
                EnqueueManyRequest(
                    context=old.context,
                    queue=queue,
                    tasks=[TaskSpec(task_type="t", unique_key="k")],
                )
            )
            assert [r.task.state for r in many.results if r.task is not None] == [TaskState.DEAD]
            await expect_status(
                old.stub.cancel_task(
                    CancelTaskRequest(context=old.context, queue=queue, task_id=task.id)
                ),
                Status.UNIMPLEMENTED,
            )
            await expect_status(
                old.stub.retry_tasks(RetryTasksRequest(context=old.context, queue=queue)),
                Status.UNIMPLEMENTED,
            )
            retried = await old.stub.retry_task(
                RetryTaskRequest(context=old.context, queue=queue, task_id=task.id)
            )
            assert retried.task is not None
            assert retried.task.state == TaskState.PENDING

            [leased] = await old.claim(queue)
            await expect_status(
                old.stub.ack(AckRequest(context=old.context, lease=ref(leased), result=b"r")),
                Status.UNIMPLEMENTED,
                "result",
            )
            async with open_work(old) as work:
                other = await old.enqueue(queue)
                await work.register(queue)
                await work.call(credit=CreditUpdate(available=1))
                [pushed] = await work.wait_tasks(1)
                assert pushed.task is not None
                assert pushed.task.id == other.id
                refused = await work.call(ack=AckRequest(lease=ref(pushed), result=b"r"))
                assert refused.error is not None
                assert refused.error.code == ErrorCode.INCOMPATIBLE_VERSION
                assert (await work.call(ack=AckRequest(lease=ref(pushed)))).error is None
            await old.stub.ack(AckRequest(context=old.context, lease=ref(leased)))
            reply = await new.stub.get_task(
                GetTaskRequest(context=new.context, queue=queue, task_id=task.id)
            )
            assert reply.task is not None
            assert reply.task.state == TaskState.SUCCEEDED
