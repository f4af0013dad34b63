"""Unit tests of the daemon's pure parts: codec, validation, sessions, wake-ups,
reaper and claim batching (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import betterproto2
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._contract import limits, versions
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ClaimRequest,
    ClaimResponse,
    EnqueueManyRequest,
    EnqueueRequest,
    ErrorDetail,
    ExtendLeaseRequest,
    GetTaskRequest,
    GetTaskResponse,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    RequestContext,
    RetryBackoff,
    Task,
    TaskSpec,
    WorkResult,
)
from ringo_trio._wire.codec import decode, encode
from ringo_trio.server.clock import LoopClock, ManualClock
from ringo_trio.server.rpc import validate as v
from ringo_trio.server.rpc.codec import StrictCodec, WireError
from ringo_trio.server.rpc.gate import Gate
from ringo_trio.server.rpc.reply_bounds import CLAIM_ROUND
from ringo_trio.server.rpc.service import QueueService
from ringo_trio.server.rpc.sessions import SessionTable
from ringo_trio.server.rpc.wakeups import (
    INCONSISTENT_WAKEUP_RETRY,
    SCHEDULE_SLACK,
    LeaseReaper,
    QueueWakeups,
    until_due,
)
from ringo_trio.server.storage.base import Storage, StorageUnavailable
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.virtual_daemon import PROMPT, on_virtual_time, quiet

pytestmark = pytest.mark.anyio

NOW = datetime(2030, 1, 1, tzinfo=UTC)

# -- codec ---------------------------------------------------------------------

_text = st.text(max_size=20)
# betterproto2 0.10 mis-encodes negative durations with a fractional part
# (-0.5 s goes out as +0.5 s; the SDK must refuse negatives before sending),
# so negative values here are whole seconds.
_durations = st.none() | st.one_of(
    st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=1000)),
    st.integers(-(10**8), 0).map(lambda seconds: timedelta(seconds=seconds)),
)
_specs = st.builds(
    TaskSpec,
    task_type=_text,
    payload=st.binary(max_size=50),
    unique_key=_text,
    max_attempts=st.integers(0, 2**32 - 1),
    retry_backoff=st.none()
    | st.builds(
        RetryBackoff, initial=_durations, maximum=_durations, multiplier=st.floats(allow_nan=False)
    ),
    delay=_durations,
    not_before=st.none() | st.datetimes(timezones=st.just(UTC)),
    priority=st.integers(-(2**31), 2**31 - 1),
)
_contexts = st.none() | st.builds(
    RequestContext,
    protocol_major=st.integers(0, 2**32 - 1),
    protocol_minor=st.integers(0, 2**32 - 1),
    session_token=_text,
)
_requests = st.one_of(
    st.builds(EnqueueRequest, context=_contexts, queue=_text, task=st.none() | _specs),
    st.builds(
        EnqueueManyRequest, context=_contexts, queue=_text, tasks=st.lists(_specs, max_size=4)
    ),
    st.builds(
        ClaimRequest,
        context=_contexts,
        queue=_text,
        task_types=st.lists(_text, max_size=3),
        limit=st.integers(0, 2**32 - 1),
        wait_timeout=_durations,
    ),
    st.builds(
        WorkResult,
        request_id=st.integers(0, 2**64 - 1),
        error=st.none()
        | st.builds(ErrorDetail, message=_text, metadata=st.dictionaries(_text, _text)),
    ),
)
_REQUEST_TYPES: list[type[betterproto2.Message]] = [
    EnqueueRequest,
    EnqueueManyRequest,
    ClaimRequest,
    AckRequest,
    NackRequest,
    ExtendLeaseRequest,
    GetTaskRequest,
    WorkResult,
]


@given(_requests)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_codec_accepts_every_valid_encoding_unchanged(message: betterproto2.Message) -> None:
    """Property: the strict check never refuses a message betterproto itself
    encoded, and decoding gives back an equal message."""
    data = bytes(message)
    decode(data, type(message))
    assert StrictCodec().decode(data, type(message)) == message


@given(st.sampled_from(_REQUEST_TYPES), st.binary(max_size=64))
@settings(max_examples=1000)
def test_codec_turns_any_bytes_into_a_message_or_invalid_argument(
    message_type: type[betterproto2.Message], data: bytes
) -> None:
    """Property: for arbitrary bytes the codec returns a message of the right
    type or raises GRPCError(INVALID_ARGUMENT) — never another exception,
    which would reach the client as UNKNOWN/INTERNAL."""
    status: Status | None = None
    try:
        decoded = StrictCodec().decode(data, message_type)
    except GRPCError as exc:
        status = exc.status
    else:
        assert isinstance(decoded, message_type)
    assert status in (None, Status.INVALID_ARGUMENT)


@given(_requests, st.data())
@settings(max_examples=200)
def test_codec_refuses_truncations_inside_a_field(message: betterproto2.Message, data: Any) -> None:
    """Property: cutting a valid encoding inside its last field is refused
    (betterproto alone would silently accept a shortened message)."""
    encoded = bytes(message)
    if not encoded:
        return
    boundaries = _field_boundaries(encoded)
    cut = data.draw(st.integers(1, len(encoded) - 1)) if len(encoded) > 1 else 0
    if cut == 0 or cut in boundaries:
        return
    with pytest.raises(WireError):
        decode(encoded[:cut], type(message))


def _field_boundaries(encoded: bytes) -> set[int]:
    """Offsets at which a top-level field ends (cuts there are valid messages)."""
    ends = {0}
    pos = 0
    while pos < len(encoded):
        key, pos = _varint(encoded, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(encoded, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            length, pos = _varint(encoded, pos)
            pos += length
        ends.add(pos)
    return ends


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


@pytest.mark.parametrize(
    ("data", "message_type", "fragment"),
    [
        (b"\x2a\x02\x01\x02", ClaimRequest, "limit: wire type 2 does not match a uint32 field"),
        (b"\x12\x01", EnqueueRequest, "queue: truncated field"),
        (b"\x0b", EnqueueRequest, "context: unsupported wire type 3"),
        (b"\x7b", EnqueueRequest, "#15: unsupported wire type 3"),
        (b"\x00\x00", EnqueueRequest, "field number 0"),
        (b"\x1a\x03\x2a\x01\xff", EnqueueManyRequest, "tasks[0].retry_backoff: truncated"),
        (b"\x1a\x03\x7a\x02\xff", EnqueueManyRequest, "tasks[0].#15: truncated field"),
        (b"\x12\x03\x0a\x05\x61", AckRequest, "lease.task_id: truncated field"),
        (b"\x12\x05\x1a\x03\x0a\x01\xc3", WorkResult, "error.metadata[0].key: string"),
        (b"\x78" + b"\xff" * 10 + b"\x01", AckRequest, "#15: varint longer than 10 bytes"),
        (b"\x08\x01", AckRequest, "context: wire type 0 does not match a message field"),
    ],
)
def test_codec_names_the_malformed_field(
    data: bytes, message_type: type[betterproto2.Message], fragment: str
) -> None:
    with pytest.raises(GRPCError) as refused:
        StrictCodec().decode(data, message_type)
    assert refused.value.status is Status.INVALID_ARGUMENT
    assert fragment in (refused.value.message or "")


def test_codec_unrepresentable_duration_is_invalid_argument() -> None:
    """Property: well-formed bytes whose values overflow Python's types (a
    Duration of 10^15 s) are the caller's error, not an INTERNAL."""
    duration = b"\x08" + _encode_varint(10**15)
    data = b"\x32" + bytes([len(duration)]) + duration  # ClaimRequest.wait_timeout
    with pytest.raises(GRPCError) as refused:
        StrictCodec().decode(data, ClaimRequest)
    assert refused.value.status is Status.INVALID_ARGUMENT


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def test_codec_enforces_the_message_size_limit_both_ways() -> None:
    """Property: frames over the limit are RESOURCE_EXHAUSTED in both
    directions (requests over the message limit, replies over the reply
    limit); a frame exactly at the limit passes."""
    codec = StrictCodec(max_message_bytes=20, max_reply_bytes=20)
    at_limit = EnqueueRequest(queue="q" * 18)
    assert len(bytes(at_limit)) == 20
    assert codec.decode(bytes(at_limit), EnqueueRequest) == at_limit
    assert codec.encode(at_limit, EnqueueRequest) == bytes(at_limit)
    over = EnqueueRequest(queue="q" * 19)
    for call in (
        lambda: codec.decode(bytes(over), EnqueueRequest),
        lambda: codec.encode(over, EnqueueRequest),
    ):
        with pytest.raises(GRPCError) as refused:
            call()
        assert refused.value.status is Status.RESOURCE_EXHAUSTED


def test_codec_sends_no_reply_over_the_reply_limit(caplog: pytest.LogCaptureFixture) -> None:
    """Property: by default a reply over MAX_REPLY_BYTES (gRPC's default
    receive limit) is not sent but answered RESOURCE_EXHAUSTED and logged as
    a daemon bug, while requests up to MAX_MESSAGE_BYTES are read."""
    codec = StrictCodec()
    task = Task(payload=b"x" * limits.MAX_REPLY_BYTES)
    with (
        caplog.at_level(logging.ERROR, logger="ringo_trio.server"),
        pytest.raises(GRPCError) as refused,
    ):
        codec.encode(GetTaskResponse(task=task), GetTaskResponse)
    assert refused.value.status is Status.RESOURCE_EXHAUSTED
    assert "reply bound" in caplog.text
    request = EnqueueRequest(task=TaskSpec(payload=b"x" * limits.MAX_REPLY_BYTES))
    assert codec.decode(bytes(request), EnqueueRequest) == request


# -- validation ------------------------------------------------------------------


def test_task_spec_normalization_fills_defaults_and_resolves_delay() -> None:
    """Property: the engine gets an unambiguous spec — defaults filled, a
    relative delay turned into an absolute not_before; the request is not
    mutated."""
    original = TaskSpec(task_type="t", delay=timedelta(seconds=5))
    spec = v.task_spec(original, "task", NOW)
    assert spec.max_attempts == limits.DEFAULT_MAX_ATTEMPTS
    assert spec.delay is None
    assert spec.not_before == NOW + timedelta(seconds=5)
    assert spec.retry_backoff == RetryBackoff(
        initial=limits.DEFAULT_BACKOFF_INITIAL,
        maximum=limits.DEFAULT_BACKOFF_MAX,
        multiplier=limits.DEFAULT_BACKOFF_MULTIPLIER,
    )
    assert original.delay == timedelta(seconds=5)
    partial = v.task_spec(
        TaskSpec(
            task_type="t", max_attempts=2, retry_backoff=RetryBackoff(initial=timedelta(hours=1))
        ),
        "task",
        NOW,
    )
    assert partial.max_attempts == 2
    assert partial.retry_backoff == RetryBackoff(
        initial=timedelta(hours=1), maximum=timedelta(hours=1), multiplier=2.0
    )


def test_claim_args_defaults_and_type_dedupe() -> None:
    args = v.claim_args(ClaimRequest(queue="q", worker_id="w", limit=3, task_types=["a", "a", "b"]))
    assert args.wait_timeout == timedelta(0)
    assert args.lease_duration == limits.DEFAULT_LEASE
    assert args.task_types == ["a", "b"]


# -- sessions ------------------------------------------------------------------


def test_session_expires_exactly_at_its_ttl_and_is_pruned() -> None:
    table = SessionTable(timedelta(seconds=10))
    token = table.open(3, NOW)
    session = table.lookup(token, NOW + timedelta(seconds=9.999))
    assert session is not None
    assert session.minor == 3
    assert table.lookup(token, NOW + timedelta(seconds=10)) is None
    assert table.lookup("", NOW) is None
    old = table.open(1, NOW)
    table.open(1, NOW + timedelta(seconds=11))
    assert len(table) == 1, "opening a session prunes expired ones"
    assert table.lookup(old, NOW) is None


def test_session_table_is_bounded() -> None:
    """Property: a client negotiating in a loop cannot grow memory without
    bound; the oldest session is dropped (its owner just renegotiates)."""
    table = SessionTable(timedelta(hours=1), max_sessions=3)
    tokens = [table.open(0, NOW) for _ in range(5)]
    assert len(table) == 3
    assert table.lookup(tokens[0], NOW) is None
    assert table.lookup(tokens[-1], NOW) is not None


# -- the gate's count of calls in flight -------------------------------------------


@on_virtual_time
async def test_the_drain_waits_for_calls_in_flight_and_says_whether_they_ended() -> None:
    """Property: `Gate.wait_idle` (the shutdown's drain) is True at once
    with no call in flight, False when its seconds run out with one still
    running (the daemon then logs and cancels it), True once the last ends.
    A daemon whose drain read False with nothing running would warn of
    calls it cancels at every clean shutdown."""
    gate = Gate(None)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await gate.wait_idle(5) is True
    assert loop.time() == start
    release = asyncio.Event()

    async def method(stream: object) -> None:
        await release.wait()

    counted = gate._counted(method)
    call = asyncio.create_task(counted(SimpleNamespace(deadline=None, peer=None)))
    await asyncio.sleep(0)
    assert gate.in_flight == 1
    assert await gate.wait_idle(2) is False
    assert loop.time() == start + 2
    release.set()
    await call
    assert gate.in_flight == 0
    assert await gate.wait_idle(5) is True


# -- wake-ups --------------------------------------------------------------------


async def test_notify_between_arm_and_wait_is_not_lost() -> None:
    """Property: a waiter that armed before checking storage sees a notify
    that lands before it starts waiting."""
    wakeups = QueueWakeups()
    with anyio.fail_after(1), wakeups.watch("q") as watch:
        armed = watch.arm()
        wakeups.notify("q")
        await watch.wait(armed, 30)
        fresh = watch.arm()
        assert fresh is not armed
        assert not fresh.is_set()
    assert wakeups.watched_queues() == 0


def test_a_claimer_sleeps_just_past_the_next_scheduled_moment() -> None:
    """Property (the long-poll Claim and the Work dispatcher alike): a claimer
    that found nothing sleeps until the queue's next scheduled moment plus a
    slack, so its next claim never finds the task a microsecond early; a
    moment that passed while it looked sleeps only the slack; a moment
    storage calls due at the very claim that found nothing backs off instead
    of spinning."""
    later = NOW + timedelta(seconds=3)
    assert until_due(later, NOW, NOW) == 3 + SCHEDULE_SLACK
    assert until_due(later, NOW, NOW + timedelta(seconds=1)) == 2 + SCHEDULE_SLACK
    assert until_due(later, NOW, later + timedelta(seconds=1)) == SCHEDULE_SLACK
    assert until_due(NOW, NOW, NOW) == INCONSISTENT_WAKEUP_RETRY
    assert until_due(NOW - timedelta(seconds=1), NOW, NOW) == INCONSISTENT_WAKEUP_RETRY
    assert INCONSISTENT_WAKEUP_RETRY > SCHEDULE_SLACK > 0


async def test_notify_wakes_only_its_queue_and_close_wakes_all() -> None:
    wakeups = QueueWakeups()
    with wakeups.watch("a") as a, wakeups.watch("b") as b:
        armed_a, armed_b = a.arm(), b.arm()
        wakeups.notify("a")
        wakeups.notify("unwatched")
        assert armed_a.is_set()
        assert not armed_b.is_set()
        wakeups.close()
        assert armed_b.is_set()
        assert b.closed
        assert wakeups.watched_queues() == 2
    assert wakeups.watched_queues() == 0


@on_virtual_time
async def test_a_wait_lasts_its_seconds_unless_woken() -> None:
    """Property: a waiter that found nothing sleeps the seconds it was given
    (a claimer returning early would spin on an empty queue), returns at
    once when its event is already set or it has no time left, and nothing
    is closed until `close`."""
    wakeups = QueueWakeups()
    loop = asyncio.get_running_loop()
    with wakeups.watch("q") as watch:
        assert not watch.closed
        for seconds in (0.5, 1.0, 3.0):
            start = loop.time()
            await watch.wait(watch.arm(), seconds)
            assert loop.time() - start == pytest.approx(seconds)
        start = loop.time()
        await watch.wait(watch.arm(), 0)
        await watch.wait(watch.arm(), -1)
        wakeups.notify("q")
        armed = watch.arm()
        wakeups.notify("q")
        await watch.wait(armed, 30)
        assert loop.time() == start
        assert not watch.closed
        wakeups.close()
        assert watch.closed


class _CountingStorage(SQLiteEngine):
    """Only expire_leases is real: it records calls and raises `failure`
    when one is set. The engine is never opened, so any other storage call
    fails loudly."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent/never-opened.db"))
        self.expire_calls: list[datetime] = []
        self.expired = 0
        self.failure: Exception | None = None

    async def expire_leases(self, now: datetime) -> int:
        self.expire_calls.append(now)
        if self.failure is not None:
            raise self.failure
        return self.expired


async def _run_reaper(reaper: LeaseReaper, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await reaper.run()


def _loop_clock() -> LoopClock:
    return LoopClock(asyncio.get_running_loop().time)


@on_virtual_time
async def test_reaper_sweeps_at_the_noted_deadline_not_before() -> None:
    """Property: after the startup sweep, the reaper sweeps when a noted lease
    deadline arrives (not before, and not only at the backstop), and wakes
    waiters when something expired. On virtual time: no sweep just before
    the deadline, one at it."""
    storage = _CountingStorage()
    storage.expired = 1
    wakeups = QueueWakeups()
    clock = _loop_clock()
    reaper = LeaseReaper(storage, clock, wakeups, backstop=60)
    with wakeups.watch("q") as watch:
        running = asyncio.create_task(_run_reaper(reaper, 1.0))
        await quiet(0.05)
        assert len(storage.expire_calls) == 1  # startup sweep
        armed = watch.arm()
        deadline = clock.now() + timedelta(milliseconds=300)
        reaper.note(deadline)
        await asyncio.sleep(0.29)
        assert len(storage.expire_calls) == 1, "swept before the deadline"
        await asyncio.sleep(0.01 + PROMPT)
        assert len(storage.expire_calls) == 2
        assert deadline <= storage.expire_calls[1] < deadline + timedelta(seconds=PROMPT)
        assert armed.is_set()
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


@on_virtual_time
async def test_reaper_coalesces_a_burst_of_deadlines() -> None:
    """Property: many distinct deadlines close together cost a few sweeps, not
    one write transaction each."""
    storage = _CountingStorage()
    clock = _loop_clock()
    reaper = LeaseReaper(storage, clock, QueueWakeups(), backstop=60, min_interval=0.05)
    running = asyncio.create_task(_run_reaper(reaper, 0.6))
    await quiet(0.02)
    start = clock.now()
    for i in range(200):
        reaper.note(start + timedelta(milliseconds=100 + i))  # 100..300 ms
    await running
    sweeps_for_burst = len(storage.expire_calls) - 1
    assert 1 <= sweeps_for_burst <= 8


@on_virtual_time
async def test_reaper_backstop_and_engine_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Property: with no deadline known the reaper still sweeps every
    `backstop` seconds (leases from a previous process), and an engine error
    is logged without ending the reaper."""
    storage = _CountingStorage()
    storage.failure = RuntimeError("engine hiccup")
    reaper = LeaseReaper(storage, _loop_clock(), QueueWakeups(), backstop=0.1)
    with caplog.at_level(logging.ERROR, logger="ringo_trio.server"):
        await _run_reaper(reaper, 0.55)
    assert 4 <= len(storage.expire_calls) <= 7
    assert any("expiring leases failed" in r.getMessage() for r in caplog.records)


async def test_a_sweep_that_fails_expired_nothing_and_wakes_no_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: a sweep whose storage call fails (an outage or a bug)
    reports 0 expired and neither wakes waiters nor tells the WaitTask
    recheck; an outage is one warning line, anything else a logged trace.
    A sweep that expired leases does both; a lease with no end is no
    deadline."""
    storage = _CountingStorage()
    wakeups = QueueWakeups()
    reaper = LeaseReaper(storage, ManualClock(NOW), wakeups)
    told: list[None] = []
    reaper.expired_listener = lambda: told.append(None)
    reaper.note(NOW)
    reaper.note(None)
    assert reaper._deadlines == [NOW]
    storage.expired = 3
    with wakeups.watch("q") as watch, caplog.at_level(logging.WARNING, "ringo_trio.server"):
        armed = watch.arm()
        storage.failure = RuntimeError("engine hiccup")
        assert await reaper.sweep() == 0
        storage.failure = StorageUnavailable("database restarting")
        assert await reaper.sweep() == 0
        assert not armed.is_set()
        assert told == []
        storage.failure = None
        assert await reaper.sweep() == 3
        assert armed.is_set()
        assert told == [None]
    levels = [(r.levelno, "database restarting" in r.getMessage()) for r in caplog.records]
    assert levels == [(logging.ERROR, False), (logging.WARNING, True)]


# -- claim batching ----------------------------------------------------------------


class _BigTaskStorage(_CountingStorage):
    """`available` tasks of one payload size: claim leases them in order
    (attempt 1), release hands them back."""

    def __init__(self, payload_bytes: int, available: int) -> None:
        super().__init__()
        self.payload = b"x" * payload_bytes
        self.available = available
        self.limits: list[int] = []
        self.leased: set[str] = set()
        self.released: list[str] = []
        self._next = 0

    async def claim(
        self,
        queue: str,
        task_types: Sequence[str],
        limit: int,
        worker_id: str,
        lease_duration: timedelta,
        now: datetime,
    ) -> list[LeasedTask]:
        self.limits.append(limit)
        n = min(limit, self.available)
        self.available -= n
        until = now + lease_duration
        ids = [str(self._next + i) for i in range(n)]
        self._next += n
        self.leased.update(ids)
        return [
            LeasedTask(
                task=Task(id=i, queue=queue, payload=self.payload),
                lease=Lease(task_id=i, attempt=1, lease_token="t", until=until),
            )
            for i in ids
        ]

    async def release(self, refs: Sequence[LeaseRef], now: datetime) -> int:
        for ref in refs:
            self.leased.remove(ref.task_id)
            self.released.append(ref.task_id)
        self.available += len(refs)
        return len(refs)


def _service(storage: Storage) -> QueueService:
    clock = ManualClock(NOW)
    wakeups = QueueWakeups()
    return QueueService(
        storage,
        clock=clock,
        sessions=SessionTable(timedelta(hours=1)),
        served_minor=versions.MINOR,
        wakeups=wakeups,
        reaper=LeaseReaper(storage, clock, wakeups),
    )


async def test_large_claim_never_holds_a_lease_it_does_not_answer() -> None:
    """Property: a Claim of 1000 worst-case (1 MiB) tasks answers within
    MAX_REPLY_BYTES, and every lease it took beyond that is released before
    it answers; a storage round leases at most CLAIM_ROUND tasks."""
    storage = _BigTaskStorage(limits.MAX_PAYLOAD_BYTES, available=1000)
    args = v.claim_args(ClaimRequest(queue="q", worker_id="w", limit=1000))
    leased = await _service(storage).claims.claim_now(args, NOW)
    assert len(encode(ClaimResponse(tasks=leased))) <= limits.MAX_REPLY_BYTES
    assert 0 < len(leased) < 1000
    assert storage.leased == {item.task.id for item in leased if item.task}
    assert max(storage.limits) <= CLAIM_ROUND


async def test_large_claim_of_small_tasks_gets_them_all() -> None:
    """Property: the bound does not cap a claim of small tasks: all 1000
    are leased, none released, and a short round ends the claim."""
    storage = _BigTaskStorage(100, available=1000)
    args = v.claim_args(ClaimRequest(queue="q", worker_id="w", limit=1000))
    leased = await _service(storage).claims.claim_now(args, NOW)
    assert len(leased) == 1000
    assert storage.released == []
    assert len(storage.limits) == -(-1000 // CLAIM_ROUND)
    storage.available = 5
    storage.limits.clear()
    assert len(await _service(storage).claims.claim_now(args, NOW)) == 5
    assert len(storage.limits) == 1


async def test_a_claim_that_fits_takes_one_round() -> None:
    """Property: a claim of up to CLAIM_ROUND small tasks is one storage
    round (what a manual ``claim(32)`` costs, as before the bound)."""
    storage = _BigTaskStorage(100, available=1000)
    args = v.claim_args(ClaimRequest(queue="q", worker_id="w", limit=32))
    assert len(await _service(storage).claims.claim_now(args, NOW)) == 32
    assert storage.limits == [32]
