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
import re
from collections.abc import Iterator

import pytest

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT
from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.storage.postgres.schema import PENDING_BY_TYPE
from ringo_trio.server.storage.rows import DEAD, LEASED, PENDING, SUCCEEDED
from tests._kit.storage import SyncEngine, generic_plans, open_engine, postgres_kind

#: A backlog whose `tasks_pending` is one B-tree level taller than the
#: queue-led index the claim once competed with (the bench's 40,000-task
#: run, where the claim sorted the whole queue: 27 ms a claim).
BACKLOG = 40_000
QUEUE = "bench-queue"


@pytest.fixture
def engine(storage_database: str, tmp_path: pathlib.Path) -> Iterator[SyncEngine]:
    """A PostgreSQL engine whose table autovacuum never analyzes: its
    statistics are the ones a test makes."""
    with open_engine(postgres_kind(storage_database), tmp_path) as engine:
        _execute(engine, f"ALTER TABLE {_tasks(engine)} SET (autovacuum_enabled = false)")
        yield engine


def _tasks(engine: SyncEngine) -> str:
    return str(engine.raw._sql.tasks)  # type: ignore[attr-defined]


def _execute(engine: SyncEngine, statement: str, *args: object) -> None:
    async def execute() -> None:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(statement, *args)

    engine.run(execute())


def _fill(
    engine: SyncEngine, state: int, limit_key: str = "", task_type: str = "t", count: int = BACKLOG
) -> None:
    """`count` tasks of one type in `state` (under `limit_key`), written
    in one statement."""
    _execute(
        engine,
        f"""
        INSERT INTO {_tasks(engine)} (id, queue, task_type, payload, unique_key, state,
            attempt, max_attempts, base_max_attempts, priority, backoff_initial_us,
            backoff_max_us, backoff_multiplier, created_at, updated_at, available_at,
            last_error, worker_id, lease_token, retry_delays_us, limit_key)
        SELECT gen_random_uuid()::text, $1, $5, '\\x00', '', $2, 0, 3, 3, 0, 1, 1, 1,
            i, i, i, '', '', '', '{{1}}', $4
        FROM generate_series(1, $3::integer) i
        """,
        QUEUE,
        state,
        count,
        limit_key,
        task_type,
    )


def _claim_path_plans(engine: SyncEngine) -> dict[str, str]:
    sql = engine.raw._sql  # type: ignore[attr-defined]
    return generic_plans(
        engine,
        {
            "claim": (sql.claim.claim, f"'{QUEUE}', 1000000, 64, 'w', 2000000, '{{a}}'"),
            "next_wakeup": (sql.claim.next_wakeup, f"'{QUEUE}'"),
            "limit_key_rows": (sql.limits.key_rows, f"'{QUEUE}', 1000000"),
            "claim_typed": (
                sql.claim.claim_typed,
                f"'{QUEUE}', 1000000, 64, 'w', 2000000, '{{a}}', '{{t,u}}'",
            ),
            "next_wakeup_typed": (sql.claim.next_wakeup_typed, f"'{QUEUE}', '{{t,u}}'"),
            "limit_unkeyed": (sql.limits.unkeyed, f"'{QUEUE}', 1000000, 64"),
            "limit_unkeyed_head": (sql.limits.unkeyed_head, f"'{QUEUE}'"),
            "limit_unkeyed_typed": (sql.limits.unkeyed_typed, f"'{QUEUE}', 1000000, 64, '{{t,u}}'"),
            "limit_unkeyed_head_typed": (sql.limits.unkeyed_head_typed, f"'{QUEUE}', '{{t,u}}'"),
            "limit_keys": (sql.limits.keys, f"'{QUEUE}'"),
            "limit_keys_typed": (sql.limits.keys_typed, f"'{QUEUE}', '{{t,u}}'"),
            "limit_key_heads": (sql.limits.key_heads, f"'{QUEUE}', '{{k:big}}'"),
            "limit_key_heads_typed": (
                sql.limits.key_heads_typed,
                f"'{QUEUE}', '{{k:big}}', '{{t,u}}'",
            ),
            "limit_heads": (sql.limits.heads, f"'{QUEUE}', '{{k:big}}', '{{5}}', 1000000"),
            "limit_heads_typed": (
                sql.limits.heads_typed,
                f"'{QUEUE}', '{{k:big}}', '{{5}}', 1000000, '{{t,u}}'",
            ),
            "limit_read_keys": (sql.limits.read_keys, f"'{QUEUE}', '{{k:a,k:b}}'"),
            "limit_lock_keys": (sql.limits.lock_keys, f"'{QUEUE}', '{{k:a,k:b}}'"),
        },
    )


def _assert_seeks(plans: dict[str, str]) -> None:
    for name, plan in plans.items():
        assert "tasks_active_type" not in plan, (name, plan)
        assert "Seq Scan on tasks" not in plan, (name, plan)
        if name.endswith("_typed"):
            # Sorted are the rows each type's walk picked (`d`), never a table's.
            assert "Sort Key: tasks" not in plan, (name, plan)
            if name.startswith(("limit_key", "limit_heads")):
                assert _indexes(plan) & _KEY_ORDERS == {"tasks_limit_pending_type"}, (name, plan)
            else:
                typed = "tasks_pending_unkeyed_type" if "unkeyed" in name else "tasks_pending_type"
                assert _indexes(plan) & _CLAIM_ORDERS == {typed}, (name, plan)
        else:
            assert "tasks_pending_type" not in plan, (name, plan)
            assert "tasks_pending_unkeyed_type" not in plan, (name, plan)
    # (The keyed count groups what it read, keyed tasks only: its sort is not a walk.)
    for name in ("claim", "next_wakeup", "limit_unkeyed", "limit_unkeyed_head"):
        assert "Sort" not in plans[name], (name, plans[name])
    assert "Sort Key: tasks" not in plans["limit_key_heads"], plans["limit_key_heads"]
    for name in ("claim", "next_wakeup"):
        assert "using tasks_pending on" in plans[name], (name, plans[name])
        assert "tasks_pending_unkeyed" not in plans[name], (name, plans[name])
    for name in ("claim", "claim_typed"):
        assert "tasks_leased" in plans[name], (name, plans[name])  # the expiry's walk
    assert "tasks_leased" in plans["next_wakeup_typed"], plans["next_wakeup_typed"]
    for name in ("limit_key_rows", "limit_keys", "limit_key_heads", "limit_heads"):
        assert _indexes(plans[name]) & _KEY_ORDERS == {"tasks_limit_pending"}, (name, plans[name])
    # A key's state row: one lookup per key asked, never the queue's rows
    # each compared with every key of the array.
    for name in ("limit_read_keys", "limit_lock_keys"):
        assert re.search(r"Index Cond: \(\(queue = \$1\) AND \(key = \w+\.key\)\)", plans[name]), (
            name,
            plans[name],
        )
    # A limited claim's tasks without a key: their own index, never a walk of
    # `tasks_pending` through the keys' tasks ahead of them (schema 16).
    for name in ("limit_unkeyed", "limit_unkeyed_head"):
        assert _indexes(plans[name]) & _CLAIM_ORDERS == {"tasks_pending_unkeyed"}, (
            name,
            plans[name],
        )


#: The indexes that hold PENDING tasks in claim order: each walk seeks one.
_CLAIM_ORDERS = {
    "tasks_pending",
    "tasks_pending_type",
    "tasks_pending_unkeyed",
    "tasks_pending_unkeyed_type",
}


#: The indexes that hold keyed PENDING tasks in claim order, by key.
_KEY_ORDERS = {"tasks_limit_pending", "tasks_limit_pending_type"}


def _indexes(plan: str) -> set[str]:
    return set(re.findall(r" using (\w+) on ", plan))


def test_a_backlog_on_a_table_never_analyzed_is_claimed_by_index_seeks(
    engine: SyncEngine,
) -> None:
    """Property: a claim costs the same whatever the backlog behind it --
    with no statistics at all (a fresh database, autovacuum not yet round),
    the claim, the wake-up and the keyed limits' count seek the
    state-specific indexes; no plan reads and sorts the queue's active
    tasks (before schema 14: 27 ms a claim at 40,000 tasks, a third of the
    throughput). A claim and a wake-up of some task types seek each type's
    own tasks (`tasks_pending_type`), never the backlog of its types or of
    others (schema 15), also on a queue with keyed limits, where one key
    holds a backlog as deep of another type (schema 17)."""
    _fill(engine, PENDING)
    _fill(engine, PENDING, "k:big", "b")
    _assert_seeks(_claim_path_plans(engine))


def test_a_lease_is_found_by_its_task_id_on_a_small_table_never_analyzed(
    engine: SyncEngine,
) -> None:
    """Property: every statement that acts on one task's lease (ack, nack,
    reject, renewal, progress, a group commit with and without deleting)
    finds it by one `tasks_id` lookup, also on a small table never analyzed
    whose tasks are all leased -- where `tasks_leased` once looked as
    cheap, and each ack walked every lease of the table (250 µs of
    PostgreSQL CPU per ack at 640 leases against ~35), on every connection
    whose plan was made then, until an ANALYZE."""
    _fill(engine, LEASED, count=640)
    settle = engine.raw._sql.settle  # type: ignore[attr-defined]
    ref = "'a', 1, 'x', 1"
    group = "'{a}', '{1}', '{x}', '{0}', '{NULL}', '{NULL}', '{NULL}', 1"
    plans = generic_plans(
        engine,
        {
            "ack": (settle.ack, f"{ref}, NULL"),
            "nack": (settle.nack, f"{ref}, 'e', NULL"),
            "reject": (settle.reject, f"{ref}, 'e'"),
            "extend": (settle.extend, f"{ref}, 2"),
            "progress": (settle.progress, f"{ref}, 1, 2, 'm'"),
            "settle_many": (settle.settle_many, group),
            "settle_many_deleting": (settle.settle_many_deleting, f"{group}, '{{}}'"),
        },
    )
    for name, plan in plans.items():
        assert "using tasks_id on" in plan, (name, plan)
        assert "tasks_leased" not in plan, (name, plan)


def test_a_backlog_after_a_drained_queue_was_analyzed_is_claimed_by_index_seeks(
    engine: SyncEngine,
) -> None:
    """Property: statistics taken while the queue was drained (every task
    finished, none PENDING or LEASED) do not turn the claim of the next
    burst into a walk of the queue."""
    _fill(engine, SUCCEEDED)
    _execute(engine, f"ANALYZE {_tasks(engine)}")
    _fill(engine, PENDING)
    _fill(engine, PENDING, "k:big", "b")
    _assert_seeks(_claim_path_plans(engine))


def test_a_keyed_backlog_of_another_type_once_analyzed_is_not_walked(
    engine: SyncEngine,
) -> None:
    """Property: with statistics that know a key's deep backlog of one type
    (autovacuum analyzes a table as a backlog grows), a claim and a wake-up
    of other types on a queue with keyed limits still find their keys and
    each key's tasks by seeks per type (`tasks_limit_pending_type`), never a
    walk of `tasks_limit_pending` through that key's backlog (spelled
    `state = PENDING`, the typed statements' generic plan took it: 10 ms a
    claim behind one key's 25,000 tasks of another type)."""
    _fill(engine, PENDING, "k:big", "b")
    _execute(engine, f"ANALYZE {_tasks(engine)}")
    plans = _claim_path_plans(engine)
    for name in ("limit_keys_typed", "limit_key_heads_typed", "limit_heads_typed"):
        assert _indexes(plans[name]) & _KEY_ORDERS == {"tasks_limit_pending_type"}, (
            name,
            plans[name],
        )
        assert "Seq Scan on tasks" not in plans[name], (name, plans[name])


def test_purge_and_retention_after_an_analyze_without_finished_tasks_walk_by_age(
    engine: SyncEngine,
) -> None:
    """Property: statistics taken before any task finished do not turn a
    purge, a retention pass or a bulk retry into a read and sort of every
    finished task of the queue (or of every queue), nor into a walk of
    other queues' old tasks: each walks `tasks_finished_queue`, the
    queue's own oldest first."""
    _fill(engine, PENDING)
    _execute(engine, f"ANALYZE {_tasks(engine)}")
    _fill(engine, DEAD)
    operate = engine.raw._sql.operate  # type: ignore[attr-defined]
    plans = generic_plans(
        engine,
        {
            "purge": (operate.delete_finished_queue, f"'{{4}}', 1000000, 100, '{QUEUE}'"),
            "retention": (operate.delete_finished, "'{4}', 1000000, 100"),
            "retry_dead": (operate.retry_dead, f"'{QUEUE}', 1000000, 100, 2000000, NULL"),
        },
    )
    for name, plan in plans.items():
        assert "tasks_finished_queue" in plan, (name, plan)
        for walk in ("Seq Scan on tasks", "tasks_finished ", "tasks_finished_age"):
            assert walk not in plan, (name, plan)
        # Sorted are the rows the walks picked (`c`), never a table's rows.
        assert "Sort Key: tasks" not in plan, (name, plan)


def test_activity_counts_without_types_stop_at_the_cap(engine: SyncEngine) -> None:
    """Property: GetQueueActivity counts PENDING and LEASED tasks together,
    of the types asked (all without), exactly up to the cap, also for rows
    changed by statements of their own (the count triggers see them), and
    leaves out tasks not yet due when asked to. Without `due_by` it reads
    the counts, never the tasks: a drained queue's index entries and rows
    (no vacuum yet) cost a poll nothing (it walked up to 1,000 of them and
    their rows, ~10 ms of PostgreSQL's CPU per poll behind a busy worker)."""
    _fill(engine, PENDING)
    t = _tasks(engine)
    _execute(
        engine,
        f"UPDATE {t} SET state = {LEASED}, lease_until = 5"
        f" WHERE seq IN (SELECT seq FROM {t} ORDER BY seq LIMIT 30)",
    )
    f = '"' + engine.raw.schema + '"'  # type: ignore[attr-defined]

    async def due_counts() -> list[int]:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            return [
                # Due by 100: the 30 leased and the PENDING tasks available at 31..100.
                await conn.fetchval(f"SELECT {f}.ringo_due_activity($1, NULL, 1000, 100)", QUEUE),
                await conn.fetchval(
                    f"SELECT {f}.ringo_due_activity($1, ARRAY['t'], 1000, 100)", QUEUE
                ),
            ]

    assert engine.activity(QUEUE, []) == MAX_ACTIVITY_COUNT
    assert engine.activity(QUEUE, ["x"]) == 0
    _execute(engine, f"UPDATE {t} SET state = {SUCCEEDED} WHERE seq > 500")
    assert engine.activity(QUEUE, []) == 500
    assert engine.activity(QUEUE, ["t", "x"]) == 500
    assert engine.run(due_counts()) == [100, 100]
    sql = engine.raw._sql  # type: ignore[attr-defined]
    plans = generic_plans(
        engine,
        {
            "active": (sql.listing.active, f"'{QUEUE}', NULL"),
            "active_typed": (sql.listing.active, f"'{QUEUE}', '{{t}}'"),
        },
    )
    for name, plan in plans.items():
        read = set(re.findall(r" on (\w+)", plan))
        assert read <= {"task_counts", "task_counts_pkey", "task_count_deltas"}, (name, plan)


def test_the_typed_pending_term_admits_pending_alone(engine: SyncEngine) -> None:
    """Property: `PENDING_BY_TYPE`, how the typed statements and
    `tasks_pending_type` spell PENDING, admits PENDING and no other state a
    task is stored in (a state numbered below PENDING would break it)."""
    stored = [int(s) for s in TaskState if s != TaskState.UNSPECIFIED]

    async def admitted() -> list[int]:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            rows = await conn.fetch(
                f"SELECT state FROM unnest($1::smallint[]) AS t(state) WHERE {PENDING_BY_TYPE}",
                stored,
            )
            return [r[0] for r in rows]

    assert engine.run(admitted()) == [PENDING]
