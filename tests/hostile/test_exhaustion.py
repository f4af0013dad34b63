"""Resource exhaustion: attacks on a real ringod over loopback that used to
pin memory or time (a client that stops reading, a huge length prefix,
HTTP/2 rapid reset, idle connections, compressed messages)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import anyio
import h2.errors
import pytest

from ringo_trio._contract import limits, versions
from ringo_trio._contract.work.server import PUSH_BUDGET_BYTES
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    NegotiateRequest,
    RequestContext,
    TaskState,
    WorkerRegistration,
    WorkRequest,
    WorkResponse,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import Client, connect, new_queue, split_endpoint
from tests._kit.h2raw import ENQUEUE_METHOD, NEGOTIATE_METHOD, WORK_METHOD, RawH2, grpc_frame

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    # The daemon tests' clients (grpclib, the raw h2 client) are asyncio.
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path_factory.mktemp("exhaustion") / "data") as process:
        yield process


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A daemon that closes idle and unresponsive connections within a second."""
    args = ["--idle-timeout", "1", "--keepalive-interval", "0.3", "--keepalive-timeout", "0.3"]
    with spawn_daemon(tmp_path_factory.mktemp("impatient") / "data", extra_args=args) as process:
        yield process


async def raw(daemon: DaemonProcess, *, window: int = 65535) -> RawH2:
    host, port = split_endpoint(daemon.endpoint)
    return await RawH2.connect(host, port, window=window)


async def still_serves(daemon: DaemonProcess) -> None:
    async with connect(daemon) as client:
        await client.stub.negotiate(
            NegotiateRequest(
                sdk_name="tests",
                sdk_version="0",
                protocol_major=versions.MAJOR,
                protocol_minor=versions.MINOR,
            )
        )


def no_traceback(daemon: DaemonProcess) -> None:
    assert "Traceback" not in daemon.stderr_text(), daemon.stderr_text()


# -- a worker that stops reading ----------------------------------------------------


async def stalled_worker(
    daemon: DaemonProcess, context: RequestContext, queue: str, lease: timedelta
) -> tuple[RawH2, int]:
    """A Work stream with credit 64 whose worker never opens its receive window."""
    client = await raw(daemon)
    client.auto_ack = False
    stream_id = client.start(WORK_METHOD)
    registration = WorkerRegistration(
        context=context,
        queue=queue,
        worker_id="stalled",
        task_types=["t"],
        max_concurrency=64,
        lease_duration=lease,
    )
    await client.send(stream_id, grpc_frame(WorkRequest(register=registration)))
    credit = WorkRequest(request_id=1, credit=CreditUpdate(available=64))
    await client.send(stream_id, grpc_frame(credit))
    return client, stream_id


async def states(client: Client, queue: str, ids: list[str]) -> list[tuple[TaskState, int]]:
    tasks = [await client.get(queue, task_id) for task_id in ids]
    return [(task.state, task.attempt) for task in tasks]


async def test_stalled_stream_holds_at_most_its_budget_and_gives_it_back(
    daemon: DaemonProcess,
) -> None:
    """A worker that stops reading makes the daemon hold at most the stream's
    byte budget of claimed tasks (not a 64-task batch of 1 MiB payloads), and
    once their leases are nearly out the stream is reset and those tasks are
    PENDING again, no attempt spent, for another worker to claim."""
    queue = new_queue("stall")
    payload = b"x" * limits.MAX_PAYLOAD_BYTES
    held_max = PUSH_BUDGET_BYTES // len(payload)
    with anyio.fail_after(40):
        async with connect(daemon) as client:
            # Small tasks first: they are written at once and make the next
            # claim ask for many tasks, which then turn out to be big.
            for _ in range(8):
                await client.enqueue(queue, payload=b"s")
            ids = [(await client.enqueue(queue, payload=payload)).id for _ in range(20)]
            worker, stream_id = await stalled_worker(
                daemon, client.context, queue, timedelta(seconds=3)
            )

            async def held_now() -> int:
                now = await states(client, queue, ids)
                await worker.pump(0.05)
                return sum(state is TaskState.LEASED for state, _ in now)

            # Sampled until the daemon has claimed, then until it gave back.
            held = [await held_now()]
            while not held[-1]:
                held.append(await held_now())
            while held[-1]:
                held.append(await held_now())
            assert 0 < max(held) <= held_max, held
            assert await states(client, queue, ids) == [(TaskState.PENDING, 0)] * len(ids)
            await worker.until(lambda: worker.streams[stream_id].reset is not None, 5)
            assert worker.streams[stream_id].reset is not None
            worker.close()
            # A Claim answers what fits in a 4 MiB reply (three of these), so
            # another worker takes them in a few calls, each at attempt 1. The
            # small tasks were delivered, so their leases run out on their own
            # clock: whether they are claimable again by now depends on how
            # fast this machine is, and they are left out of the count.
            attempts: dict[str, int] = {}
            while not set(ids) <= attempts.keys():
                more = await client.claim(queue, limit=len(ids), worker_id="w2")
                assert more, "a task given back is claimable"
                attempts |= {item.task.id: item.lease.attempt for item in more}
            assert {attempts[task_id] for task_id in ids} == {1}


async def test_resuming_worker_never_gets_an_expired_lease(daemon: DaemonProcess) -> None:
    """A worker that stops reading until its leases have run out, then reads
    again, receives no task frame whose lease has expired (the daemon reset
    the stalled stream instead of finishing the frame later)."""
    queue = new_queue("resume")
    with anyio.fail_after(30):
        async with connect(daemon) as client:
            for _ in range(5):
                await client.enqueue(queue, payload=b"y" * 200_000)
            worker, stream_id = await stalled_worker(
                daemon, client.context, queue, timedelta(seconds=2)
            )
            await worker.until(lambda: False, 4)
            # Resume: open both windows wide and read everything.
            state = worker.streams[stream_id]
            worker.auto_ack = True
            if state.reset is None:
                worker.conn.increment_flow_control_window(2**30, stream_id)
            worker.conn.increment_flow_control_window(2**30)
            await worker.flush()
            await worker.until(lambda: state.ended or state.reset is not None, 10)
            received = datetime.now(UTC)
            worker.close()
    frames = [WorkResponse.parse(message) for message in state.messages()]
    # A batch frame (minor >= 10) is its elements.
    frames = [m for frame in frames for m in (frame.batch.responses if frame.batch else [frame])]
    leases = [frame.task.lease for frame in frames if frame.task and frame.task.lease]
    assert all(lease.until > received for lease in leases), leases
    assert state.reset is not None


# -- HTTP/2 --------------------------------------------------------------------------


async def test_rapid_reset_gets_goaway(daemon: DaemonProcess) -> None:
    """A connection that opens and resets streams by the thousand gets
    GOAWAY(ENHANCE_YOUR_CALM) and is closed before it gets through them all;
    other clients are still served."""
    attempts = 20_000
    with anyio.fail_after(30):
        client = await raw(daemon)
        sent = 0
        try:
            while sent < attempts and not client.eof and client.goaway is None:
                for _ in range(500):
                    stream_id = client.start(NEGOTIATE_METHOD)
                    client.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    sent += 1
                await client.flush()
                await client.pump(0.001)
        except ConnectionError:
            pass
        await client.until(lambda: client.goaway is not None, 10)
        client.close()
        assert client.goaway is not None, f"no GOAWAY after {sent} resets (eof: {client.eof})"
        assert client.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        # The daemon stopped processing streams long before the last one.
        assert client.goaway.last_stream_id is not None
        assert client.goaway.last_stream_id < 2 * attempts - 1
        await still_serves(daemon)


async def test_idle_connection_is_closed(impatient: DaemonProcess) -> None:
    """A connection that never starts a call is closed with GOAWAY(NO_ERROR)
    after --idle-timeout."""
    with anyio.fail_after(10):
        client = await raw(impatient)
        await client.until(lambda: client.eof, 9)
        client.close()
    assert client.goaway is not None
    assert client.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
    assert client.eof


async def test_connection_with_a_call_is_not_idle(impatient: DaemonProcess) -> None:
    """A connection that keeps a call open and answers pings is neither idle
    nor dead: it stays open past --idle-timeout and --keepalive-timeout."""
    with anyio.fail_after(10):
        client = await raw(impatient)
        stream_id = client.start(NEGOTIATE_METHOD)
        await client.flush()
        await client.until(lambda: False, 2.5)
        assert not client.eof
        assert client.goaway is None
        await client.send(stream_id, grpc_frame(b""), end=True)
        client.close()


async def test_unresponsive_connection_is_closed(impatient: DaemonProcess) -> None:
    """A connection with a call open that stops reading (its pings go
    unanswered) is closed after --keepalive-interval + --keepalive-timeout,
    which also ends its calls."""
    with anyio.fail_after(15):
        client = await raw(impatient)
        client.start(NEGOTIATE_METHOD)
        await client.flush()
        await anyio.sleep(3)  # not reading: pings pile up unanswered
        await client.until(lambda: False, 10)
        client.close()
    assert client.eof


# -- messages ------------------------------------------------------------------------


@pytest.mark.parametrize("method", [ENQUEUE_METHOD, WORK_METHOD])
async def test_huge_length_prefix_is_refused_on_the_prefix(
    daemon: DaemonProcess, method: str
) -> None:
    """A message announcing 100 MB (over the 64 MiB limit) is refused with
    RESOURCE_EXHAUSTED as soon as its 5-byte prefix arrives, without the
    body being read (the client has sent only a few bytes of it)."""
    with anyio.fail_after(15):
        client = await raw(daemon)
        stream_id = client.start(method)
        await client.send(stream_id, (100_000_000).to_bytes(5) + b"x" * 1000)
        state = client.streams[stream_id]
        await client.until(lambda: state.header("grpc-status") is not None, 10)
        client.close()
    assert state.header("grpc-status") == "8", (state.headers, state.trailers)
    assert f"exceeds the {limits.MAX_MESSAGE_BYTES}-byte message limit" in (
        state.header("grpc-message") or ""
    )
    no_traceback(daemon)


@pytest.mark.parametrize("encoding", [None, "gzip"])
async def test_compressed_message_is_unimplemented(
    daemon: DaemonProcess, encoding: str | None
) -> None:
    """A compressed message (flag set, with or without grpc-encoding) and any
    grpc-encoding but identity get UNIMPLEMENTED with grpc-accept-encoding:
    identity, as the gRPC spec wants, and no traceback in the daemon log."""
    request = NegotiateRequest(sdk_name="t", sdk_version="0", protocol_major=1)
    extra = [("grpc-encoding", encoding)] if encoding else []
    with anyio.fail_after(10):
        client = await raw(daemon)
        stream_id = client.start(NEGOTIATE_METHOD, extra)
        await client.send(stream_id, grpc_frame(request, compressed=True), end=True)
        state = client.streams[stream_id]
        await client.until(lambda: state.header("grpc-status") is not None, 8)
        client.close()
    assert state.header("grpc-status") == "12", (state.headers, state.trailers)
    assert state.header("grpc-accept-encoding") == "identity"
    no_traceback(daemon)


async def test_uncompressed_message_with_gzip_encoding_is_unimplemented(
    daemon: DaemonProcess,
) -> None:
    """A call that declares grpc-encoding gzip is refused with UNIMPLEMENTED
    even when its message is not compressed: the daemon cannot answer in gzip."""
    request = NegotiateRequest(sdk_name="t", sdk_version="0", protocol_major=1)
    with anyio.fail_after(10):
        client = await raw(daemon)
        stream_id = client.start(NEGOTIATE_METHOD, [("grpc-encoding", "gzip")])
        await client.send(stream_id, grpc_frame(request), end=True)
        state = client.streams[stream_id]
        await client.until(lambda: state.header("grpc-status") is not None, 8)
        client.close()
    assert state.header("grpc-status") == "12", (state.headers, state.trailers)
    assert state.header("grpc-accept-encoding") == "identity"
