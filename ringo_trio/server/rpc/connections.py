"""The daemon's HTTP/2 connections: grpclib's server plus the guards it lacks.

Theory of operation
-------------------
grpclib's server trusts its peers: a hostile (or broken) client can make it
spend memory or time without limit. Each way is stopped at the one place it
enters: the per-connection `H2Protocol`, its events processor and its
streams, which `GuardedServer` substitutes for grpclib's own. Nothing above
this module (the gate, the services, the Work streams) sees a difference,
except that a refused message reaches the method as `GRPCError` from
``recv_message``, which every method already turns into its final status.

**Rapid reset** (CVE-2023-44487). Every HEADERS frame starts a handler task
and every RST_STREAM cancels it, so a client can open and reset streams as
fast as it can write, and h2 remembers every closed stream of the connection.
Resets are counted per connection over a sliding window (`RESET_LIMIT` in
`RESET_WINDOW` seconds, far above what cancelling calls ever needs); one more
and the connection gets GOAWAY(ENHANCE_YOUR_CALM) and every call on it is
cancelled. Input is handed to h2 in `_SLICE`-sized pieces and everything
after the GOAWAY is discarded unparsed; the socket itself closes when the
peer hangs up or after `_LINGER` seconds, because closing a socket with
unread input makes the kernel send RST, which can destroy the GOAWAY before
the peer reads it. grpclib forgets a closed connection's handler (and its
streams) only when a new connection arrives, so `GuardedServer` does that
at every new connection rather than every tenth.

**Idle connections.** A connection without a call for `idle_timeout` seconds
gets GOAWAY(NO_ERROR) and is closed; so does one that never starts a call.
The GOAWAY names the last stream the daemon processed, so a client whose new
call crossed it knows the call never ran and may retry it.

**Keepalive.** While a connection has calls, the daemon pings it every
`keepalive_interval` seconds and closes it when a ping is not acknowledged
within `keepalive_timeout` seconds: a peer that vanished, or stopped reading
its socket, no longer holds its calls (and a Work stream's leases) open.

**Message prefixes.** grpclib reads a whole message before the codec looks
at its size, acknowledging the data as it comes, so a 5-byte length prefix
made the daemon buffer whatever it announced. `_GuardedStream` checks each
prefix when it is read: a length above `MAX_MESSAGE_BYTES` is refused with
``RESOURCE_EXHAUSTED`` before a byte of the body is acknowledged (flow
control then holds the client to one window), and a message with the
compressed flag set is refused with ``UNIMPLEMENTED``, as is a call whose
``grpc-encoding`` is not ``identity``: the daemon implements no compression,
and says so in ``grpc-accept-encoding: identity`` on every response.

**In memory.** grpclib serves only on a listening socket; the testing kit
wants the same server without one (`memory.InMemoryChannel`).
`GuardedServer.start_in_memory` sets the state grpclib's `start` would, and
`accept` hands out the server's side of each in-memory connection — a
subclass doing what its base does, never a patch of grpclib's classes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, cast

import grpclib.server
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.protocol import AbstractHandler, Connection, EventsProcessor, H2Protocol, Stream
from grpclib.server import Handler, Server
from grpclib.utils import Wrapper
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import RequestReceived, StreamReset
from h2.settings import SettingCodes

from ringo_trio._contract.limits import MAX_MESSAGE_BYTES

__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DEFAULT_KEEPALIVE_TIMEOUT",
    "RESET_LIMIT",
    "RESET_WINDOW",
    "ConnectionLimits",
    "GuardedServer",
    "trailers_without_reset",
]

DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_KEEPALIVE_INTERVAL = 60.0
DEFAULT_KEEPALIVE_TIMEOUT = 20.0
RESET_LIMIT = 1000
RESET_WINDOW = 10.0

_ACCEPT_ENCODING = ("grpc-accept-encoding", "identity")
# What a refusal of compression tells the client to do instead.
_SEND_UNCOMPRESSED = f"send messages uncompressed ({': '.join(_ACCEPT_ENCODING)})"
# Seconds a connection told GOAWAY stays open for the peer to read it.
_LINGER = 1.0
# Bytes of input handed to h2 at a time.
_SLICE = 16384


def _set_nodelay(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT
    reset_limit: int = RESET_LIMIT
    reset_window: float = RESET_WINDOW

    def __post_init__(self) -> None:
        for name in ("idle_timeout", "keepalive_interval", "keepalive_timeout", "reset_window"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.reset_limit < 1:
            raise ValueError("reset_limit must be at least 1")

    def grpclib_config(self) -> Configuration:
        return Configuration(
            _keepalive_time=self.keepalive_interval,
            _keepalive_timeout=self.keepalive_timeout,
            # grpclib's defaults stop pinging after two pings without data
            # and space them 300 s apart: a stalled peer would never be found.
            _http2_max_pings_without_data=0,
            _http2_min_sent_ping_interval_without_data=self.keepalive_interval,
        )


class GuardedServer(Server):
    """`grpclib.server.Server` whose connections are `_GuardedProtocol`s."""

    # grpclib forgets closed connections (and every stream they had) only
    # every tenth new connection; an attacker reconnecting after each GOAWAY
    # would keep ten of them alive.
    __gc_interval__ = 1

    def __init__(
        self, handlers: Collection[Any], *, codec: CodecBase, limits: ConnectionLimits
    ) -> None:
        super().__init__(handlers, codec=codec, config=limits.grpclib_config())
        self._limits = limits

    def _protocol_factory(self) -> H2Protocol:
        # As grpclib's, with the guarded protocol.
        self.__gc_step__()
        handler = Handler(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(handler)
        return _GuardedProtocol(handler, self._config, self._h2_config, self._limits)

    def start_in_memory(self) -> None:
        """Serve without a socket: connections then come only through `accept`
        (`memory.InMemoryChannel`). Sets what grpclib's `Server.start` sets,
        so `close` and `wait_closed` work as usual."""
        self._server = _NoListener()
        self._server_closed_fut = asyncio.get_running_loop().create_future()

    @property
    def serving(self) -> bool:
        """Started (with a socket or in memory) and not closed."""
        closed = self._server_closed_fut
        return closed is not None and not closed.done()

    def accept(self) -> H2Protocol:
        """The server's side of a new in-memory connection."""
        return self._protocol_factory()


class _NoListener(asyncio.AbstractServer):
    """What grpclib's `Server` holds instead of a listening socket."""

    def close(self) -> None:
        pass

    async def wait_closed(self) -> None:
        pass

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def is_serving(self) -> bool:
        return True

    async def start_serving(self) -> None:
        pass

    async def serve_forever(self) -> None:
        raise NotImplementedError


class _GuardedProtocol(H2Protocol):
    def __init__(
        self, handler: Handler, config: Any, h2_config: Any, limits: ConnectionLimits
    ) -> None:
        super().__init__(handler, config, h2_config)
        self._limits = limits
        self._timer: asyncio.TimerHandle | None = None
        # Every moment here is the event loop's clock: the timers that act on
        # them run on it, and a test's virtual clock then moves them all.
        self._loop = asyncio.get_running_loop()
        self._opened = self._loop.time()
        self._going_away = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # grpclib's, with `_GuardedConnection` and `_GuardedProcessor`. Small
        # frames go out at once (without TCP_NODELAY, Nagle holds a reply
        # back for the peer's delayed ACK: ~40 ms a round trip).
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _set_nodelay(sock)
        h2_conn = H2Connection(config=self.h2_config)
        h2_conn.initiate_connection()
        initial = h2_conn.local_settings.initial_window_size
        conn_delta = self.config.http2_connection_window_size - initial
        if conn_delta:
            h2_conn.increment_flow_control_window(conn_delta)
        if self.config.http2_stream_window_size != initial:
            h2_conn.update_settings(
                {SettingCodes.INITIAL_WINDOW_SIZE: self.config.http2_stream_window_size}
            )
        self._h2 = h2_conn
        self.connection = _GuardedConnection(
            h2_conn, cast(asyncio.Transport, transport), config=self.config
        )
        self.connection.flush()
        self.connection.initialize()
        self.processor = _GuardedProcessor(self.handler, self.connection, self)
        self._timer = self._loop.call_later(self._limits.idle_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
        # h2 parses a whole read (up to 256 KiB with uvloop: thousands of
        # streams) before grpclib sees its first event; fed in slices, a
        # connection told GOAWAY stops costing at the next slice.
        if len(data) <= _SLICE:
            if not self._going_away:
                super().data_received(data)
            return
        view = memoryview(data)
        for start in range(0, len(data), _SLICE):
            if self._going_away:
                return
            super().data_received(bytes(view[start : start + _SLICE]))

    def _check_idle(self) -> None:
        processor = cast(_GuardedProcessor, self.processor)
        now = self._loop.time()
        timeout = self._limits.idle_timeout
        busy_until = now + timeout
        if not processor.streams:
            # Every call is a registered stream until it ends, so the last
            # one's end covers its start (grpclib's own stamp of a stream's
            # creation is on another clock: `time.monotonic`).
            busy_until = max(self._opened, processor.last_call_ended) + timeout
            if busy_until <= now:
                self.goaway(ErrorCodes.NO_ERROR, "idle connection")
                return
        self._timer = self._loop.call_later(busy_until - now, self._check_idle)

    def goaway(self, code: ErrorCodes, reason: str) -> None:
        """GOAWAY(`code`), cancel every call, and close the connection soon."""
        if self._going_away:
            return
        self._going_away = True
        connection = cast(_GuardedConnection, self.connection)
        connection.stop_pinging()
        self._h2.close_connection(error_code=code, additional_data=reason.encode())
        connection.flush()
        self.handler.close()
        for stream in self.processor.streams.values():
            stream.__terminated__(reason)
        # Not closed yet: the peer gets `_LINGER` seconds to read the GOAWAY
        # and hang up (see the module docstring), its input discarded.
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(_LINGER, self.processor.close, reason)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().connection_lost(exc)


class _GuardedConnection(Connection):
    def __init__(
        self, connection: H2Connection, transport: asyncio.Transport, *, config: Any
    ) -> None:
        super().__init__(connection, transport, config=config)
        self._h2 = connection
        self._sock = transport

    def create_stream(
        self, *, stream_id: int | None = None, wrapper: Wrapper | None = None
    ) -> Stream:
        return _GuardedStream(self, self._h2, self._sock, stream_id=stream_id, wrapper=wrapper)

    def stop_pinging(self) -> None:
        # After GOAWAY h2 refuses to ping.
        if self._ping_handle is not None:
            self._ping_handle.cancel()
        if self._close_by_ping_handler is not None:
            self._close_by_ping_handler.cancel()


class _GuardedProcessor(EventsProcessor):
    def __init__(
        self, handler: AbstractHandler, connection: Connection, protocol: _GuardedProtocol
    ) -> None:
        super().__init__(handler, connection)
        self._protocol = protocol
        limits = protocol._limits
        self._reset_window = limits.reset_window
        # The moments of the last `reset_limit` resets: the limit is exceeded
        # when the oldest of them is younger than `reset_window`.
        self._resets: collections.deque[float] = collections.deque(maxlen=limits.reset_limit)
        self.last_call_ended = 0.0

    def process(self, event: Any) -> None:
        # After GOAWAY the rest of the read (already parsed by h2) is dropped.
        if not self._protocol._going_away:
            super().process(event)

    def register(self, stream: Stream) -> Any:
        release = super().register(stream)

        def release_stream() -> None:
            self.last_call_ended = self._protocol._loop.time()
            release()

        return release_stream

    def process_request_received(self, event: RequestReceived) -> None:
        super().process_request_received(event)
        stream = self.streams.get(event.stream_id)
        if stream is None:
            return
        # grpclib's h2 configuration decodes headers to str.
        for name, value in cast(list[tuple[str, str]], event.headers or ()):
            if name == "grpc-encoding" and value != "identity":
                cast(_GuardedStream, stream).refusal = GRPCError(
                    Status.UNIMPLEMENTED,
                    f"grpc-encoding {value!r} is not supported; {_SEND_UNCOMPRESSED}",
                )

    def process_stream_reset(self, event: StreamReset) -> None:
        super().process_stream_reset(event)
        now = self._protocol._loop.time()
        resets = self._resets
        if len(resets) == resets.maxlen and now - resets[0] < self._reset_window:
            self._protocol.goaway(ErrorCodes.ENHANCE_YOUR_CALM, "too many stream resets")
            return
        resets.append(now)


class _GuardedStream(Stream):
    """A server stream that checks each message prefix before reading the body."""

    refusal: GRPCError | None = None
    _in_body = False
    _headers_sent = False
    # Set by `trailers_without_reset`.
    _no_reset = False

    async def recv_data(self, size: int) -> bytes:
        # grpclib's `recv_message` reads a 5-byte prefix, then the body it
        # announces (`size` is then that length).
        if self._in_body:
            self._in_body = False
            return await super().recv_data(size)
        if self.refusal is not None:
            raise self.refusal
        prefix = await super().recv_data(size)
        if len(prefix) == 5:
            if prefix[0]:
                raise GRPCError(
                    Status.UNIMPLEMENTED,
                    f"compressed messages are not supported; {_SEND_UNCOMPRESSED}",
                )
            length = int.from_bytes(prefix[1:5])
            if length > MAX_MESSAGE_BYTES:
                raise GRPCError(
                    Status.RESOURCE_EXHAUSTED,
                    f"request of {length} bytes exceeds the {MAX_MESSAGE_BYTES}-byte message limit",
                )
            self._in_body = True
        return prefix

    async def send_headers(self, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        if not self._headers_sent:
            self._headers_sent = True
            headers = [*headers, _ACCEPT_ENCODING]
        await super().send_headers(headers, end_stream)

    def reset_nowait(self, error_code: ErrorCodes = ErrorCodes.NO_ERROR) -> None:
        if not self._no_reset:
            super().reset_nowait(error_code)


@contextlib.contextmanager
def trailers_without_reset(stream: grpclib.server.Stream[Any, Any]) -> Iterator[None]:
    """While the block runs, `stream` sends no RST_STREAM: its trailers alone
    end the call.

    grpclib follows a non-OK status with RST_STREAM(NO_ERROR) while the
    client's side is still open, which a Work stream's always is; grpclib's
    client handles the reset by cancelling its pending read, so frames and a
    status that arrived in the same read as the reset would be lost. grpclib
    offers no switch for this, so the guarded stream under `stream` (every
    stream of a `GuardedServer` is one) has it.
    """
    guarded = cast(_GuardedStream, stream._stream)
    guarded._no_reset = True
    try:
        yield
    finally:
        guarded._no_reset = False
