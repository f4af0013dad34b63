"""The daemon's one source of time.

Every time-dependent decision in the daemon (lease deadlines, backoff,
long-poll waits, session expiry) reads `Clock.now()`; nothing calls
`time.time()` directly, so a test harness can run the daemon in-process on a
`ManualClock` and skip time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    """Wall-clock UTC time."""

    def now(self) -> datetime:
        return datetime.now(UTC)


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
