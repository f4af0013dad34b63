"""An asyncio grpclib client for the daemon tests, and assertion helpers."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._limits import PROTOCOL_MAJOR, PROTOCOL_MINOR
from ringo_trio._proto.grpc.health.v1 import HealthStub
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    EnqueueRequest,
    EnqueueResult,
    GetQueueActivityRequest,
    GetTaskRequest,
    LeasedTask,
    LeaseRef,
    NegotiateRequest,
    QueueServiceStub,
    RequestContext,
    Task,
    TaskSpec,
)
from ringo_trio.testing import DaemonProcess


def new_queue(prefix: str = "q") -> str:
    """A queue name no other test uses, so tests can share one daemon."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Client:
    channel: Channel
    stub: QueueServiceStub
    health: HealthStub
    context: RequestContext

    async def enqueue(self, queue: str, **spec: Any) -> Task:
        spec.setdefault("task_type", "t")
        response = await self.stub.enqueue(
            EnqueueRequest(context=self.context, queue=queue, task=TaskSpec(**spec))
        )
        assert response.result is not None
        assert response.result.task is not None
        return response.result.task

    async def enqueue_spec(self, queue: str, spec: TaskSpec) -> EnqueueResult:
        response = await self.stub.enqueue(
            EnqueueRequest(context=self.context, queue=queue, task=spec)
        )
        assert response.result is not None
        return response.result

    async def get(self, queue: str, task_id: str) -> Task:
        response = await self.stub.get_task(
            GetTaskRequest(context=self.context, queue=queue, task_id=task_id)
        )
        assert response.task is not None
        return response.task

    async def activity(self, queue: str, *task_types: str) -> int:
        response = await self.stub.get_queue_activity(
            GetQueueActivityRequest(context=self.context, queue=queue, task_types=list(task_types))
        )
        return response.active_task_count

    async def claim(self, queue: str, limit: int = 1, **kwargs: Any) -> list[LeasedTask]:
        kwargs.setdefault("worker_id", "w1")
        response = await self.stub.claim(
            ClaimRequest(context=self.context, queue=queue, limit=limit, **kwargs)
        )
        return response.tasks


def ref(leased: LeasedTask) -> LeaseRef:
    assert leased.lease is not None
    return LeaseRef(
        task_id=leased.lease.task_id,
        attempt=leased.lease.attempt,
        lease_token=leased.lease.lease_token,
    )


@dataclass
class Setup:
    """A queue holding one LEASED and one PENDING task (see `leased_and_pending`)."""

    queue: str
    lease: LeaseRef
    leased_id: str
    pending_id: str


async def leased_and_pending(client: Client, queue: str) -> Setup:
    await client.enqueue(queue)
    [leased] = await client.claim(queue)
    pending = await client.enqueue(queue)
    assert leased.task is not None
    return Setup(queue, ref(leased), leased.task.id, pending.id)


async def snapshot(client: Client, s: Setup) -> tuple[int, Task, Task]:
    """Everything a refused request must leave unchanged."""
    return (
        await client.activity(s.queue),
        await client.get(s.queue, s.leased_id),
        await client.get(s.queue, s.pending_id),
    )


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


@asynccontextmanager
async def connect(
    daemon: DaemonProcess | str,
    *,
    token: str | None = None,
    minor: int = PROTOCOL_MINOR,
    negotiate: bool = True,
) -> AsyncIterator[Client]:
    endpoint = daemon if isinstance(daemon, str) else daemon.endpoint
    host, port = split_endpoint(endpoint)
    channel = Channel(host, port)
    metadata = {"authorization": f"Bearer {token}"} if token is not None else None
    try:
        stub = QueueServiceStub(channel, metadata=metadata)
        context = RequestContext(protocol_major=PROTOCOL_MAJOR, protocol_minor=minor)
        if negotiate:
            response = await stub.negotiate(
                NegotiateRequest(
                    sdk_name="tests",
                    sdk_version="0",
                    protocol_major=PROTOCOL_MAJOR,
                    protocol_minor=minor,
                )
            )
            context = RequestContext(
                protocol_major=response.protocol_major,
                protocol_minor=response.protocol_minor,
                session_token=response.session_token,
            )
        yield Client(channel, stub, HealthStub(channel, metadata=metadata), context)
    finally:
        channel.close()


async def rpc_error(call: Awaitable[Any]) -> GRPCError:
    """The GRPCError `call` fails with (fails the test if it succeeds)."""
    try:
        result = await call
    except GRPCError as exc:
        return exc
    raise AssertionError(f"expected the call to fail, it returned {result!r}")


async def expect_status(call: Awaitable[Any], status: Status, *fragments: str) -> GRPCError:
    exc = await rpc_error(call)
    assert exc.status is status, (exc.status, exc.message)
    for fragment in fragments:
        assert fragment in (exc.message or ""), (fragment, exc.message)
    return exc
