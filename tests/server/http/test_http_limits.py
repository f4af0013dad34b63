"""`serve_http`'s bounds against hostile clients (``ringo_trio.server.http.server``):
connections per address, the head timeout, rationed error logs.

Each test serves a tiny handler on a real loopback socket with small limits;
clients are blocking sockets in worker threads, bound to distinct loopback
addresses (all of 127.0.0.0/8 is loopback on Linux) to act as distinct
clients.
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import anyio
import pytest

from ringo_trio.server.http.server import ErrorLog, HttpLimits, Request, Response, serve_http

pytestmark = pytest.mark.anyio

Handler = Callable[[Request], Awaitable[Response]]


async def ok(request: Request) -> Response:
    return Response(200, b"ok")


@asynccontextmanager
async def serving(limits: HttpLimits, handler: Handler = ok) -> AsyncIterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(serve_http, listener, handler, limits, name="test"))
        yield port
        tg.cancel_scope.cancel()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def exchange(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    """Send `data` from `source` and read until the server closes."""
    with connect(port, source) as sock:
        with suppress(ConnectionResetError):
            sock.sendall(data)
        chunks = []
        with suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


GET = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def test_one_address_cannot_take_the_connections_of_others() -> None:
    """Property: past max_connections_per_address, one more connection from
    that address is answered 503 and closed, while another address is still
    served; max_connections stays the bound over all addresses."""
    limits = HttpLimits(max_connections=4, max_connections_per_address=2, head_timeout=30.0)
    with anyio.fail_after(30):
        async with serving(limits) as port:
            held = [await anyio.to_thread.run_sync(connect, port) for _ in range(2)]
            try:
                # Accepted in order: the held ones are counted before these.
                same = await anyio.to_thread.run_sync(exchange, port, GET)
                assert same.startswith(b"HTTP/1.1 503"), same
                other = await anyio.to_thread.run_sync(exchange, port, GET, "127.0.0.2")
                assert other.startswith(b"HTTP/1.1 200"), other
                held += [await anyio.to_thread.run_sync(connect, port, "127.0.0.3")]
                held += [await anyio.to_thread.run_sync(connect, port, "127.0.0.4")]
                full = await anyio.to_thread.run_sync(exchange, port, GET, "127.0.0.5")
                assert full.startswith(b"HTTP/1.1 503"), full
            finally:
                for sock in held:
                    sock.close()


async def test_a_trickled_or_missing_head_is_cut_at_the_head_timeout() -> None:
    """Property: a connection that sends its head a byte at a time, or sends
    nothing, holds its slot head_timeout seconds, not read_timeout: the
    trickler gets 408 and a close, the silent one a close; meanwhile others
    are served."""
    limits = HttpLimits(max_connections=8, head_timeout=0.3, read_timeout=3600.0)

    def trickle() -> bytes:
        with connect(port) as sock:
            sock.settimeout(0.05)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            while True:
                with suppress(ConnectionResetError):
                    sock.sendall(b"a")
                try:
                    return sock.recv(65536)
                except TimeoutError:
                    continue

    def silent() -> bytes:
        with connect(port) as sock:
            return sock.recv(65536)

    with anyio.fail_after(60):
        async with serving(limits) as port:
            assert (await anyio.to_thread.run_sync(trickle)).startswith(b"HTTP/1.1 408")
            assert await anyio.to_thread.run_sync(silent) == b""
            served = await anyio.to_thread.run_sync(exchange, port, GET)
            assert served.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: \xff\xfe\r\n\r\n", id="header-not-utf8"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", id="header-control"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n", id="header-del"),
        pytest.param(b"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n", id="path-bad-escape"),
        pytest.param(b"GET /a%e9 HTTP/1.1\r\nHost: x\r\n\r\n", id="path-not-utf8"),
        pytest.param(b"GET /?q=%4 HTTP/1.1\r\nHost: x\r\n\r\n", id="query-bad-escape"),
        pytest.param(b"GET /?q=%ff HTTP/1.1\r\nHost: x\r\n\r\n", id="query-not-utf8"),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\nq=%ff&a", id="form-not-utf8"
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nq=%", id="form-bad-escape"
        ),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n\xff\xfe", id="form-bytes"
        ),
    ],
)
async def test_malformed_bytes_are_a_400(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a header value that is not UTF-8 or holds a control
    character, a broken or non-UTF-8 percent escape in the path or query, and
    a malformed form body are answered 400 (the client's fault), never 500,
    and log no error."""

    async def reads_everything(request: Request) -> Response:
        request.form()
        return Response(200, b"ok")

    with anyio.fail_after(30):
        async with serving(HttpLimits(), reads_everything) as port:
            answer = await anyio.to_thread.run_sync(exchange, port, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_well_formed_non_ascii_is_served() -> None:
    """Property: the strict decoding refuses only malformed input: UTF-8 in a
    header value and percent-encoded UTF-8 in the path, query and form are
    decoded and served."""
    seen: list[Request] = []

    async def record(request: Request) -> Response:
        seen.append(request)
        request.form()
        return Response(200, b"ok")

    sent = (
        b"POST /caf%C3%A9?q=%C3%A9+x HTTP/1.1\r\nHost: x\r\nX-A: caf\xc3\xa9\t!\r\n"
        b"Content-Length: 8\r\n\r\nq=%C3%A9"
    )
    with anyio.fail_after(30):
        async with serving(HttpLimits(), record) as port:
            answer = await anyio.to_thread.run_sync(exchange, port, sent)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    [request] = seen
    assert (request.path, request.query, request.headers["x-a"]) == (
        "/café",
        {"q": ["é x"]},
        "café\t!",
    )
    assert request.form() == {"q": ["é"]}


async def test_a_failing_handler_logs_one_traceback_per_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: an exception in the handler answers 500 every time, but one
    client address gets at most one traceback logged per interval; another
    address still gets its own."""

    async def broken(request: Request) -> Response:
        raise RuntimeError("handler on fire")

    with anyio.fail_after(60):
        async with serving(HttpLimits(), broken) as port:
            for _ in range(10):
                answer = await anyio.to_thread.run_sync(exchange, port, GET)
                assert answer.startswith(b"HTTP/1.1 500"), answer
            answer = await anyio.to_thread.run_sync(exchange, port, GET, "127.0.0.2")
            assert answer.startswith(b"HTTP/1.1 500"), answer
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 2
    assert all("handler on fire" in str(r.exc_info) for r in tracebacks)


def test_the_error_log_counts_what_it_left_out() -> None:
    """Property: within an interval an address gets one traceback; the next
    one after the interval says how many were left out; all addresses
    together get at most per_interval per interval."""
    now = [0.0]
    logger = logging.getLogger("test.errorlog")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    logger.addHandler(keep)
    try:
        errors = ErrorLog(logger, interval=10.0, per_interval=3, clock=lambda: now[0])
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            for _ in range(5):
                errors.exception("10.0.0.1", "failed")
            assert len(records) == 1
            now[0] = 10.0
            errors.exception("10.0.0.1", "failed")
            assert len(records) == 2
            assert "4 more from 10.0.0.1" in records[-1].getMessage()
            for host in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
                errors.exception(host, "failed")
            assert len(records) == 4  # 10.0.0.4 is past per_interval
            # An IPv6 client's /64 is one address.
            now[0] = 20.0
            errors.exception("2001:db8::1", "failed")
            errors.exception("2001:db8::2", "failed")
            assert len(records) == 5
    finally:
        logger.removeHandler(keep)
