"""What the SDK needs of a transport: the one interface `Connection` is written against.

`ringo_trio._transport.grpclib.Transport` (grpclib over a socket, in its
asyncio island) is the implementation every client uses; the in-memory
transport (`ringo_trio._transport.memory`, used by `ringo_trio.testing`) is
the other, connecting a client to an in-process daemon without sockets. Both
keep the same contract: arguments and results are plain betterproto
messages, failures are always `ringo_trio` errors, and cancellation comes
back as cancellation.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, Self, TypeVar

from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._endpoint import Endpoint
from .._errors import IncompatibleVersionError

__all__ = [
    "DEFAULT_KEEPALIVE",
    "ClientTransport",
    "Keepalive",
    "SessionRejectedError",
    "StreamChannels",
]

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Keepalive:
    """HTTP/2 PING keepalive of a client channel: a ping every ``interval``
    seconds, busy or idle, and the connection is closed (its calls and
    streams fail `UnavailableError`) when one goes unacknowledged for
    ``timeout`` seconds. A daemon that froze or a path that went dark is so
    found within ``interval + timeout``; nothing else would find it while
    the client only waits (an idle Work stream, a shared daemon's member)."""

    interval: float
    timeout: float


#: The original SDK's values for its shared-daemon channels, kept for every channel.
DEFAULT_KEEPALIVE = Keepalive(interval=15.0, timeout=10.0)


class SessionRejectedError(IncompatibleVersionError):
    """The daemon refused the call's RequestContext (unknown or expired session
    token) before running the operation, so renegotiating and retrying is safe."""


@dataclass(frozen=True, slots=True)
class StreamChannels(Generic[_Req, _Resp]):
    """The SDK side of one open stream.

    ``send`` is None for a server stream. Closing ``send`` half-closes the
    stream; ``receive`` ends (EndOfStream) when the server ends the stream.
    """

    send: MemoryObjectSendStream[_Req] | None
    receive: MemoryObjectReceiveStream[_Resp]


class ClientTransport(Protocol):
    """A gRPC channel to one daemon, usable from any anyio task.

    Entered (``async with``) once, in the task that owns its lifetime;
    ``aclose`` may be called from any task and is idempotent.
    """

    @property
    def endpoint(self) -> Endpoint: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def aclose(self) -> None:
        """Close the channel; in-flight calls fail with UnavailableError."""
        ...

    async def reset(
        self, endpoint: Endpoint, *, metadata: tuple[tuple[str, str], ...] | None = None
    ) -> None:
        """Replace the channel with one to ``endpoint`` (a restarted daemon)."""
        ...

    async def unary(
        self, method: str, request: Any, response_type: type[_T], *, rpc_timeout: float | None
    ) -> _T:
        """One unary RPC with the gRPC deadline ``rpc_timeout``."""
        ...

    async def health_check(self, *, rpc_timeout: float) -> bool:
        """True when the daemon's health service reports SERVING."""
        ...

    def open_stream(
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
    ) -> AbstractAsyncContextManager[StreamChannels[_Req, _Resp]]:
        """A server stream (``request`` given) or a bidi stream (``request`` None);
        ``coalesce`` turns the requests queued when the writer wakes into
        what it sends (the Work stream's batch frames)."""
        ...
