"""The lease operations: one implementation for both paths that settle leases.

Ack, nack, reject, extend and progress arrive as unary RPCs
(`QueueService`) and as Work-stream commands (`work`); both run them here,
so both validate, store and wake up alike and only the error channel differs
(a status, or an ``ErrorDetail``). The caller has admitted the call's context
(a Work stream once, at registration) and maps the failures.

What a settlement wakes: a nack makes its task claimable again, so its
queue's claimers are woken; on a queue with limit rules any lease that ends
may free its key's concurrency, so they are woken too (the engine's
concurrency recheck stays as the backstop for leases that end on another
daemon). Every settled task is named to `TaskWaits.settled` after the commit,
for the WaitTask calls parked on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ExtendLeaseRequest,
    Lease,
    NackRequest,
    RejectRequest,
    ReportProgressRequest,
)

from ..storage.base import LeaseLost, Nack, Settlement, Storage
from . import validate as v
from .commit import GroupCommit
from .waits import TaskWaits
from .wakeups import LeaseReaper, QueueWakeups

__all__ = ["LeaseOperations"]


class LeaseOperations:
    """Field validation, storage and wake-ups of each lease operation."""

    def __init__(
        self,
        storage: Storage,
        wakeups: QueueWakeups,
        reaper: LeaseReaper,
        waits: TaskWaits,
        commit: GroupCommit | None,
    ) -> None:
        self._storage = storage
        self._wakeups = wakeups
        self._reaper = reaper
        self._waits = waits
        # The daemon's committer groups settlements across Work streams;
        # without one (in-process tests), each stream's group is its own
        # transaction.
        self._commit = commit

    async def ack(self, message: AckRequest, now: datetime) -> None:
        """The caller has checked that its minor allows a result."""
        ack = v.ack_settlement(message)
        task = await self._storage.ack(ack.ref, now, ack.result)
        self._freed(task.queue, task.limit_key)
        self._waits.settled((ack.ref.task_id,))

    async def nack(self, message: NackRequest, now: datetime) -> None:
        nack = v.nack_settlement(message)
        task = await self._storage.nack(nack.ref, nack.error, nack.retry_delay, now)
        self._wakeups.notify(task.queue)
        # DEAD when that was the last attempt; a waiter reads which.
        self._waits.settled((task.id,))

    async def reject(self, message: RejectRequest, now: datetime) -> None:
        reject = v.reject_settlement(message)
        task = await self._storage.reject(reject.ref, reject.error, now)
        self._freed(task.queue, task.limit_key)
        self._waits.settled((reject.ref.task_id,))

    def _freed(self, queue: str, limit_key: str | None) -> None:
        """A lease of `queue` ended without making its task claimable."""
        if limit_key and self._storage.limited(queue):
            self._wakeups.notify(queue)

    async def settle(
        self, settlements: Sequence[Settlement], now: datetime
    ) -> list[str | LeaseLost]:
        """A Work stream's acks, nacks and rejects, in order, committed
        together (with other streams' through the daemon's `GroupCommit`;
        `Storage.settle_many` has the contract)."""
        if self._commit is not None:
            answers = await self._commit.settle(settlements, now)
        else:
            answers = await self._storage.settle_many(settlements, now)
        woken = {
            answer
            for item, answer in zip(settlements, answers, strict=True)
            if isinstance(answer, str) and (type(item) is Nack or self._storage.limited(answer))
        }
        for queue in woken:
            self._wakeups.notify(queue)
        if self._waits.parked:
            self._waits.settled(
                item.ref.task_id
                for item, answer in zip(settlements, answers, strict=True)
                if isinstance(answer, str)
            )
        return answers

    async def extend(self, message: ExtendLeaseRequest, now: datetime) -> Lease:
        ref = v.lease_ref(message.lease)
        extension = v.duration(
            message.extension, "extension", positive=True, maximum=limits.MAX_LEASE
        )
        if extension is None:
            raise v.FieldError("extension", "is required")
        lease = await self._storage.extend_lease(ref, extension, now)
        self._reaper.note(lease.until)
        return lease

    async def progress(self, message: ReportProgressRequest, now: datetime) -> None:
        ref = v.lease_ref(message.lease)
        v.progress_values(message.current, message.total, message.message)
        await self._storage.report_progress(
            ref, message.current, message.total, message.message, now
        )
