"""In-memory connections to the daemon's server: the same HTTP/2, no socket.

The testing kit (`ringo_trio.testing.RingoTestEnv`) runs the daemon in the
test's own event loop and connects its client through `InMemoryChannel`, a
grpclib channel whose every connection is a pair of `_Pipe` transports handing
bytes to the other side's protocol with ``call_soon``. Everything above the
transport — the guarded server protocol, the gate, the codec, the services —
is the daemon's own, so a test exercises the real protocol. The server side
is `GuardedServer.start_in_memory` and `GuardedServer.accept`: grpclib has no
public way to serve without a listening socket, so its subclass does it.

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

from .connections import GuardedServer

__all__ = ["InMemoryChannel"]

_PEER = ("in-memory", 0)


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

    def __init__(self, server: GuardedServer) -> None:
        super().__init__("in-memory", 0)
        self._daemon_server = server

    async def _create_connection(self) -> H2Protocol:
        # grpclib's hook for how a channel connects (its own opens a socket).
        if not self._daemon_server.serving:
            raise ConnectionRefusedError("the in-process daemon is not serving")
        client = self._protocol_factory()
        connect_protocols(client, self._daemon_server.accept())
        return client
