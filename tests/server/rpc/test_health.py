"""grpc.health.v1.Health of a real daemon (and, for shutdown, of one on virtual time)."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import connect, expect_status
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, virtual_daemon

pytestmark = pytest.mark.anyio

SERVING = HealthCheckResponseServingStatus.SERVING
NOT_SERVING = HealthCheckResponseServingStatus.NOT_SERVING


async def test_check_reports_serving_for_the_server_and_the_queue_service(
    daemon: DaemonProcess,
) -> None:
    """Property: Check answers SERVING for "" and "ringo.v1.QueueService" and
    NOT_FOUND for a service the daemon does not have."""
    with anyio.fail_after(10):
        async with connect(daemon, negotiate=False) as client:
            for service in ("", "ringo.v1.QueueService"):
                response = await client.health.check(HealthCheckRequest(service=service))
                assert response.status is SERVING
            await expect_status(
                client.health.check(HealthCheckRequest(service="no.such.Service")),
                Status.NOT_FOUND,
            )


@on_virtual_time
async def test_watch_streams_serving_then_not_serving_on_shutdown() -> None:
    """Property: Watch sends the current status at once, then NOT_SERVING when
    the daemon starts shutting down, and then ends so shutdown is not held
    up: the daemon stops at the shutdown's (virtual) instant, not after its
    drain timeout (5 s). (ringod's exit status on a signal: test_cli.)"""
    async with virtual_daemon() as served, connect(served.daemon, negotiate=False) as client:
        seen: list[HealthCheckResponseServingStatus] = []
        unknown: list[HealthCheckResponseServingStatus] = []

        async def watch(
            service: str, into: list[HealthCheckResponseServingStatus], first: asyncio.Event
        ) -> None:
            async for response in client.health.watch(HealthCheckRequest(service=service)):
                into.append(response.status)
                first.set()

        firsts = [asyncio.Event(), asyncio.Event()]
        watches = [
            asyncio.create_task(watch("", seen, firsts[0])),
            asyncio.create_task(watch("no.such.Service", unknown, firsts[1])),
        ]
        for first in firsts:
            await first.wait()
        assert seen == [SERVING]
        assert unknown == [HealthCheckResponseServingStatus.SERVICE_UNKNOWN]
        stopped_at = now()
        served.stop.set()
        await asyncio.gather(*watches)
        assert seen == [SERVING, NOT_SERVING]
        await served.serving  # stopped, without an error
        assert now() - stopped_at < PROMPT
