"""Negotiation, RequestContext checks, session expiry, older minors, bearer tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import limits, versions
from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthCheckResponseServingStatus
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ClaimRequest,
    EnqueueManyRequest,
    EnqueueRequest,
    ExtendLeaseRequest,
    GetQueueActivityRequest,
    GetTaskRequest,
    NackRequest,
    NegotiateRequest,
    RejectRequest,
    ReportProgressRequest,
    RequestContext,
    RetryTaskRequest,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import (
    Client,
    Setup,
    connect,
    expect_status,
    leased_and_pending,
    new_queue,
    ref,
    snapshot,
)
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, virtual_daemon

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def short_session_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path_factory.mktemp("ttl") / "data", session_ttl=0.5) as process:
        yield process


@pytest.fixture(scope="module")
def minor0_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path_factory.mktemp("minor0") / "data", protocol_minor=0) as process:
        yield process


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    # Many wrong tokens on purpose: answered at once, not throttled.
    with spawn_daemon(
        tmp_path_factory.mktemp("auth") / "data",
        token=TOKEN,
        extra_args=["--auth-failure-delay", "0"],
    ) as process:
        yield process


def _negotiate(major: int = versions.MAJOR, minor: int = versions.MINOR) -> Any:
    return NegotiateRequest(
        sdk_name="tests", sdk_version="0", protocol_major=major, protocol_minor=minor
    )


async def test_negotiate_answers_the_lower_minor_and_a_fresh_token(
    daemon: DaemonProcess,
) -> None:
    """Property: the response minor is min(client minor, served minor), the
    token is random per negotiation, and the TTL is reported."""
    with anyio.fail_after(10):
        async with connect(daemon, negotiate=False) as client:
            newer = await client.stub.negotiate(_negotiate(minor=versions.MINOR + 5))
            older = await client.stub.negotiate(_negotiate(minor=1))
            assert newer.protocol_major == versions.MAJOR
            assert newer.protocol_minor == versions.MINOR
            assert older.protocol_minor == 1
            assert newer.session_token
            assert older.session_token
            assert newer.session_token != older.session_token
            assert newer.session_ttl == limits.DEFAULT_SESSION_TTL
            assert newer.server_version


async def test_negotiate_refuses_another_major(daemon: DaemonProcess) -> None:
    """Property: a client of another protocol major gets OUT_OF_RANGE naming
    both majors, and no session."""
    with anyio.fail_after(10):
        async with connect(daemon, negotiate=False) as client:
            for major in (0, 2):
                await expect_status(
                    client.stub.negotiate(_negotiate(major=major)),
                    Status.OUT_OF_RANGE,
                    f"protocol major {major}",
                    f"major {versions.MAJOR}",
                )


def _every_call(
    client: Client, ctx: RequestContext | None, fixture: Setup
) -> list[Callable[[], Awaitable[Any]]]:
    """One call of every context-checked RPC, each valid apart from `ctx`."""
    stub = client.stub
    queue, lease, pending_id = fixture.queue, fixture.lease, fixture.pending_id
    return [
        lambda: stub.enqueue(
            EnqueueRequest(context=ctx, queue=queue, task=TaskSpec(task_type="t"))
        ),
        lambda: stub.enqueue_many(
            EnqueueManyRequest(context=ctx, queue=queue, tasks=[TaskSpec(task_type="t")])
        ),
        lambda: stub.get_task(GetTaskRequest(context=ctx, queue=queue, task_id=pending_id)),
        lambda: stub.retry_task(RetryTaskRequest(context=ctx, queue=queue, task_id=pending_id)),
        lambda: stub.claim(ClaimRequest(context=ctx, queue=queue, worker_id="w", limit=5)),
        lambda: stub.ack(AckRequest(context=ctx, lease=lease)),
        lambda: stub.nack(NackRequest(context=ctx, lease=lease)),
        lambda: stub.reject(RejectRequest(context=ctx, lease=lease)),
        lambda: stub.extend_lease(
            ExtendLeaseRequest(context=ctx, lease=lease, extension=timedelta(seconds=5))
        ),
        lambda: stub.report_progress(
            ReportProgressRequest(context=ctx, lease=lease, current=1, total=1)
        ),
        lambda: stub.get_queue_activity(GetQueueActivityRequest(context=ctx, queue=queue)),
    ]


@pytest.mark.parametrize(
    "bad_context",
    [
        pytest.param(lambda good: None, id="missing-context"),
        pytest.param(lambda good: RequestContext(1, good.protocol_minor, ""), id="empty-token"),
        pytest.param(lambda good: RequestContext(1, good.protocol_minor, "forged"), id="unknown"),
        pytest.param(lambda good: RequestContext(2, 0, good.session_token), id="other-major"),
        pytest.param(lambda good: RequestContext(0, 0, good.session_token), id="major-0"),
        pytest.param(
            lambda good: RequestContext(1, good.protocol_minor + 1, good.session_token),
            id="minor-above-session",
        ),
    ],
)
async def test_rejected_context_refuses_every_rpc_before_it_runs(
    daemon: DaemonProcess, bad_context: Callable[[RequestContext], RequestContext | None]
) -> None:
    """Property: every RPC but Negotiate checks its RequestContext first; a
    missing/unknown token, another major or a minor above the session's is
    OUT_OF_RANGE and the operation does not run (no enqueue, claim, ack,
    nack, reject, extension, progress or retry happens)."""
    queue = new_queue()
    with anyio.fail_after(20):
        # A minor-5 session, so "minor above the session" is still a minor the
        # daemon serves: the check is against the session, not the daemon.
        async with connect(daemon, minor=5) as client:
            fixture = await leased_and_pending(client, queue)
            before = await snapshot(client, fixture)
            ctx = bad_context(client.context)
            for call in _every_call(client, ctx, fixture):
                await expect_status(call(), Status.OUT_OF_RANGE)
            assert await snapshot(client, fixture) == before
            assert before[1].state is TaskState.LEASED


@on_virtual_time
async def test_expired_session_is_refused_until_renegotiated() -> None:
    """Property: a session token works until its TTL and stops working at it
    (OUT_OF_RANGE, nothing enqueued); a fresh negotiation works again. On
    virtual time: still valid just before the TTL, refused just after."""
    queue = new_queue()
    ttl = 0.5
    async with (
        virtual_daemon(session_ttl=timedelta(seconds=ttl)) as served,
        connect(served.daemon) as client,
    ):
        negotiated = now()
        await client.enqueue(queue)
        await asyncio.sleep(negotiated + ttl - 0.05 - now())
        await client.enqueue(queue)
        await asyncio.sleep(0.05 + PROMPT)
        await expect_status(client.enqueue(queue), Status.OUT_OF_RANGE, "expired")
        async with connect(served.daemon) as fresh:
            assert await fresh.activity(queue) == 2
            await fresh.enqueue(queue)
            assert await fresh.activity(queue) == 3


async def test_the_session_ttl_flag_is_the_negotiated_ttl(
    short_session_daemon: DaemonProcess,
) -> None:
    """Property: ringod's --session-ttl is the TTL its Negotiate announces (and
    enforces: timed on virtual time above)."""
    with anyio.fail_after(10):
        async with connect(short_session_daemon, negotiate=False) as client:
            response = await client.stub.negotiate(_negotiate())
            assert response.session_ttl == timedelta(seconds=0.5)


async def test_older_minor_daemon_negotiates_down_and_refuses_newer_rpcs(
    minor0_daemon: DaemonProcess,
) -> None:
    """Property: `--protocol-minor 0` serves minor 0: negotiation answers 0,
    GetQueueActivity (minor 1) is UNIMPLEMENTED, a context claiming minor 1 is
    OUT_OF_RANGE, and minor-0 RPCs work."""
    queue = new_queue()
    assert minor0_daemon.info["protocol_minor"] == 0
    with anyio.fail_after(10):
        async with connect(minor0_daemon) as client:
            assert client.context.protocol_minor == 0
            task = await client.enqueue(queue)
            await expect_status(
                client.activity(queue), Status.UNIMPLEMENTED, "GetQueueActivity", "minor 1"
            )
            ctx1 = RequestContext(1, 1, client.context.session_token)
            await expect_status(
                client.stub.get_task(GetTaskRequest(context=ctx1, queue=queue, task_id=task.id)),
                Status.OUT_OF_RANGE,
            )
            [leased] = await client.claim(queue)
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))


async def test_minor0_session_on_newest_daemon_cannot_use_queue_activity(
    daemon: DaemonProcess,
) -> None:
    """Property: the RPC gate is the session's minor, not the daemon's."""
    with anyio.fail_after(10):
        async with connect(daemon, minor=0) as client:
            assert client.context.protocol_minor == 0
            await expect_status(client.activity(new_queue()), Status.UNIMPLEMENTED)


async def test_due_only_activity_leaves_out_scheduled_tasks(daemon: DaemonProcess) -> None:
    """Property: GetQueueActivity with due_only (minor 8) counts a task
    scheduled in the future as not there, and counts it once it is due to
    the daemon's clock only; without due_only it counts as before."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon) as client:
            await client.enqueue(queue, delay=timedelta(hours=1))
            assert await client.activity(queue) == 1
            assert await client.activity(queue, due_only=True) == 0
            await client.enqueue(queue)
            assert await client.activity(queue, due_only=True) == 1
            assert await client.activity(queue) == 2


async def test_minor7_session_cannot_ask_for_due_only_activity(daemon: DaemonProcess) -> None:
    """Property: due_only is gated on the session's minor: a minor-7 session
    that sets it is UNIMPLEMENTED (never a count that silently includes
    scheduled tasks), while its plain GetQueueActivity still works."""
    queue = new_queue()
    with anyio.fail_after(10):
        async with connect(daemon, minor=7) as client:
            assert client.context.protocol_minor == 7
            await client.enqueue(queue, delay=timedelta(hours=1))
            await expect_status(
                client.activity(queue, due_only=True), Status.UNIMPLEMENTED, "due_only", "minor 8"
            )
            assert await client.activity(queue) == 1


async def test_bearer_token_is_required_on_every_rpc_including_health(
    token_daemon: DaemonProcess,
) -> None:
    """Property: with --token, a missing or wrong bearer token is
    UNAUTHENTICATED on Negotiate, health and queue RPCs, and a refused call
    changes nothing; the right token (any scheme case) works."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(token_daemon, token=TOKEN) as good:
            await good.enqueue(queue)
            for bad in (None, "wrong", TOKEN.upper(), TOKEN + "x", ""):
                async with connect(token_daemon, token=bad, negotiate=False) as client:
                    # A real session with a bad token: only the token is wrong.
                    ctx = good.context
                    await expect_status(client.stub.negotiate(_negotiate()), Status.UNAUTHENTICATED)
                    await expect_status(
                        client.health.check(HealthCheckRequest()), Status.UNAUTHENTICATED
                    )
                    await expect_status(
                        client.stub.enqueue(
                            EnqueueRequest(context=ctx, queue=queue, task=TaskSpec(task_type="t"))
                        ),
                        Status.UNAUTHENTICATED,
                        "bearer token",
                    )
            assert await good.activity(queue) == 1
            health = await good.health.check(HealthCheckRequest())
            assert health.status is HealthCheckResponseServingStatus.SERVING
        channel_metadata = {"authorization": f"bearer {TOKEN}"}
        async with connect(token_daemon, negotiate=False) as lower:
            lower.stub.metadata = channel_metadata
            response = await lower.stub.negotiate(_negotiate())
            assert response.session_token


def test_token_flag_is_reported_without_the_secret(token_daemon: DaemonProcess) -> None:
    """Property: the ready line says auth is on but never contains the token."""
    assert token_daemon.info["auth"] is True
    assert TOKEN not in repr(token_daemon.info)
    assert TOKEN not in token_daemon.stderr_text()
