"""Paused queues (protocol minor 13): the daemon's cache of the stored flags.

Theory of operation
-------------------
A paused queue takes enqueues, but the daemon neither pushes (Work stream)
nor claims (unary Claim) for it; leases already handed out run on, and
their acks, renewals and progress work as ever. The flag is stored
(`Storage.set_queue_paused`) and the claim statements never read it:
instead every dispatch round and every Claim attempt asks this cache
(`queue in paused.names`, one set lookup, the only cost an unpaused queue
pays), and a paused queue's dispatchers and long polls sleep on the queue's
wake-up (`QueueWakeups`) until it is resumed.

**Changes made here** (`set`) run one at a time (a lock), store the flag,
then update the cache, so this daemon's cache follows its own changes in
commit order. A resume wakes the queue at once: its parked dispatchers and
claims claim in the next loop turn. A pause needs no wake-up: each
dispatcher and claim asks the cache before its next claim (a claim already
in flight finishes; its tasks are pushed).

**Changes made by other daemons** (PostgreSQL) arrive through the storage
watch (`Storage.watch`'s ``paused_changed``, a NOTIFY in the changing
transaction, delivered in commit order with the wake-ups): the cache follows
at once (`changed_elsewhere`), so a daemon has stopped pushing a queue
before it hears of tasks enqueued after the pause, and marks itself stale;
so does the watch's every (re)connect, since notifications may have been
missed meanwhile. `run`
re-reads the whole set from the store (`Storage.paused_queues`: few rows)
when stale, and in any case every `refresh_interval` seconds, so the
staleness of a daemon's cache is bounded even if a notification is lost
with the listener still up: a pause made elsewhere stops this daemon's
pushes within that interval, a resume starts them within it (normally
within one notification's delivery). A queue found resumed by a re-read is
woken like a local resume. A re-read that fails keeps the set it has and
retries at the next beat.

On an engine no other process writes (SQLite), `run` returns at once:
every change is made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from ..storage.base import Storage
from .wakeups import QueueWakeups

__all__ = ["DEFAULT_PAUSED_REFRESH", "PausedQueues"]

log = logging.getLogger("ringo_trio.server")

DEFAULT_PAUSED_REFRESH = 5.0
"""Seconds between re-reads of the paused set on a shared store: the
longest a lost notification can leave a daemon's cache stale."""


class PausedQueues:
    def __init__(
        self,
        storage: Storage,
        wakeups: QueueWakeups,
        *,
        refresh_interval: float = DEFAULT_PAUSED_REFRESH,
    ) -> None:
        if not refresh_interval > 0:
            raise ValueError("refresh_interval must be positive")
        self._storage = storage
        self._wakeups = wakeups
        self._refresh_interval = refresh_interval
        # Read on every dispatch round: a plain set, no call.
        self.names: set[str] = set()
        self._lock = asyncio.Lock()
        self._stale = asyncio.Event()

    async def load(self) -> None:
        """Re-read the set from the store; wake the queues it no longer holds."""
        async with self._lock:
            stored = await self._storage.paused_queues()
            resumed = self.names - stored
            # In place: the dispatchers hold this very set.
            self.names.intersection_update(stored)
            self.names.update(stored)
        for queue in resumed:
            self._wakeups.notify(queue)

    async def set(self, queue: str, paused: bool, now: datetime) -> bool:
        """Store `queue`'s flag and follow it here; True when it changed."""
        async with self._lock:
            changed = await self._storage.set_queue_paused(queue, paused, now)
            if paused:
                self.names.add(queue)
            else:
                self.names.discard(queue)
        if not paused:
            # Even when unchanged: a cache another daemon's resume left
            # stale is right again now, and waking costs one loop turn.
            self._wakeups.notify(queue)
        return changed

    def changed_elsewhere(self, queue: str, paused: bool) -> None:
        """Another daemon paused or resumed `queue` (its notification):
        followed at once, before any wake-up notified after it, and
        confirmed by a re-read (a re-read in flight may predate it)."""
        if paused:
            self.names.add(queue)
        elif queue in self.names:
            self.names.discard(queue)
            self._wakeups.notify(queue)
        self._stale.set()

    def stale(self) -> None:
        """Flags may have changed unannounced (the watch reconnected): `run`
        re-reads soon."""
        self._stale.set()

    async def run(self) -> None:
        """Re-read the set when stale and every `refresh_interval` seconds,
        until cancelled (see the module docstring); returns at once on a
        store no other process writes."""
        if not self._storage.waits_across_processes:
            return
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_interval):
                    await self._stale.wait()
            self._stale.clear()
            try:
                await self.load()
            except Exception as exc:
                log.warning("reading the paused queues failed (%s); retrying", exc)
