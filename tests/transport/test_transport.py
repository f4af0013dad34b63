"""The transport island: error mapping, streams (pumps, backpressure, teardown), both backends.

Streams are exercised against the daemon's Health.Watch (server stream) and an
in-test grpclib bidi echo server standing in for the future Work stream.
"""

from __future__ import annotations

import asyncio
import pathlib
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import grpclib.const
import grpclib.exceptions
import grpclib.protocol
import grpclib.server
import pytest
import trio

from ringo_trio import FailedPreconditionError, NotFoundError, RingoError, UnavailableError
from ringo_trio._endpoint import Endpoint, parse_endpoint
from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    WorkerDrain,
    WorkRequest,
    WorkResponse,
    WorkResult,
)
from ringo_trio._transport.base import SessionRejectedError
from ringo_trio._transport.grpclib import HEALTH_CHECK, HEALTH_WATCH, Transport, _map_error
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import eventually, free_port

WORK = "/ringo.v1.QueueService/Work"


class RawReply:
    """A reply sent as the test wrote it, byte for byte."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


class _ClosingServer(grpclib.server.Server):
    """grpclib's server, whose close also closes the connections still open.
    Neither grpclib's nor asyncio's (Python 3.11) does: a connection whose
    client's close the server's loop has not read yet when it ends is left
    to the collector, and its unclosed socket's ResourceWarning fails
    whichever test is running then (filterwarnings = error)."""

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._protocols: list[grpclib.protocol.H2Protocol] = []

    def _protocol_factory(self) -> grpclib.protocol.H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.append(protocol)
        return protocol

    async def wait_closed(self) -> None:
        await super().wait_closed()
        for protocol in self._protocols:
            if hasattr(protocol, "connection"):  # made: it has a transport
                protocol.connection.close()
        await asyncio.sleep(0)  # the transports' closing callbacks


class EchoServer:
    """Answers every WorkRequest with a result carrying its request_id; a drain frame
    fails the stream with FAILED_PRECONDITION; a health check with the bytes of
    ``health_reply``. Runs on its own thread and loop."""

    def __init__(self) -> None:
        self.port = 0
        self.health_reply = b"\x08\x01"  # SERVING
        self.handler_ended = threading.Event()
        self.received = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._started = threading.Event()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            WORK: grpclib.const.Handler(
                self._work, grpclib.const.Cardinality.STREAM_STREAM, WorkRequest, WorkResponse
            ),
            HEALTH_CHECK: grpclib.const.Handler(
                self._check, grpclib.const.Cardinality.UNARY_UNARY, HealthCheckRequest, RawReply
            ),
        }

    async def _check(self, stream: grpclib.server.Stream[HealthCheckRequest, RawReply]) -> None:
        await stream.recv_message()
        await stream.send_message(RawReply(self.health_reply))

    async def _work(self, stream: grpclib.server.Stream[WorkRequest, WorkResponse]) -> None:
        try:
            async for request in stream:
                self.received += 1
                if request.drain is not None:
                    raise grpclib.exceptions.GRPCError(
                        grpclib.const.Status.FAILED_PRECONDITION, "drain refused"
                    )
                await stream.send_message(
                    WorkResponse(result=WorkResult(request_id=request.request_id))
                )
        finally:
            self.handler_ended.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = _ClosingServer([self])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await server.start(sock=sock)
        self._started.set()
        await self._stop.wait()
        server.close()
        await server.wait_closed()

    def __enter__(self) -> EchoServer:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


@pytest.fixture
def health_daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path) as daemon:
        yield daemon


def endpoint_of(port: int) -> Endpoint:
    return Endpoint("127.0.0.1", port, False)


def request(i: int) -> WorkRequest:
    return WorkRequest(request_id=i, credit=CreditUpdate(available=1))


# -- scenarios, run on both backends -------------------------------------------


async def bidi_round_trip(port: int) -> None:
    """1000 frames each way in order through the pumps; half-close ends the stream."""
    async with (
        Transport(endpoint_of(port)) as transport,
        transport.open_stream(WORK, WorkRequest, WorkResponse) as stream,
    ):
        assert stream.send is not None
        received: list[int] = []

        async def reader() -> None:
            async for response in stream.receive:
                assert response.result is not None
                received.append(response.result.request_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            for i in range(1, 1001):
                await stream.send.send(request(i))
            await stream.send.aclose()
        assert received == list(range(1, 1001))


async def backpressure(port: int) -> None:
    """With one-slot buffers and a slow reader nothing is lost or reordered."""
    async with (
        Transport(endpoint_of(port)) as transport,
        transport.open_stream(
            WORK, WorkRequest, WorkResponse, send_buffer=1, receive_buffer=1
        ) as stream,
    ):
        assert stream.send is not None
        send = stream.send

        async def writer() -> None:
            async with send:
                for i in range(1, 201):
                    await send.send(request(i))

        got = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            async for response in stream.receive:
                got.append(response.result.request_id)
                if len(got) % 50 == 0:
                    await anyio.sleep(0.05)
        assert got == list(range(1, 201))


async def stream_failure_cancels_the_block(port: int) -> None:
    """A stream error cancels the body and is raised from the block as a ringo error."""
    async with Transport(endpoint_of(port)) as transport:
        reached_end = False

        async def refused_drain() -> None:
            nonlocal reached_end
            async with transport.open_stream(WORK, WorkRequest, WorkResponse) as stream:
                assert stream.send is not None
                await stream.send.send(WorkRequest(request_id=1, drain=WorkerDrain(begin=True)))
                await anyio.sleep(30)
                reached_end = True

        with pytest.raises(FailedPreconditionError, match="drain refused"):
            await refused_drain()
        assert not reached_end
        # The transport is still usable for a new stream.
        async with transport.open_stream(WORK, WorkRequest, WorkResponse) as stream:
            assert stream.send is not None
            await stream.send.send(request(7))
            assert (await stream.receive.receive()).result.request_id == 7


async def leaving_early_cancels_the_stream(echo: EchoServer) -> None:
    """Leaving the block while the stream is open cancels it on the server too."""
    async with Transport(endpoint_of(echo.port)) as transport:
        async with transport.open_stream(WORK, WorkRequest, WorkResponse) as stream:
            assert stream.send is not None
            await stream.send.send(request(1))
            await stream.receive.receive()
        await eventually(echo.handler_ended.is_set)


async def health_watch(endpoint: str) -> None:
    async with Transport(parse_endpoint(endpoint)) as transport:
        assert await transport.health_check(rpc_timeout=5)
        async with transport.open_stream(
            HEALTH_WATCH, HealthCheckRequest, HealthCheckResponse, request=HealthCheckRequest()
        ) as stream:
            assert stream.send is None
            first = await stream.receive.receive()
            assert first.status == HealthCheckResponseServingStatus.SERVING


async def malformed_unary_reply(echo: EchoServer) -> None:
    """Property: a unary reply that is no valid encoding of its message is a
    RingoError naming it, never a message decoded from part of the bytes
    (betterproto2's own parser dropped the truncated field and answered
    "not serving"); the transport stays usable."""
    echo.health_reply = b"\x08\x81"  # field 1, a varint cut short
    async with Transport(endpoint_of(echo.port)) as transport:
        with pytest.raises(RingoError, match="malformed HealthCheckResponse from the daemon"):
            await transport.health_check(rpc_timeout=5)
        echo.health_reply = b"\x08\x01"
        assert await transport.health_check(rpc_timeout=5)


async def unavailable_and_closed(port: int) -> None:
    async with Transport(endpoint_of(port)) as transport:
        with pytest.raises(UnavailableError, match=f"127.0.0.1:{port}"):
            await transport.health_check(rpc_timeout=5)
        await transport.aclose()
        await transport.aclose()
        with pytest.raises(RingoError, match="closed"):
            await transport.health_check(rpc_timeout=5)
        with pytest.raises(RingoError, match="closed"):
            async with transport.open_stream(WORK, WorkRequest, WorkResponse):
                pass


# -- trio ------------------------------------------------------------------------


@pytest.mark.trio
async def test_bidi_round_trip_trio(echo: EchoServer) -> None:
    with trio.fail_after(20):
        await bidi_round_trip(echo.port)


@pytest.mark.trio
async def test_backpressure_trio(echo: EchoServer) -> None:
    with trio.fail_after(20):
        await backpressure(echo.port)


@pytest.mark.trio
async def test_stream_failure_trio(echo: EchoServer) -> None:
    with trio.fail_after(20):
        await stream_failure_cancels_the_block(echo.port)


@pytest.mark.trio
async def test_leaving_early_trio(echo: EchoServer) -> None:
    with trio.fail_after(20):
        await leaving_early_cancels_the_stream(echo)


@pytest.mark.trio
async def test_health_watch_trio(health_daemon: DaemonProcess) -> None:
    with trio.fail_after(20):
        await health_watch(health_daemon.endpoint)


@pytest.mark.trio
async def test_malformed_unary_reply_trio(echo: EchoServer) -> None:
    with trio.fail_after(20):
        await malformed_unary_reply(echo)


@pytest.mark.trio
async def test_unavailable_and_closed_trio() -> None:
    with trio.fail_after(20):
        await unavailable_and_closed(free_port())


@pytest.mark.trio
async def test_body_exception_leaves_the_stream_unwrapped(echo: EchoServer) -> None:
    """An exception from the stream block's body comes out as itself."""
    with trio.fail_after(20):
        async with Transport(endpoint_of(echo.port)) as transport:
            with pytest.raises(KeyError):
                async with transport.open_stream(WORK, WorkRequest, WorkResponse):
                    raise KeyError("body")


@pytest.mark.trio
async def test_transport_is_usable_from_a_task_spawned_before_it(echo: EchoServer) -> None:
    """The loop is bound explicitly, not through a context variable, so a task started
    before the transport existed can still use it."""
    with trio.fail_after(20):
        send, receive = trio.open_memory_channel[Any](1)
        results: list[int] = []

        async def user() -> None:
            transport = await receive.receive()
            async with transport.open_stream(WORK, WorkRequest, WorkResponse) as stream:
                await stream.send.send(request(3))
                results.append((await stream.receive.receive()).result.request_id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(user)
            async with Transport(endpoint_of(echo.port)) as transport:
                await send.send(transport)
                await eventually(lambda: bool(results))
        assert results == [3]


# -- asyncio ---------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_bidi_round_trip_asyncio(echo: EchoServer) -> None:
    with anyio.fail_after(20):
        await bidi_round_trip(echo.port)


@pytest.mark.anyio
async def test_backpressure_asyncio(echo: EchoServer) -> None:
    with anyio.fail_after(20):
        await backpressure(echo.port)


@pytest.mark.anyio
async def test_stream_failure_asyncio(echo: EchoServer) -> None:
    with anyio.fail_after(20):
        await stream_failure_cancels_the_block(echo.port)


@pytest.mark.anyio
async def test_leaving_early_asyncio(echo: EchoServer) -> None:
    with anyio.fail_after(20):
        await leaving_early_cancels_the_stream(echo)


@pytest.mark.anyio
async def test_health_watch_asyncio(health_daemon: DaemonProcess) -> None:
    with anyio.fail_after(20):
        await health_watch(health_daemon.endpoint)


@pytest.mark.anyio
async def test_unavailable_and_closed_asyncio() -> None:
    with anyio.fail_after(20):
        await unavailable_and_closed(free_port())


@pytest.mark.anyio
async def test_malformed_unary_reply_asyncio(echo: EchoServer) -> None:
    with anyio.fail_after(20):
        await malformed_unary_reply(echo)


# -- the error boundary and the lifecycle, without a server -----------------------


@pytest.mark.parametrize(
    ("raised", "mapped", "says"),
    [
        (
            grpclib.exceptions.GRPCError(grpclib.const.Status.OUT_OF_RANGE, "session 7 expired"),
            SessionRejectedError,
            "session 7 expired",
        ),
        (
            grpclib.exceptions.GRPCError(grpclib.const.Status.OUT_OF_RANGE),
            SessionRejectedError,
            "session rejected by the daemon",
        ),
        (
            grpclib.exceptions.GRPCError(grpclib.const.Status.NOT_FOUND, "no task 'x'"),
            NotFoundError,
            "no task 'x'",
        ),
        (
            grpclib.exceptions.GRPCError(grpclib.const.Status.UNAVAILABLE, "draining"),
            UnavailableError,
            "daemon at 127.0.0.1:7 is unavailable: draining",
        ),
        (ConnectionRefusedError(), UnavailableError, "unavailable: ConnectionRefusedError"),
        (OSError("no route to host"), UnavailableError, "unavailable: no route to host"),
        (ssl.SSLError("bad certificate"), UnavailableError, "TLS handshake failed"),
    ],
)
def test_transport_errors_become_ringo_errors_that_keep_their_detail(
    raised: Exception, mapped: type[RingoError], says: str
) -> None:
    """Property: at the transport's one error boundary, each gRPC status and
    transport failure becomes the SDK's own error, and the user still reads
    what went wrong: the daemon's detail, or the failure's name when it has
    no text of its own."""
    error = _map_error(raised, endpoint_of(7))
    assert type(error) is mapped
    assert says in str(error)


def test_errors_that_are_not_the_transports_are_left_alone() -> None:
    """A bug in the SDK (any other exception) is not disguised as an outage."""
    assert _map_error(ValueError("a bug"), endpoint_of(7)) is None


@pytest.mark.trio
async def test_a_transport_is_entered_only_once() -> None:
    """Entering a Transport again, while in it, is refused: one transport owns
    one loop binding and one channel."""
    with trio.fail_after(20):
        async with Transport(endpoint_of(free_port())) as transport:
            with pytest.raises(RingoError, match="only once"):
                async with transport:
                    pass


@pytest.mark.trio
async def test_a_failure_of_the_sdks_own_code_under_a_stream_comes_out_as_itself(
    echo: EchoServer,
) -> None:
    """Property: an exception of the SDK's own code under a stream (here its
    frame coalescing) is no transport error: it ends the stream block as
    itself, neither mapped to an outage nor turned into another error."""

    def broken(queued: list[WorkRequest]) -> list[WorkRequest]:
        raise ValueError("a coalescing bug")

    async def send_one(transport: Transport) -> None:
        channels = transport.open_stream(WORK, WorkRequest, WorkResponse, coalesce=broken)
        async with channels as stream:
            assert stream.send is not None
            await stream.send.send(request(1))
            await trio.sleep(15)

    with trio.fail_after(20):
        async with Transport(endpoint_of(echo.port)) as transport:
            with pytest.raises(ValueError, match="a coalescing bug"):
                await send_one(transport)


@pytest.mark.trio
async def test_what_queued_up_while_the_writer_waited_goes_to_coalesce_together(
    echo: EchoServer,
) -> None:
    """Property: the frames the SDK queued while the stream's writer was
    away reach `coalesce` together, so they can leave as one batch frame,
    and none is held back waiting for more."""
    batches: list[list[int]] = []

    def record(queued: list[WorkRequest]) -> list[WorkRequest]:
        batches.append([message.request_id for message in queued])
        return queued

    with trio.fail_after(20):
        async with (
            Transport(endpoint_of(echo.port)) as transport,
            transport.open_stream(WORK, WorkRequest, WorkResponse, coalesce=record) as stream,
        ):
            assert stream.send is not None
            for request_id in (1, 2, 3):
                stream.send.send_nowait(request(request_id))
            answered = [(await stream.receive.receive()).result.request_id for _ in range(3)]
    assert answered == [1, 2, 3]
    assert batches == [[1, 2, 3]]
