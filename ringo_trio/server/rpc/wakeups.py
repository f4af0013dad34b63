"""Wake-ups for long-poll claims and the lease reaper.

`QueueWakeups` is the edge-triggered signal "something in this queue may
have become claimable" (an enqueue, a nack, a retry, an expired lease). A
waiter *arms* the queue's current event before it tries to claim and waits
on that same event afterwards; `notify` sets the event and installs a fresh
one. A notification that lands between the claim attempt and the wait has
therefore already set the armed event, so no wake-up is ever lost and no
polling interval is needed.

Scheduled work (a delayed task, a backoff, a lease expiring) produces no
notification at all; waiters cover it by also sleeping until
`Storage.next_wakeup`. The `LeaseReaper` covers it for everyone else: it
expires leases at the earliest deadline it has been told about (every lease
the daemon hands out is noted), plus a periodic backstop sweep for leases it
cannot know about (granted by a previous daemon process on the same data, or
by another daemon on a shared PostgreSQL database).

Work made claimable by *another* daemon on a shared database reaches
`notify` through the daemon's storage watch (see `daemon`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from ..clock import Clock
from ..storage.base import Storage, StorageUnavailable

__all__ = [
    "INCONSISTENT_WAKEUP_RETRY",
    "SCHEDULE_SLACK",
    "LeaseReaper",
    "QueueWakeups",
    "Watch",
    "until_due",
]

log = logging.getLogger("ringo_trio.server")

# Sleep a little past a scheduled moment, so the claim that follows does not
# find its task a microsecond early.
SCHEDULE_SLACK = 0.002
# Storage called a moment due yet the claim found nothing: back off this long
# instead of spinning on it.
INCONSISTENT_WAKEUP_RETRY = 0.05


def until_due(wake_at: datetime, claimed_at: datetime, now: datetime) -> float:
    """Seconds a claimer whose claim at `claimed_at` found nothing sleeps
    (unless woken) for `wake_at`, the queue's next scheduled moment
    (`Storage.next_wakeup`); `now` is read after that lookup. The long-poll
    Claim and the Work stream's dispatcher both wait this way."""
    if wake_at <= claimed_at:
        return INCONSISTENT_WAKEUP_RETRY
    return max((wake_at - now).total_seconds(), 0.0) + SCHEDULE_SLACK


class _Slot:
    __slots__ = ("event", "watchers")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.watchers = 0


class Watch:
    """A waiter's handle on one queue's wake-ups (see `QueueWakeups.watch`)."""

    __slots__ = ("_owner", "_slot")

    def __init__(self, owner: QueueWakeups, slot: _Slot) -> None:
        self._owner = owner
        self._slot = slot

    def arm(self) -> asyncio.Event:
        """The event the next notification will set. Call before checking."""
        return self._slot.event

    @property
    def closed(self) -> bool:
        return self._owner.closed

    async def wait(self, armed: asyncio.Event, seconds: float) -> None:
        """Until `armed` is set or `seconds` pass (whichever first)."""
        if armed.is_set() or seconds <= 0:
            return
        try:
            async with asyncio.timeout(seconds):
                await armed.wait()
        except TimeoutError:
            pass


class QueueWakeups:
    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self.closed = False

    @contextmanager
    def watch(self, queue: str) -> Iterator[Watch]:
        slot = self._slots.get(queue)
        if slot is None:
            slot = self._slots[queue] = _Slot()
        slot.watchers += 1
        try:
            yield Watch(self, slot)
        finally:
            slot.watchers -= 1
            if slot.watchers == 0:
                # Only watched queues keep a slot: memory follows waiters, not
                # the number of queue names ever seen.
                del self._slots[queue]

    def notify(self, queue: str) -> None:
        slot = self._slots.get(queue)
        if slot is not None:
            self._fire(slot)

    def notify_all(self) -> None:
        for slot in list(self._slots.values()):
            self._fire(slot)

    def close(self) -> None:
        """Shutdown: wake every waiter; they see `closed` and return."""
        self.closed = True
        self.notify_all()

    @staticmethod
    def _fire(slot: _Slot) -> None:
        event, slot.event = slot.event, asyncio.Event()
        event.set()

    def watched_queues(self) -> int:
        return len(self._slots)


class LeaseReaper:
    """Expires leases at their deadline and wakes long-poll waiters.

    `run` lives for the server's lifetime inside the daemon's task group and
    is cancelled on shutdown; an engine error is logged and retried on the
    next deadline, never allowed to end the loop.
    """

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        wakeups: QueueWakeups,
        *,
        backstop: float = 5.0,
        min_interval: float = 0.05,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._wakeups = wakeups
        self._backstop = backstop
        # Under churn (thousands of leases a second, most acked long before
        # their deadline) sweeping once per distinct deadline would be a write
        # transaction per lease; coalescing keeps it to a few per second at the
        # cost of expiring up to `min_interval` late.
        self._min_interval = min_interval
        self._deadlines: list[datetime] = []
        self._last_noted: datetime | None = None
        self._changed = asyncio.Event()
        # Told after a sweep expired leases (some may have gone DEAD): the
        # daemon rechecks its WaitTask callers' tasks.
        self.expired_listener: Callable[[], None] | None = None

    def note(self, until: datetime | None) -> None:
        """A lease now ends at `until`; make sure a sweep happens then."""
        if until is None or until == self._last_noted:
            return
        self._last_noted = until
        earliest = self._deadlines[0] if self._deadlines else None
        heapq.heappush(self._deadlines, until)
        if earliest is None or until < earliest:
            self._changed.set()

    async def sweep(self) -> int:
        now = self._clock.now()
        while self._deadlines and self._deadlines[0] <= now:
            heapq.heappop(self._deadlines)
        try:
            expired = await self._storage.expire_leases(now)
        except StorageUnavailable as exc:
            # An outage is not a bug: one line, and the next sweep retries.
            log.warning("expiring leases failed (%s); retrying at the next deadline", exc)
            return 0
        except Exception:
            log.exception("expiring leases failed; retrying at the next deadline")
            return 0
        if expired:
            log.debug("expired %d lease(s)", expired)
            self._wakeups.notify_all()
            if self.expired_listener is not None:
                self.expired_listener()
        return expired

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_backstop = loop.time()
        not_before = loop.time()
        while True:
            now = self._clock.now()
            due = bool(self._deadlines) and self._deadlines[0] <= now
            if due or loop.time() >= next_backstop:
                await self.sweep()
                next_backstop = loop.time() + self._backstop
                not_before = loop.time() + self._min_interval
            delay = next_backstop - loop.time()
            if self._deadlines:
                until_deadline = (self._deadlines[0] - self._clock.now()).total_seconds()
                delay = min(delay, until_deadline)
            delay = max(delay, not_before - loop.time(), 0.0)
            self._changed.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._changed.wait()
            except TimeoutError:
                pass
