"""Per-queue throughput and failures of the last hour, for the sparklines.

`Activity` keeps, per queue, how many settlements succeeded (ack) and failed
(nack or reject) in each of the last `MINUTES` minutes: two rings of
`MINUTES` counters. It is in the daemon's memory only, so it covers what
*this* daemon saw since it started (on a shared PostgreSQL store, other
daemons' settlements are theirs). At most `limits.MAX_METRIC_QUEUES` queues
are tracked; later ones are not drawn.

`instrument_activity` feeds it by wrapping the storage instance's settling
methods, like the metrics do (`http.metrics.instrument_storage`); the daemon
installs it only with ``--ui-listen``, so without the dashboard it costs
nothing. A group commit (`Storage.settle_many`) answers each settled task's
queue, which is what is counted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ringo_trio._contract import limits

from ...storage.base import Ack, Settlement, Storage
from ..metrics import watch_results

__all__ = ["MINUTES", "Activity", "instrument_activity"]

MINUTES = 60


class _Series:
    __slots__ = ("failed", "minute", "succeeded")

    def __init__(self, minute: int) -> None:
        self.minute = minute
        self.succeeded = [0] * MINUTES
        self.failed = [0] * MINUTES

    def advance(self, minute: int) -> None:
        """Zero the buckets of the minutes that passed since the last one."""
        gap = minute - self.minute
        if gap <= 0:
            return
        for step in range(1, min(gap, MINUTES) + 1):
            slot = (self.minute + step) % MINUTES
            self.succeeded[slot] = 0
            self.failed[slot] = 0
        self.minute = minute


class Activity:
    def __init__(self, max_queues: int = limits.MAX_METRIC_QUEUES) -> None:
        self._max_queues = max_queues
        self._queues: dict[str, _Series] = {}

    def record(self, queue: str, *, succeeded: bool, now: float | None = None) -> None:
        minute = int((time.time() if now is None else now) // 60)
        series = self._queues.get(queue)
        if series is None:
            if len(self._queues) >= self._max_queues:
                return
            series = self._queues[queue] = _Series(minute)
        series.advance(minute)
        if minute < series.minute - MINUTES + 1:
            return
        slot = minute % MINUTES
        if succeeded:
            series.succeeded[slot] += 1
        else:
            series.failed[slot] += 1

    def series(self, queue: str, now: float | None = None) -> tuple[list[int], list[int]]:
        """(succeeded, failed) per minute, oldest first, the current minute last."""
        minute = int((time.time() if now is None else now) // 60)
        series = self._queues.get(queue)
        if series is None:
            return [0] * MINUTES, [0] * MINUTES
        series.advance(minute)
        slots = [(minute - back) % MINUTES for back in range(MINUTES - 1, -1, -1)]
        return [series.succeeded[s] for s in slots], [series.failed[s] for s in slots]


def instrument_activity(storage: Storage, activity: Activity) -> None:
    """Wrap `storage`'s settling methods (on the instance) to feed `activity`."""

    def grouped(answers: list[Any], settlements: Sequence[Settlement], *_: Any) -> None:
        # A settled item's answer is its task's queue; a lost one counts nothing.
        for item, answer in zip(settlements, answers, strict=False):
            if isinstance(answer, str):
                activity.record(answer, succeeded=isinstance(item, Ack))

    watch_results(
        storage,
        {
            "ack": lambda task, *_: activity.record(task.queue, succeeded=True),
            "nack": lambda task, *_: activity.record(task.queue, succeeded=False),
            "reject": lambda task, *_: activity.record(task.queue, succeeded=False),
            "settle_many": grouped,
        },
        "ui",
    )
