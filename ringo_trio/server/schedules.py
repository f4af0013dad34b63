"""The daemon's schedule loop: due schedules become tasks, each tick once.

Theory of operation
-------------------
`ScheduleLoop.run` lives in the daemon's task group for its whole life (as
retention does). Each round reads the daemon's `Clock` once and asks storage
to fire what is due (`Storage.fire_schedules`: the exactly-once part is
there, in one transaction per round; storage/schedules.py), then wakes the
queues that got tasks, as an enqueue does, and sleeps until the earliest
``next_fire_at`` left. A put or a resume on this daemon `poke`s it awake at
once. On a store other daemons share (PostgreSQL), a schedule put on
another daemon is found by looking: the sleep is then at most
`limits.MAX_SCHEDULE_SLEEP`. A round that fails (database away, disk full)
is logged and tried again after `_RETRY` seconds; nothing here ends the
daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ringo_trio._contract import limits

from .clock import Clock
from .storage.base import Storage
from .storage.schedules import FiringReport

__all__ = ["ScheduleLoop"]

log = logging.getLogger("ringo_trio.server")

_BATCH = 100
_RETRY = 1.0
# Past the due moment, so the round does not find the tick a hair early.
_SLACK = 0.001


class ScheduleLoop:
    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        notify: Callable[[str], None],
        *,
        max_sleep: float | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._notify = notify
        if max_sleep is None and storage.shared_store:
            max_sleep = limits.MAX_SCHEDULE_SLEEP
        self._max_sleep = max_sleep
        self._poked = asyncio.Event()
        # Told of every round's report (metrics).
        self.fired_listener: Callable[[FiringReport], None] | None = None

    def poke(self) -> None:
        """A schedule changed here: look again now."""
        self._poked.set()

    async def fire_due(self) -> FiringReport:
        """One round: fire what is due now (in batches), wake the queues."""
        while True:
            report = await self._storage.fire_schedules(self._clock.now(), _BATCH)
            for queue in {task.queue for task in report.created}:
                self._notify(queue)
            if self.fired_listener is not None:
                self.fired_listener(report)
            if not report.more:
                return report
            # Between batches, the other calls waiting on the loop.
            await asyncio.sleep(0)

    async def run(self) -> None:
        while True:
            self._poked.clear()
            try:
                report = await self.fire_due()
            except Exception:
                log.exception("firing schedules failed; trying again in %.0fs", _RETRY)
                sleep: float | None = _RETRY
            else:
                sleep = None
                if report.next_due is not None:
                    sleep = max((report.next_due - self._clock.now()).total_seconds(), 0.0)
                    sleep += _SLACK
            if self._max_sleep is not None:
                sleep = self._max_sleep if sleep is None else min(sleep, self._max_sleep)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep):
                    await self._poked.wait()
