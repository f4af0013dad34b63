"""In-memory connections to the daemon's server: the same HTTP/2, no socket.

The testing kit (`ringo_trio.testing.RingoTestEnv`) runs the daemon in the
test's own event loop and connects its client through `InMemoryChannel`, a
grpclib channel whose every connection is a pair of `_Pipe` transports handing
bytes to the other side's protocol with ``call_soon``. Everything above the
transport — the guarded server protocol, the gate, the codec, the services —
is the daemon's own, so a test exercises the real protocol.

No socket means nothing waits on the outside world: when every task is
blocked, only a timer can make progress, which is what lets a mock clock
(trio's ``autojump_threshold=0``) jump straight to the next lease expiry or
retry instead of a deadline firing while bytes are in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpclib.client
from grpclib.protocol import H2Protocol
from grpclib.server import Server

__all__ = ["InMemoryChannel", "start_in_memory"]

_PEER = ("in-memory", 0)


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


def start_in_memory(server: Server) -> None:
    """Mark ``server`` started without a socket (its close and wait_closed then work as usual)."""
    server._server = _NoListener()
    server._server_closed_fut = asyncio.get_running_loop().create_future()


def _closed(server: Server) -> bool:
    closed = server._server_closed_fut
    return closed is None or closed.done()


class _Pipe(asyncio.Transport):
    """One direction of an in-memory connection: what ``owner`` writes, ``receiver`` reads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self.owner: asyncio.Protocol | None = None
        self.receiver: asyncio.Protocol | None = None
        self.other: _Pipe | None = None
        self._closing = False
        self._lost = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        # The gate's throttle keys failures by peer address.
        return _PEER if name in ("peername", "sockname") else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if data and not self._closing:
            self._loop.call_soon(self._deliver, bytes(data))

    def _deliver(self, data: bytes) -> None:
        # Bytes written before a close still arrive, as on a socket.
        other = self.other
        if self.receiver is not None and other is not None and not other._lost:
            self.receiver.data_received(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        # Either side closing ends the connection for both.
        for pipe in (self, self.other):
            if pipe is not None and not pipe._closing:
                pipe._closing = True
                self._loop.call_soon(pipe._lose)

    def abort(self) -> None:
        self.close()

    def _lose(self) -> None:
        if not self._lost and self.owner is not None:
            self._lost = True
            self.owner.connection_lost(None)


def connect_protocols(client: H2Protocol, server: H2Protocol) -> None:
    """Wire ``client`` and ``server`` to each other and start both."""
    loop = asyncio.get_running_loop()
    up, down = _Pipe(loop), _Pipe(loop)
    up.owner, up.receiver, up.other = client, server, down
    down.owner, down.receiver, down.other = server, client, up
    server.connection_made(down)
    client.connection_made(up)


class InMemoryChannel(grpclib.client.Channel):
    """A grpclib channel whose connections go to ``server`` in this process."""

    def __init__(self, server: Server) -> None:
        super().__init__("in-memory", 0)
        self._server = server

    async def _create_connection(self) -> H2Protocol:
        if _closed(self._server):
            raise ConnectionRefusedError("the in-process daemon is not serving")
        client = self._protocol_factory()
        connect_protocols(client, self._server._protocol_factory())
        return client
