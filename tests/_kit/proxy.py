"""A TCP proxy the tests control: forward to a daemon, cut every connection on demand."""

from __future__ import annotations

import trio


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to ``target_port``; `cut` drops every live connection.

    New connections are accepted again right after a cut, so a client that
    reconnects gets through — the cut models a network blip, not an outage.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        # Connections accepted, and those that have ended (either side hung up).
        self.accepted = 0
        self.ended = 0
        self._connections: set[trio.CancelScope] = set()

    @property
    def live_connections(self) -> int:
        return len(self._connections)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._forward, listeners)
            task_status.started()

    def cut(self) -> None:
        self.cuts += 1
        for scope in list(self._connections):
            scope.cancel()

    async def _forward(self, client: trio.SocketStream) -> None:
        scope = trio.CancelScope()
        self._connections.add(scope)
        self.accepted += 1
        try:
            with scope:
                upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                async with client, upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)
        finally:
            self._connections.discard(scope)
            self.ended += 1


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        both.cancel()
