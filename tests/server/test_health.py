"""grpc.health.v1.Health of a real daemon."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon

from ._client import connect, expect_status

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


async def test_watch_streams_serving_then_not_serving_on_shutdown(tmp_path: Path) -> None:
    """Property: Watch sends the current status at once, then NOT_SERVING when
    the daemon starts shutting down, and then ends so shutdown is not held up
    (the daemon still exits 0)."""
    with anyio.fail_after(20), spawn_daemon(tmp_path / "data") as process:
        async with connect(process, negotiate=False) as client:
            seen: list[HealthCheckResponseServingStatus] = []
            unknown: list[HealthCheckResponseServingStatus] = []

            async def watch(
                service: str,
                into: list[HealthCheckResponseServingStatus],
                *,
                task_status: anyio.abc.TaskStatus[None],
            ) -> None:
                async for response in client.health.watch(HealthCheckRequest(service=service)):
                    into.append(response.status)
                    if len(into) == 1:
                        task_status.started()

            async with anyio.create_task_group() as tg:
                await tg.start(watch, "", seen)
                await tg.start(watch, "no.such.Service", unknown)
                assert seen == [SERVING]
                assert unknown == [HealthCheckResponseServingStatus.SERVICE_UNKNOWN]
                started = time.monotonic()
                returncode = await anyio.to_thread.run_sync(process.terminate)
                elapsed = time.monotonic() - started
            assert seen == [SERVING, NOT_SERVING]
            assert returncode == 0
            # Open watches must not hold shutdown up to the drain timeout (5 s).
            assert elapsed < 3
