"""Paused queues in storage (minor 13), on both engines: the stored flag, what
stats and the queue list say of it, and (PostgreSQL) its announcement to the
other daemons of the database."""

from __future__ import annotations

import asyncio
import pathlib

from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.postgres import PostgresEngine
from tests._kit.storage import LEASE, SyncEngine, open_engine, postgres_kind, spec


def test_a_flag_is_stored_and_reports_whether_it_changed(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: set_queue_paused answers True only when it changed the flag
    (pausing twice, or resuming a queue that is not paused, changes
    nothing); paused_queues lists exactly the paused queues, and the flag
    outlives a reopen (a daemon restart)."""
    now = clock.now()
    assert engine.paused_queues() == frozenset()
    assert engine.set_queue_paused("a", True, now) is True
    assert engine.set_queue_paused("a", True, now) is False
    assert engine.set_queue_paused("b", False, now) is False
    assert engine.set_queue_paused("b", True, now) is True
    assert engine.paused_queues() == {"a", "b"}
    engine.reopen()
    assert engine.paused_queues() == {"a", "b"}
    assert engine.set_queue_paused("a", False, now) is True
    assert engine.set_queue_paused("a", False, now) is False
    assert engine.paused_queues() == {"b"}


def test_stats_and_the_queue_list_show_the_flag(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: queue_stats and list_queues report paused; a paused queue
    without any task is listed (paused ahead of time), in name order with
    the others and across pages; once resumed, an empty queue is not listed
    again. Pausing changes no task: the counts stay as they were."""
    now = clock.now()
    engine.enqueue("busy", [spec(), spec()], now)
    engine.enqueue("zeta", [spec()], now)
    assert engine.set_queue_paused("busy", True, now)
    assert engine.set_queue_paused("empty", True, now)

    busy = engine.queue_stats("busy", now, by_type=True)
    assert busy.paused is True
    assert busy.pending == 2
    assert engine.queue_stats("zeta", now, by_type=False).paused is False
    assert engine.queue_stats("empty", now, by_type=False).paused is True

    listed = engine.list_queues(now, after="", limit=10)
    assert [(q.queue, q.paused, q.pending) for q in listed] == [
        ("busy", True, 2),
        ("empty", True, 0),
        ("zeta", False, 1),
    ]
    assert [q.queue for q in engine.list_queues(now, after="busy", limit=1)] == ["empty"]

    assert engine.set_queue_paused("empty", False, now)
    assert [q.queue for q in engine.list_queues(now, after="", limit=10)] == ["busy", "zeta"]


def test_the_flag_is_not_read_by_the_claim(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: the engine's claim ignores the flag (the daemon asks its
    cache instead, `rpc.paused`), so the claim statements pay nothing for
    it; a paused queue's tasks are as claimable to storage as before."""
    now = clock.now()
    engine.enqueue("q", [spec()], now)
    engine.set_queue_paused("q", True, now)
    assert len(engine.claim("q", [], 1, "w", LEASE, now)) == 1


def test_another_engine_hears_a_pause_and_a_resume(
    storage_database: str, tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """Property (PostgreSQL): a pause or resume by one engine reaches the
    `watch` of another engine on the same database as paused_changed(queue,
    flag), in commit order with the wake-ups (the pause before the enqueue
    after it), and never its own engine's; a change that changed nothing
    announces nothing."""
    # Only PostgreSQL is shared by several daemons.
    engine_kind = postgres_kind(storage_database)
    with open_engine(engine_kind, tmp_path) as a, open_engine(engine_kind, tmp_path) as b:
        assert isinstance(a.raw, PostgresEngine)
        assert isinstance(b.raw, PostgresEngine)
        raw_a, raw_b = a.raw, b.raw
        now = clock.now()

        async def scenario() -> tuple[list[object], list[object]]:
            heard_a: list[object] = []
            heard_b: list[object] = []
            listening = asyncio.Event()
            all_heard = asyncio.Event()

            def hear(what: object) -> None:
                heard_b.append(what)
                if len(heard_b) == 3:
                    all_heard.set()

            def wake_b(queue: str | None) -> None:
                if queue is None:
                    listening.set()
                else:
                    hear(("wake", queue))

            async with asyncio.timeout(30), asyncio.TaskGroup() as tasks:
                watch_a = tasks.create_task(
                    raw_a.watch(lambda q: None, lambda q, p: heard_a.append((q, p)))
                )
                watch_b = tasks.create_task(
                    raw_b.watch(wake_b, lambda q, p: hear(("paused", q, p)))
                )
                await listening.wait()
                await raw_a.set_queue_paused("q", True, now)
                await raw_a.set_queue_paused("q", True, now)  # no change: no note
                await raw_a.enqueue("q", [spec()], now)
                await raw_a.set_queue_paused("q", False, now)
                await all_heard.wait()
                watch_a.cancel()
                watch_b.cancel()
            return heard_a, heard_b

        heard_a, heard_b = a.run(scenario())
        assert heard_b == [("paused", "q", True), ("wake", "q"), ("paused", "q", False)]
        assert heard_a == []
