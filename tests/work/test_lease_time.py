"""Lease time on the worker's side: durations, armed on the monotonic clock.

A pushed lease says how long it runs from the moment the daemon sent it
(``Lease.ttl``, minor >= 11; below, the registered lease duration counts);
the worker arms its deadline at receipt on its event loop's clock. Nothing
reads the wall clock for that, so a worker whose wall clock is minutes off
the daemon's — or drifting — arms exactly the deadlines of one whose clock
is right (docs/protocol.md, "Lease time").

The `StreamDriver` runs here with its real session, reader and timer under
trio's MockClock (virtual time, no socket), fed the frames a daemon would
push; the wall clock is shifted for the whole run (`skewed_wall`). The
manual-claim handle (`LeasedTask`) keeps its lease on the same clock. Real
processes under libfaketime: test_clock_skew.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio import TaskSpec
from ringo_trio._contract.work.client import LeaseKey, WorkSession
from ringo_trio._models import Task
from ringo_trio._proto.ringo.v1 import Lease, WorkRequest
from ringo_trio._proto.ringo.v1 import LeasedTask as WireLeasedTask
from ringo_trio._proto.ringo.v1 import Task as WireTask
from ringo_trio._queue import leased as _leased
from ringo_trio._queue import queue as _queue
from ringo_trio._wire.codec import decode
from ringo_trio._work import _driver
from ringo_trio._work._driver import Frame, StreamDriver
from ringo_trio._work._frames import PushedTask, WorkResultFrame
from ringo_trio.testing import RingoTestEnv

#: The daemon's wall clock at virtual time 0.
DAEMON_EPOCH = datetime(2030, 1, 1, tzinfo=UTC)
TEN_MINUTES = 600.0


@contextmanager
def skewed_wall(offset: float, drift: float) -> Iterator[None]:
    """Every wall clock the SDK could read — `datetime.now` as the driver
    and the queue module see it, `time.time` — runs `offset` seconds off
    the daemon's and gains `drift` seconds per second of virtual time."""

    def wall() -> datetime:
        try:
            now = trio.current_time()
        except RuntimeError:
            # Read outside the run (another thread: a log record's time).
            return datetime.now(UTC) + timedelta(seconds=offset)
        return DAEMON_EPOCH + timedelta(seconds=now + offset + drift * now)

    class SkewedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> SkewedDatetime:
            moment = wall()
            return moment if tz is not None else moment.replace(tzinfo=None)  # type: ignore[return-value]

    with pytest.MonkeyPatch.context() as patch:
        # raising=False: the driver and the queue no longer import datetime;
        # a change that read it again would read this one.
        patch.setattr(_driver, "datetime", SkewedDatetime, raising=False)
        patch.setattr(_queue, "datetime", SkewedDatetime, raising=False)
        patch.setattr(_leased, "datetime", SkewedDatetime)
        patch.setattr(time, "time", lambda: wall().timestamp())
        patch.setattr(time, "time_ns", lambda: int(wall().timestamp() * 1e9))
        yield


@dataclass(frozen=True)
class Push:
    """One push of the scenario: after `gap` seconds (0: in the same batch
    frame as the one before, when `batched`), a lease whose ttl is `ttl`
    (None: a daemon below minor 11, whose lease runs `daemon_lease`)."""

    gap: float
    ttl: float | None
    batched: bool


class Owner:
    """The worker side of the driver: records when handlers are cancelled."""

    def __init__(self, trace: list[tuple[float, str, str]]) -> None:
        self.trace = trace

    def start_handler(self, live: StreamDriver, key: LeaseKey, task: Task) -> None:
        self.trace.append((trio.current_time(), "start", key.task_id))

    def cancel_handler(self, key: LeaseKey, why: str) -> None:
        self.trace.append((trio.current_time(), "cancel", key.task_id))

    def task_cancelled(self, key: LeaseKey) -> None:  # pragma: no cover - never here
        raise AssertionError("no operator cancels here")

    def quiet(self) -> bool:
        return False

    def after_act(self) -> None:
        pass


def _pushed(index: int, push: Push, lease: float, daemon_lease: float) -> PushedTask:
    sent = DAEMON_EPOCH + timedelta(seconds=trio.current_time())
    runs = daemon_lease if push.ttl is None else push.ttl
    task_id = f"t{index}"
    return PushedTask(
        Task.from_wire(WireTask(id=task_id)),
        task_id,
        1,
        f"token{index}",
        "w",
        sent + timedelta(seconds=runs),
        push.ttl,
    )


async def _run(
    pushes: list[Push], lease: float, daemon_lease: float, minor: int
) -> list[tuple[float, str, str]]:
    """Drive one stream through `pushes` (no renewal is ever answered) until
    every lease has run out; what happened when (handlers started and
    cancelled, renewals sent), in order of time."""
    trace: list[tuple[float, str, str]] = []
    session = WorkSession(concurrency=len(pushes), minor=minor, command_timeout=1e9)
    out_send, out_receive = anyio.create_memory_object_stream[Frame](float("inf"))
    in_send, in_receive = anyio.create_memory_object_stream[Any](float("inf"))
    driver = StreamDriver(session, out_send, Owner(trace))
    session.register()
    driver.act(
        session.registered(
            lease_duration=lease,
            max_concurrency=len(pushes),
            ordered_request_ids=session.ordered_request_ids,
            now=trio.current_time(),
        )
    )

    async def renewals() -> None:
        async for frame in out_receive:
            request = decode(frame.data, WorkRequest)
            if request.extend_lease is not None:
                assert request.extend_lease.lease is not None
                trace.append((trio.current_time(), "renew", request.extend_lease.lease.task_id))

    async def daemon() -> None:
        # The credit the registration asked for (request 1), then the pushes.
        in_send.send_nowait(WorkResultFrame(1, "", "", "", None))
        index = 0
        while index < len(pushes):
            await trio.sleep(pushes[index].gap)
            frames = [_pushed(index, pushes[index], lease, daemon_lease)]
            index += 1
            while index < len(pushes) and pushes[index].batched and minor >= 10:
                frames.append(_pushed(index, pushes[index], lease, daemon_lease))
                index += 1
            in_send.send_nowait(frames[0] if len(frames) == 1 else frames)

    with trio.fail_after(10 * TEN_MINUTES), out_send, out_receive, in_send, in_receive:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver.read, in_receive)
            nursery.start_soon(driver.timer_loop)
            nursery.start_soon(renewals)
            nursery.start_soon(daemon)
            # Past the last deadline: every lease has run out.
            await trio.sleep(sum(p.gap for p in pushes) + 2 * max(lease, daemon_lease) + 1)
            nursery.cancel_scope.cancel()
    # Sorted: trio runs the tasks ready at one instant in no fixed order.
    return sorted(trace)


def run(
    pushes: list[Push],
    lease: float,
    daemon_lease: float,
    minor: int,
    skew: tuple[float, float] = (0.0, 0.0),
) -> list[tuple[float, str, str]]:
    with skewed_wall(*skew):
        return trio.run(
            _run,
            pushes,
            lease,
            daemon_lease,
            minor,
            clock=trio.testing.MockClock(autojump_threshold=0),
        )


def expected_deadlines(
    pushes: list[Push], lease: float, daemon_lease: float, minor: int
) -> dict[str, float]:
    """Receipt plus the ttl (the registered lease without one), at most the lease."""
    deadlines = {}
    now = 0.0
    for index, push in enumerate(pushes):
        if index == 0 or not (push.batched and minor >= 10):
            now += push.gap
        runs = lease if push.ttl is None else push.ttl
        deadlines[f"t{index}"] = now + min(max(runs, 0.0), lease)
    return deadlines


LEASES = st.floats(1.0, 120.0)
PUSHES = st.lists(
    st.builds(
        Push,
        gap=st.floats(0.0, 30.0),
        ttl=st.none() | st.floats(-5.0, 250.0),
        batched=st.booleans(),
    ),
    min_size=1,
    max_size=6,
)
SKEWS = st.tuples(
    st.floats(-TEN_MINUTES, TEN_MINUTES),
    # Drift up to 1 %, either way: far past any real clock's.
    st.floats(-0.01, 0.01),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pushes=PUSHES,
    lease=LEASES,
    daemon_lease=LEASES,
    minor=st.sampled_from([10, 11]),
    skew=SKEWS,
)
def test_a_skewed_wall_clock_arms_the_same_deadlines(
    pushes: list[Push],
    lease: float,
    daemon_lease: float,
    minor: int,
    skew: tuple[float, float],
) -> None:
    """Property (lease time is relative): whatever the worker's wall clock
    says — off by up to ±10 minutes and drifting — its driver starts,
    renews and gives up every pushed lease at exactly the moments of a
    worker whose clock is right, and gives each up at its receipt plus its
    ttl (a daemon below minor 11: plus the registered lease duration),
    never more than the lease duration."""
    if minor < 11:
        pushes = [Push(p.gap, None, p.batched) for p in pushes]
    right = run(pushes, lease, daemon_lease, minor)
    skewed = run(pushes, lease, daemon_lease, minor, skew)
    assert skewed == right
    cancelled = {task_id: when for when, kind, task_id in right if kind == "cancel"}
    assert cancelled == expected_deadlines(pushes, lease, daemon_lease, minor)


def test_a_clock_ten_minutes_ahead_keeps_a_six_second_lease() -> None:
    """Example (the issue's numbers): a worker 600 s ahead, a 6 s lease with
    its full ttl; the renewal goes out at 4 s, the deadline is at 6 s."""
    pushes = [Push(0.0, 6.0, False)]
    trace = run(pushes, 6.0, 6.0, 11, (TEN_MINUTES, 0.0))
    assert [(round(when, 9), kind) for when, kind, _ in trace] == [
        (0.0, "start"),
        (4.0, "renew"),
        (6.0, "cancel"),
    ]


# -- manual claims ----------------------------------------------------------------


def _wire_leased(ttl: timedelta | None) -> WireLeasedTask:
    lease = Lease(task_id="t", attempt=1, lease_token="k", worker_id="w", until=DAEMON_EPOCH)
    lease.ttl = ttl
    return WireLeasedTask(task=WireTask(id="t"), lease=lease)


@pytest.mark.parametrize(
    ("ttl", "asked", "runs"),
    [
        (timedelta(seconds=12.5), None, 12.5),
        (timedelta(seconds=12.5), timedelta(seconds=30), 12.5),
        (None, timedelta(seconds=30), 30.0),
        (None, None, None),
    ],
    ids=["ttl", "ttl-over-asked", "below-minor-11", "unknown"],
)
def test_a_claimed_lease_runs_its_ttl_from_the_reply(
    ttl: timedelta | None, asked: timedelta | None, runs: float | None
) -> None:
    """Property: a claimed lease's deadline is the reply's arrival plus its
    ttl, or plus the duration the claim asked for from a daemon below minor
    11, or unknown; ``until`` is kept for display only."""
    with skewed_wall(-TEN_MINUTES, 0.0):
        leased = _leased.LeasedTask(
            None,  # type: ignore[arg-type]
            _wire_leased(ttl),
            received=1000.0,
            lease_duration=asked,
        )
    assert leased.lease_deadline == (None if runs is None else 1000.0 + runs)
    assert leased.lease_until == DAEMON_EPOCH


@pytest.mark.trio
@pytest.mark.parametrize("offset", [-TEN_MINUTES, 0.0, TEN_MINUTES])
async def test_manual_leases_keep_time_on_the_monotonic_clock(
    autojump_clock: trio.testing.MockClock, offset: float
) -> None:
    """Property: through a daemon (in process, virtual time), a claimed
    lease ends its ttl after the claim's reply arrived — the lease duration
    asked for — and `extend_lease` moves it to its send time plus the
    extension; a wall clock ten minutes off changes neither."""
    with trio.fail_after(60), skewed_wall(offset, 0.0):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("manual")
            await queue.enqueue_many([TaskSpec("t")])
            [leased] = await queue.claim(lease_duration=timedelta(seconds=30))
            arrived = trio.current_time()
            assert leased.lease_deadline == pytest.approx(arrived + 30, abs=1e-6)
            await trio.sleep(20)
            sent = trio.current_time()
            await leased.extend_lease(timedelta(seconds=40))
            assert leased.lease_deadline == pytest.approx(sent + 40, abs=1e-6)
            await leased.ack()
