"""Malformed requests: INVALID_ARGUMENT naming the field, and nothing changes.

Every case is a request that is valid except for one field, sent with a
live session against a queue holding one LEASED and one PENDING task; after
the refusal both tasks and the queue's activity count are exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    AckResponse,
    ClaimRequest,
    EnqueueManyRequest,
    EnqueueRequest,
    EnqueueResponse,
    ExtendLeaseRequest,
    GetQueueActivityRequest,
    GetTaskRequest,
    LeaseRef,
    NackRequest,
    RejectRequest,
    ReportProgressRequest,
    RetryBackoff,
    RetryTaskRequest,
    TaskSpec,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import (
    Client,
    Setup,
    connect,
    expect_status,
    leased_and_pending,
    new_queue,
    snapshot,
    split_endpoint,
)

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024


def spec(**overrides: Any) -> TaskSpec:
    overrides.setdefault("task_type", "t")
    return TaskSpec(**overrides)


Build = Callable[[Any, Setup], tuple[str, Any]]


def enqueue(queue: str | None = None, **task: Any) -> Build:
    return lambda ctx, s: (
        "enqueue",
        EnqueueRequest(context=ctx, queue=s.queue if queue is None else queue, task=spec(**task)),
    )


def claim(**fields: Any) -> Build:
    def build(ctx: Any, s: Setup) -> tuple[str, Any]:
        args = {"queue": s.queue, "worker_id": "w", "limit": 1, **fields}
        return "claim", ClaimRequest(context=ctx, **args)

    return build


def with_lease(method: str, cls: type, lease: Callable[[Setup], Any], **fields: Any) -> Build:
    return lambda ctx, s: (method, cls(context=ctx, lease=lease(s), **fields))


def good_lease(s: Setup) -> LeaseRef:
    return s.lease


# A NUL in any text field: PostgreSQL text cannot hold one, so every engine
# refuses it alike (see test_nul_is_refused_alike_on_postgres).
NUL_CASES: list[tuple[str, Build, str]] = [
    ("nul-queue", enqueue(queue="q\x00q"), "queue: must not contain a NUL character"),
    ("nul-task-type", enqueue(task_type="t\x00"), "task.task_type: must not contain a NUL"),
    ("nul-unique-key", enqueue(unique_key="\x00"), "task.unique_key: must not contain a NUL"),
    (
        "nul-get-task-id",
        lambda ctx, s: ("get_task", GetTaskRequest(context=ctx, queue=s.queue, task_id="a\x00")),
        "task_id: must not contain a NUL character",
    ),
    ("nul-claim-worker", claim(worker_id="w\x00"), "worker_id: must not contain a NUL"),
    ("nul-claim-type", claim(task_types=["t\x00"]), "task_types[0]: must not contain a NUL"),
    (
        "nul-nack-error",
        with_lease("nack", NackRequest, good_lease, error="boom\x00"),
        "error: must not contain a NUL character",
    ),
    (
        "nul-progress-message",
        with_lease("report_progress", ReportProgressRequest, good_lease, message="\x00"),
        "message: must not contain a NUL character",
    ),
]

CASES: list[tuple[str, Build, str]] = [
    *NUL_CASES,
    ("queue-empty", enqueue(queue=""), "queue: must not be empty"),
    ("queue-too-long", enqueue(queue="q" * 201), "queue: 201 bytes exceeds the 200-byte limit"),
    ("queue-utf8-bytes", enqueue(queue="é" * 101), "queue: 202 bytes exceeds the 200-byte limit"),
    (
        "task-missing",
        lambda ctx, s: ("enqueue", EnqueueRequest(context=ctx, queue=s.queue)),
        "task: is required",
    ),
    ("task-type-empty", enqueue(task_type=""), "task.task_type: must not be empty"),
    ("task-type-too-long", enqueue(task_type="x" * 201), "task.task_type: 201 bytes"),
    (
        "payload-too-large",
        enqueue(payload=b"x" * (limits.MAX_PAYLOAD_BYTES + 1)),
        "task.payload: 1048577 bytes exceeds the 1048576-byte limit",
    ),
    ("unique-key-too-long", enqueue(unique_key="k" * 513), "task.unique_key: 513 bytes"),
    (
        "max-attempts-too-high",
        enqueue(max_attempts=limits.MAX_ATTEMPTS_LIMIT + 1),
        "task.max_attempts: 10001 exceeds the limit of 10000",
    ),
    ("delay-negative", enqueue(delay=timedelta(seconds=-1)), "task.delay: must not be negative"),
    (
        "delay-and-not-before",
        enqueue(delay=timedelta(seconds=1), not_before=datetime(2030, 1, 1, tzinfo=UTC)),
        "task.delay: at most one of delay and not_before",
    ),
    (
        "delay-overflows",
        enqueue(delay=timedelta(days=999_999_000)),
        "task.delay: 999999000 days exceeds the maximum of 365 days",
    ),
    (
        "delay-over-the-limit",
        enqueue(delay=limits.MAX_DELAY + timedelta(seconds=1)),
        "task.delay: 365 days 1 second exceeds the maximum of 365 days",
    ),
    (
        "not-before-over-the-limit",
        enqueue(not_before=datetime(9000, 1, 1, 0, 0, 1, tzinfo=UTC)),
        "task.not_before: 9000-01-01T00:00:01+00:00 is after the latest allowed"
        " 9000-01-01T00:00:00+00:00",
    ),
    (
        "backoff-initial-far-future",
        enqueue(retry_backoff=RetryBackoff(initial=timedelta(days=3_000_000))),
        "task.retry_backoff.initial: 3000000 days exceeds the maximum of 365 days",
    ),
    (
        "backoff-initial-over-int64-microseconds",
        enqueue(retry_backoff=RetryBackoff(initial=timedelta(days=200_000_000))),
        "task.retry_backoff.initial: 200000000 days exceeds the maximum of 365 days",
    ),
    (
        "backoff-maximum-over-the-limit",
        enqueue(
            retry_backoff=RetryBackoff(
                initial=timedelta(seconds=1), maximum=limits.MAX_DELAY + timedelta(days=1)
            )
        ),
        "task.retry_backoff.maximum: 366 days exceeds the maximum of 365 days",
    ),
    (
        "backoff-multiplier-below-1",
        enqueue(retry_backoff=RetryBackoff(multiplier=0.5)),
        "task.retry_backoff.multiplier: 0.5 is below 1",
    ),
    (
        "backoff-multiplier-nan",
        enqueue(retry_backoff=RetryBackoff(multiplier=math.nan)),
        "task.retry_backoff.multiplier: must be a finite number",
    ),
    (
        "backoff-initial-negative",
        enqueue(retry_backoff=RetryBackoff(initial=timedelta(seconds=-2))),
        "task.retry_backoff.initial: must not be negative",
    ),
    (
        "backoff-maximum-below-initial",
        enqueue(
            retry_backoff=RetryBackoff(initial=timedelta(seconds=10), maximum=timedelta(seconds=1))
        ),
        "task.retry_backoff.maximum: must not be less than initial",
    ),
    (
        "batch-too-large",
        lambda ctx, s: (
            "enqueue_many",
            EnqueueManyRequest(
                context=ctx, queue=s.queue, tasks=[spec() for _ in range(limits.MAX_BATCH + 1)]
            ),
        ),
        "tasks: 1001 tasks exceeds the limit of 1000",
    ),
    (
        "batch-one-bad-payload",
        lambda ctx, s: (
            "enqueue_many",
            EnqueueManyRequest(
                context=ctx,
                queue=s.queue,
                tasks=[spec(), spec(), spec(), spec(payload=b"x" * 2_000_000), spec()],
            ),
        ),
        "tasks[3].payload: 2000000 bytes exceeds the 1048576-byte limit",
    ),
    (
        "batch-queue-empty",
        lambda ctx, s: ("enqueue_many", EnqueueManyRequest(context=ctx, queue="", tasks=[spec()])),
        "queue: must not be empty",
    ),
    (
        "get-no-lookup",
        lambda ctx, s: ("get_task", GetTaskRequest(context=ctx, queue=s.queue)),
        "lookup: exactly one of task_id or unique_key is required",
    ),
    (
        "get-both-lookups",
        lambda ctx, s: (
            "get_task",
            GetTaskRequest(context=ctx, queue=s.queue, task_id=s.pending_id, unique_key="k"),
        ),
        "lookup: more than one of task_id, unique_key",
    ),
    (
        "batch-empty",
        lambda ctx, s: ("enqueue_many", EnqueueManyRequest(context=ctx, queue=s.queue, tasks=[])),
        "tasks: 0 tasks is outside 1..1000",
    ),
    (
        "get-empty-task-id",
        lambda ctx, s: ("get_task", GetTaskRequest(context=ctx, queue=s.queue, task_id="")),
        "task_id: must not be empty",
    ),
    (
        "get-queue-empty",
        lambda ctx, s: ("get_task", GetTaskRequest(context=ctx, queue="", task_id=s.pending_id)),
        "queue: must not be empty",
    ),
    (
        "retry-no-lookup",
        lambda ctx, s: ("retry_task", RetryTaskRequest(context=ctx, queue=s.queue)),
        "lookup: exactly one",
    ),
    (
        "retry-both-lookups",
        lambda ctx, s: (
            "retry_task",
            RetryTaskRequest(context=ctx, queue=s.queue, task_id=s.leased_id, unique_key="k"),
        ),
        "lookup: more than one of task_id, unique_key",
    ),
    (
        "retry-key-too-long",
        lambda ctx, s: (
            "retry_task",
            RetryTaskRequest(context=ctx, queue=s.queue, unique_key="k" * 513),
        ),
        "unique_key: 513 bytes",
    ),
    ("claim-limit-0", claim(limit=0), "limit: 0 is outside 1..1000"),
    ("claim-limit-1001", claim(limit=1001), "limit: 1001 is outside 1..1000"),
    ("claim-worker-empty", claim(worker_id=""), "worker_id: must not be empty"),
    ("claim-worker-too-long", claim(worker_id="w" * 201), "worker_id: 201 bytes"),
    ("claim-queue-empty", claim(queue=""), "queue: must not be empty"),
    ("claim-type-empty", claim(task_types=["t", ""]), "task_types[1]: must not be empty"),
    ("claim-too-many-types", claim(task_types=[f"t{i}" for i in range(101)]), "task_types: 101"),
    (
        "claim-wait-negative",
        claim(wait_timeout=timedelta(seconds=-1)),
        "wait_timeout: must not be negative",
    ),
    (
        "claim-wait-too-long",
        claim(wait_timeout=timedelta(seconds=61)),
        "wait_timeout: 1 minute 1 second exceeds the maximum of 1 minute",
    ),
    ("claim-lease-zero", claim(lease_duration=timedelta(0)), "lease_duration: must be positive"),
    (
        "claim-lease-too-long",
        claim(lease_duration=timedelta(days=2)),
        "lease_duration: 2 days exceeds the maximum of 1 day",
    ),
    ("ack-lease-missing", with_lease("ack", AckRequest, lambda s: None), "lease: is required"),
    (
        "ack-task-id-empty",
        with_lease("ack", AckRequest, lambda s: LeaseRef("", s.lease.attempt, "tok")),
        "lease.task_id: must not be empty",
    ),
    (
        "ack-token-empty",
        with_lease("ack", AckRequest, lambda s: LeaseRef(s.lease.task_id, s.lease.attempt, "")),
        "lease.lease_token: must not be empty",
    ),
    (
        "ack-attempt-0",
        with_lease("ack", AckRequest, lambda s: LeaseRef(s.lease.task_id, 0, s.lease.lease_token)),
        "lease.attempt: must be at least 1",
    ),
    (
        "nack-error-too-long",
        with_lease("nack", NackRequest, good_lease, error="e" * (limits.MAX_ERROR_BYTES + 1)),
        "error: 262145 bytes exceeds the 262144-byte limit",
    ),
    (
        "nack-negative-override",
        with_lease("nack", NackRequest, good_lease, retry_delay_override=timedelta(seconds=-1)),
        "retry_delay_override: must not be negative",
    ),
    (
        "nack-override-far-future",
        with_lease("nack", NackRequest, good_lease, retry_delay_override=timedelta(days=3_000_000)),
        "retry_delay_override: 3000000 days exceeds the maximum of 365 days",
    ),
    (
        "nack-lease-missing",
        with_lease("nack", NackRequest, lambda s: None),
        "lease: is required",
    ),
    (
        "reject-error-too-long",
        with_lease(
            "reject", RejectRequest, good_lease, error="é" * (limits.MAX_ERROR_BYTES // 2 + 1)
        ),
        "error: 262146 bytes exceeds",
    ),
    (
        "extend-missing",
        with_lease("extend_lease", ExtendLeaseRequest, good_lease),
        "extension: is required",
    ),
    (
        "extend-zero",
        with_lease("extend_lease", ExtendLeaseRequest, good_lease, extension=timedelta(0)),
        "extension: must be positive",
    ),
    (
        "extend-negative",
        with_lease("extend_lease", ExtendLeaseRequest, good_lease, extension=timedelta(seconds=-5)),
        "extension: must be positive",
    ),
    (
        "extend-too-long",
        with_lease("extend_lease", ExtendLeaseRequest, good_lease, extension=timedelta(days=2)),
        "extension: 2 days exceeds the maximum of 1 day",
    ),
    (
        "progress-message-too-long",
        with_lease("report_progress", ReportProgressRequest, good_lease, message="m" * 4097),
        "message: 4097 bytes exceeds the 4096-byte limit",
    ),
    (
        "progress-current-nan",
        with_lease("report_progress", ReportProgressRequest, good_lease, current=math.nan),
        "current: must be a finite number",
    ),
    (
        "progress-total-inf",
        with_lease("report_progress", ReportProgressRequest, good_lease, total=math.inf),
        "total: must be a finite number",
    ),
    (
        "activity-queue-empty",
        lambda ctx, s: ("get_queue_activity", GetQueueActivityRequest(context=ctx, queue="")),
        "queue: must not be empty",
    ),
    (
        "activity-type-empty",
        lambda ctx, s: (
            "get_queue_activity",
            GetQueueActivityRequest(context=ctx, queue=s.queue, task_types=[""]),
        ),
        "task_types[0]: must not be empty",
    ),
]


async def _setup(client: Client) -> Setup:
    return await leased_and_pending(client, new_queue("val"))


@pytest.mark.parametrize(("build", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_invalid_field_is_refused_by_name_and_changes_nothing(
    daemon: DaemonProcess, build: Build, fragment: str
) -> None:
    """Property: a request invalid in one field is INVALID_ARGUMENT whose
    message names that field and says what is wrong, and the refused request
    changes nothing (no task enqueued, leased, settled, extended or retried)."""
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            setup = await _setup(client)
            before = await snapshot(client, setup)
            method, request = build(client.context, setup)
            await expect_status(
                getattr(client.stub, method)(request), Status.INVALID_ARGUMENT, fragment
            )
            assert await snapshot(client, setup) == before


async def test_nul_is_refused_alike_on_postgres(postgres_dsn: str) -> None:
    """Property: a NUL in any text field is INVALID_ARGUMENT naming the field
    on a PostgreSQL daemon too, with the same message as on SQLite (not
    INTERNAL from the database), and changes nothing."""
    with spawn_daemon(None, postgres_dsn=postgres_dsn) as daemon, anyio.fail_after(30):
        async with connect(daemon) as client:
            setup = await _setup(client)
            before = await snapshot(client, setup)
            for _name, build, fragment in NUL_CASES:
                method, request = build(client.context, setup)
                await expect_status(
                    getattr(client.stub, method)(request), Status.INVALID_ARGUMENT, fragment
                )
            assert await snapshot(client, setup) == before


async def test_unknown_task_is_not_found(daemon: DaemonProcess) -> None:
    """Property: GetTask / RetryTask of an id or key the queue does not hold
    is NOT_FOUND."""
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            setup = await _setup(client)
            ctx = client.context
            for lookup in ({"task_id": "0" * 32}, {"unique_key": "missing"}):
                await expect_status(
                    client.stub.get_task(GetTaskRequest(context=ctx, queue=setup.queue, **lookup)),
                    Status.NOT_FOUND,
                )
                await expect_status(
                    client.stub.retry_task(
                        RetryTaskRequest(context=ctx, queue=setup.queue, **lookup)
                    ),
                    Status.NOT_FOUND,
                )


class RawFrame:
    """Sends its bytes verbatim through grpclib's ProtoCodec."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


async def _raw_call(endpoint: str, method: str, data: bytes, reply: type) -> Any:
    host, port = split_endpoint(endpoint)
    channel = Channel(host, port)
    try:
        stream: Any
        async with channel.request(
            f"/ringo.v1.QueueService/{method}", Cardinality.UNARY_UNARY, RawFrame, reply
        ) as stream:
            await stream.send_message(RawFrame(data), end=True)
            return await stream.recv_message()
    finally:
        channel.close()


@pytest.mark.parametrize(
    ("method", "data", "reply", "fragment"),
    [
        (
            "Enqueue",
            b"\xff\xff\xff",
            EnqueueResponse,
            "malformed EnqueueRequest: message: truncated",
        ),
        ("Enqueue", b"garbage bytes here", EnqueueResponse, "unsupported wire type"),
        ("Enqueue", b"\x0a\x02\x1a\xc3", EnqueueResponse, "context.session_token"),
        ("Enqueue", b"\x1a\x04\x0a\x02\xff\xfe", EnqueueResponse, "task.task_type: string is not"),
        ("Ack", bytes(EnqueueRequest(queue="qqqqq", task=spec())), AckResponse, "lease"),
    ],
    ids=["truncated-varint", "bad-wire-type", "truncated-field", "bad-utf8", "wrong-message"],
)
async def test_undecodable_frames_are_invalid_argument_and_the_daemon_stays_up(
    daemon: DaemonProcess, method: str, data: bytes, reply: type, fragment: str
) -> None:
    """Property: bytes that are not a valid encoding of the method's message
    are INVALID_ARGUMENT naming where decoding failed; nothing changes and
    the daemon keeps serving."""
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            setup = await _setup(client)
            before = await snapshot(client, setup)
            await expect_status(
                _raw_call(daemon.endpoint, method, data, reply), Status.INVALID_ARGUMENT, fragment
            )
            assert await snapshot(client, setup) == before
            assert daemon.running


async def test_oversized_message_is_resource_exhausted(daemon: DaemonProcess) -> None:
    """Property: a request frame over MAX_MESSAGE_BYTES is refused with
    RESOURCE_EXHAUSTED and changes nothing; the daemon keeps serving."""
    with anyio.fail_after(30):
        async with connect(daemon) as client:
            setup = await _setup(client)
            before = await snapshot(client, setup)
            # A valid EnqueueRequest whose only problem is its size.
            request = EnqueueRequest(
                context=client.context,
                queue=setup.queue,
                task=spec(payload=b"x" * (limits.MAX_MESSAGE_BYTES + 1)),
            )
            await expect_status(
                _raw_call(daemon.endpoint, "Enqueue", bytes(request), EnqueueResponse),
                Status.RESOURCE_EXHAUSTED,
                f"exceeds the {limits.MAX_MESSAGE_BYTES}-byte message limit",
            )
            assert await snapshot(client, setup) == before


async def test_payload_at_the_limit_is_accepted(daemon: DaemonProcess) -> None:
    """Property: the limits are inclusive — a 1 MiB payload and a 512-byte
    unique key are fine (the boundary the refusals above sit just past)."""
    with anyio.fail_after(15):
        async with connect(daemon) as client:
            queue = new_queue()
            task = await client.enqueue(
                queue, payload=b"x" * limits.MAX_PAYLOAD_BYTES, unique_key="k" * 512
            )
            assert len((await client.get(queue, task.id)).payload) == MiB
