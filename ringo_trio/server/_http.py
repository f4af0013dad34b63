"""The daemon's small HTTP/1.1 server (``/metrics`` and the dashboard).

Theory of operation
-------------------
Protocol work is h11's (sans-IO): this module only moves bytes between a
socket and an `h11.Connection` on the daemon's asyncio loop, and calls a
`Handler` with each complete `Request`. It serves plain HTTP on a listening
socket the caller bound (TLS, if wanted, belongs in a proxy in front).

`serve_http` runs until cancelled; every connection is a task of its
`asyncio.TaskGroup`, so none outlives it. What a client can make it hold is
bounded by `HttpLimits`:

* at most ``max_connections`` connections at once; one more is answered 503
  at once (best effort, never waiting on the client) and closed;
* a request head of at most ``max_head_bytes`` (h11 answers 431 past it) and a
  body of at most ``max_body_bytes`` (413);
* a request must arrive whole within ``read_timeout`` seconds of its first
  byte (else 408), and an idle keep-alive connection is closed after
  ``read_timeout`` seconds without one; a response must be written within
  ``write_timeout`` seconds, else the connection is dropped.

Keep-alive is h11's: a connection serves requests one after another until
either side says ``Connection: close``; a response with status >= 400 closes
it too, so a misbehaving client holds a slot for one answer only. A
malformed request gets h11's status hint (400 mostly) and a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import h11

__all__ = ["DropConnection", "Handler", "HttpLimits", "Request", "Response", "serve_http"]

log = logging.getLogger("ringo_trio.server.http")

_ACCEPT_BACKOFF = 0.1
_RECV_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 16
    max_head_bytes: int = 8 * 1024
    max_body_bytes: int = 64 * 1024
    read_timeout: float = 5.0
    write_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    """Percent-decoded path, without the query."""
    raw_path: str
    """The path as sent (still percent-encoded): segments may contain '/'."""
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names; a repeated header's values joined with ', '."""
    body: bytes
    peer: tuple[str, int]

    def arg(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0] if values else default

    def form(self) -> dict[str, list[str]]:
        """An ``application/x-www-form-urlencoded`` body, parsed."""
        try:
            text = self.body.decode("utf-8")
            return urllib.parse.parse_qs(text, keep_blank_values=True, max_num_fields=100)
        except ValueError:
            # Not UTF-8, or too many fields: no form the dashboard made.
            return {}


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False
    """Close the connection after this response."""


class DropConnection(Exception):
    """Raised by a handler: close the connection without an answer."""


Handler = Callable[[Request], Awaitable[Response]]


async def serve_http(
    sock: socket.socket, handler: Handler, limits: HttpLimits, *, name: str
) -> None:
    """Serve `handler` on the listening `sock` until cancelled; closes `sock`."""
    loop = asyncio.get_running_loop()
    busy = 0

    async def run(conn: socket.socket, peer: tuple[str, int]) -> None:
        nonlocal busy
        try:
            await _Connection(loop, conn, peer, handler, limits).serve()
        except (OSError, TimeoutError) as exc:
            log.debug("%s: connection failed: %r", name, exc)
        except Exception:
            # A bug costs one connection, never the daemon's task group.
            log.exception("%s: serving a connection failed", name)
        finally:
            busy -= 1
            conn.close()

    with sock:
        async with asyncio.TaskGroup() as connections:
            while True:
                try:
                    conn, address = await loop.sock_accept(sock)
                except OSError as exc:
                    # Out of file descriptors, or a connection aborted before
                    # it was accepted: the daemon goes on, clients retry.
                    log.warning("%s: accepting a connection failed: %r", name, exc)
                    await asyncio.sleep(_ACCEPT_BACKOFF)
                    continue
                conn.setblocking(False)
                if busy >= limits.max_connections:
                    # One non-blocking send into an empty socket buffer: a
                    # client that does not read cannot make us wait.
                    with contextlib.suppress(OSError), conn:
                        conn.send(_BUSY)
                    continue
                busy += 1
                peer = (str(address[0]), int(address[1])) if address else ("", 0)
                connections.create_task(run(conn, peer), name=f"ringod {name} connection")


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 22\r\nConnection: close\r\n\r\ntoo many connections\r\n"
)


class _Connection:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        peer: tuple[str, int],
        handler: Handler,
        limits: HttpLimits,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._peer = peer
        self._handler = handler
        self._limits = limits
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        # Whether any byte of the current request arrived (a timeout then
        # deserves a 408; an idle keep-alive connection is closed silently).
        self._started = False

    async def serve(self) -> None:
        conn = self._h11
        while True:
            try:
                request = await self._read_request()
            except h11.RemoteProtocolError as exc:
                await self._error(exc.error_status_hint, f"{exc}\n")
                return
            except _TooLarge:
                await self._error(413, "request body too large\n")
                return
            except TimeoutError:
                if conn.their_state is not h11.IDLE or self._started:
                    await self._error(408, "request timeout\n")
                return
            if request is None:
                return
            try:
                response = await self._handler(request)
            except DropConnection:
                return
            await self._respond(response)
            # An answer that said `Connection: close` (see _respond) leaves h11
            # in MUST_CLOSE, as does a client that asked for it.
            if conn.our_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                # The client did not finish its request body: nothing to reuse.
                return

    async def _read_request(self) -> Request | None:
        conn = self._h11
        self._started = False
        head: h11.Request | None = None
        body = bytearray()
        async with asyncio.timeout(self._limits.read_timeout):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await self._loop.sock_recv(self._sock, _RECV_BYTES)
                    if data:
                        self._started = True
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    head = event
                    # h11 bounds only a head still incomplete in its buffer;
                    # one that arrived whole in a single read is measured here.
                    size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                    if size > self._limits.max_head_bytes:
                        raise h11.RemoteProtocolError("request head too large", 431)
                    length = _content_length(event.headers)
                    if length is not None and length > self._limits.max_body_bytes:
                        raise _TooLarge
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > self._limits.max_body_bytes:
                        raise _TooLarge
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    return _request(head, bytes(body), self._peer)
                else:
                    # ConnectionClosed or PAUSED (the client pipelined before
                    # our answer): nothing more to read for this cycle.
                    return None

    async def _respond(self, response: Response) -> None:
        conn = self._h11
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
        ]
        if response.close or response.status >= 400:
            headers.append(("Connection", "close"))
        reason = _REASONS.get(response.status, b"")
        data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
        assert data is not None
        if response.body:
            more = conn.send(h11.Data(data=response.body))
            assert more is not None
            data += more
        end = conn.send(h11.EndOfMessage())
        assert end is not None
        data += end
        async with asyncio.timeout(self._limits.write_timeout):
            await self._loop.sock_sendall(self._sock, data)

    async def _error(self, status: int, message: str) -> None:
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        with contextlib.suppress(OSError, TimeoutError, h11.LocalProtocolError):
            await self._respond(Response(status, message.encode(), close=True))


_REASONS = {int(s): s.phrase.encode() for s in http.HTTPStatus}


class _TooLarge(Exception):
    pass


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


def _request(head: h11.Request, body: bytes, peer: tuple[str, int]) -> Request:
    target = head.target.decode("ascii", "replace")
    raw_path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("ascii", "replace")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    try:
        fields = urllib.parse.parse_qs(query, keep_blank_values=True, max_num_fields=50)
    except ValueError:
        raise h11.RemoteProtocolError("too many query fields", error_status_hint=400) from None
    return Request(
        method=head.method.decode("ascii", "replace"),
        path=urllib.parse.unquote(raw_path),
        raw_path=raw_path,
        query=fields,
        headers=headers,
        body=body,
        peer=peer,
    )
