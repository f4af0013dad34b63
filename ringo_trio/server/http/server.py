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

* at most ``max_connections_per_address`` connections at once from one
  client address (an IPv6 client's whole /64, which one host usually
  holds), and at most ``max_connections`` in all; one more is answered 503
  at once (best effort, never waiting on the client) and closed. The
  per-address cap is what leaves room for everyone else when one address
  opens many slow connections; the global cap is the last bound, reached
  only by many addresses. Behind a reverse proxy every client has the
  proxy's address, so the per-address cap is the proxy's whole share: set
  it to ``max_connections`` (None) there, and let the proxy bound its
  clients;
* a request head of at most ``max_head_bytes`` (h11 answers 431 past it) and a
  body of at most ``max_body_bytes`` (413);
* a request head must arrive whole within ``head_timeout`` seconds, and the
  whole request within ``read_timeout``, both counted from the connection's
  opening for its first request and from the request's first byte for a
  later one (else 408 and a close, so a client trickling its head a byte at
  a time holds its slot ``head_timeout`` seconds at most); an idle
  keep-alive connection is closed after ``read_timeout`` seconds without a
  byte; a response must be written within ``write_timeout`` seconds, else the
  connection is dropped.

Keep-alive is h11's: a connection serves requests one after another until
either side says ``Connection: close``; a response with status >= 400 closes
it too, so a misbehaving client holds a slot for one answer only. A
malformed request gets h11's status hint (400 mostly) and a close.

Malformed bytes are the client's fault, so they are a 400, never a 500: a
header value that is not UTF-8 or holds a control character, a path or
query with a broken ``%`` escape or one that does not decode to UTF-8, and
(through `BadRequest`, raised by `Request.form` and by a handler) a
malformed form body. Any other exception a handler raises answers 500 and
is logged by `ErrorLog`: one traceback per client address per
``interval``, then a count of the ones left out, so one client cannot
flood the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import ipaddress
import logging
import re
import socket
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import h11

__all__ = [
    "BadRequest",
    "DropConnection",
    "ErrorLog",
    "Handler",
    "HttpLimits",
    "Request",
    "Response",
    "address_key",
    "serve_http",
    "unquote_strict",
]

log = logging.getLogger("ringo_trio.server.http")

_ACCEPT_BACKOFF = 0.1
_RECV_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 16
    max_connections_per_address: int | None = None
    """None: no cap per address below ``max_connections``."""
    max_head_bytes: int = 8 * 1024
    max_body_bytes: int = 64 * 1024
    head_timeout: float = 5.0
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
        """An ``application/x-www-form-urlencoded`` body, parsed.

        Raises `BadRequest` for a body no browser's form makes: not UTF-8,
        a broken ``%`` escape, or too many fields.
        """
        try:
            return _parse_qs(self.body.decode("utf-8"), max_fields=100)
        except ValueError:
            raise BadRequest("malformed form body") from None


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


class BadRequest(ValueError):
    """Raised by a handler (or `Request.form`): answer 400 with the message."""


Handler = Callable[[Request], Awaitable[Response]]


async def serve_http(
    sock: socket.socket,
    handler: Handler,
    limits: HttpLimits,
    *,
    name: str,
    errors: ErrorLog | None = None,
) -> None:
    """Serve `handler` on the listening `sock` until cancelled; closes `sock`."""
    loop = asyncio.get_running_loop()
    errors = errors if errors is not None else ErrorLog(log)
    busy = 0
    # Open connections per address key (`address_key`); absent means none.
    per_address: dict[str, int] = {}

    async def run(conn: socket.socket, peer: tuple[str, int], key: str) -> None:
        nonlocal busy
        try:
            await _Connection(loop, conn, peer, handler, limits, name, errors).serve()
        except (OSError, TimeoutError) as exc:
            log.debug("%s: connection failed: %r", name, exc)
        except Exception:
            # A bug costs one connection, never the daemon's task group.
            errors.exception(peer[0], "%s: serving a connection failed", name)
        finally:
            busy -= 1
            left = per_address[key] - 1
            if left:
                per_address[key] = left
            else:
                del per_address[key]
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
                peer = (str(address[0]), int(address[1])) if address else ("", 0)
                key = address_key(peer[0])
                cap = limits.max_connections_per_address
                refusal = None
                if busy >= limits.max_connections:
                    refusal = _BUSY
                elif cap is not None and per_address.get(key, 0) >= cap:
                    refusal = _BUSY_ADDRESS
                if refusal is not None:
                    # One non-blocking send into an empty socket buffer: a
                    # client that does not read cannot make us wait.
                    with contextlib.suppress(OSError), conn:
                        conn.send(refusal)
                    continue
                busy += 1
                per_address[key] = per_address.get(key, 0) + 1
                connections.create_task(run(conn, peer, key), name=f"ringod {name} connection")


def _busy(message: bytes) -> bytes:
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(message), message)
    )


_BUSY = _busy(b"too many connections\r\n")
_BUSY_ADDRESS = _busy(b"too many connections from your address\r\n")


def address_key(host: str) -> str:
    """What the per-address cap counts by: an IPv4 address, an IPv6 /64."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


class ErrorLog:
    """Tracebacks of unexpected failures, rationed per client address.

    At most one traceback per address key (`address_key`) per `interval`
    seconds, and at most `per_interval` from all addresses together; the next
    one logged from an address says how many of its own were left out.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 60.0,
        per_interval: int = 20,
        max_addresses: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self.interval = interval
        self.per_interval = per_interval
        self.max_addresses = max_addresses
        self._clock = clock
        # Address key -> [monotonic time of its last traceback, left out since].
        self._addresses: OrderedDict[str, list[float]] = OrderedDict()
        self._window = -float("inf")
        self._in_window = 0

    def exception(self, host: str, message: str, *args: object) -> None:
        """Log the exception being handled (as `Logger.exception`), if rationed in."""
        now = self._clock()
        key = address_key(host)
        entry = self._addresses.pop(key, None) or [-float("inf"), 0]
        self._addresses[key] = entry  # the most recently failing, last
        while len(self._addresses) > self.max_addresses:
            self._addresses.popitem(last=False)
        if now - self._window >= self.interval:
            self._window, self._in_window = now, 0
        if now - entry[0] < self.interval or self._in_window >= self.per_interval:
            entry[1] += 1
            return
        self._in_window += 1
        left_out = int(entry[1])
        entry[0], entry[1] = now, 0
        if left_out:
            message += " (and %d more from %s not logged since its last)"
            args = (*args, left_out, host)
        self._logger.exception(message, *args)


class _Connection:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        peer: tuple[str, int],
        handler: Handler,
        limits: HttpLimits,
        name: str,
        errors: ErrorLog,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._peer = peer
        self._handler = handler
        self._limits = limits
        self._name = name
        self._errors = errors
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        # The first request's time counts from the connection's opening (a
        # client that connects and trickles holds a slot from then on).
        self._opened: float | None = loop.time()
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
            except BadRequest as exc:
                response = Response(400, f"{exc}\n".encode())
            except Exception:
                # A bug costs its request a 500, never the connection
                # unanswered; its traceback is rationed per client.
                self._errors.exception(
                    self._peer[0], "%s: %s %s failed", self._name, request.method, request.path
                )
                response = Response(500, b"internal error; see the daemon log\n")
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
        limits = self._limits
        self._started = False
        head: h11.Request | None = None
        body = bytearray()
        # When the request's time started counting: the connection's opening
        # for its first request, a later one's first byte (until then the
        # connection is idle, and closed quietly after read_timeout).
        start, self._opened = self._opened, None
        head_within = min(limits.head_timeout, limits.read_timeout)
        idle_until = self._loop.time() + limits.read_timeout
        deadline = idle_until if start is None else start + head_within
        async with asyncio.timeout_at(deadline) as scope:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await self._loop.sock_recv(self._sock, _RECV_BYTES)
                    if data:
                        self._started = True
                        if start is None:
                            start = self._loop.time()
                            scope.reschedule(start + head_within)
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    head = event
                    if start is None:
                        # Pipelined: it was already buffered.
                        start = self._loop.time()
                    scope.reschedule(start + limits.read_timeout)
                    # h11 bounds only a head still incomplete in its buffer;
                    # one that arrived whole in a single read is measured here.
                    size = len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                    if size > limits.max_head_bytes:
                        raise h11.RemoteProtocolError("request head too large", 431)
                    length = _content_length(event.headers)
                    if length is not None and length > limits.max_body_bytes:
                        raise _TooLarge
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limits.max_body_bytes:
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


# A `%` not followed by two hex digits.
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# C0 controls but HTAB, and DEL: h11 lets them through in header values.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def unquote_strict(text: str) -> str:
    """Percent-decode `text`; ValueError for a broken escape or non-UTF-8 bytes."""
    if _BAD_ESCAPE.search(text):
        raise ValueError("malformed percent-encoding")
    return urllib.parse.unquote(text, errors="strict")


def _parse_qs(text: str, *, max_fields: int) -> dict[str, list[str]]:
    """A query or form, strictly: ValueError for what `unquote_strict` refuses."""
    if _BAD_ESCAPE.search(text):
        raise ValueError("malformed percent-encoding")
    return urllib.parse.parse_qs(
        text, keep_blank_values=True, max_num_fields=max_fields, errors="strict"
    )


def _request(head: h11.Request, body: bytes, peer: tuple[str, int]) -> Request:
    # h11 admits only visible ASCII in the target and a token as the method
    # and header names; header values may hold any byte but NUL, CR and LF.
    target = head.target.decode("ascii")
    raw_path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("ascii")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise h11.RemoteProtocolError(f"header {key}: not UTF-8", 400) from None
        if _CONTROL.search(text):
            raise h11.RemoteProtocolError(f"header {key}: a control character", 400)
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    try:
        path = unquote_strict(raw_path)
    except ValueError:
        raise h11.RemoteProtocolError("path: malformed percent-encoding", 400) from None
    try:
        fields = _parse_qs(query, max_fields=50)
    except ValueError:
        raise h11.RemoteProtocolError(
            "query: malformed percent-encoding or too many fields", 400
        ) from None
    return Request(
        method=head.method.decode("ascii"),
        path=path,
        raw_path=raw_path,
        query=fields,
        headers=headers,
        body=body,
        peer=peer,
    )
