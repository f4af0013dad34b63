"""A shared daemon's members (`server.rpc.members.Members`) on virtual time.

`Members.serve_call` is driven with a stand-in for grpclib's stream (one
request in, messages out), and its timers run on trio's MockClock
(`on_virtual_time`), so each test asserts the virtual instant the daemon
decides to stop. `tests/server/test_shared.py` runs the same rules end to
end, with SDK processes attaching to a real shared ``ringod``.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._proto.ringo.v1 import AttachLocalRequest, AttachLocalResponse
from ringo_trio.server.rpc.members import Members
from tests._kit.virtual_daemon import now, on_virtual_time, quiet


class _Stream:
    """What `serve_call` uses of grpclib's server stream."""

    def __init__(self, request: AttachLocalRequest | None) -> None:
        self.request = request
        self.sent: list[AttachLocalResponse] = []

    async def recv_message(self) -> AttachLocalRequest | None:
        return self.request

    async def send_message(self, message: AttachLocalResponse) -> None:
        self.sent.append(message)


class _Idle:
    """`on_idle`: the virtual instants and reasons it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []

    def __call__(self, reason: str) -> None:
        self.calls.append((now(), reason))


async def _member(members: Members, generation: str = "g1") -> asyncio.Task[None]:
    """A member attached (its call running until it ends or is cancelled)."""
    stream = _Stream(AttachLocalRequest(generation=generation))
    call = asyncio.create_task(members.serve_call(stream))
    await quiet(0)
    assert stream.sent == [AttachLocalResponse(generation=generation)]
    return call


async def _leave(call: asyncio.Task[None]) -> None:
    """The member ends its call (cancel / RST_STREAM / its process died)."""
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def _refusal(members: Members, request: AttachLocalRequest | None) -> GRPCError:
    with pytest.raises(GRPCError) as refused:
        await members.serve_call(_Stream(request))
    return refused.value


# -- arguments -----------------------------------------------------------------------


def test_the_documented_defaults_and_argument_edges_hold() -> None:
    """Property: the defaults docs/daemon.md states (`--linger` 2 s,
    `--attach-timeout` 15 s); a generation of 1 to 200 characters; a linger
    of 0 or more; an attach timeout above 0. Anything else is a ValueError
    naming the argument."""
    members = Members("g")
    assert (members.linger, members.attach_timeout) == (2.0, 15.0)
    assert Members("x" * 200).generation == "x" * 200
    assert Members(None).shared is False
    assert Members("g", linger=0).linger == 0
    assert Members("g", attach_timeout=0.001).attach_timeout == 0.001
    for bad_generation in ("", "x" * 201):
        with pytest.raises(ValueError, match="generation"):
            Members(bad_generation)
    for bad_linger in (-0.001, math.nan):
        with pytest.raises(ValueError, match="linger"):
            Members("g", linger=bad_linger)
    for bad_timeout in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="attach_timeout"):
            Members("g", attach_timeout=bad_timeout)


# -- attach and detach -----------------------------------------------------------------


@on_virtual_time
async def test_refused_calls_are_never_counted() -> None:
    """Property: a call without its request is INVALID_ARGUMENT; any
    AttachLocal on a daemon that is not shared, or naming another
    generation, is FAILED_PRECONDITION (naming both generations); on a
    daemon that is closing, UNAVAILABLE. None of them counts as a member."""
    members = Members("g1")
    assert (await _refusal(members, None)).status is Status.INVALID_ARGUMENT
    not_shared = await _refusal(Members(None), AttachLocalRequest(generation="g1"))
    assert not_shared.status is Status.FAILED_PRECONDITION
    assert not_shared.message == "not a shared daemon"
    mismatch = await _refusal(members, AttachLocalRequest(generation="g0"))
    assert mismatch.status is Status.FAILED_PRECONDITION
    assert "'g1'" in (mismatch.message or "")
    assert "'g0'" in (mismatch.message or "")
    members.close()
    closing = await _refusal(members, AttachLocalRequest(generation="g1"))
    assert closing.status is Status.UNAVAILABLE
    assert members.count == 0


@on_virtual_time
async def test_every_attach_meets_exactly_one_detach() -> None:
    """Property: a member counts from its answer until its call ends, by
    its own cancel or by `close`, which ends every member's call
    UNAVAILABLE; the count never goes below zero or stays above it."""
    members = Members("g1")
    first, second = await _member(members), await _member(members)
    assert members.count == 2
    await _leave(first)
    assert members.count == 1
    members.close()
    with pytest.raises(GRPCError) as ended:
        await second
    assert ended.value.status is Status.UNAVAILABLE
    assert members.count == 0


# -- stopping by itself ----------------------------------------------------------------


@on_virtual_time
async def test_a_daemon_nobody_attaches_to_stops_at_its_attach_timeout() -> None:
    """Property: armed with no member, the daemon stops exactly
    `attach_timeout` seconds later, once, saying why; from then on it is
    closing and refuses newcomers."""
    members = Members("g1", attach_timeout=15.0)
    idle = _Idle()
    armed = now()
    members.arm(idle)
    await quiet(14.9)
    assert idle.calls == []
    await quiet(60)
    assert idle.calls == [(armed + 15.0, "no member attached within 15s (--attach-timeout)")]
    assert members.closing
    refused = await _refusal(members, AttachLocalRequest(generation="g1"))
    assert refused.status is Status.UNAVAILABLE


@on_virtual_time
async def test_the_daemon_stops_linger_seconds_after_its_last_member_left() -> None:
    """Property: an attach cancels the attach timeout; the daemon stops
    exactly `linger` seconds after the count last dropped to 0, and a member
    attaching within the linger cancels it (the daemon keeps serving)."""
    members = Members("g1", linger=2.0, attach_timeout=15.0)
    idle = _Idle()
    members.arm(idle)
    await quiet(10)
    member = await _member(members)
    await quiet(20)  # past the attach timeout: cancelled by the attach
    assert idle.calls == []
    await _leave(member)
    await quiet(1.5)
    returning = await _member(members)  # within the linger
    await quiet(10)
    assert idle.calls == []
    await _leave(returning)
    left = now()
    await quiet(10)
    assert idle.calls == [(left + 2.0, "no member for 2s (--linger)")]
    assert members.closing


@on_virtual_time
async def test_arming_after_members_came_and_went_starts_the_linger() -> None:
    """Property: a daemon armed when members have already attached and
    left (they came before it announced itself) waits `linger`, not the
    attach timeout; armed with a member attached it waits for nothing."""
    members = Members("g1", linger=2.0, attach_timeout=15.0)
    await _leave(await _member(members))
    idle = _Idle()
    armed = now()
    members.arm(idle)
    await quiet(30)
    assert idle.calls == [(armed + 2.0, "no member for 2s (--linger)")]

    busy = Members("g1", linger=2.0, attach_timeout=15.0)
    member = await _member(busy)
    busy_idle = _Idle()
    busy.arm(busy_idle)
    await quiet(30)
    assert busy_idle.calls == []
    assert not busy.closing
    busy.close()
    with pytest.raises(GRPCError):
        await member


@on_virtual_time
async def test_a_daemon_that_is_not_shared_or_already_closing_never_stops_by_itself() -> None:
    """Property: arming a daemon that is not shared, or one already
    closing, starts no timer: `on_idle` never runs."""
    for members in (Members(None), Members("g1")):
        if members.shared:
            members.close()
        idle = _Idle()
        members.arm(idle)
        await quiet(60)
        assert idle.calls == []
