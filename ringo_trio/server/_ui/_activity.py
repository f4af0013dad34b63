"""Per-queue throughput and failures of the last hour, for the sparklines.

`Activity` keeps, per queue, how many settlements succeeded (ack) and failed
(nack or reject) in each of the last `MINUTES` minutes: two rings of
`MINUTES` counters. It is in the daemon's memory only, so it covers what
*this* daemon saw since it started (on a shared PostgreSQL store, other
daemons' settlements are theirs). At most `limits.MAX_METRIC_QUEUES` queues
are tracked; later ones are not drawn.

`instrument_activity` feeds it by wrapping the storage instance's settling
methods, like the metrics do (`_metrics.instrument_storage`); the daemon
installs it only with ``--ui-listen``, so without the dashboard it costs
nothing. A group commit (`Storage.settle_many`) names leases, not queues:
the queue of each lease comes from the claim that handed it out, remembered
in a bounded map (`_MAX_LEASES` entries; an older lease's settlement is not
counted).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ringo_trio import _limits as limits
from ringo_trio._proto.ringo.v1 import LeasedTask

from ..storage._base import Ack, Settlement, Storage

__all__ = ["MINUTES", "Activity", "instrument_activity"]

log = logging.getLogger("ringo_trio.server.ui")

MINUTES = 60
_MAX_LEASES = 100_000


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
    leases: dict[str, str] = {}

    def claimed(batch: list[LeasedTask], queue: str, *_: Any) -> None:
        for leased in batch:
            if leased.task is not None:
                leases[leased.task.id] = queue
        while len(leases) > _MAX_LEASES:
            del leases[next(iter(leases))]

    def grouped(outcomes: list[Any], settlements: Sequence[Settlement], *_: Any) -> None:
        for item, outcome in zip(settlements, outcomes, strict=False):
            # Popped already when the engine settled through its own ack,
            # nack and reject (the one-by-one default): counted there.
            queue = leases.pop(item.ref.task_id, None)
            if outcome is None and queue is not None:
                activity.record(queue, succeeded=isinstance(item, Ack))

    hooks: dict[str, Callable[..., None]] = {
        "claim": claimed,
        "ack": lambda task, *_: activity.record(task.queue, succeeded=True),
        "nack": lambda task, *_: activity.record(task.queue, succeeded=False),
        "reject": lambda task, *_: activity.record(task.queue, succeeded=False),
        "settle_many": grouped,
    }
    for operation, hook in hooks.items():
        setattr(storage, operation, _after(getattr(storage, operation), hook, leases, operation))


def _after(
    method: Callable[..., Awaitable[Any]],
    hook: Callable[..., None],
    leases: dict[str, str],
    operation: str,
) -> Callable[..., Awaitable[Any]]:
    forget = operation in ("ack", "nack", "reject")

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        result = await method(*args, **kwargs)
        try:
            if forget:
                leases.pop(result.id, None)
            hook(result, *args)
        except Exception:
            # A miscount must never fail the call that was counted.
            log.exception("ui: recording %s failed", operation)
        return result

    return call
