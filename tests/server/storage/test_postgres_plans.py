"""The PostgreSQL daemon's hot statements keep their plans whatever the statistics say.

The daemon prepares each statement once per connection and runs its generic
plan (`pool.SERVER_SETTINGS`), made from the statistics of that moment: a
table never analyzed, or analyzed while its queue was drained, estimates one
PENDING row for every `queue = $1 AND state = 1`. Those are exactly the
moments a backlog arrives, so the plan made then must still seek the
state's own index, not read the queue's active tasks and sort them.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import asyncpg  # type: ignore[import-untyped]
import pytest

from ringo_trio.server.storage.postgres.pool import SERVER_SETTINGS
from ringo_trio.server.storage.rows import DEAD, LEASED, PENDING, SUCCEEDED
from tests._kit.storage import SyncEngine, open_engine, postgres_kind

#: A backlog whose `tasks_pending` is one B-tree level taller than the
#: queue-led index the claim once competed with (the bench's 40,000-task
#: run, where the claim sorted the whole queue: 27 ms a claim).
BACKLOG = 40_000
QUEUE = "bench-queue"


@pytest.fixture
def engine(storage_database: str, tmp_path: pathlib.Path) -> Iterator[SyncEngine]:
    with open_engine(postgres_kind(storage_database), tmp_path) as engine:
        yield engine


def _fill(engine: SyncEngine, state: int) -> None:
    """`BACKLOG` tasks of one type in `state`, written in one statement."""
    t = engine.raw._sql.tasks  # type: ignore[attr-defined]

    async def fill() -> None:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(
                f"""
                INSERT INTO {t} (id, queue, task_type, payload, unique_key, state, attempt,
                    max_attempts, base_max_attempts, priority, backoff_initial_us,
                    backoff_max_us, backoff_multiplier, created_at, updated_at,
                    available_at, last_error, worker_id, lease_token, retry_delays_us)
                SELECT gen_random_uuid()::text, $1, 't', '\\x00', '', $2, 0, 3, 3, 0, 1, 1, 1,
                    i, i, i, '', '', '', '{{1}}'
                FROM generate_series(1, $3::integer) i
                """,
                QUEUE,
                state,
                BACKLOG,
            )

    engine.run(fill())


def _generic_plans(engine: SyncEngine, *, finished: bool = False) -> dict[str, str]:
    """The generic plans a daemon connection opened now would run: the
    claim path's, or (`finished`) those of purge, retention and bulk retry."""
    raw = engine.raw
    sql = raw._sql  # type: ignore[attr-defined]
    statements, args = (
        (
            {
                "purge": (sql.operate.delete_finished_queue, "smallint[], bigint, bigint, text"),
                "retention": (sql.operate.delete_finished, "smallint[], bigint, bigint"),
                "retry_dead": (sql.operate.retry_dead, "text, bigint, bigint, bigint, text[]"),
            },
            {
                "purge": f"ARRAY[4]::smallint[], 1000000, 100, '{QUEUE}'",
                "retention": "ARRAY[4]::smallint[], 1000000, 100",
                "retry_dead": f"'{QUEUE}', 1000000, 100, 2000000, NULL",
            },
        )
        if finished
        else (
            {
                "claim": (sql.claim.claim, "text, bigint, bigint, text, bigint, text[], text[]"),
                "next_wakeup": (sql.claim.next_wakeup, "text, text[]"),
                "limit_key_rows": (sql.limits.key_rows, "text, bigint"),
            },
            {
                "claim": f"'{QUEUE}', 1000000, 64, 'w', 2000000, NULL, ARRAY['a']",
                "next_wakeup": f"'{QUEUE}', NULL",
                "limit_key_rows": f"'{QUEUE}', 1000000",
            },
        )
    )

    async def explain() -> dict[str, str]:
        conn = await asyncpg.connect(raw.dsn, server_settings=SERVER_SETTINGS)  # type: ignore[attr-defined]
        try:
            plans = {}
            for name, (statement, types) in statements.items():
                await conn.execute(f"PREPARE {name} ({types}) AS {statement}")
                rows = await conn.fetch(f"EXPLAIN EXECUTE {name} ({args[name]})")
                plans[name] = "\n".join(r[0] for r in rows)
            return plans
        finally:
            await conn.close()

    return engine.run(explain())  # type: ignore[no-any-return]


def _assert_seeks(plans: dict[str, str]) -> None:
    for name, plan in plans.items():
        assert "tasks_active_type" not in plan, (name, plan)
        assert "Seq Scan on tasks" not in plan, (name, plan)
    # (The keyed count groups what it read, keyed tasks only: its sort is not a walk.)
    for name in ("claim", "next_wakeup"):
        assert "Sort" not in plans[name], (name, plans[name])
    assert "tasks_pending" in plans["claim"], plans["claim"]
    assert "tasks_leased" in plans["claim"], plans["claim"]  # the expiry's walk
    assert "tasks_pending" in plans["next_wakeup"], plans["next_wakeup"]
    assert "tasks_limit_pending" in plans["limit_key_rows"], plans["limit_key_rows"]


def test_a_backlog_on_a_table_never_analyzed_is_claimed_by_index_seeks(
    engine: SyncEngine,
) -> None:
    """Property: a claim costs the same whatever the backlog behind it --
    with no statistics at all (a fresh database, autovacuum not yet round),
    the claim, the wake-up and the keyed limits' count seek the
    state-specific indexes; no plan reads and sorts the queue's active
    tasks (before schema 14: 27 ms a claim at 40,000 tasks, a third of the
    throughput)."""
    t = engine.raw._sql.tasks  # type: ignore[attr-defined]
    engine.run(_execute(engine, f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
    _fill(engine, PENDING)
    _assert_seeks(_generic_plans(engine))


def test_a_backlog_after_a_drained_queue_was_analyzed_is_claimed_by_index_seeks(
    engine: SyncEngine,
) -> None:
    """Property: statistics taken while the queue was drained (every task
    finished, none PENDING or LEASED) do not turn the claim of the next
    burst into a walk of the queue."""
    t = engine.raw._sql.tasks  # type: ignore[attr-defined]
    engine.run(_execute(engine, f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
    _fill(engine, SUCCEEDED)
    engine.run(_execute(engine, f"ANALYZE {t}"))
    _fill(engine, PENDING)
    _assert_seeks(_generic_plans(engine))


def test_activity_counts_without_types_stop_at_the_cap(engine: SyncEngine) -> None:
    """Property: GetQueueActivity without task types counts PENDING and
    LEASED tasks together, capped, and leaves out tasks not yet due when
    asked to (the counts moved to the state-specific indexes in schema 14)."""
    schema = engine.raw.schema  # type: ignore[attr-defined]
    t = engine.raw._sql.tasks  # type: ignore[attr-defined]

    async def counts() -> list[int]:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(
                f"UPDATE {t} SET state = {LEASED}, lease_until = 5 WHERE seq IN"
                f" (SELECT seq FROM {t} ORDER BY seq LIMIT 30)"
            )
            f = f'"{schema}"'
            return [
                await conn.fetchval(f"SELECT {f}.ringo_activity($1, NULL, $2)", QUEUE, cap)
                for cap in (10, 39_999, 40_000, 50_000)
            ] + [
                # Due by 100: the 30 leased and the PENDING tasks available at 31..100.
                await conn.fetchval(f"SELECT {f}.ringo_due_activity($1, NULL, 1000, 100)", QUEUE),
                await conn.fetchval(
                    f"SELECT {f}.ringo_due_activity($1, ARRAY['t'], 1000, 100)", QUEUE
                ),
                await conn.fetchval(f"SELECT {f}.ringo_activity($1, ARRAY['x'], 10)", QUEUE),
            ]

    _fill(engine, PENDING)
    assert engine.run(counts()) == [10, 39_999, 40_000, 40_000, 100, 100, 0]


async def _execute(engine: SyncEngine, statement: str) -> None:
    async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
        await conn.execute(statement)


def test_purge_and_retention_after_an_analyze_without_finished_tasks_walk_by_age(
    engine: SyncEngine,
) -> None:
    """Property: statistics taken before any task finished do not turn a
    purge, a retention pass or a bulk retry into a read and sort of every
    finished task of the queue (or of every queue), nor into a walk of
    other queues' old tasks: each walks `tasks_finished_queue`, the
    queue's own oldest first."""
    t = engine.raw._sql.tasks  # type: ignore[attr-defined]
    engine.run(_execute(engine, f"ALTER TABLE {t} SET (autovacuum_enabled = false)"))
    _fill(engine, PENDING)
    engine.run(_execute(engine, f"ANALYZE {t}"))
    _fill(engine, DEAD)
    plans = _generic_plans(engine, finished=True)
    for name, plan in plans.items():
        assert "Seq Scan on tasks" not in plan, (name, plan)
        assert "tasks_finished " not in plan, (name, plan)
        # Sorted are the rows the walks picked (`c`), never a table's rows.
        assert "Sort Key: tasks" not in plan, (name, plan)
    for name, plan in plans.items():
        assert "tasks_finished_queue" in plan, (name, plan)
        assert "tasks_finished_age" not in plan, (name, plan)
