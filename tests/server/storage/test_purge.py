"""Deleting finished tasks (DeleteTasks, retention) on both engines: which tasks go,
in what order, that the batch stays bounded and indexed, and that a deleted task's
unique key can be used again."""

from __future__ import annotations

import asyncio
import pathlib
from datetime import datetime, timedelta

import asyncpg
import pytest

from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.retention import Retention, RetentionPolicy
from ringo_trio.server.storage.base import NotFound
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import operate as engine_module
from tests._kit.storage import (
    ENGINE_KINDS,
    EngineKind,
    SyncEngine,
    claim_one,
    generic_plans,
    open_engine,
    postgres_kind,
    ref_of,
    schema_for,
    spec,
)

SUCCEEDED, DEAD, CANCELLED = int(TaskState.SUCCEEDED), int(TaskState.DEAD), int(TaskState.CANCELLED)
FINISHED = [SUCCEEDED, DEAD, CANCELLED]


def finish(
    engine: SyncEngine, now: datetime, state: int, queue: str = "q", **fields: object
) -> str:
    """Enqueue one task and bring it to `state` (SUCCEEDED or DEAD) at `now`; its id."""
    [out] = engine.enqueue(queue, [spec(**fields)], now)
    leased = claim_one(engine, now, queue)
    assert leased.task.id == out.task.id
    if state == SUCCEEDED:
        engine.ack(ref_of(leased), now)
    else:
        engine.reject(ref_of(leased), "broken", now)
    return str(out.task.id)


def gone(engine: SyncEngine, task_id: str, queue: str = "q") -> bool:
    try:
        engine.get(queue, task_id=task_id)
    except NotFound:
        return True
    return False


def test_deletes_the_oldest_finished_first_across_states(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A batch takes the tasks that finished longest ago, whatever their state, and
    never more than `limit`: repeated batches work a backlog off oldest first."""
    ids = []
    for i in range(6):
        ids.append(finish(engine, clock.now(), SUCCEEDED if i % 2 else DEAD))
        clock.advance(timedelta(minutes=1))
    assert engine.delete_finished("q", FINISHED, None, 4) == 4
    assert [gone(engine, i) for i in ids] == [True] * 4 + [False] * 2
    assert engine.delete_finished("q", FINISHED, None, 4) == 2
    assert all(gone(engine, i) for i in ids)
    assert engine.delete_finished("q", FINISHED, None, 4) == 0


def test_a_batch_of_every_queue_takes_the_oldest_of_all_queues_first(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Retention's batch (no queue named) takes the tasks that finished longest
    ago whichever queue holds them, `limit` at a time, and stops at the cutoff:
    a queue with many old tasks is not worked off before another's older ones,
    and none is skipped (on PostgreSQL the queues are walked one by one)."""
    finished = []
    for i, queue in enumerate(["c", "a", "b", "a", "c", "c", "b", "a", "d"]):
        finished.append((queue, finish(engine, clock.now(), DEAD if i % 3 else SUCCEEDED, queue)))
        clock.advance(timedelta(minutes=1))
    cutoff = clock.now() - timedelta(minutes=1)  # the last one finished at the cutoff
    for batch in ([0, 1, 2, 3], [4, 5, 6, 7]):
        assert engine.delete_finished(None, FINISHED, cutoff, 4) == 4
        assert [gone(engine, t, q) for q, t in finished] == [
            i <= batch[-1] for i in range(len(finished))
        ]
    assert engine.delete_finished(None, FINISHED, cutoff, 4) == 0
    assert not gone(engine, finished[-1][1], "d")


def test_only_the_asked_queue_states_and_age_are_deleted(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A delete touches only the named queue (or every queue when none is named),
    only the named finished states, and only tasks finished strictly before the
    cutoff; PENDING and LEASED tasks are never touched."""
    start = clock.now()
    old_ok = finish(engine, start, SUCCEEDED)
    old_dead = finish(engine, start, DEAD)
    other = finish(engine, start, SUCCEEDED, queue="other")
    clock.advance(timedelta(hours=1))
    cutoff = clock.now()
    at_cutoff = finish(engine, cutoff, SUCCEEDED)
    engine.enqueue("q", [spec()], start)
    leased = claim_one(engine, start)
    [pending] = engine.enqueue("q", [spec()], start)

    assert engine.delete_finished("q", [DEAD], cutoff, 100) == 1
    assert gone(engine, old_dead)
    assert not gone(engine, old_ok)
    assert engine.delete_finished("q", [SUCCEEDED], cutoff, 100) == 1
    assert gone(engine, old_ok)
    assert not gone(engine, at_cutoff)
    assert not gone(engine, other, "other")
    # Every queue, every finished state, any age: the active tasks stay.
    assert engine.delete_finished(None, FINISHED, None, 100) == 2
    assert gone(engine, at_cutoff)
    assert gone(engine, other, "other")
    assert engine.get("q", task_id=pending.task.id).state == TaskState.PENDING
    assert engine.get("q", task_id=leased.task.id).state == TaskState.LEASED


def test_active_states_are_refused(engine: SyncEngine, clock: ManualClock) -> None:
    """Asking the engine to delete PENDING or LEASED tasks is a programming error
    (the service refuses it first), and deletes nothing."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    for state in (TaskState.PENDING, TaskState.LEASED):
        with pytest.raises(ValueError, match="finished"):
            engine.delete_finished("q", [SUCCEEDED, int(state)], None, 10)
    assert engine.get("q", task_id=out.task.id).state == TaskState.PENDING


def test_a_delete_of_nothing_deletes_nothing_and_says_so(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A limit of 0 (or below), or no state asked for, deletes no task and
    answers 0: the answer is what retention and DeleteTasks add up and
    report, and a pass keeps deleting while a batch comes back full."""
    kept = finish(engine, clock.now(), SUCCEEDED)
    assert engine.delete_finished("q", [SUCCEEDED], None, 0) == 0
    assert engine.delete_finished(None, FINISHED, None, -1) == 0
    assert engine.delete_finished("q", [], None, 10) == 0
    assert not gone(engine, kept)
    assert engine.delete_finished("q", [SUCCEEDED], None, 1) == 1


def test_a_deleted_tasks_unique_key_can_be_used_again(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Once a finished task is deleted, enqueueing its unique key creates a new task
    (before, the same enqueue is a duplicate of the finished one)."""
    first = finish(engine, clock.now(), SUCCEEDED, unique_key="k")
    [dup] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    assert not dup.created
    assert dup.task.id == first
    assert engine.delete_finished("q", [SUCCEEDED], None, 10) == 1
    [again] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    assert again.created
    assert again.task.id != first
    assert engine.get("q", unique_key="k").id == again.task.id


# -- retention -----------------------------------------------------------------

DAY = timedelta(days=1)


def retention_pass(engine: SyncEngine, clock: ManualClock, policy: RetentionPolicy) -> int:
    deleted = engine.run(Retention(engine.raw, clock, policy).purge())
    return sum(deleted.values())


def test_retention_deletes_what_its_policy_no_longer_keeps(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """With succeeded kept 7 days and dead 30: at day 14 a task that succeeded 8 days
    ago is gone, one that succeeded 6 days ago is kept, a task that died 13 days
    ago is kept until it is 30 days old; in every queue."""
    start = clock.now()
    dead = finish(engine, start + DAY, DEAD, queue="a")
    old = finish(engine, start + 6 * DAY, SUCCEEDED, queue="b")
    young = finish(engine, start + 8 * DAY, SUCCEEDED, queue="a")
    clock.advance(14 * DAY)
    policy = RetentionPolicy(succeeded=7 * DAY, dead=30 * DAY, batch=1, pause=0)
    assert retention_pass(engine, clock, policy) == 1
    assert gone(engine, old, "b")
    assert not gone(engine, young, "a")
    assert not gone(engine, dead, "a")
    clock.advance(17 * DAY)  # the dead task is exactly 30 days old: kept
    assert retention_pass(engine, clock, policy) == 1
    assert gone(engine, young, "a")
    assert not gone(engine, dead, "a")
    clock.advance(timedelta(seconds=1))
    assert retention_pass(engine, clock, policy) == 1
    assert gone(engine, dead, "a")


def test_retention_kept_forever_deletes_nothing(engine: SyncEngine, clock: ManualClock) -> None:
    """A state whose retention is None (ringod --retain-dead forever) is never deleted,
    however old; the default policy keeps every state."""
    dead = finish(engine, clock.now(), DEAD)
    ok = finish(engine, clock.now(), SUCCEEDED)
    clock.advance(365 * DAY)
    assert retention_pass(engine, clock, RetentionPolicy()) == 0
    assert retention_pass(engine, clock, RetentionPolicy(succeeded=DAY)) == 1
    assert gone(engine, ok)
    assert not gone(engine, dead)


def test_retention_works_a_backlog_off_batch_by_batch(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A pass keeps deleting batch after batch until a batch comes back short, so a
    backlog larger than one batch is gone after one pass."""
    engine.enqueue("q", [spec(max_attempts=1) for _ in range(25)], clock.now())
    engine.claim("q", [], 25, "w", timedelta(seconds=1), clock.now())
    clock.advance(timedelta(seconds=2))
    assert engine.expire_leases(clock.now()) == 25  # the last attempt: DEAD
    clock.advance(2 * DAY)
    assert retention_pass(engine, clock, RetentionPolicy(dead=DAY, batch=10, pause=0)) == 25


# -- SQLite: the plan ------------------------------------------------------------


@pytest.mark.parametrize("queue", ["q", None])
def test_sqlite_batches_walk_an_index(tmp_path: pathlib.Path, queue: str | None) -> None:
    """Each statement of a batch is an index search: no scan of the task table (which
    holds every task, finished or not) and no sort (temp b-tree) of what it finds."""
    sql = engine_module.OLDEST_FINISHED if queue is None else engine_module.OLDEST_FINISHED_QUEUE
    with open_engine(ENGINE_KINDS["sqlite"], tmp_path) as sqlite:
        db = sqlite.raw._db  # type: ignore[attr-defined]
        params = {"queue": queue, "state": SUCCEEDED, "before": 0, "limit": 1}
        plan = [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params)]
        delete = [r[3] for r in db.execute("EXPLAIN QUERY PLAN DELETE FROM tasks WHERE seq = 1")]
    index = "tasks_finished_age" if queue is None else "tasks_finished_queue"
    assert any(index in step for step in plan), plan
    assert not [s for s in plan + delete if s.startswith("SCAN") or "TEMP B-TREE" in s], plan


# -- PostgreSQL: the plan, and daemons purging side by side ------------------------


def test_postgres_batches_walk_an_index(storage_database: str, tmp_path: pathlib.Path) -> None:
    """The delete's generic plan (what the engine's prepared statement runs) finds
    its rows by the finished-task indexes, never by a sequential scan, even with
    plenty of rows to choose from."""

    async def fill(engine: SyncEngine) -> None:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(f'SET search_path TO "{schema_for(tmp_path)}"')
            await conn.execute(
                "INSERT INTO tasks (id, queue, task_type, payload, unique_key, state, attempt,"
                " max_attempts, base_max_attempts, priority, backoff_initial_us,"
                " backoff_max_us, backoff_multiplier, created_at, updated_at, available_at,"
                " finished_at, last_error, worker_id, lease_token, retry_delays_us)"
                " SELECT md5(g::text), 'q' || (g % 10), 't', '', '', 1 + g % 5, 1, 1, 1, 0,"
                " 0, 0, 1, g, g, g, CASE WHEN g % 5 >= 2 THEN g END, '', '', '', '{0}'"
                " FROM generate_series(1, 20000) g"
            )
            await conn.execute("ANALYZE tasks")
            await conn.execute("RESET search_path")

    with open_engine(postgres_kind(storage_database), tmp_path) as engine:
        engine.run(fill(engine))
        sql = engine.raw._sql  # type: ignore[attr-defined]
        plans = generic_plans(
            engine,
            {
                "every_queue": (sql.operate.delete_finished, "'{3,4}', 5, 10"),
                "one_queue": (sql.operate.delete_finished_queue, "'{3,4}', 5, 10, 'q1'"),
            },
        )
        for plan in plans.values():
            assert "tasks_finished_queue" in plan, plan
            assert "Seq Scan" not in plan, plan


def test_postgres_daemons_purging_at_once_skip_each_others_rows(
    storage_database: str, tmp_path: pathlib.Path
) -> None:
    """While another transaction (another daemon's batch) holds some finished rows,
    a delete neither waits for it nor touches those rows: it deletes the others and
    returns; the held rows are deleted once they are free."""
    clock = ManualClock()
    with open_engine(postgres_kind(storage_database), tmp_path) as engine:
        ids = [finish(engine, clock.now(), SUCCEEDED) for _ in range(6)]

        async def main() -> tuple[int, int]:
            conn = await asyncpg.connect(storage_database)
            try:
                async with conn.transaction():
                    await conn.execute(
                        f'SELECT 1 FROM "{schema_for(tmp_path)}".tasks'
                        " WHERE id = ANY($1::text[]) FOR UPDATE",
                        ids[:2],
                    )
                    async with asyncio.timeout(30):
                        first = await engine.raw.delete_finished("q", FINISHED, None, 100)
                second = await engine.raw.delete_finished("q", FINISHED, None, 100)
                return first, second
            finally:
                await conn.close()

        assert engine.run(main()) == (4, 2)
        assert all(gone(engine, i) for i in ids)


def test_postgres_enqueue_takes_a_key_whose_task_is_deleted_under_it(
    storage_database: str, tmp_path: pathlib.Path
) -> None:
    """An enqueue that met a unique key's finished task, which another daemon's purge
    deleted before the enqueue could read it, creates its own task for the key
    instead of failing."""

    class PurgedUnderfoot(PostgresEngine):
        """Deletes every finished task just before the first duplicate lookup."""

        armed = True

        async def _fetch(self, sql: str, *args: object) -> list[object]:
            if self.armed and sql == self._sql.claim.by_keys:
                self.armed = False
                await self.delete_finished(None, FINISHED, None, 100)
            return await super()._fetch(sql, *args)

    plain = postgres_kind(storage_database)
    kind = EngineKind(
        name="postgres",
        make=lambda scratch: PurgedUnderfoot(storage_database, schema=plain.make(scratch).schema),
        source=plain.source,
        imports=plain.imports,
    )
    clock = ManualClock()
    with open_engine(kind, tmp_path) as engine:
        first = finish(engine, clock.now(), SUCCEEDED, unique_key="k")
        [out, dup] = engine.enqueue("q", [spec(unique_key="k"), spec(unique_key="k")], clock.now())
        assert out.created
        assert out.task.id != first
        assert not dup.created
        assert dup.task.id == out.task.id
        assert engine.get("q", unique_key="k").id == out.task.id
