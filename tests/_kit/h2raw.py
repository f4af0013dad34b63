"""A raw HTTP/2 client (asyncio + h2) that can misbehave on purpose: stop
reading, announce messages it never sends, reset streams by the thousand."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import betterproto2
import h2.config
import h2.connection
import h2.events
import h2.settings
from grpclib.protocol import H2Protocol

from ringo_trio.server.rpc.connections import GuardedServer
from ringo_trio.server.rpc.memory import connect_protocols

WORK_METHOD = "/ringo.v1.QueueService/Work"
NEGOTIATE_METHOD = "/ringo.v1.QueueService/Negotiate"
ENQUEUE_METHOD = "/ringo.v1.QueueService/Enqueue"


def grpc_frame(message: betterproto2.Message | bytes, *, compressed: bool = False) -> bytes:
    body = message if isinstance(message, bytes) else bytes(message)
    return struct.pack(">?I", compressed, len(body)) + body


@dataclass
class StreamState:
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None

    def messages(self) -> list[bytes]:
        """The complete gRPC messages received so far."""
        out = []
        pos = 0
        while pos + 5 <= len(self.data):
            (length,) = struct.unpack(">I", self.data[pos + 1 : pos + 5])
            if pos + 5 + length > len(self.data):
                break
            out.append(bytes(self.data[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        return out

    def header(self, name: str) -> str | None:
        for key, value in [*self.headers, *self.trailers]:
            if key == name:
                return value
        return None


class RawH2:
    """One HTTP/2 connection. `pump` reads what has arrived; nothing is read
    (and no WINDOW_UPDATE sent) unless the test asks."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.streams: dict[int, StreamState] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.eof = False
        self.auto_ack = True

    @classmethod
    async def connect(cls, host: str, port: int, *, window: int = 65535) -> RawH2:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer, window)
        await client.flush()
        return client

    @classmethod
    async def in_memory(cls, server: GuardedServer, *, window: int = 65535) -> RawH2:
        """A connection to an in-memory daemon's server (`virtual_daemon`):
        no socket, so the daemon's timers run on the test's virtual clock."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        server_side = server.accept()
        connect_protocols(cast(H2Protocol, protocol), server_side)
        transport = cast(asyncio.WriteTransport, protocol._transport)  # type: ignore[attr-defined]
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        client = cls(reader, writer, window)
        await client.flush()
        return client

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    def start(self, path: str, extra: Sequence[tuple[str, str]] = (), *, end: bool = False) -> int:
        """Open a stream (headers buffered; `flush` sends them)."""
        stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "ringod"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *extra,
        ]
        self.conn.send_headers(stream_id, headers, end_stream=end)
        self.streams[stream_id] = StreamState()
        return stream_id

    async def send(self, stream_id: int, data: bytes, *, end: bool = False) -> None:
        self.conn.send_data(stream_id, data, end_stream=end)
        await self.flush()

    async def pump(self, wait: float) -> bool:
        """Read and handle one chunk (False on timeout or EOF)."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), wait)
        except TimeoutError:
            return False
        except ConnectionError:
            data = b""
        if not data:
            self.eof = True
            return False
        for event in self.conn.receive_data(data):
            self._handle(event)
        await self.flush()
        return True

    async def until(self, done: object, wait: float) -> None:
        """Pump until `done()` is true or the connection ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not done() and not self.eof:  # type: ignore[operator]
            left = deadline - loop.time()
            if left <= 0:
                return
            await self.pump(left)

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.streams[event.stream_id].headers += event.headers  # type: ignore[arg-type]
        elif isinstance(event, h2.events.TrailersReceived):
            state = self.streams[event.stream_id]
            state.trailers += event.headers  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None
            assert event.data is not None
            self.streams[event.stream_id].data += event.data
            if self.auto_ack:
                self.conn.acknowledge_received_data(
                    event.flow_controlled_length or 0, event.stream_id
                )
        elif isinstance(event, h2.events.StreamEnded):
            assert event.stream_id is not None
            self.streams[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            assert event.stream_id is not None
            if event.stream_id in self.streams:
                self.streams[event.stream_id].reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    def close(self) -> None:
        self.writer.close()
