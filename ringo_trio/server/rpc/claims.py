"""The unary ``Claim``: a long poll that hands out leases only with its reply.

Theory of operation
-------------------
`LongPollClaims.claim` tries storage; if nothing is claimable and the caller
allowed a ``wait_timeout``, it sleeps until the first of: a wake-up for its
queue (enqueue, nack, retry, an expired lease — `wakeups.QueueWakeups`,
armed before the attempt so none is lost), the queue's next scheduled moment
(`Storage.next_wakeup`, slept to by `wakeups.until_due`: a delayed task or
backoff becoming due, a lease expiring), the caller's deadline, or shutdown.
Then it tries again. There is no polling interval: an enqueue reaches a
waiting claimer in one event-loop turn. A client deadline shorter than
``wait_timeout`` shortens the wait, so the call answers (empty) instead of
being cut off. A paused queue claims nothing (`paused`) and waits for its
resume's wake-up.

Every lease handed out is noted with the `LeaseReaper`, which expires leases
at their deadline even when nobody is claiming, so activity counts and task
states stay true.

Replies are bounded by ``MAX_REPLY_BYTES`` (`reply_bounds`): a Claim answers
fewer tasks rather than a bigger message, and hands back what it leased
beyond the reply's room before it answers, so it never holds a lease it
does not send.

A lease reaches its client only with the reply, so a Claim that ends any
other way hands its leases back (`Storage.release`: PENDING, the attempt
unspent) and wakes the queue: a caller cancelled while a round is in flight
(that round the engine returns, see `storage.handback.guard_claim`; the
rounds before it, `claim_now`), and a reply that cannot be delivered
(`QueueService`'s handler for Claim calls `hand_back`). A later round that
fails answers with the earlier ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef

from ..clock import Clock
from ..storage.base import Storage
from ..storage.handback import hand_back
from . import validate as v
from .gate import time_remaining
from .paused import PausedQueues
from .reply_bounds import claim_within
from .wakeups import LeaseReaper, QueueWakeups, until_due

__all__ = ["DEADLINE_MARGIN", "LongPollClaims"]

log = logging.getLogger("ringo_trio.server")

#: How long before the client's own deadline a long poll (Claim, WaitTask)
#: gives up waiting and answers.
DEADLINE_MARGIN = 0.25


class LongPollClaims:
    """The daemon's unary Claims (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        clock: Clock,
        wakeups: QueueWakeups,
        reaper: LeaseReaper,
        paused: PausedQueues,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._wakeups = wakeups
        self._reaper = reaper
        self._paused = paused

    async def claim(self, args: v.ClaimArgs) -> list[LeasedTask]:
        """Leases for `args`, waiting up to its ``wait_timeout`` for some."""
        loop = asyncio.get_running_loop()
        wait = args.wait_timeout.total_seconds()
        client_left = time_remaining()
        if client_left is not None:
            # Answer (empty) shortly before the client gives up rather than be
            # cancelled at its deadline, possibly right after leasing tasks.
            wait = min(wait, client_left - DEADLINE_MARGIN)
        deadline = loop.time() + wait
        with self._wakeups.watch(args.queue) as watch:
            while True:
                # Armed before the attempt: a notify racing the attempt sets
                # this very event, so the wait below returns at once.
                armed = watch.arm()
                if watch.closed:
                    # Shutting down: hand out no lease whose response may
                    # never be delivered.
                    return []
                now = self._clock.now()
                paused = args.queue in self._paused.names
                leased = [] if paused else await self.claim_now(args, now)
                if leased:
                    return leased
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                if not paused:
                    wake_at = await self._storage.next_wakeup(args.queue, args.task_types, now)
                    if wake_at is not None:
                        remaining = min(remaining, until_due(wake_at, now, self._clock.now()))
                await watch.wait(armed, remaining)

    async def claim_now(self, args: v.ClaimArgs, now: datetime) -> list[LeasedTask]:
        """One attempt: as many leases as storage has and the reply holds."""
        leased: list[LeasedTask] = []  # every round's leases, answered or not

        async def claim(limit: int) -> list[LeasedTask]:
            try:
                batch = await self._storage.claim(
                    args.queue, args.task_types, limit, args.worker_id, args.lease_duration, now
                )
            except Exception:
                if not leased:
                    raise
                # The earlier rounds are leased to this caller, and the reply
                # is the only way it learns of them: an empty round ends the
                # claim with them.
                log.warning(
                    "Claim: a later round failed; answering with the %d task(s) before it",
                    len(leased),
                    exc_info=True,
                )
                return []
            for item in batch:
                # Noted per batch, before the next await; `note` skips a repeat
                # of the deadline it just saw (every lease of a batch shares one).
                if item.lease is not None:
                    self._reaper.note(item.lease.until)
            leased.extend(batch)
            return batch

        try:
            # What a round leased beyond the reply's room is handed back
            # before the reply (`claim_within`).
            return await claim_within(claim, self.hand_back, args.limit)
        except asyncio.CancelledError:
            # The round in flight is the engine's to hand back; the rounds
            # before it are only here (a ref handed back twice is skipped).
            await self.hand_back(leased)
            raise

    async def hand_back(self, leased: Sequence[LeasedTask]) -> None:
        """Return leases their caller never received, and wake their queues."""
        refs = [
            LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token)
            for lease in (item.lease for item in leased)
            if lease is not None
        ]
        queues = {item.task.queue for item in leased if item.task is not None}
        if await hand_back(self._storage, refs, self._clock.now()):
            for queue in queues:
                self._wakeups.notify(queue)
