"""The Work stream's lease-freshness rule, in-process on a manual clock (the
hostile tests show the budget and the stall reset against a real daemon)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest

from ringo_trio._contract.work import server as machine
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    TaskSpec,
    TaskState,
    WorkerRegistration,
    WorkRequest,
)
from ringo_trio.server.clock import ManualClock
from tests._kit.work_stream import FakeStream, in_process

LEASE_MARGIN = timedelta(seconds=machine.LEASE_MARGIN)

pytestmark = pytest.mark.anyio


async def test_a_lease_that_aged_in_the_batch_is_claimed_afresh(
    tmp_path: Path, push_minor: int
) -> None:
    """Property: a push never starts with less than the lease's margin left. When
    a slow send ages the rest of a batch past that point, those leases go
    back (PENDING, attempt unspent) and the worker gets the tasks under fresh
    leases instead."""
    lease = timedelta(seconds=30)
    clock = ManualClock()
    gate = asyncio.Event()
    blocked = asyncio.Event()
    sent_at: list[datetime] = []

    async def slow_first(n: int) -> None:
        sent_at.append(clock.now())
        if n == 1:
            blocked.set()
            await gate.wait()

    async with in_process(tmp_path, clock, push_minor) as (service, engine, context):
        outcomes = await engine.enqueue("q", [TaskSpec(task_type="t")] * 3, clock.now())
        task_ids = [o.task.id for o in outcomes if o.task is not None]
        stream = FakeStream(slow_first)
        registration = WorkerRegistration(
            context=context, queue="q", worker_id="w", max_concurrency=8, lease_duration=lease
        )
        stream.inbox.put_nowait(WorkRequest(register=registration))
        stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=3)))
        with anyio.fail_after(10):
            serving = asyncio.create_task(service.work_streams.serve(stream))
            await blocked.wait()
            # The first frame is still on its way when the others' leases
            # have less than the margin left.
            clock.advance(lease - LEASE_MARGIN + timedelta(seconds=1))
            gate.set()
            await stream.until(lambda: len(stream.tasks) == 3)
            pushed = stream.tasks
            for item, when in zip(pushed, sent_at, strict=True):
                assert item.lease is not None
                assert item.lease.until is not None
                assert item.lease.until - when >= LEASE_MARGIN, (item.lease.until, when)
            # The two that waited were claimed a second time (attempt 1 again:
            # the returned attempt was not spent).
            assert [item.lease.attempt for item in pushed if item.lease] == [1, 1, 1]
            for task_id in task_ids:
                task = await engine.get("q", task_id=task_id)
                assert (task.state, task.attempt) == (TaskState.LEASED, 1)
            stream.inbox.put_nowait(None)
            await serving
