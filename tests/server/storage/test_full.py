"""Storage with no room to write, on both engines.

SQLite is made full for real with ``PRAGMA max_page_count`` (writes then fail
with SQLITE_FULL, the code a full disk gives). PostgreSQL cannot be given a
full disk without root, so a trigger makes the real server raise SQLSTATE
53100 (``disk_full``) on every insert and update, which is what a full
tablespace answers.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import StorageFull
from tests._kit.storage import LEASE, SyncEngine, make_full, make_room, spec


def test_a_full_store_raises_storage_full_tells_the_listener_and_writes_nothing(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: while the store has no room, enqueue, claim and the probe
    raise StorageFull (a StorageUnavailable), the engine's full_listener
    hears of each, and nothing was written; reads keep working. Once there
    is room the probe commits and writes work again."""
    heard: list[StorageFull] = []
    engine.raw.full_listener = heard.append
    now = clock.now()
    outcomes = engine.enqueue("q", [spec() for _ in range(1000)], now)
    first = outcomes[0].task
    make_full(engine)
    with pytest.raises(StorageFull):
        engine.enqueue("q", [spec("big", payload=b"x" * 100_000)], now)
    with pytest.raises(StorageFull):
        engine.claim("q", [], 1000, "w1", LEASE, now)
    with pytest.raises(StorageFull):
        engine.probe(now)
    assert len(heard) == 3
    assert engine.get("q", task_id=first.id) == first
    assert engine.activity("q", ["big"]) == 0

    make_room(engine)
    engine.probe(now + timedelta(seconds=1))
    engine.enqueue("q", [spec("big", payload=b"x" * 100_000)], now)
    [leased] = engine.claim("q", [], 1, "w1", LEASE, now)
    assert leased.task.id == first.id
    assert engine.get("q", task_id=first.id).state == TaskState.LEASED
    assert len(heard) == 3
