"""The daemon in-process (same event loop as the test), for faults and shutdown
races a child process cannot be made to show on cue; the shutdown timeout on
virtual time (`tests/_kit/virtual_daemon.py`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio._proto.ringo.v1 import AckRequest, LeaseRef, Task, TaskSpec, TaskState
from ringo_trio.server.storage.base import EnqueueOutcome
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.grpc_client import connect, expect_status, new_queue, ref, serving
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, virtual_daemon

pytestmark = pytest.mark.anyio


class FaultyEngine(SQLiteEngine):
    """The real engine, plus an enqueue that blows up on one queue name and an
    ack that can be held mid-call."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hold_acks: asyncio.Event | None = None
        self.ack_entered = asyncio.Event()
        self.closed = False

    async def enqueue(
        self, queue: str, specs: Sequence[TaskSpec], now: datetime
    ) -> list[EnqueueOutcome]:
        if queue == "boom":
            raise RuntimeError("disk on fire")
        return await super().enqueue(queue, specs, now)

    async def ack(self, ref: LeaseRef, now: datetime, result: bytes | None = None) -> Task:
        self.ack_entered.set()
        if self.hold_acks is not None:
            await self.hold_acks.wait()
        return await super().ack(ref, now, result)

    async def close(self) -> None:
        self.closed = True
        await super().close()


async def test_unexpected_exception_is_internal_logged_and_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: an exception nobody expected (an engine bug) answers that one
    call INTERNAL, is logged with its traceback, and the daemon keeps serving."""
    engine = FaultyEngine(tmp_path / "ringo.db")
    with anyio.fail_after(10):
        async with serving(engine) as daemon, connect(daemon.endpoint) as client:
            with caplog.at_level(logging.ERROR, logger="ringo_trio.server"):
                await expect_status(
                    client.enqueue("boom"),
                    Status.INTERNAL,
                    "internal error in enqueue (RuntimeError)",
                )
            [record] = [r for r in caplog.records if r.exc_info]
            assert "enqueue failed unexpectedly" in record.getMessage()
            assert record.exc_info is not None
            assert str(record.exc_info[1]) == "disk on fire"
            queue = new_queue()
            await client.enqueue(queue)
            assert await client.activity(queue) == 1
            assert await client.activity("boom") == 0


async def test_shutdown_drains_in_flight_calls_then_closes_storage(tmp_path: Path) -> None:
    """Property: on shutdown the daemon reports NOT_SERVING, refuses new calls
    with UNAVAILABLE, lets the call already running finish (it commits and
    answers OK), and closes storage only after that."""
    engine = FaultyEngine(tmp_path / "ringo.db")
    queue = new_queue()
    stop = asyncio.Event()
    with anyio.fail_after(15):
        async with (
            serving(engine, stop=stop) as daemon,
            connect(daemon.endpoint) as client,
            connect(daemon.endpoint) as other,
        ):
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue)
            engine.hold_acks = asyncio.Event()
            outcome: list[object] = []

            async def ack() -> None:
                outcome.append(
                    await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(ack)
                await engine.ack_entered.wait()
                stop.set()
                # Health stays answerable while draining; Watch ends on NOT_SERVING.
                async for response in other.health.watch(HealthCheckRequest()):
                    last = response.status
                assert last is HealthCheckResponseServingStatus.NOT_SERVING
                health = await other.health.check(HealthCheckRequest())
                assert health.status is HealthCheckResponseServingStatus.NOT_SERVING
                await expect_status(other.enqueue(queue), Status.UNAVAILABLE, "shutting down")
                assert not engine.closed
                engine.hold_acks.set()
            assert len(outcome) == 1
        assert engine.closed
    reopened = SQLiteEngine(tmp_path / "ringo.db")
    await reopened.open()
    try:
        stored = await reopened.get(queue, task_id=task.id)
        assert stored.state is TaskState.SUCCEEDED
        assert await reopened.activity(queue, []) == 0
    finally:
        await reopened.close()


@on_virtual_time
async def test_shutdown_timeout_bounds_a_call_that_never_finishes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a call still running after --shutdown-timeout is cancelled
    and answered UNAVAILABLE (logged), so shutdown always ends — exactly at
    the timeout on virtual time, not before and not later — and the client
    is not left hanging; storage is still closed."""
    engine = FaultyEngine(tmp_path / "ringo.db")
    queue = new_queue()
    timeout = 0.3
    with caplog.at_level(logging.WARNING, logger="ringo_trio.server"):
        async with (
            virtual_daemon(engine=engine, shutdown_timeout=timeout) as served,
            connect(served.daemon) as client,
        ):
            await client.enqueue(queue)
            [leased] = await client.claim(queue)
            engine.hold_acks = asyncio.Event()  # never set
            ack = asyncio.create_task(
                expect_status(
                    client.stub.ack(AckRequest(context=client.context, lease=ref(leased))),
                    Status.UNAVAILABLE,
                    "shut down before this call finished",
                )
            )
            await engine.ack_entered.wait()
            started = now()
            served.stop.set()
            await ack
            await served.serving  # stopped, without an error
            assert timeout <= now() - started < timeout + PROMPT
    assert engine.closed
    assert any("still running" in r.getMessage() for r in caplog.records)
