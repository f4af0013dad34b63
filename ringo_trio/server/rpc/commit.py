"""Group commit across Work streams: many callers' settlements, one transaction.

Theory of operation
-------------------
Every Work stream that settles leases calls `GroupCommit.settle` with its
batch. The batch joins a queue and the committer's one task (`run`, started
by the daemon in a TaskGroup it owns) takes EVERYTHING queued into one
`Storage.settle_many` call, so the storage pays one transaction (one
`BEGIN IMMEDIATE … COMMIT` on SQLite, one statement on PostgreSQL) per flush
instead of one per batch. Callers that arrive while a flush runs are queued
for the next one, which starts as soon as the running one ends: no timer,
no deliberate wait. Under light load a flush holds one caller's batch;
under heavy load the groups grow by themselves (the flush takes longer,
more callers queue), which is where the commits cost most.

Each caller's batch stays whole in one flush (one transaction), in the order
callers arrived; a flush takes whole batches up to `max_items` settlements
(a batch larger than that goes alone), so a flush holds SQLite's loop for a
bounded time. A caller's answer is exactly what `settle_many` would have
answered for its batch alone: answers are per item and a lost lease never
stops the others. A flush that fails (`StorageUnavailable`, `StorageFull`)
rolled the whole group back, so every caller in it gets (a copy of) that
error and none of their items happened.

`now`: one per flush, the latest of its callers' `now`s (each is the daemon
clock when its request arrived, all of them at or before the flush).

Cancellation (documented promise): a caller cancelled while its batch is
still queued withdraws it — none of its items will be applied; a caller
cancelled after its batch went into a flush cannot stop it — the items are
applied exactly once, only the answer is dropped (the flush belongs to the
committer's task, never to a caller's). Either way no item is lost halfway
or applied twice. When `run` ends (daemon shutdown), queued and in-flight
callers get `StorageUnavailable`: the in-flight flush's outcome is then
unknown, as with any storage call cut by a lost connection.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from ..storage.base import LeaseLost, Settlement, Storage, StorageUnavailable

__all__ = ["DEFAULT_MAX_ITEMS", "GroupCommit"]

# One flush's settlements at most: ~20 µs of SQLite each in a group
# (bench/settle.py), so a full flush holds the daemon's loop ~5 ms; groups
# of 64 already take most of what grouping saves.
DEFAULT_MAX_ITEMS = 256


@dataclass(eq=False)
class _Batch:
    items: Sequence[Settlement]
    now: datetime
    answer: asyncio.Future[list[str | LeaseLost]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommit:
    """Merges concurrent callers' settlements into shared transactions."""

    def __init__(self, storage: Storage, *, max_items: int = DEFAULT_MAX_ITEMS) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        self._storage = storage
        self._max_items = max_items
        self._queue: collections.deque[_Batch] = collections.deque()
        self._wake = asyncio.Event()
        self._stopped = False
        self.flushes = 0
        """How many `settle_many` calls ran (the transactions spent)."""

    async def settle(self, items: Sequence[Settlement], now: datetime) -> list[str | LeaseLost]:
        """`Storage.settle_many(items, now)`, committed together with the
        other callers queued at the same time (see the module docstring for
        what cancellation does)."""
        if not items:
            return []
        if self._stopped:
            raise StorageUnavailable("the daemon is stopping: settlements are no longer committed")
        batch = _Batch(items, now)
        self._queue.append(batch)
        self._wake.set()
        try:
            # Shielded: cancelling this caller must not cancel the future the
            # committer resolves (it checks `done()` anyway).
            return await asyncio.shield(batch.answer)
        except asyncio.CancelledError:
            # Still queued: withdrawn, never applied. Taken already: the
            # flush applies it; the answer is dropped.
            if batch in self._queue:
                self._queue.remove(batch)
            if not batch.answer.cancel() and not batch.answer.cancelled():
                # Answered just before the cancellation landed: retrieve it,
                # or asyncio logs an error it thinks nobody saw.
                batch.answer.exception()
            raise

    async def run(self) -> None:
        """Flush until cancelled; run once, in a TaskGroup the daemon owns."""
        flight: list[_Batch] = []
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    flight = self._take()
                    await self._flush(flight)
                    flight = []
        finally:
            self._stopped = True
            gone = StorageUnavailable("the daemon stopped before these settlements committed")
            for batch in (*flight, *self._queue):
                _resolve(batch, error=gone)
            self._queue.clear()

    def _take(self) -> list[_Batch]:
        """Whole batches from the front of the queue, up to max_items
        settlements (at least one batch)."""
        taken = [self._queue.popleft()]
        size = len(taken[0].items)
        while self._queue and size + len(self._queue[0].items) <= self._max_items:
            size += len(self._queue[0].items)
            taken.append(self._queue.popleft())
        return taken

    async def _flush(self, flight: list[_Batch]) -> None:
        items = [item for batch in flight for item in batch.items]
        now = max(batch.now for batch in flight)
        self.flushes += 1
        try:
            answers = await self._storage.settle_many(items, now)
        except Exception as exc:
            for batch in flight:
                _resolve(batch, error=exc)
            return
        start = 0
        for batch in flight:
            end = start + len(batch.items)
            _resolve(batch, answers=answers[start:end])
            start = end


def _resolve(
    batch: _Batch,
    *,
    answers: list[str | LeaseLost] | None = None,
    error: Exception | None = None,
) -> None:
    """Answer `batch`'s caller, unless it went away (cancelled) meanwhile."""
    if batch.answer.done():
        return
    if error is None:
        assert answers is not None
        batch.answer.set_result(answers)
        return
    # A copy per caller: one exception object raised in several tasks would
    # collect all their tracebacks.
    mine = copy.copy(error)
    mine.__cause__ = error
    batch.answer.set_exception(mine)
