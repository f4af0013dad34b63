"""Health follows storage: NOT_SERVING while PostgreSQL cannot be reached.

The real test runs ``ringod`` on a real PostgreSQL behind a `DatabaseProxy`
that the test takes down (every connection cut, the port closed) and brings
back, and watches health through the SDK's transport. The probe's own rules
(a failed operation makes it ping at once; one dropped connection is no
outage) run on an in-process daemon on virtual time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

from ringo_trio._endpoint import parse_endpoint
from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponse,
    HealthCheckResponseServingStatus,
)
from ringo_trio._transport.grpclib import HEALTH_WATCH, Transport
from ringo_trio.server.storage.base import StorageUnavailable
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.postgres import DatabaseProxy, daemons_off_loop
from tests._kit.virtual_daemon import PROMPT, on_virtual_time, virtual_daemon

SERVING = HealthCheckResponseServingStatus.SERVING
NOT_SERVING = HealthCheckResponseServingStatus.NOT_SERVING
# ringod's reach probe finds an outage within its interval + timeout (1 s +
# 2 s); this leaves a loaded machine room, and without the probe health
# never changes at all.
FOUND_WITHIN = 10.0


@pytest.mark.trio
async def test_health_is_not_serving_while_postgres_cannot_be_reached(postgres_dsn: str) -> None:
    """Properties: a daemon whose PostgreSQL cannot be reached (connections
    cut, new ones refused) answers health Check NOT_SERVING within its probe
    bound, and Watch streams the change; once the database is back, both say
    SERVING again, without a restart of the daemon."""
    target = urlsplit(postgres_dsn)
    proxy = DatabaseProxy(target.hostname or "127.0.0.1", target.port or 5432)
    request = HealthCheckRequest()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            proxied = urlunsplit(
                target._replace(netloc=f"{target.username}@127.0.0.1:{proxy.port}")
            )
            async with (
                daemons_off_loop(proxied, 1) as (daemon,),
                Transport(parse_endpoint(daemon.endpoint)) as transport,
                transport.open_stream(
                    HEALTH_WATCH, HealthCheckRequest, HealthCheckResponse, request=request
                ) as watch,
            ):
                assert (await watch.receive.receive()).status == SERVING
                assert await transport.health_check(rpc_timeout=5)

                proxy.down()
                with trio.fail_after(FOUND_WITHIN):
                    assert (await watch.receive.receive()).status == NOT_SERVING
                assert not await transport.health_check(rpc_timeout=5)

                await proxy.up()
                with trio.fail_after(FOUND_WITHIN):
                    assert (await watch.receive.receive()).status == SERVING
                assert await transport.health_check(rpc_timeout=5)
            nursery.cancel_scope.cancel()


class _Unreachable(SQLiteEngine):
    """SQLite posing as a server engine whose reachability the test decides."""

    can_be_unreachable = True

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reachable = True
        self.pings = 0

    async def ping(self) -> None:
        self.pings += 1
        if not self.reachable:
            raise StorageUnavailable("the test says so")


@on_virtual_time
async def test_a_lost_connection_makes_the_probe_ping_at_once(tmp_path: Path) -> None:
    """Properties: an operation reporting a lost connection makes the probe
    ping at once, so health turns NOT_SERVING at that instant rather than at
    the probe's next beat; a report while storage still answers (one
    dropped connection) leaves health SERVING; health returns to SERVING at
    the first ping that succeeds; an engine that cannot be unreachable
    (SQLite) is never pinged."""
    engine = _Unreachable(tmp_path / "ringo.db")
    async with virtual_daemon(engine=engine, storage_probe=60.0) as served:
        health = served.daemon.health
        assert health.serving
        await asyncio.sleep(1)
        pings = engine.pings

        assert engine.unavailable_listener is not None
        engine.unavailable_listener(StorageUnavailable("one connection dropped"))
        await asyncio.sleep(PROMPT)
        assert engine.pings == pings + 1
        assert health.serving

        engine.reachable = False
        engine.unavailable_listener(StorageUnavailable("the server is gone"))
        await asyncio.sleep(PROMPT)
        assert not health.serving

        engine.reachable = True
        await asyncio.sleep(60.0 + PROMPT)
        assert health.serving

    local = _Local(tmp_path / "local.db")
    local.reachable = False
    async with virtual_daemon(engine=local, storage_probe=0.5) as served:
        await asyncio.sleep(5)
        assert served.daemon.health.serving
    assert local.pings == 0


class _Local(_Unreachable):
    can_be_unreachable = False
