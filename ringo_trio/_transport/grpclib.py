"""The transport island: the only SDK module that touches asyncio, grpclib and trio-asyncio.

Theory of operation
-------------------
grpclib is an asyncio library. The SDK above this module is written against
anyio and runs under trio (the reference backend) or asyncio. `Transport`
hides the difference behind four operations — ``unary``, ``health_check``,
``reset`` and ``open_stream`` — whose arguments and results are plain
betterproto messages and whose failures are always `ringo_trio` errors.

*Where asyncio runs.* Under trio, entering a `Transport` opens a
``trio_asyncio`` loop in the entering task (which is the client's owning task,
so the loop lives inside the client's ``async with`` and dies with it). Every
grpclib object — the channel, its protocol, its streams — is created and used
only from coroutines running on that loop; trio code crosses into it with
``loop.run_aio_coroutine`` (one crossing per unary call). Under asyncio the
island is the running loop itself and calls go straight through.

*The one error boundary.* `_map_error` turns grpclib's ``GRPCError`` into the
exception `ringo_trio._errors.error_for_code` names for its status, and every
way a connection can break (stream reset, h2 protocol error, ``OSError``
including refused connections, TLS failures and grpclib's deadline
``TimeoutError``) into `UnavailableError`. Cancellation is never mapped: it is
how a caller's cancel scope reaches the asyncio side and must come back as
cancellation. A rejected RequestContext (``OUT_OF_RANGE``) becomes
`SessionRejectedError`, a private subclass of `IncompatibleVersionError`, so
that the client can tell "renegotiate and retry once" apart from "this RPC
needs a newer minor" (``UNIMPLEMENTED``) without parsing messages.

*Streams.* A bridge crossing per message would cost most of the stream's
throughput, so a stream is served by exactly one asyncio reader pump and (for
bidi streams) one asyncio writer pump, talking to the SDK through anyio memory
channels. Both pumps use the non-blocking channel operations (plain
synchronous calls, safe because trio and its asyncio loop share one thread)
and cross the bridge only when they actually have to wait: the reader when the
SDK's receive buffer is full, the writer when it has nothing to send. The
trio-side runner of a stream lives in a task group owned by the
``open_stream`` block, so leaving the block ends the stream and no pump
outlives it; a stream failure cancels the block and is raised from it.

*Keepalive.* Every channel pings its daemon (HTTP/2 PING, `Keepalive`;
the client's options, 15 s / 10 s by default), idle or not, and grpclib
closes the connection when a ping goes unacknowledged: a frozen daemon or a
dead path then fails the pending calls and streams like any other drop,
where it would otherwise hold them until their deadline, or forever.

*Codec.* Messages go through `_Codec`: betterproto2 messages by the shared
strict codec the daemon decodes with (`ringo_trio._wire.codec`), the
pre-encoded frames and hand-written reply decoders by their own methods; a
malformed reply is a `RingoError`, not a message made of part of the bytes.

*Limits.* grpclib has no per-message compression, so the SDK refuses the
``compression`` option rather than accept and ignore it, and it has no
receive-size limit to configure (`ringo_trio._contract.limits.MAX_MESSAGE_BYTES` is
enforced by the daemon on what it accepts).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio
import betterproto2
import grpclib.client
import grpclib.config
import grpclib.const
import grpclib.encoding.base
import grpclib.exceptions
import h2.exceptions
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._endpoint import Endpoint
from .._errors import (
    RingoError,
    UnavailableError,
    error_for_code,
)
from .._interrupts import protected
from .._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)
from .._wire.codec import WireError, decode, encode
from .base import DEFAULT_KEEPALIVE, Keepalive, SessionRejectedError, StreamChannels

__all__ = ["SessionRejectedError", "StreamChannels", "Transport", "client_tls_context"]

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_T = TypeVar("_T")

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# How long closing waits for a TLS connection's shutdown exchange.
_TLS_CLOSE_TIMEOUT = 1.0
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"


# Connection-level failures. OSError covers refused/reset connections, TLS
# errors and TimeoutError (grpclib's client deadline).
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    grpclib.exceptions.StreamTerminatedError,
    grpclib.exceptions.ProtocolError,
    h2.exceptions.H2Error,
    EOFError,
)


def _map_error(exc: Exception, endpoint: Endpoint) -> RingoError | None:
    if isinstance(exc, grpclib.exceptions.GRPCError):
        code = exc.status.name
        detail = exc.message or ""
        if code == "OUT_OF_RANGE":
            return SessionRejectedError(detail or "session rejected by the daemon")
        if code != "UNAVAILABLE":
            return error_for_code(code, detail)
    elif isinstance(exc, ssl.SSLError):
        # A refused handshake (an untrusted certificate, mutual TLS without a
        # client certificate, a plaintext daemon) is no passing outage: say so.
        detail = f"TLS handshake failed: {exc}"
    elif isinstance(exc, _UNAVAILABLE_ERRORS):
        detail = str(exc) or type(exc).__name__
    else:
        return None
    return UnavailableError(f"daemon at {endpoint.authority} is unavailable: {detail}")


class _Codec(grpclib.encoding.base.CodecBase):
    """The SDK's messages on the wire: betterproto2 messages by the codec the
    daemon uses (`ringo_trio._wire.codec`: strict, and ~4x faster than
    betterproto2's own ``bytes()``/``parse``, which cost a unary Enqueue ~20 %
    of its client CPU); anything else by its own ``SerializeToString`` /
    ``FromString`` (the pre-encoded Work frames and the hand-written reply
    decoders). A reply that is no valid encoding of its message is the
    daemon's fault, raised as a `RingoError` naming it."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, betterproto2.Message):
            return encode(message)
        data: bytes = message.SerializeToString()
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        if isinstance(message_type, type) and issubclass(message_type, betterproto2.Message):
            try:
                return decode(data, message_type)
            except WireError as exc:
                raise RingoError(
                    f"malformed {message_type.__name__} from the daemon: {exc}"
                ) from None
        return message_type.FromString(data)


@functools.cache
def protect_island_from_keyboard_interrupt() -> None:
    """Make the trio-asyncio loop KI-protected: a Ctrl-C that arrives while
    it runs asyncio code is delivered to the program's main task at its next
    checkpoint (trio's rule for protected code) instead of being raised in
    whatever asyncio callback happened to run.

    Why: trio raises KeyboardInterrupt in the interrupted frame unless that
    frame, or one of its callers up to the task's root, is marked protected.
    asyncio callbacks are not written to survive an exception at an arbitrary
    bytecode: raised inside grpclib's ``data_received`` it corrupts the h2
    connection, inside a future's done-callback it drops the wake-up of the
    trio task waiting on it, inside the loop's own task it ends the loop.
    Each left the SDK waiting on an asyncio future nothing would resolve — a
    hang that a second Ctrl-C could not end — with the worker's leases
    LEASED until they expired (issue 24: 5 of 25 runs at random moments).
    Every asyncio callback runs below one of these trio-asyncio frames, and
    every crossing between the two sides passes through the others, so
    marking them (trio's own mechanism: ``enable_ki_protection`` records the
    code object) covers the whole island. Once per process (cached); process-wide, which is
    what the marking is (it is also right for any other trio-asyncio loop).
    """
    import trio
    import trio_asyncio._base
    import trio_asyncio._handles
    import trio_asyncio._util

    loop = trio_asyncio._base.BaseTrioEventLoop
    for function in (
        loop._main_loop,  # asyncio callbacks run below it
        loop._main_loop_one,
        loop._main_loop_exit,
        loop._io_task,  # the loop's readers and writers: grpclib's socket
        loop.run_aio_coroutine,  # trio → asyncio crossings
        trio_asyncio._util.run_aio_future,
        trio_asyncio._handles.AsyncHandle._run,  # asyncio → trio crossings
    ):
        trio.lowlevel.enable_ki_protection(function)


class Transport:
    """A gRPC channel to one daemon, usable from any anyio task.

    Enter it (``async with``) in the task that owns its lifetime. ``aclose``
    may be called from any task and is idempotent; leaving the ``async with``
    also closes it.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        metadata: tuple[tuple[str, str], ...] = (),
        keepalive: Keepalive | None = DEFAULT_KEEPALIVE,
    ) -> None:
        # ``metadata`` comes validated: the client checks the bearer token
        # when it is constructed, before any network activity.
        self._endpoint = endpoint
        self._metadata = list(metadata)
        # Every channel this transport opens (reset included) pings (None: none does).
        self._channel_config = _channel_config(keepalive)
        self._channel: grpclib.client.Channel | None = None
        self._stack = AsyncExitStack()
        self._entered = False
        self._closed = False
        # Set on entry: how to run an asyncio coroutine from the SDK side, and
        # how an asyncio pump waits on an SDK-side (anyio) operation.
        self._run_aio: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] = _as_is
        self._run_sdk: Callable[..., Awaitable[Any]] = _call

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._entered:
            raise RingoError("a Transport can be entered only once")
        self._entered = True
        library = sniffio.current_async_library()
        if library == "trio":
            self._use_loop(await self._trio_loop(self._stack))
        elif library != "asyncio":
            raise RingoError(f"ringo_trio runs under trio or asyncio, not {library}")
        try:
            await self._run_aio(self._aio_open(self._endpoint))
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _trio_loop(self, stack: AsyncExitStack) -> Any:
        """The trio-asyncio loop grpclib runs on under trio: a new one, open
        until ``stack`` closes (the testing kit shares its daemon's instead)."""
        import trio_asyncio

        return await stack.enter_async_context(trio_asyncio.open_loop())

    def _use_loop(self, loop: Any) -> None:
        """Cross into the trio-asyncio ``loop`` (under trio) for every asyncio operation."""
        protect_island_from_keyboard_interrupt()
        self._run_aio = loop.run_aio_coroutine

        def run_sdk(fn: Callable[..., Awaitable[Any]], *args: Any) -> Awaitable[Any]:
            return loop.trio_as_future(fn, *args)  # type: ignore[no-any-return]

        self._run_sdk = run_sdk

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            with anyio.CancelScope(shield=True):
                await self.aclose()
        finally:
            await self._stack.aclose()

    async def aclose(self) -> None:
        """Close the channel; in-flight calls fail with UnavailableError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            await self._run_aio(self._aio_close())

    async def reset(
        self, endpoint: Endpoint, *, metadata: tuple[tuple[str, str], ...] | None = None
    ) -> None:
        """Replace the channel with one to ``endpoint`` (a restarted local daemon),
        sending ``metadata`` from now on when given (a re-elected shared daemon's token)."""
        if self._closed:
            raise RingoError("transport is closed")
        if metadata is not None:
            self._metadata = list(metadata)
        await self._run_aio(self._aio_open(endpoint))

    # -- calls --------------------------------------------------------------

    async def unary(
        self, method: str, request: Any, response_type: type[_T], *, rpc_timeout: float | None
    ) -> _T:
        """One unary RPC; transport and status failures raise ringo_trio errors.

        ``rpc_timeout`` is the gRPC deadline sent to the daemon (expiry is an
        `UnavailableError`); cancel scopes cancel the call as usual.
        """
        result: _T = await self._run_aio(
            self._aio_unary(method, request, response_type, rpc_timeout)
        )
        return result

    async def health_check(self, *, rpc_timeout: float) -> bool:
        """True when the daemon's health service reports SERVING."""
        reply = await self.unary(
            HEALTH_CHECK, HealthCheckRequest(), HealthCheckResponse, rpc_timeout=rpc_timeout
        )
        return reply.status == HealthCheckResponseServingStatus.SERVING

    @asynccontextmanager
    async def open_stream(
        self,
        method: str,
        request_type: type[_Req],
        response_type: type[_Resp],
        *,
        request: _Req | None = None,
        send_buffer: float = 64,
        receive_buffer: float = 64,
        rpc_timeout: float | None = None,
        coalesce: Callable[[list[_Req]], list[_Req]] | None = None,
    ) -> AsyncIterator[StreamChannels[_Req, _Resp]]:
        """Open a server stream (``request`` given) or a bidi stream (``request`` None).

        ``coalesce`` (bidi): the writer hands it every request queued when it
        wakes and sends what it returns instead (fewer, larger messages).

        A failure of the stream cancels the body and is raised when the block
        exits; leaving the block early cancels the stream.
        """
        if self._closed:
            raise RingoError("transport is closed")
        to_wire_tx, to_wire_rx = anyio.create_memory_object_stream[_Req](send_buffer)
        from_wire_tx, from_wire_rx = anyio.create_memory_object_stream[_Resp](receive_buffer)
        failure: list[RingoError] = []
        with to_wire_tx, to_wire_rx, from_wire_tx, from_wire_rx:
            try:
                async with anyio.create_task_group() as tg:

                    @protected
                    async def run() -> None:
                        coro = self._aio_stream(
                            method,
                            request_type,
                            response_type,
                            request,
                            to_wire_rx,
                            from_wire_tx,
                            rpc_timeout,
                            coalesce,
                        )
                        try:
                            await self._run_aio(coro)
                        except RingoError as exc:
                            failure.append(exc)
                            tg.cancel_scope.cancel()

                    tg.start_soon(run)
                    try:
                        yield StreamChannels(
                            send=to_wire_tx if request is None else None, receive=from_wire_rx
                        )
                    finally:
                        # Closed first: the writer pump may be waiting for the
                        # next request in a trio task of the loop's own nursery,
                        # which cancelling the asyncio side does not reach; end
                        # of stream releases it, or the runner never returns.
                        to_wire_tx.close()
                        tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # Only the body's own exception can be in here (the runner
                # keeps its failure to itself); give it back unwrapped.
                raise sole_exception(group) from None
        if failure:
            raise failure[0]

    # -- the asyncio side ---------------------------------------------------

    async def _aio_open(self, endpoint: Endpoint) -> None:
        new = self._new_channel(endpoint)
        old, self._channel = self._channel, new
        self._endpoint = endpoint
        if old is not None:
            old.close()

    def _new_channel(self, endpoint: Endpoint) -> grpclib.client.Channel:
        """A channel to ``endpoint`` (runs on the asyncio side)."""
        context: ssl.SSLContext | None = None
        if endpoint.tls:
            context = endpoint.tls_context or client_tls_context()
        return grpclib.client.Channel(
            endpoint.host, endpoint.port, ssl=context, config=self._channel_config, codec=_Codec()
        )

    async def _aio_close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is None:
            return
        # A TLS connection closes in a round trip (close_notify both ways)
        # after close() returns; the loop must live that long or the socket
        # under it is never closed.
        lost = _connection_lost(channel) if self._endpoint.tls else None
        channel.close()
        if lost is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TLS_CLOSE_TIMEOUT):
                    await lost

    def _require_channel(self) -> grpclib.client.Channel:
        if self._channel is None:
            raise RingoError("client is closed")
        return self._channel

    async def _aio_unary(
        self, method: str, request: Any, response_type: type[_T], rpc_timeout: float | None
    ) -> _T:
        channel = self._require_channel()
        endpoint = self._endpoint
        try:
            async with channel.request(
                method,
                grpclib.const.Cardinality.UNARY_UNARY,
                type(request),
                response_type,
                timeout=rpc_timeout,
                metadata=self._metadata,
            ) as stream:
                await stream.send_message(request, end=True)
                reply = await stream.recv_message()
        except Exception as exc:
            mapped = _map_error(exc, endpoint)
            if mapped is None:
                raise
            raise mapped from exc
        if reply is None:
            raise UnavailableError(f"daemon at {endpoint.authority} sent no reply")
        return reply

    async def _aio_stream(
        self,
        method: str,
        request_type: type[Any],
        response_type: type[Any],
        request: Any,
        outbound: MemoryObjectReceiveStream[Any],
        inbound: MemoryObjectSendStream[Any],
        rpc_timeout: float | None,
        coalesce: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        channel = self._require_channel()
        endpoint = self._endpoint
        cardinality = (
            grpclib.const.Cardinality.UNARY_STREAM
            if request is not None
            else grpclib.const.Cardinality.STREAM_STREAM
        )
        try:
            async with channel.request(
                method,
                cardinality,
                request_type,
                response_type,
                timeout=rpc_timeout,
                metadata=self._metadata,
            ) as stream:
                if request is not None:
                    await stream.send_message(request, end=True)
                    await self._reader_pump(stream, inbound)
                else:
                    await stream.send_request()
                    try:
                        async with asyncio.TaskGroup() as pumps:
                            writer = pumps.create_task(
                                self._writer_pump(stream, outbound, coalesce)
                            )
                            await self._reader_pump(stream, inbound)
                            # The server ended the stream: nothing left to send to.
                            writer.cancel()
                    except BaseExceptionGroup as group:
                        # grpclib turns a StreamTerminatedError leaving this block
                        # into the status the server sent, if any; it must see the
                        # bare exception to do so.
                        raise sole_exception(group) from None
        except Exception as exc:
            mapped = _map_error(exc, endpoint)
            if mapped is None and isinstance(exc, ExceptionGroup):
                # Both pumps failed at once: report the first transport error.
                leaves = [_map_error(leaf, endpoint) for leaf in exc.exceptions]
                mapped = next((leaf for leaf in leaves if leaf is not None), None)
            if mapped is None:
                raise
            raise mapped from exc
        # A clean end of stream: the SDK's receive ends with EndOfStream.
        inbound.close()

    async def _reader_pump(
        self, stream: grpclib.client.Stream[Any, Any], inbound: MemoryObjectSendStream[Any]
    ) -> None:
        send_nowait = inbound.send_nowait
        while True:
            message = await stream.recv_message()
            if message is None:
                return
            try:
                send_nowait(message)
            except anyio.WouldBlock:
                # Backpressure: the only time the reader crosses the bridge.
                try:
                    await self._run_sdk(inbound.send, message)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return

    async def _writer_pump(
        self,
        stream: grpclib.client.Stream[Any, Any],
        outbound: MemoryObjectReceiveStream[Any],
        coalesce: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        receive_nowait = outbound.receive_nowait
        try:
            while True:
                try:
                    message = receive_nowait()
                except anyio.WouldBlock:
                    try:
                        message = await self._run_sdk(outbound.receive)
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                if coalesce is None:
                    await stream.send_message(message)
                    continue
                # Whatever queued up while the writer waited goes out together:
                # nothing is held back for more to arrive.
                queued = [message]
                while True:
                    try:
                        queued.append(receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                for message in coalesce(queued):
                    await stream.send_message(message)
            await stream.end()
        except grpclib.exceptions.StreamTerminatedError:
            # The server ended or reset the stream; the reader reports how.
            return


def _channel_config(keepalive: Keepalive | None) -> grpclib.config.Configuration | None:
    """grpclib's settings for a channel that pings as ``keepalive`` says."""
    if keepalive is None:
        return None
    return grpclib.config.Configuration(
        _keepalive_time=keepalive.interval,
        _keepalive_timeout=keepalive.timeout,
        # Idle too: a member's AttachLocal or a worker's Work stream may carry
        # nothing for hours, and an idle client's next call should not be
        # the one that finds the connection dead.
        _keepalive_permit_without_calls=True,
        # grpclib's defaults stop after two pings without data and space
        # them 300 s apart: an idle channel would stop looking. The interval
        # is the rate; the floor only keeps a timer that fires early from
        # skipping a ping.
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=keepalive.interval / 2,
    )


def _connection_lost(channel: grpclib.client.Channel) -> asyncio.Future[None] | None:
    """A future set when `channel`'s open connection is finally gone (None: none open).

    grpclib offers no way to wait for that, so its protocol's connection_lost,
    the last thing to happen to a connection, is wrapped.
    """
    protocol: Any = getattr(channel, "_protocol", None)
    handler = getattr(protocol, "handler", None)
    if handler is None or handler.connection_lost:
        return None
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    original = protocol.connection_lost

    def connection_lost(exc: BaseException | None) -> None:
        original(exc)
        if not lost.done():
            lost.set_result(None)

    protocol.connection_lost = connection_lost
    return lost


def client_tls_context(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext:
    """A client's TLS settings: trust the CAs in `ca` (a PEM bundle; None: the
    system trust store) and present the certificate `cert` with its `key` (a
    PEM file each; `key` None: it is in `cert`) when the daemon asks for one.

    Raises OSError or ssl.SSLError for a file that cannot be loaded.
    """
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    # gRPC needs HTTP/2 negotiated through ALPN.
    context.set_alpn_protocols(["h2"])
    return context


def sole_exception(group: BaseExceptionGroup[Any]) -> BaseException:
    """The one leaf of a (nested) group, or the group itself when it holds several."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else group


def _as_is(coro: Coroutine[Any, Any, _T]) -> Coroutine[Any, Any, _T]:
    # Under asyncio the coroutine is awaited where it is: no wrapper per call.
    return coro


def _call(fn: Callable[..., Awaitable[_T]], *args: Any) -> Awaitable[_T]:
    return fn(*args)
