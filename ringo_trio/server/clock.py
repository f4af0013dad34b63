"""The daemon's one source of time.

Every time-dependent decision in the daemon (lease deadlines, backoff,
long-poll waits, session expiry) reads `Clock.now()`; nothing calls
`time.time()` directly, so a test harness can run the daemon in-process on a
`ManualClock` and skip time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta


class Clock:
    """Wall-clock UTC time."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class LoopClock(Clock):
    """UTC time that moves with an event loop's clock (``loop.time``), from ``start``.

    The testing kit's in-process daemon reads this: when the loop's clock is
    virtual (trio's ``MockClock`` under trio-asyncio, a fast-forwarded asyncio
    loop), lease expiry, retry delays and session TTLs skip with it, in step
    with the daemon's own timers, which wait on the same loop.
    """

    def __init__(self, time: Callable[[], float], start: datetime | None = None) -> None:
        self._time = time
        self._origin = time()
        self._start = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._time() - self._origin)


class ManualClock(Clock):
    """A clock that only moves when told to (tests)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise ValueError("a clock never runs backwards")
        self._now += delta
