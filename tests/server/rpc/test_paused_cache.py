"""The daemon's cache of paused queues (`server/rpc/paused.py`) on its own,
against a store of flags, on virtual time. Pausing through a daemon (and
through two daemons on PostgreSQL) is held in test_pause.py; this file holds
how the cache follows changes it is told of late or not at all."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import cast

import pytest

from ringo_trio.server.rpc.paused import PausedQueues
from ringo_trio.server.rpc.wakeups import QueueWakeups
from ringo_trio.server.storage.base import Storage
from tests._kit.virtual_daemon import in_background, now, on_virtual_time


class _Flags:
    """The stored paused flags, which other daemons change behind this one's
    back (set `paused` directly); records when the set is read."""

    def __init__(self, *, shared: bool) -> None:
        self.waits_across_processes = shared
        self.paused: set[str] = set()
        self.reads: list[float] = []

    async def paused_queues(self) -> set[str]:
        self.reads.append(now())
        return set(self.paused)

    async def set_queue_paused(self, queue: str, paused: bool, _now: datetime) -> bool:
        changed = (queue in self.paused) != paused
        (self.paused.add if paused else self.paused.discard)(queue)
        return changed


def test_a_refresh_interval_must_be_positive() -> None:
    """Property: a cache that would re-read in a busy loop is refused; a
    short interval is accepted."""
    flags = cast(Storage, _Flags(shared=True))
    with pytest.raises(ValueError, match="positive"):
        PausedQueues(flags, QueueWakeups(), refresh_interval=0.0)
    PausedQueues(flags, QueueWakeups(), refresh_interval=0.5)


@on_virtual_time
async def test_a_resume_elsewhere_is_followed_and_wakes_the_queue_at_once() -> None:
    """Property: another daemon's resume (its notification) takes the queue
    out of the cache and wakes its parked dispatchers and claims at once,
    not at the next re-read; a resume of a queue the cache does not hold
    wakes nobody."""
    wakeups = QueueWakeups()
    cache = PausedQueues(cast(Storage, _Flags(shared=True)), wakeups)
    cache.changed_elsewhere("q", paused=True)
    assert cache.names == {"q"}
    with wakeups.watch("q") as q, wakeups.watch("other") as other:
        armed_q, armed_other = q.arm(), other.arm()
        cache.changed_elsewhere("other", paused=False)
        assert not armed_other.is_set()
        cache.changed_elsewhere("q", paused=False)
        assert armed_q.is_set()
    assert cache.names == set()


@on_virtual_time
async def test_a_change_never_announced_is_found_within_the_refresh_interval() -> None:
    """Property (a store other daemons write): the cache re-reads the flags
    every `refresh_interval` even if no notification came (one lost with the
    listener still up), so a pause made elsewhere holds here within that
    interval, and a resume found that way wakes the queue."""
    flags = _Flags(shared=True)
    wakeups = QueueWakeups()
    cache = PausedQueues(cast(Storage, flags), wakeups, refresh_interval=5.0)
    start = now()
    async with in_background(cache.run()):
        flags.paused.add("q")
        await asyncio.sleep(5.5)
        assert cache.names == {"q"}
        with wakeups.watch("q") as q:
            armed = q.arm()
            flags.paused.clear()
            await asyncio.sleep(5.0)
            assert armed.is_set()
        assert cache.names == set()
        assert [at - start for at in flags.reads] == [5.0, 10.0]


@on_virtual_time
async def test_a_store_nobody_else_writes_is_never_re_read() -> None:
    """Property: on SQLite every change is made through this daemon, so the
    cache's loop ends at once and never reads the flags again."""
    flags = _Flags(shared=False)
    cache = PausedQueues(cast(Storage, flags), QueueWakeups())
    async with asyncio.timeout(1):
        await cache.run()
    assert flags.reads == []
