"""Client keepalive: every channel pings its daemon, and a frozen daemon is found.

A daemon stopped with SIGSTOP keeps its sockets: the kernel accepts
connections and bytes for it, nothing answers, nothing resets. Only an
unanswered HTTP/2 PING tells the client. The daemon runs behind a
`CuttableProxy` (never cut here) so the tests can see the client's
connections open and close; SIGSTOP reaches the daemon behind it, and PINGs
cross the proxy unanswered like any other bytes.
"""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import trio

from ringo_trio import InvalidArgumentError, Ringo, Task, TaskContext, TaskSpec, UnavailableError
from ringo_trio._endpoint import parse_endpoint
from ringo_trio._transport.base import DEFAULT_KEEPALIVE, Keepalive
from ringo_trio._transport.grpclib import Transport
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import eventually, free_port
from tests._kit.proxy import CuttableProxy

pytestmark = pytest.mark.trio

# Short, so a frozen daemon is found in about a second.
INTERVAL = 0.5
TIMEOUT = 0.5
# How long the tests give the keepalive to find a frozen daemon: a loaded
# machine's slack over INTERVAL + TIMEOUT, and far below what finds it
# without keepalive (a call's 30 s deadline; for an idle connection or a
# Work stream, nothing ever does).
FOUND_WITHIN = 8.0


async def test_clients_configure_their_channels_with_the_keepalive_options(
    tmp_path: pathlib.Path,
) -> None:
    """Properties: the keepalive options of `Ringo.connect` and `Ringo.local`
    (shared or not) reach the client's channel; the default is a ping every
    15 s with 10 s to answer (the original SDK's shared-daemon values) for
    every kind of client; ``keepalive_interval=None`` turns pings off; the
    channel pings while idle and never stops (grpclib's defaults would stop
    after two pings without data and space them 300 s apart); bad values
    are refused before any network activity."""
    assert Keepalive(interval=15.0, timeout=10.0) == DEFAULT_KEEPALIVE
    cases = [
        (Ringo.connect("127.0.0.1:1"), DEFAULT_KEEPALIVE),
        (Ringo.local(tmp_path / "a"), DEFAULT_KEEPALIVE),
        (Ringo.local(tmp_path / "b", shared=True), DEFAULT_KEEPALIVE),
        (
            Ringo.connect("127.0.0.1:1", keepalive_interval=3, keepalive_timeout=2.5),
            Keepalive(3.0, 2.5),
        ),
        (
            Ringo.connect(
                "127.0.0.1:1",
                keepalive_interval=timedelta(seconds=4),
                keepalive_timeout=timedelta(milliseconds=500),
            ),
            Keepalive(4.0, 0.5),
        ),
        (
            Ringo.local(tmp_path / "c", shared=True, keepalive_interval=6, keepalive_timeout=1),
            Keepalive(6.0, 1.0),
        ),
        (Ringo.connect("127.0.0.1:1", keepalive_interval=None), None),
    ]
    for client, expected in cases:
        assert client._connection.keepalive == expected

    endpoint = parse_endpoint("127.0.0.1:1")
    with trio.fail_after(10):
        # Entering a transport makes its channel; grpclib connects at the first call.
        async with Transport(endpoint, keepalive=Keepalive(3.0, 2.5)) as transport:
            assert transport._channel is not None
            config = transport._channel._config
            assert config._keepalive_time == 3.0
            assert config._keepalive_timeout == 2.5
            assert config._keepalive_permit_without_calls is True
            assert config._http2_max_pings_without_data == 0
            assert config._http2_min_sent_ping_interval_without_data <= 3.0
            # A reset (a restarted or re-elected daemon) keeps pinging.
            await transport.reset(parse_endpoint("127.0.0.1:2"))
            assert transport._channel._config._keepalive_time == 3.0
        async with Transport(endpoint, keepalive=None) as transport:
            assert transport._channel is not None
            assert transport._channel._config._keepalive_time is None

    for bad in (
        {"keepalive_interval": 0},
        {"keepalive_interval": -1},
        {"keepalive_interval": float("inf")},
        {"keepalive_interval": True},
        {"keepalive_interval": "15"},
        {"keepalive_timeout": 0},
        {"keepalive_timeout": None},
        {"keepalive_timeout": float("nan")},
    ):
        with pytest.raises(InvalidArgumentError):
            Ringo.connect("127.0.0.1:1", **bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            Ringo.local(tmp_path / "d", **bad)  # type: ignore[arg-type]


@pytest.fixture
async def proxied(tmp_path: pathlib.Path) -> AsyncIterator[tuple[DaemonProcess, CuttableProxy]]:
    port = free_port()
    with spawn_daemon(tmp_path / "daemon", extra_args=["--listen", f"127.0.0.1:{port}"]) as daemon:
        proxy = CuttableProxy(port)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            yield daemon, proxy
            nursery.cancel_scope.cancel()


@contextmanager
def frozen(daemon: DaemonProcess) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) for the block; always thawed on the way out,
    or it could not even be stopped."""
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


async def test_an_idle_client_finds_a_frozen_daemon_and_recovers_once_it_thaws(
    proxied: tuple[DaemonProcess, CuttableProxy],
) -> None:
    """Properties: the daemon takes pings at the client's rate (several
    intervals pass and the idle connection stays up: no ping limit closes
    it); an idle client keeps pinging however long it idles, so its
    connection to a daemon that froze is closed by the keepalive within
    interval + timeout, with no call in flight; the next call fails
    `UnavailableError` well before its 30 s deadline; once the daemon
    thaws, calls work again on a new connection."""
    daemon, proxy = proxied
    async with Ringo.connect(
        f"127.0.0.1:{proxy.port}", keepalive_interval=INTERVAL, keepalive_timeout=TIMEOUT
    ) as client:
        queue = client.queue("keepalive-idle")
        with trio.fail_after(20):
            await queue.enqueue(TaskSpec("t"))
        # Idle for several intervals: the pings go on (and the connection
        # stays up: the daemon accepts them at this rate).
        await trio.sleep(6 * INTERVAL)
        assert (proxy.accepted, proxy.ended) == (1, 0)

        with frozen(daemon):
            await eventually(lambda: proxy.ended == 1, within=FOUND_WITHIN)
            with trio.fail_after(20), pytest.raises(UnavailableError):
                await queue.enqueue(TaskSpec("t"))

        with trio.fail_after(20):
            assert (await queue.enqueue(TaskSpec("t"))).created
        assert proxy.accepted > 1


async def test_an_idle_workers_stream_dies_with_a_frozen_daemon_and_reconnects(
    proxied: tuple[DaemonProcess, CuttableProxy],
) -> None:
    """Properties: a registered worker with nothing to do, whose daemon froze,
    has its Work stream's connection closed by the keepalive within
    interval + timeout (without it the stream would wait forever), then
    reconnects as after any drop; once the daemon thaws it runs new work."""
    daemon, proxy = proxied
    ran = trio.Event()

    async def handle(task: Task, ctx: TaskContext) -> None:
        ran.set()

    async with Ringo.connect(
        f"127.0.0.1:{proxy.port}", keepalive_interval=INTERVAL, keepalive_timeout=TIMEOUT
    ) as client:
        queue = client.queue("keepalive-worker")
        worker = queue.worker(handle)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(20):
                await nursery.start(worker.run)
            assert (proxy.accepted, proxy.ended) == (1, 0)
            with frozen(daemon):
                await eventually(lambda: proxy.ended == 1, within=FOUND_WITHIN)
                # The worker's recovery connects again (to the frozen daemon).
                await eventually(lambda: proxy.accepted > 1, within=FOUND_WITHIN)
            with trio.fail_after(30):
                await queue.enqueue(TaskSpec("t"))
                await ran.wait()
                await worker.close()
