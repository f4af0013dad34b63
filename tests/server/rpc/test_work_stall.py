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
from ringo_trio.server.rpc.work import StreamStalled
from tests._kit.virtual_daemon import now, on_virtual_time
from tests._kit.work_stream import FakeStream, in_process

LEASE_MARGIN = timedelta(seconds=machine.LEASE_MARGIN)


@pytest.mark.anyio
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


@on_virtual_time
async def test_a_worker_that_stops_reading_is_reset_before_its_leases_run_short(
    tmp_path: Path,
) -> None:
    """Property (stalls): a task frame that cannot be written -- the worker
    stopped reading, and HTTP/2 flow control holds the send -- ends the
    stream once the batch's leases are down to their margin, not at
    `STALL_TIMEOUT` (30 s) however long the leases are; every lease of
    the batch goes back, PENDING, no attempt spent, for another worker."""
    lease = timedelta(seconds=12)  # the margin is 5 s: reset 7 s after the claim
    clock = ManualClock()

    async def stopped_reading(_n: int) -> None:
        await asyncio.Event().wait()

    async with in_process(tmp_path, clock) as (service, engine, context):
        outcomes = await engine.enqueue("q", [TaskSpec(task_type="t")] * 3, clock.now())
        stream = FakeStream(stopped_reading)
        registration = WorkerRegistration(
            context=context, queue="q", worker_id="w", max_concurrency=8, lease_duration=lease
        )
        stream.inbox.put_nowait(WorkRequest(register=registration))
        stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=3)))
        start = now()
        with pytest.raises(StreamStalled):
            await service.work_streams.serve(stream)
        assert now() - start == pytest.approx((lease - LEASE_MARGIN).total_seconds())
        for outcome in outcomes:
            assert outcome.task is not None
            task = await engine.get("q", task_id=outcome.task.id)
            assert (task.state, task.attempt) == (TaskState.PENDING, 0)
