"""Lease time on the daemon's side (minor >= 11): every lease it sends says
how long it runs from the moment of sending (``Lease.ttl``), in process on a
manual clock; below minor 11 the frames are the very bytes they were.

Pushes are encoded from storage rows at claim time and joined with their ttl
when each message is written (`Push.frame_with`), so a lease that waited
between the claim and its frame has a shorter ttl; the extend_lease result
and the unary Claim and ExtendLease replies carry theirs the same way.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import anyio
import pytest

from ringo_trio._contract import versions
from ringo_trio._contract.work import server as machine
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    CreditUpdate,
    ExtendLeaseRequest,
    LeaseRef,
    TaskSpec,
    WorkerRegistration,
    WorkRequest,
    WorkResponse,
)
from ringo_trio._wire.codec import decode
from ringo_trio._wire.work import encode_work_push, encode_work_response_batch
from ringo_trio.server.clock import ManualClock
from tests._kit.grpc_client import elements
from tests._kit.work_stream import FakeStream, in_process

pytestmark = pytest.mark.anyio

LEASE = timedelta(seconds=30)
STEP = timedelta(seconds=7)


class RawStream(FakeStream):
    """A FakeStream that also keeps each message's bytes and the daemon's
    clock when it was written, and lets the clock move between writes."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(self._sending)
        self.clock = clock
        self.raw: list[bytes] = []
        self.sent_at: list[datetime] = []

    async def _sending(self, n: int) -> None:
        self.sent_at.append(self.clock.now())
        # The next message is written later than this one: its ttl is shorter.
        self.clock.advance(STEP)

    async def send_message(self, message: WorkResponse) -> None:
        if message.task is not None or message.batch is not None:
            self.raw.append(bytes(message))
        await super().send_message(message)


async def _push_three(tmp_path: Path, minor: int, clock: ManualClock) -> RawStream:
    """Three tasks pushed to one stream of `minor`, one message each."""
    async with in_process(tmp_path, clock, minor) as (service, engine, context):
        await engine.enqueue("q", [TaskSpec(task_type="t")] * 3, clock.now())
        stream = RawStream(clock)
        registration = WorkerRegistration(
            context=context, queue="q", worker_id="w", max_concurrency=8, lease_duration=LEASE
        )
        stream.inbox.put_nowait(WorkRequest(register=registration))
        stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=3)))
        with anyio.fail_after(10):
            serving = asyncio.create_task(service.work_streams.serve(stream))
            await stream.until(lambda: len(stream.tasks) == 3)
            stream.inbox.put_nowait(None)
            await serving
    return stream


@pytest.mark.parametrize("minor", [versions.MINOR, 10], ids=["newest", "minor10"])
async def test_a_pushed_lease_s_ttl_is_its_until_minus_the_send_time(
    tmp_path: Path, minor: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: every lease pushed at minor >= 11 carries ``ttl = until -
    the daemon's clock when its message was written`` — not when it was
    claimed: the clock moves between the claim and the writes — and each
    frame is the generic encoding of that LeasedTask; below minor 11 no
    lease has a ttl."""
    # One push per message, so each is written at its own moment.
    monkeypatch.setattr(machine, "PUSH_MESSAGE_BYTES", 1)
    clock = ManualClock()
    claimed_at = clock.now()
    stream = await _push_three(tmp_path, minor, clock)
    pushed = stream.tasks
    assert len(stream.raw) == len(stream.sent_at) == 3
    for leased, sent_at, raw in zip(pushed, stream.sent_at, stream.raw, strict=True):
        lease = leased.lease
        assert lease is not None
        assert lease.until == claimed_at + LEASE
        if minor >= 11:
            assert lease.ttl == lease.until - sent_at
        else:
            assert lease.ttl is None
        assert raw == encode_work_push(leased)
    if minor >= 11:
        assert [item.lease.ttl for item in pushed if item.lease] == [
            LEASE,
            LEASE - STEP,
            LEASE - 2 * STEP,
        ]


@pytest.mark.parametrize("minor", [9, 10], ids=["minor9-plain", "minor10-batch"])
async def test_below_minor_11_push_frames_are_the_bytes_they_were(
    tmp_path: Path, minor: int
) -> None:
    """Property (nothing changes below minor 11): every push message — a
    frame per push at minor 9, a batch frame at minor 10 — is byte for byte
    the generic encoding of its LeasedTasks without a ttl, which is what
    the daemon wrote before leases carried one (its pushes were encoded
    from rows byte-equal to the generic encoder, tests/server/storage)."""
    clock = ManualClock()
    stream = await _push_three(tmp_path, minor, clock)
    assert stream.raw
    for raw in stream.raw:
        message = decode(raw, WorkResponse)
        pushes = [element.task for element in elements(message)]
        assert all(p is not None and p.lease is not None for p in pushes)
        assert all(p.lease.ttl is None for p in pushes if p and p.lease)
        frames = [encode_work_push(p) for p in pushes if p is not None]
        assert raw == (frames[0] if message.batch is None else encode_work_response_batch(frames))


@pytest.mark.parametrize("minor", [versions.MINOR, 10], ids=["newest", "minor10"])
async def test_replies_carry_the_lease_s_ttl_from_minor_11(tmp_path: Path, minor: int) -> None:
    """Property: the unary Claim and ExtendLease replies and the Work
    stream's extend_lease result carry ``ttl = until - now`` at minor >= 11
    (the manual clock stands still: ``now`` is the reply's moment), and no
    ttl below."""
    clock = ManualClock()
    async with in_process(tmp_path, clock, minor) as (service, engine, context):
        await engine.enqueue("q", [TaskSpec(task_type="t")] * 2, clock.now())
        reply = await service.claim(
            ClaimRequest(context=context, queue="q", worker_id="w", limit=1, lease_duration=LEASE)
        )
        [leased] = reply.tasks
        lease = leased.lease
        assert lease is not None
        assert lease.until is not None
        assert lease.ttl == (LEASE if minor >= 11 else None)
        clock.advance(STEP)
        ref = LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token)
        extended = await service.extend_lease(
            ExtendLeaseRequest(context=context, lease=ref, extension=LEASE)
        )
        assert extended.lease is not None
        assert extended.lease.until == clock.now() + LEASE
        assert extended.lease.ttl == (LEASE if minor >= 11 else None)

        # The Work stream's extend_lease command.
        stream = FakeStream()
        registration = WorkerRegistration(
            context=context, queue="q", worker_id="w", max_concurrency=1, lease_duration=LEASE
        )
        stream.inbox.put_nowait(WorkRequest(register=registration))
        stream.inbox.put_nowait(WorkRequest(request_id=1, credit=CreditUpdate(available=1)))
        with anyio.fail_after(10):
            serving = asyncio.create_task(service.work_streams.serve(stream))
            await stream.until(lambda: len(stream.tasks) == 1)
            [pushed] = stream.tasks
            assert pushed.lease is not None
            clock.advance(STEP)
            push_ref = LeaseRef(
                task_id=pushed.lease.task_id,
                attempt=pushed.lease.attempt,
                lease_token=pushed.lease.lease_token,
            )
            stream.inbox.put_nowait(
                WorkRequest(
                    request_id=2, extend_lease=ExtendLeaseRequest(lease=push_ref, extension=LEASE)
                )
            )
            await stream.until(
                lambda: any(
                    e.result is not None and e.result.request_id == 2
                    for sent in stream.sent
                    for e in elements(sent)
                )
            )
            [result] = [
                e.result
                for sent in stream.sent
                for e in elements(sent)
                if e.result is not None and e.result.request_id == 2
            ]
            assert result.error is None, result.error
            assert result.lease is not None
            assert result.lease.until == clock.now() + LEASE
            assert result.lease.ttl == (LEASE if minor >= 11 else None)
            stream.inbox.put_nowait(None)
            await serving
