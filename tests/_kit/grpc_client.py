"""An asyncio grpclib client for the daemon tests, and assertion helpers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import anyio
from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import decode_grpc_message

from ringo_trio._contract.versions import MAJOR as PROTOCOL_MAJOR
from ringo_trio._contract.versions import MINOR as PROTOCOL_MINOR
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
    WorkerRegistered,
    WorkerRegistration,
    WorkRequest,
    WorkRequestBatch,
    WorkResponse,
    WorkResult,
)
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.storage.base import Storage
from ringo_trio.testing import DaemonProcess


@asynccontextmanager
async def serving(
    engine: Storage,
    prepare: Callable[[Daemon], None] = lambda _daemon: None,
    *,
    stop: asyncio.Event | None = None,
    **config: Any,
) -> AsyncIterator[Daemon]:
    """The daemon on `engine` (`DaemonConfig` on 127.0.0.1, any port, with
    `config`), in this loop; `prepare` runs before it serves. Setting `stop`
    begins its shutdown while the block runs; leaving the block sets it."""
    daemon = Daemon(DaemonConfig(host="127.0.0.1", port=0, **config), engine)
    prepare(daemon)
    if stop is None:
        stop = asyncio.Event()
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(daemon.serve, stop, lambda _daemon: ready.set())
        await ready.wait()
        try:
            yield daemon
        finally:
            stop.set()


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """TimeoutError in the main thread once `seconds` have passed."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"test ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


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

    async def activity(self, queue: str, *task_types: str, due_only: bool = False) -> int:
        response = await self.stub.get_queue_activity(
            GetQueueActivityRequest(
                context=self.context,
                queue=queue,
                task_types=list(task_types),
                due_only=due_only,
            )
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
    daemon: DaemonProcess | Daemon | str,
    *,
    token: str | None = None,
    minor: int = PROTOCOL_MINOR,
    negotiate: bool = True,
) -> AsyncIterator[Client]:
    """A negotiated client of a ``ringod`` process or endpoint, or of an
    in-process `Daemon` serving in memory (`_virtual.virtual_daemon`)."""
    if isinstance(daemon, Daemon):
        channel: Channel = daemon.in_memory_channel()
    else:
        endpoint = daemon if isinstance(daemon, str) else daemon.endpoint
        channel = Channel(*split_endpoint(endpoint))
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


# -- the Work stream ------------------------------------------------------------

WORK_METHOD = "/ringo.v1.QueueService/Work"


class WorkStream:
    """The test's end of one Work call. Frames are read only on demand and
    sorted as they arrive: pushed tasks, results, heartbeats. Every result
    is checked against the commands sent: the n-th result must carry the
    n-th command's request_id (one answer per command, in order)."""

    def __init__(self, stream: ClientStream[WorkRequest, WorkResponse], context: RequestContext):
        self.stream = stream
        self.context = context
        self.tasks: list[LeasedTask] = []
        self.sent_ids: list[int] = []
        self.answers: list[WorkResult] = []
        self.heartbeats: list[WorkResponse] = []
        # The element count of each batch frame received.
        self.batches: list[int] = []
        self.ended = False

    async def send_register(self, queue: str, **fields: Any) -> None:
        fields.setdefault("context", self.context)
        fields.setdefault("worker_id", "w1")
        fields.setdefault("max_concurrency", 8)
        await self.stream.send_message(
            WorkRequest(register=WorkerRegistration(queue=queue, **fields))
        )

    async def register(self, queue: str, **fields: Any) -> WorkerRegistered:
        await self.send_register(queue, **fields)
        frame = await self.frame()
        assert frame is not None
        assert frame.registered is not None, frame
        return frame.registered

    async def send(self, request_id: int | None = None, **body: Any) -> int:
        """Send one command without waiting; its position among the commands."""
        if request_id is None:
            request_id = max(self.sent_ids, default=0) + 1
        await self.stream.send_message(WorkRequest(request_id=request_id, **body))
        self.sent_ids.append(request_id)
        return len(self.sent_ids) - 1

    async def send_batch(self, *commands: dict[str, Any]) -> list[int]:
        """Send `commands` (each the body of one WorkRequest, with an optional
        ``request_id``) as one batch frame; their positions among the commands."""
        requests = []
        for body in commands:
            body = dict(body)
            request_id = body.pop("request_id", None)
            if request_id is None:
                request_id = max(self.sent_ids, default=0) + 1
            requests.append(WorkRequest(request_id=request_id, **body))
            self.sent_ids.append(request_id)
        await self.stream.send_message(WorkRequest(batch=WorkRequestBatch(requests=requests)))
        return list(range(len(self.sent_ids) - len(commands), len(self.sent_ids)))

    async def frame(self) -> WorkResponse | None:
        response = await self.stream.recv_message()
        if response is None:
            self.ended = True
            return None
        if response.batch is not None:
            # Minor >= 10: exactly its elements, in order.
            assert response.batch.responses, "an empty batch"
            for element in response.batch.responses:
                assert element.task is not None or element.result is not None, element
                self._take(element)
            self.batches.append(len(response.batch.responses))
        else:
            self._take(response)
        return response

    def _take(self, response: WorkResponse) -> None:
        if response.task is not None:
            self.tasks.append(response.task)
        elif response.result is not None:
            index = len(self.answers)
            assert index < len(self.sent_ids), f"a result nobody asked for: {response.result}"
            assert response.result.request_id == self.sent_ids[index], (
                f"result {response.result.request_id} answers command #{index},"
                f" which was request {self.sent_ids[index]}"
            )
            self.answers.append(response.result)
        elif response.heartbeat is not None:
            self.heartbeats.append(response)

    async def answer(self, index: int) -> WorkResult:
        """The result of the `index`-th command sent (reading frames until it comes)."""
        while len(self.answers) <= index:
            if await self.frame() is None:
                raise AssertionError(f"the stream ended before answering command #{index}")
        return self.answers[index]

    async def call(self, request_id: int | None = None, **body: Any) -> WorkResult:
        return await self.answer(await self.send(request_id, **body))

    async def wait_tasks(self, count: int) -> list[LeasedTask]:
        while len(self.tasks) < count:
            if await self.frame() is None:
                raise AssertionError(f"the stream ended after {len(self.tasks)} task(s)")
        return self.tasks[:count]

    async def end_status(self) -> tuple[Status, str]:
        """Read to the end of the stream; its final status and message."""
        try:
            while await self.frame() is not None:
                pass
        except GRPCError as exc:
            # A trailers-only answer (refused before any frame) raises here.
            return exc.status, exc.message or ""
        # The public API reads trailers only after our side has ended; look
        # at what arrived directly.
        h2_stream: Any = self.stream._stream
        trailers = dict(h2_stream.trailers or h2_stream.headers or ())
        message = trailers.get("grpc-message")
        return (
            Status(int(trailers["grpc-status"])),
            decode_grpc_message(message) if message else "",
        )


def elements(frame: WorkResponse | None) -> list[WorkResponse]:
    """The frames `frame` stands for: a batch's elements in order, else itself."""
    assert frame is not None, "the stream ended"
    return list(frame.batch.responses) if frame.batch is not None else [frame]


@asynccontextmanager
async def open_work(client: Client) -> AsyncIterator[WorkStream]:
    """A Work call on `client`'s channel; reset on exit unless the server ended it."""
    stream = client.channel.request(
        WORK_METHOD,
        Cardinality.STREAM_STREAM,
        WorkRequest,
        WorkResponse,
        metadata=client.stub.metadata,
    )
    await stream.__aenter__()
    try:
        await stream.send_request()
        yield WorkStream(stream, client.context)
    finally:
        with contextlib.suppress(Exception):
            await stream.cancel()
        with contextlib.suppress(Exception):
            await stream.__aexit__(None, None, None)
