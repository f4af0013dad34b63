"""The real PostgreSQL server every machine of this project runs (127.0.0.1:5432).

Tests never mock it: each test that needs it gets a database of its own,
created here and dropped (with its connections) when the test ends. The
admin connection goes through `psql`, so creating databases needs no driver.
``RINGO_TEST_POSTGRES`` overrides the server (a libpq URL of its admin DB).

Also here: daemons on one database (`postgres_daemons`, `daemons_off_loop`)
and `DatabaseProxy`, which stands between them and the server and can take
the database away and bring it back.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, asynccontextmanager, contextmanager
from urllib.parse import urlsplit, urlunsplit

import trio

from ringo_trio.testing import DaemonProcess

ADMIN_DSN = os.environ.get("RINGO_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", ADMIN_DSN, "-v", "ON_ERROR_STOP=1", "-qXc", sql],
        check=True,
        capture_output=True,
        timeout=60,
    )


def dsn_for(database: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit(parts._replace(path="/" + database))


@contextmanager
def fresh_database(prefix: str = "ringo_test") -> Iterator[str]:
    """Create an empty database, yield its DSN, drop it (forcibly) afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    _psql(f'CREATE DATABASE "{name}"')
    try:
        yield dsn_for(name)
    finally:
        _psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def postgres_daemons(
    dsn: str, count: int, extra_args: Sequence[str] = ()
) -> Iterator[list[DaemonProcess]]:
    """`count` daemons on `dsn`, started concurrently; stopped on exit."""
    daemons = [DaemonProcess(None, postgres_dsn=dsn, extra_args=extra_args) for _ in range(count)]
    try:
        with ThreadPoolExecutor(count) as pool:
            for started in [pool.submit(d.start) for d in daemons]:
                started.result()
        yield daemons
    finally:
        for daemon in daemons:
            daemon.stop()


@asynccontextmanager
async def daemons_off_loop(dsn: str, count: int) -> AsyncIterator[list[DaemonProcess]]:
    """`postgres_daemons`, started and stopped in a thread: for a test whose
    own event loop must keep serving (a proxy) while the daemons start."""
    with ExitStack() as stack:
        daemons = await trio.to_thread.run_sync(stack.enter_context, postgres_daemons(dsn, count))
        try:
            yield daemons
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(stack.close)


class DatabaseProxy:
    """A TCP proxy between daemons and PostgreSQL on a fixed port: `down`
    cuts every connection and closes the port (new connections are
    refused, as by a database that is gone), `up` listens again."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._nursery: trio.Nursery | None = None
        self._scope = trio.CancelScope()

    async def run(self, *, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.up()
            task_status.started()
            await trio.sleep_forever()

    async def up(self) -> None:
        assert self._nursery is not None
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self._scope = trio.CancelScope()
        self._nursery.start_soon(self._serve, listeners, self._scope)

    def down(self) -> None:
        self._scope.cancel()

    async def _serve(self, listeners: list[trio.SocketListener], scope: trio.CancelScope) -> None:
        with scope:
            try:
                await trio.serve_listeners(self._forward, listeners)
            finally:
                for listener in listeners:
                    await listener.aclose()

    async def _forward(self, client: trio.SocketStream) -> None:
        async with client:
            try:
                upstream = await trio.open_tcp_stream(*self.target)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        both.cancel()
