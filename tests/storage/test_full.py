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
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

from .conftest import LEASE, SyncEngine, spec


def make_full(engine: SyncEngine, *, pages_left: int = 0, on_task: str | None = None) -> None:
    """No room from now on; with `on_task`, room runs out when a write reaches
    that task: SQLite after `pages_left` more pages, PostgreSQL at an update
    of that row."""
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        db = raw._conn()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages + pages_left}")
        return
    assert isinstance(raw, PostgresEngine)
    schema = raw._sql.tasks.rpartition(".")[0]
    when = "INSERT OR UPDATE" if on_task is None else "UPDATE"
    row = "" if on_task is None else f"WHEN (NEW.id = '{on_task}')"
    engine.run(
        raw._live_pool().execute(
            f"""
            CREATE FUNCTION {schema}.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
                USING ERRCODE = 'disk_full'; END $$;
            CREATE TRIGGER disk_full BEFORE {when} ON {raw._sql.tasks}
                FOR EACH ROW {row} EXECUTE FUNCTION {schema}.disk_full();
            """
        )
    )


def make_room(engine: SyncEngine) -> None:
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        raw._conn().execute("PRAGMA max_page_count = 1073741823")
        return
    assert isinstance(raw, PostgresEngine)
    engine.run(raw._live_pool().execute(f"DROP TRIGGER disk_full ON {raw._sql.tasks}"))


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
