"""The daemon's HTTP/2 connections (`server.rpc.connections`): their limits,
idle and rapid-reset guards, on virtual time.

A raw HTTP/2 client (`RawH2.in_memory`) talks to an in-memory daemon
(`virtual_daemon`), so the guards' timers run on trio's MockClock and each
test asserts the virtual instant a connection is told GOAWAY and closed. The
hostile suite (tests/hostile/test_exhaustion.py) runs the same guards over
real sockets, in real seconds.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import h2.errors
import pytest

from ringo_trio._contract.limits import MAX_MESSAGE_BYTES
from ringo_trio._proto.ringo.v1 import NegotiateRequest, WorkerRegistration, WorkRequest
from ringo_trio.server.rpc.codec import StrictCodec
from ringo_trio.server.rpc.connections import (
    DEFAULT_IDLE_TIMEOUT,
    ConnectionLimits,
    GuardedServer,
    _set_nodelay,
)
from ringo_trio.server.rpc.memory import InMemoryChannel
from tests._kit.grpc_client import connect, new_queue
from tests._kit.h2raw import NEGOTIATE_METHOD, WORK_METHOD, RawH2, grpc_frame
from tests._kit.virtual_daemon import Served, now, on_virtual_time, virtual_daemon


@asynccontextmanager
async def _connected(served: Served) -> AsyncIterator[RawH2]:
    """A raw HTTP/2 connection to the in-memory daemon, closed on exit."""
    server = served.daemon._server
    assert server is not None
    raw = await RawH2.in_memory(server)
    try:
        yield raw
    finally:
        raw.close()


# -- the limits ----------------------------------------------------------------------


def test_the_documented_connection_limits_hold() -> None:
    """Property: the defaults docs/protocol.md and docs/deployment.md state
    are the daemon's: a connection without a call closed after 300 s, pings
    every 60 s answered within 20 s, 1,000 resets in any 10 s."""
    limits = ConnectionLimits()
    assert limits.idle_timeout == 300.0
    assert limits.keepalive_interval == 60.0
    assert limits.keepalive_timeout == 20.0
    assert limits.reset_limit == 1000
    assert limits.reset_window == 10.0


@pytest.mark.parametrize(
    "field", ["idle_timeout", "keepalive_interval", "keepalive_timeout", "reset_window"]
)
def test_a_duration_limit_must_be_positive(field: str) -> None:
    """Property: a duration of 0 or less is refused with ValueError naming
    it (a zero idle timeout would close every connection at once); any
    positive one, however small, is accepted."""
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=field):
            ConnectionLimits(**{field: bad})
    assert getattr(ConnectionLimits(**{field: 0.001}), field) == 0.001


def test_the_reset_limit_is_at_least_one() -> None:
    """Property: a reset limit of 1 is accepted, 0 refused."""
    assert ConnectionLimits(reset_limit=1).reset_limit == 1
    with pytest.raises(ValueError, match="reset_limit"):
        ConnectionLimits(reset_limit=0)


def test_grpclib_pings_as_the_limits_say_and_never_gives_up() -> None:
    """Property: grpclib is configured with the limits' keepalive, with no
    cap on pings without data (its default stops after two, so a stalled
    peer would never be found) and pings spaced by the interval (its
    default: 300 s)."""
    config = ConnectionLimits(keepalive_interval=7.0, keepalive_timeout=3.0).grpclib_config()
    assert config._keepalive_time == 7.0
    assert config._keepalive_timeout == 3.0
    assert config._http2_max_pings_without_data == 0
    assert config._http2_min_sent_ping_interval_without_data == 7.0


def test_tcp_connections_send_small_frames_at_once() -> None:
    """Property: a TCP connection gets TCP_NODELAY (without it Nagle holds a
    reply back for the peer's delayed ACK, ~40 ms a round trip); a Unix
    socket, which has no such option, is left alone."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        _set_nodelay(tcp)
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    unix_side, _other = socket.socketpair(socket.AF_UNIX)
    with unix_side, _other:
        _set_nodelay(unix_side)  # no OSError


@on_virtual_time
async def test_an_in_memory_server_serves_from_its_start_to_its_close() -> None:
    """Property: `GuardedServer.serving`, which the testing kit's in-memory
    channel asks before it connects, is False before the server starts and
    after it closes, True between; a channel to a server that is not
    serving is refused instead of reaching a closed server."""
    server = GuardedServer([], codec=StrictCodec(), limits=ConnectionLimits())
    assert not server.serving
    server.start_in_memory()
    assert server.serving
    server.close()
    await server.wait_closed()
    assert not server.serving
    with pytest.raises(ConnectionRefusedError):
        await InMemoryChannel(server)._create_connection()


# -- idle connections ----------------------------------------------------------------


async def _closed_after(raw: RawH2) -> float:
    """The virtual seconds until the daemon closes the connection."""
    start = now()
    await raw.until(lambda: False, 60)
    assert raw.eof, "the daemon never closed the connection"
    return now() - start


@on_virtual_time
async def test_a_connection_that_never_calls_is_told_goaway_at_its_idle_timeout() -> None:
    """Property: a connection that starts no call gets GOAWAY(NO_ERROR)
    exactly --idle-timeout after it opened, and the daemon closes it one
    second later when the peer does not hang up (the second lets the peer
    read the GOAWAY before the socket goes)."""
    async with virtual_daemon() as served, _connected(served) as raw:
        opened = now()
        await raw.until(lambda: raw.goaway is not None, 2 * DEFAULT_IDLE_TIMEOUT)
        assert raw.goaway is not None
        assert raw.goaway.error_code == h2.errors.ErrorCodes.NO_ERROR
        assert now() == opened + DEFAULT_IDLE_TIMEOUT
        assert await _closed_after(raw) == 1.0


@on_virtual_time
async def test_a_connection_is_idle_from_the_end_of_its_last_call() -> None:
    """Property: a call resets the idle clock, and a call kept open holds
    the connection open however long it lasts: the GOAWAY comes
    --idle-timeout after the last call ended, never while one runs."""
    limits = ConnectionLimits(idle_timeout=30.0)
    async with virtual_daemon(connections=limits) as served, _connected(served) as raw:
        await raw.until(lambda: False, 20)
        call = raw.start(NEGOTIATE_METHOD)
        await raw.flush()
        # Open for four idle timeouts (answering the daemon's pings).
        await raw.until(lambda: False, 120)
        assert raw.goaway is None
        assert not raw.eof
        await raw.send(call, grpc_frame(b""), end=True)
        await raw.until(lambda: raw.streams[call].ended, 10)
        ended = now()
        await raw.until(lambda: raw.goaway is not None, 100)
        assert raw.goaway is not None
        assert now() == ended + 30.0


# -- rapid reset -----------------------------------------------------------------------


def _queue_resets(raw: RawH2, count: int) -> None:
    """Open `count` calls and cancel each at once (buffered, not written)."""
    for _ in range(count):
        stream = raw.start(NEGOTIATE_METHOD)
        raw.conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)


async def _reset_streams(raw: RawH2, count: int) -> None:
    """`count` calls opened and cancelled, in one write."""
    _queue_resets(raw, count)
    await raw.flush()


@on_virtual_time
async def test_one_reset_more_than_the_limit_within_the_window_gets_goaway() -> None:
    """Property: --reset-limit resets within the window are served; the next
    one within it gets GOAWAY(ENHANCE_YOUR_CALM) at once, and the connection
    closes a second later."""
    limits = ConnectionLimits(reset_limit=20, reset_window=10.0)
    async with virtual_daemon(connections=limits) as served, _connected(served) as raw:
        await _reset_streams(raw, 20)
        await raw.until(lambda: False, 9.9)
        assert raw.goaway is None
        sent = now()
        await _reset_streams(raw, 1)
        await raw.until(lambda: raw.goaway is not None, 1)
        assert raw.goaway is not None
        assert raw.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert now() == sent
        assert await _closed_after(raw) == 1.0


@on_virtual_time
async def test_resets_spread_wider_than_the_window_are_never_too_many() -> None:
    """Property: only resets within one window count: a client cancelling
    --reset-limit calls per window, window after window, keeps its
    connection."""
    limits = ConnectionLimits(reset_limit=20, reset_window=10.0)
    async with virtual_daemon(connections=limits) as served, _connected(served) as raw:
        for _ in range(5):
            await _reset_streams(raw, 20)
            await raw.until(lambda: False, 10.1)
        assert raw.goaway is None
        assert not raw.eof


@on_virtual_time
async def test_after_goaway_the_rest_of_a_large_read_goes_unparsed() -> None:
    """Property: a read is handed to h2 in 16 KiB slices and parsing stops
    at the slice whose reset was one too many, so one large write of
    thousands of resets costs the daemon a slice or two, not all of them:
    the GOAWAY names a last stream from the first slices."""
    limits = ConnectionLimits(reset_limit=20, reset_window=10.0)
    async with virtual_daemon(connections=limits) as served, _connected(served) as raw:
        streams = 5000
        _queue_resets(raw, streams)
        written = raw.conn.data_to_send()
        per_stream = len(written) / streams
        raw.writer.write(written)
        await raw.until(lambda: raw.goaway is not None, 1)
        assert raw.goaway is not None
        assert raw.goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        parsed = (raw.goaway.last_stream_id + 1) // 2
        assert parsed * per_stream <= 2 * 16384, (parsed, per_stream)


@on_virtual_time
async def test_a_message_of_five_bytes_is_read_as_a_body_not_a_prefix() -> None:
    """Property: only a message's 5-byte prefix is checked for the
    compressed flag and the size limit; a body that happens to be 5 bytes
    long is read as a body (sdk_name "abc" encodes to 5 bytes starting
    0x0a, which read as a prefix would be "compressed") and reaches the
    method."""
    async with virtual_daemon() as served, _connected(served) as raw:
        body = bytes(NegotiateRequest(sdk_name="abc"))
        assert len(body) == 5
        assert body[0] != 0
        call = raw.start(NEGOTIATE_METHOD)
        await raw.send(call, grpc_frame(body), end=True)
        state = raw.streams[call]
        await raw.until(lambda: state.ended, 10)
        # The method read it: OUT_OF_RANGE for its protocol major (0), not
        # UNIMPLEMENTED for a compressed message.
        assert state.header("grpc-status") == "11", state.header("grpc-message")
        assert "protocol major 0" in (state.header("grpc-message") or "")


# -- how a Work stream ends ------------------------------------------------------------


@on_virtual_time
async def test_a_work_stream_refused_ends_by_its_trailers_alone() -> None:
    """Property: a Work stream the daemon ends with an error status, its
    client's side still open, gets trailers and no RST_STREAM after them
    (grpclib's server adds one, and grpclib's client then cancels the read
    that holds the status: the worker would see a bare reset)."""
    async with virtual_daemon() as served, _connected(served) as raw:
        work = raw.start(WORK_METHOD)
        await raw.send(work, grpc_frame(b""))  # not a registration
        state = raw.streams[work]
        await raw.until(lambda: state.ended, 10)
        assert state.header("grpc-status") == "3"  # INVALID_ARGUMENT
        # Until the connection's end: every frame the daemon wrote is read.
        await raw.until(lambda: False, 2 * DEFAULT_IDLE_TIMEOUT)
        assert raw.eof
        assert state.reset is None


async def _registered_work_stream(served: Served, raw: RawH2) -> int:
    """A Work stream whose first message, a valid registration, was read."""
    async with connect(served.daemon) as client:
        context = client.context
    registration = WorkerRegistration(
        context=context,
        queue=new_queue("prefix"),
        worker_id="w",
        task_types=["t"],
        max_concurrency=1,
        lease_duration=timedelta(seconds=30),
    )
    work = raw.start(WORK_METHOD)
    await raw.send(work, grpc_frame(WorkRequest(register=registration)))
    await raw.until(lambda: bool(raw.streams[work].headers), 10)
    assert raw.streams[work].header("grpc-status") is None  # registered, open
    return work


@on_virtual_time
async def test_every_message_of_a_stream_has_its_prefix_checked() -> None:
    """Property: the size limit holds for each message of a Work stream, not
    only its first: a later prefix announcing more than MAX_MESSAGE_BYTES
    ends the stream RESOURCE_EXHAUSTED before a byte of its body is read;
    one announcing exactly the limit is not refused (the daemon waits for
    its body)."""
    async with virtual_daemon() as served, _connected(served) as raw:
        over = await _registered_work_stream(served, raw)
        await raw.send(over, b"\x00" + (MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
        await raw.until(lambda: raw.streams[over].ended, 10)
        assert raw.streams[over].header("grpc-status") == "8"  # RESOURCE_EXHAUSTED
        at_limit = await _registered_work_stream(served, raw)
        await raw.send(at_limit, b"\x00" + MAX_MESSAGE_BYTES.to_bytes(4, "big"))
        await raw.until(lambda: raw.streams[at_limit].ended, 10)
        assert not raw.streams[at_limit].ended
