"""What only the SQLite engine has: its file, pragmas, schema versions, transactions
and query plans."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import re
import sqlite3
import stat
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT
from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import SchemaTooNew
from ringo_trio.server.storage.limits import RECHECK_US, Rule
from ringo_trio.server.storage.rows import FINISHED
from ringo_trio.server.storage.sqlite import SCHEMA_VERSION, SQLiteEngine
from ringo_trio.server.storage.sqlite import claim as sqlite_claim
from ringo_trio.server.storage.sqlite import engine as sqlite_engine
from ringo_trio.server.storage.sqlite import limits as sqlite_limits
from ringo_trio.server.storage.sqlite import schema as sqlite_schema
from ringo_trio.server.storage.sqlite import settle as sqlite_settle
from ringo_trio.server.storage.sqlite import upkeep as sqlite_upkeep
from tests._kit.storage import ENGINE_KINDS, LEASE, SyncEngine, claim_one, open_engine, ref_of, spec
from tests._kit.storage import checkpointed as _checkpointed
from tests._kit.storage import run_and_kill as _run_and_kill
from tests._kit.storage import wal_header as _wal_header


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture
def db_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "data" / "ringo.db"


@pytest.fixture
def sqlite(tmp_path: pathlib.Path) -> Iterator[SyncEngine]:
    with open_engine(ENGINE_KINDS["sqlite"], tmp_path) as sync:
        yield sync


def _conn(engine: SyncEngine) -> sqlite3.Connection:
    db = engine.raw._db  # type: ignore[attr-defined]
    assert isinstance(db, sqlite3.Connection)
    return db


def test_the_database_is_wal_with_synchronous_normal(sqlite: SyncEngine) -> None:
    """Durable across kill -9 needs WAL + synchronous >= NORMAL; a busy timeout keeps a
    second reader/writer of the file (a CLI) from failing the daemon at once."""
    db = _conn(sqlite)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000
    assert db.isolation_level is None


def test_open_creates_the_file_and_its_directory(
    runner: asyncio.Runner, db_path: pathlib.Path
) -> None:
    """The engine's path is the database file itself; missing parents are created."""
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    runner.run(engine.open())  # a second open is a no-op
    runner.run(engine.close())
    assert db_path.is_file()
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def _mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_database_and_its_files_are_ours_alone(
    runner: asyncio.Runner, tmp_path: pathlib.Path
) -> None:
    """Property: payloads and results sit in the database, its WAL and its
    shared-memory file, so each is readable by the daemon's user only
    (0600) whatever the umask, in a directory of its own made 0700 with
    every missing parent; files an older daemon (or a copy) left readable
    to others are tightened when the engine opens them."""
    path = tmp_path / "a" / "b" / "ringo.db"
    engine = SQLiteEngine(path)
    runner.run(engine.open())
    try:
        runner.run(engine.enqueue("q", [spec(payload=b"secret")], ManualClock().now()))
        files = [path, path.with_name("ringo.db-wal"), path.with_name("ringo.db-shm")]
        assert [_mode(f) for f in files] == [0o600] * 3
        assert _mode(path.parent) == 0o700
        for f in files:
            f.chmod(0o644)
        # A second engine on the same files, as a restarted daemon would find them.
        again = SQLiteEngine(path)
        runner.run(again.open())
        runner.run(again.close())
        assert [_mode(f) for f in files] == [0o600] * 3
    finally:
        runner.run(engine.close())


def test_close_is_idempotent_and_a_closed_engine_refuses_calls(
    runner: asyncio.Runner, db_path: pathlib.Path
) -> None:
    """close() twice is fine; a call on a closed engine fails loudly instead of
    reopening behind the caller's back."""
    engine = SQLiteEngine(db_path)
    with pytest.raises(RuntimeError, match="not open"):
        runner.run(engine.activity("q", []))
    runner.run(engine.open())
    runner.run(engine.close())
    runner.run(engine.close())
    with pytest.raises(RuntimeError, match="not open"):
        runner.run(engine.expire_leases(ManualClock().now()))


def test_a_newer_schema_is_refused_and_left_untouched(
    runner: asyncio.Runner, db_path: pathlib.Path
) -> None:
    """A database written by a newer ringo_trio is refused with a clear error naming
    both versions, and is not modified."""
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    runner.run(engine.close())
    with sqlite3.connect(db_path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    before = db_path.read_bytes()
    with pytest.raises(SchemaTooNew, match=rf"version {SCHEMA_VERSION + 1} is newer"):
        runner.run(SQLiteEngine(db_path).open())
    assert db_path.read_bytes() == before


def test_migrations_apply_in_order_on_open(
    runner: asyncio.Runner, db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older database is brought to the current version by the missing migrations,
    in order, and keeps its data."""
    clock = ManualClock()
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    [out] = runner.run(engine.enqueue("q", [spec(unique_key="k")], clock.now()))
    runner.run(engine.close())
    extra = (
        ("CREATE TABLE m2 (step INTEGER)", "INSERT INTO m2 VALUES (2)"),
        ("INSERT INTO m2 SELECT max(step) + 1 FROM m2",),
    )
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS + extra)
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    assert runner.run(engine.get("q", unique_key="k")) == out.task
    runner.run(engine.close())
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 2
        assert raw.execute("SELECT step FROM m2 ORDER BY step").fetchall() == [(2,), (3,)]
    raw.close()


def test_a_failed_migration_changes_nothing(
    runner: asyncio.Runner, db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migrations run in one transaction: when one fails, the version and the schema
    are as before, and the old code can still open the database."""
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    runner.run(engine.close())
    bad = (("CREATE TABLE half_done (x INTEGER)", "THIS IS NOT SQL"),)
    with monkeypatch.context() as m:
        m.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS + bad)
        m.setattr(sqlite_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        with pytest.raises(sqlite3.OperationalError):
            runner.run(SQLiteEngine(db_path).open())
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        names = {r[0] for r in raw.execute("SELECT name FROM sqlite_master")}
        assert "half_done" not in names
    raw.close()
    engine = SQLiteEngine(db_path)
    runner.run(engine.open())
    runner.run(engine.close())


def _explode(*args: Any) -> Any:
    raise RuntimeError("injected failure after the write")


def test_a_failed_call_rolls_back_its_writes(
    sqlite: SyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed call changes nothing: an exception after the UPDATE ran (while the reply
    is built) rolls the transaction back -- the ack did not happen, the lease is live."""
    clock = ManualClock()
    sqlite.enqueue("q", [spec()], clock.now())
    lt = claim_one(sqlite, clock.now())
    before = sqlite.get("q", task_id=lt.task.id)
    with monkeypatch.context() as m:
        m.setattr(sqlite_engine, "row_task", _explode)
        with pytest.raises(RuntimeError, match="injected"):
            sqlite.ack(ref_of(lt), clock.now())
    assert not _conn(sqlite).in_transaction
    assert sqlite.get("q", task_id=lt.task.id) == before
    assert sqlite.ack(ref_of(lt), clock.now()).state == TaskState.SUCCEEDED


def test_a_failed_claim_leases_nothing_and_expires_nothing(
    sqlite: SyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim is one transaction, its expiry pass included: when it fails, the overdue
    lease is still as it was and the pending task was not leased."""
    clock = ManualClock()
    [_, waiting] = sqlite.enqueue("q", [spec(), spec()], clock.now())
    old = claim_one(sqlite, clock.now())
    clock.advance(2 * LEASE)
    before = [sqlite.get("q", task_id=old.task.id), sqlite.get("q", task_id=waiting.task.id)]
    with monkeypatch.context() as m:
        m.setattr(sqlite_claim, "leased", _explode)
        with pytest.raises(RuntimeError, match="injected"):
            sqlite.claim("q", [], 5, "w", LEASE, clock.now())
    after = [sqlite.get("q", task_id=old.task.id), sqlite.get("q", task_id=waiting.task.id)]
    assert after == before
    assert after[0].state == TaskState.LEASED
    assert after[1].attempt == 0
    [lt] = sqlite.claim("q", [], 5, "w", LEASE, clock.now())  # the old one is backing off
    assert lt.task.id == waiting.task.id


def test_committed_work_lives_in_the_wal_until_checkpoint(sqlite: SyncEngine) -> None:
    """The kill -9 test really exercises WAL recovery: after the kill the work is in the
    -wal file (not checkpointed into the main file), and reopening recovers it."""
    out = _run_and_kill(ENGINE_KINDS["sqlite"], sqlite)
    wal = sqlite.scratch / "ringo.db-wal"
    assert wal.stat().st_size > 0
    sqlite.reopen()
    assert sqlite.activity("q", []) == 5
    assert len(out) == 8


def test_ids_and_tokens_have_the_documented_shape(sqlite: SyncEngine) -> None:
    """Task ids are 32 hex digits (ms time prefix + random); lease tokens are
    secrets.token_hex(16)."""
    clock = ManualClock()
    [out] = sqlite.enqueue("q", [spec()], clock.now())
    assert re.fullmatch(r"[0-9a-f]{32}", out.task.id)
    ms = int((clock.now().timestamp()) * 1000)
    assert int(out.task.id[:12], 16) == ms
    lt = claim_one(sqlite, clock.now())
    assert lt.lease is not None
    assert re.fullmatch(r"[0-9a-f]{32}", lt.lease.lease_token)


_PARAMS = {
    "queue": "q",
    "now": 0,
    "prio": 0,
    "limit": 1,
    "worker": "w",
    "until": 0,
    "t0": "t",
    "t1": "u",
    "delay": None,
    "error": "",
    "id": "x",
    "attempt": 1,
    "token": "x",
    "seq": 1,
    "current": 0.0,
    "total": 0.0,
    "message": "",
    "result": None,
    "key": "k",
    "n": 1,
}


_UNKEYED = sqlite_schema.UNKEYED_PENDING
_KEY = f"limit_key = :key AND {sqlite_schema.LIMIT_PENDING}"
_UNKEYED_TYPE = "tasks_pending_unkeyed_type"


@pytest.mark.parametrize(
    ("name", "sql", "index"),
    [
        ("claim", sqlite_claim.claim_sql(0, False), "tasks_pending"),
        ("claim-typed", sqlite_claim.claim_sql(1, False), "tasks_pending_type"),
        ("claim-rest", sqlite_claim.claim_sql(0, True), "tasks_pending"),
        ("claim-typed-rest", sqlite_claim.claim_sql(1, True), "tasks_pending_type"),
        ("top-priority", sqlite_claim.priority_sql(0, False), "tasks_pending"),
        ("next-priority", sqlite_claim.priority_sql(0, True), "tasks_pending"),
        ("top-priority-typed", sqlite_claim.priority_sql(2, False), "tasks_pending_type"),
        ("next-priority-typed", sqlite_claim.priority_sql(2, True), "tasks_pending_type"),
        ("soonest", sqlite_claim.soonest_sql(0, False), "tasks_pending"),
        ("soonest-typed", sqlite_claim.soonest_sql(2, False), "tasks_pending_type"),
        ("limited-unkeyed", sqlite_claim.due_sql(0, False, _UNKEYED), "tasks_pending_unkeyed"),
        ("limited-unkeyed-rest", sqlite_claim.due_sql(0, True, _UNKEYED), "tasks_pending_unkeyed"),
        ("unkeyed-priority", sqlite_claim.priority_sql(0, True, _UNKEYED), "tasks_pending_unkeyed"),
        ("unkeyed-soonest", sqlite_claim.soonest_sql(0, False, _UNKEYED), "tasks_pending_unkeyed"),
        ("limited-unkeyed-typed", sqlite_claim.due_sql(1, False, _UNKEYED), _UNKEYED_TYPE),
        ("limited-unkeyed-typed-rest", sqlite_claim.due_sql(1, True, _UNKEYED), _UNKEYED_TYPE),
        ("unkeyed-priority-typed", sqlite_claim.priority_sql(2, True, _UNKEYED), _UNKEYED_TYPE),
        ("unkeyed-soonest-typed", sqlite_claim.soonest_sql(2, False, _UNKEYED), _UNKEYED_TYPE),
        ("key-priority", sqlite_claim.priority_sql(0, True, _KEY), "tasks_limit_pending"),
        ("key-soonest", sqlite_claim.soonest_sql(0, True, _KEY), "tasks_limit_pending"),
        ("key-heads-untyped", sqlite_limits.heads_sql(0), "tasks_limit_pending"),
        ("key-soonest-untyped", sqlite_limits.key_heads_sql(0), "tasks_limit_pending"),
        ("keys-untyped", sqlite_limits.keys_sql(0), "tasks_limit_pending"),
        ("keys-typed", sqlite_limits.keys_sql(2), "tasks_limit_pending_type"),
        ("key-heads-typed", sqlite_limits.heads_sql(1), "tasks_limit_pending_type"),
        ("key-soonest-typed", sqlite_limits.key_heads_sql(2), "tasks_limit_pending_type"),
        ("key-leases", sqlite_limits.LEASED_BY_KEY, "tasks_limit_leased"),
        ("expire-queue", sqlite_settle.EXPIRE_QUEUE, "tasks_leased"),
        ("expire-all", sqlite_settle.EXPIRE_ALL, "tasks_leased"),
        ("ack", sqlite_settle.ACK, "tasks_id"),
        ("nack", sqlite_settle.NACK, "tasks_id"),
    ],
)
def test_hot_statements_use_their_index(
    sqlite: SyncEngine, name: str, sql: str, index: str
) -> None:
    """Claim, expiry and lease operations are index searches, never a scan of the task
    table (which holds every finished task too)."""
    positional = sql.count("?")
    params: Any = ("q", 0)[:positional] if positional else _PARAMS
    plan = [r[3] for r in _conn(sqlite).execute("EXPLAIN QUERY PLAN " + sql, params)]
    indexes = re.findall(r"INDEX (\w+)", " ".join(plan))
    assert index in indexes, plan
    # Each statement seeks its own index alone, none of the other claim orders.
    assert not [i for i in indexes if i.startswith("tasks_pending") and i != index], plan
    assert not [s for s in plan if s.startswith("SCAN tasks") and "USING" not in s], plan
    if name not in _SORTS_THE_KEYS_FOUND:
        assert not [s for s in plan if "TEMP B-TREE" in s], plan


#: Statements that merge the keys each claimed type's walk found (at most
#: `MAX_LIMIT_KEYS_PER_CLAIM` per type): they sort those, never tasks.
_SORTS_THE_KEYS_FOUND = {"keys-typed", "key-soonest-typed"}


def test_claim_does_not_walk_scheduled_tasks(sqlite: SyncEngine) -> None:
    """Tasks scheduled far ahead at the top priority do not slow a claim down: the walk
    seeks per priority, so the number of rows SQLite steps over stays tiny."""
    clock = ManualClock()
    sqlite.enqueue(
        "q", [spec(priority=9, delay=timedelta(days=1)) for _ in range(1000)], clock.now()
    )
    [due] = sqlite.enqueue("q", [spec(priority=0)], clock.now())
    [lt], steps = _vm_steps(sqlite, lambda: sqlite.claim("q", [], 1, "w", LEASE, clock.now()))
    assert lt.task.id == due.task.id
    # Scanning the 1000 scheduled entries takes tens of thousands of instructions.
    assert steps < 50, steps


def _priority_seeks(sqlite: SyncEngine, call: Any) -> tuple[Any, int]:
    """`call()`'s result and how many priority seeks (`claim.priority_sql`)
    SQLite ran for it."""

    def seeks(db: sqlite3.Connection, count: Any) -> None:
        db.set_trace_callback(None if count is None else lambda sql: count("max(priority)" in sql))

    return _counted(sqlite, call, seeks)


@pytest.mark.parametrize("types", [[], ["t"]], ids=["any", "typed"])
def test_a_walk_of_many_priorities_seeks_a_bounded_number_of_them(
    sqlite: SyncEngine, types: list[str]
) -> None:
    """Property: a claim and a wake-up run a bounded number of statements on
    the daemon's only loop, however many distinct priorities the queue holds:
    the walk seeks priority by priority only `PRIORITY_PROBES` times, then
    scans the rest in one statement; and it stops as soon as it has its
    answer (a claim once it has its tasks, a wake-up once a task is due),
    without seeking the priorities below."""
    probes = sqlite_claim.PRIORITY_PROBES
    clock = ManualClock()
    # 200 distinct priorities, each task scheduled a day ahead, and one due
    # task below them all.
    sqlite.enqueue(
        "q",
        [spec("t", priority=p, delay=timedelta(days=1)) for p in range(-99, 101)],
        clock.now(),
    )
    [due] = sqlite.enqueue("q", [spec("t", priority=-100)], clock.now())
    wake, wake_seeks = _priority_seeks(sqlite, lambda: sqlite.next_wakeup("q", types, clock.now()))
    claimed, claim_seeks = _priority_seeks(
        sqlite, lambda: sqlite.claim("q", types, 10, "w", LEASE, clock.now())
    )
    assert wake == clock.now()
    assert [lt.task.id for lt in claimed] == [due.task.id]
    assert (claim_seeks, wake_seeks) == (probes + 1, probes + 1)
    # Tasks due now at the top priority: the claim of as many and the
    # wake-up read that priority alone.
    top = sqlite.enqueue("q", [spec("t", priority=200) for _ in range(3)], clock.now())
    wake, wake_seeks = _priority_seeks(sqlite, lambda: sqlite.next_wakeup("q", types, clock.now()))
    claimed, claim_seeks = _priority_seeks(
        sqlite, lambda: sqlite.claim("q", types, 3, "w", LEASE, clock.now())
    )
    assert wake == clock.now()
    assert [lt.task.id for lt in claimed] == [o.task.id for o in top]
    assert (claim_seeks, wake_seeks) == (1, 1)


def test_a_typed_claim_does_not_walk_other_types(sqlite: SyncEngine) -> None:
    """Property: a claim of some task types (every registry's worker makes
    one), its wake-up and the merge of several types cost the same however
    many tasks of other types wait ahead of them: each type is walked on its
    own (`tasks_pending_type`). Before schema 15 the claim walked
    `tasks_pending` through every task of other types ahead of its own
    (50,000 ahead: 7.7 ms a claim of 64, on the daemon's only loop)."""
    clock = ManualClock()
    sqlite.enqueue("q", [spec("b") for _ in range(1000)], clock.now())
    mine = sqlite.enqueue("q", [spec(t) for t in ("a", "c", "a", "c")], clock.now())
    sqlite.enqueue("q", [spec("d", delay=timedelta(seconds=5))], clock.now())
    first, one_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", ["a"], 1, "w", LEASE, clock.now())
    )
    rest, two_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", ["c", "a", "x"], 10, "w", LEASE, clock.now())
    )
    wake, wake_steps = _vm_steps(sqlite, lambda: sqlite.next_wakeup("q", ["d", "x"], clock.now()))
    assert [lt.task.id for lt in first + rest] == [o.task.id for o in mine]
    assert wake == clock.now() + timedelta(seconds=5)
    # Walking the 1,000 tasks of type b takes over 300 steps.
    assert max(one_steps, two_steps, wake_steps) < 50, (one_steps, two_steps, wake_steps)


def test_a_limited_claim_does_not_walk_a_keys_backlog(sqlite: SyncEngine) -> None:
    """Property: on a queue with keyed limits, a claim, a claim that finds
    nothing and the wake-up cost the same however many tasks of a key held
    by its rule wait: the unkeyed tasks are walked on their own
    (`tasks_pending_unkeyed`, schema 16), priority by priority, and a key's
    soonest task is found priority by priority. Before, each of them read
    the key's whole backlog (50,000 ahead: 8.5 ms a claim of 64, 9.7 ms a
    wake-up, on the daemon's only loop; bench/claim_backlog.py)."""
    clock = ManualClock()
    sqlite.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), clock.now())
    backlog = sqlite.enqueue("q", [spec(limit_key="k:big") for _ in range(2000)], clock.now())
    # Far ahead, at the top priority: a walk by priority never reads them.
    sqlite.enqueue(
        "q", [spec(priority=9, delay=timedelta(days=1)) for _ in range(300)], clock.now()
    )
    mine = sqlite.enqueue("q", [spec(), spec(priority=1), spec()], clock.now())
    claimed, claim_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", [], 10, "w", LEASE, clock.now())
    )
    idle, idle_steps = _vm_steps(sqlite, lambda: sqlite.claim("q", [], 10, "w", LEASE, clock.now()))
    wake, wake_steps = _vm_steps(sqlite, lambda: sqlite.next_wakeup("q", [], clock.now()))
    # The key's first task (its one slot) and the unkeyed due ones, in claim order.
    assert [lt.task.id for lt in claimed] == [
        mine[1].task.id,
        backlog[0].task.id,
        mine[0].task.id,
        mine[2].task.id,
    ]
    assert idle == []
    # Held by its concurrency alone, the key is tried again after `RECHECK_US`.
    assert wake == clock.now() + timedelta(microseconds=RECHECK_US)
    # Reading the key's 2,000 tasks takes over 120 steps.
    assert max(claim_steps, idle_steps, wake_steps) < 40, (claim_steps, idle_steps, wake_steps)


def test_a_typed_limited_claim_walks_each_keys_own_tasks(sqlite: SyncEngine) -> None:
    """Property: on a queue with keyed limits, a claim and a wake-up naming
    one task type (a registry's worker of one type) read each key's own
    tasks, however many tasks of that type other keys hold: before, SQLite
    took `tasks_pending_type` for each key's heads and walked every task of
    the type, once per key."""
    clock = ManualClock()
    sqlite.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), clock.now())
    sqlite.enqueue("q", [spec(limit_key="k:big") for _ in range(2000)], clock.now())
    small = sqlite.enqueue("q", [spec(limit_key=f"k:{i}") for i in range(5)], clock.now())
    claimed, claim_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", ["t"], 10, "w", LEASE, clock.now())
    )
    wake, wake_steps = _vm_steps(sqlite, lambda: sqlite.next_wakeup("q", ["t"], clock.now()))
    assert {lt.task.id for lt in claimed} == {o.task.id for o in small} | {
        lt.task.id for lt in claimed if lt.task.limit_key == "k:big"
    }
    assert len(claimed) == 6  # one of each key: concurrency 1
    assert wake == clock.now() + timedelta(microseconds=RECHECK_US)
    # Walking the type's 2,000 tasks once per key takes thousands of steps.
    assert max(claim_steps, wake_steps) < 60, (claim_steps, wake_steps)


def test_a_typed_limited_claim_does_not_walk_other_types(sqlite: SyncEngine) -> None:
    """Property: on a queue with keyed limits, a claim of some task types
    (a registry's worker), the merge of several types and the wake-up cost
    the same however many tasks of other types wait ahead of them, without
    a key or under one, or tasks of its types under a key its rule holds:
    each type's tasks without a key, and each type's tasks of a key, are
    walked on their own (`tasks_pending_unkeyed_type`,
    `tasks_limit_pending_type`, schema 17). Before, the claim walked
    `tasks_pending_unkeyed` through every unkeyed task of other types ahead
    of its own (50,000 ahead: 18 ms a claim of 64, 14 ms a wake-up, on the
    daemon's only loop; bench/claim_backlog.py --case typed_limited), and a
    key's tasks of every type."""
    clock = ManualClock()
    sqlite.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), clock.now())
    sqlite.enqueue("q", [spec("b") for _ in range(1000)], clock.now())
    # A key that may start a task, with a backlog of another type.
    sqlite.enqueue("q", [spec("b", limit_key="k:2") for _ in range(1000)], clock.now())
    # A key held by its rule, with a backlog of the claimed type.
    big = sqlite.enqueue("q", [spec("a", limit_key="k:big") for _ in range(1000)], clock.now())
    held = sqlite.claim("q", ["a"], 1, "w", LEASE, clock.now())
    assert [lt.task.id for lt in held] == [big[0].task.id]
    mine = sqlite.enqueue(
        "q", [spec(t, priority=p) for t, p in (("a", 0), ("c", 1), ("a", 0), ("c", 0))], clock.now()
    )
    keyed = sqlite.enqueue("q", [spec("a", limit_key="k:1")], clock.now())
    sqlite.enqueue("q", [spec("d", delay=timedelta(seconds=5))], clock.now())
    first, one_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", ["a"], 1, "w", LEASE, clock.now())
    )
    rest, two_steps = _vm_steps(
        sqlite, lambda: sqlite.claim("q", ["c", "a", "x"], 10, "w", LEASE, clock.now())
    )
    wake, wake_steps = _vm_steps(sqlite, lambda: sqlite.next_wakeup("q", ["d", "a"], clock.now()))
    # Claim order, keyed or not: priority, then enqueue order.
    assert [lt.task.id for lt in first] == [mine[0].task.id]
    assert [lt.task.id for lt in rest] == [
        mine[1].task.id,
        mine[2].task.id,
        mine[3].task.id,
        keyed[0].task.id,
    ]
    # The held key is tried again after `RECHECK_US`, before the d task's 5 s.
    assert wake == clock.now() + timedelta(microseconds=RECHECK_US)
    # Walking the 1,000 tasks of type b, keyed or not, takes over 100 steps.
    assert max(one_steps, two_steps, wake_steps) < 50, (one_steps, two_steps, wake_steps)


def test_watch_returns_at_once(sqlite: SyncEngine) -> None:
    """No other process writes the SQLite file (the data dir is locked): there is
    nothing to watch, so watch returns at once without calling notify."""
    seen: list[str | None] = []
    sqlite.watch(seen.append)
    assert seen == []


@pytest.mark.parametrize("types", [[], ["t"]], ids=["any", "typed"])
def test_a_claim_among_many_keys_walks_a_bounded_number_of_them(
    sqlite: SyncEngine, types: list[str]
) -> None:
    """Property: a limited claim and its wake-up look at
    `MAX_LIMIT_KEYS_PER_CLAIM` keys however many the queue holds (of the
    claimed types too): with 1,100 and then 2,200 keys, each held by its
    concurrency with a task waiting, their SQLite VM steps stay the same
    (within 5 %); a keys walk that does not stop at the cap reads every key
    (+50 % steps at 2,200 keys)."""
    now = ManualClock().now()
    sqlite.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), now)
    steps = []
    for first, end in ((0, 1_100), (1_100, 2_200)):
        keyed = [spec("t", limit_key=f"k:{i:05}") for i in range(first, end) for _ in range(2)]
        sqlite.enqueue("q", keyed, now)
        while sqlite.claim("q", [], 1_000, "w", LEASE, now):
            pass  # one lease per key: every key held, one task waiting
        claimed, claim_steps = _vm_steps(
            sqlite, lambda: sqlite.claim("q", types, 10, "w", LEASE, now)
        )
        wake, wake_steps = _vm_steps(sqlite, lambda: sqlite.next_wakeup("q", types, now))
        assert claimed == []
        assert wake is not None
        assert wake > now  # the keys' concurrency recheck
        steps.append((claim_steps, wake_steps))
    (claim_few, wake_few), (claim_many, wake_many) = steps
    assert claim_many <= claim_few * 1.05
    assert wake_many <= wake_few * 1.05


def _counted(
    sqlite: SyncEngine, call: Any, hook: Callable[[sqlite3.Connection, Any], None]
) -> tuple[Any, int]:
    """`call()`'s result and how many times what `hook` installs on the
    connection counted (`hook(db, None)` removes it)."""
    db = _conn(sqlite)
    counted = 0

    def count(add: int) -> None:
        nonlocal counted
        counted += add

    hook(db, count)
    try:
        return call(), counted
    finally:
        hook(db, None)


def _vm_steps(sqlite: SyncEngine, call: Any) -> tuple[Any, int]:
    """`call()`'s result and how many 100-instruction steps SQLite ran for it."""

    def steps(db: sqlite3.Connection, count: Any) -> None:
        if count is None:
            db.set_progress_handler(None, 0)
        else:
            db.set_progress_handler(lambda: count(1) or 0, 100)

    return _counted(sqlite, call, steps)


def test_activity_does_not_walk_the_backlog(sqlite: SyncEngine) -> None:
    """GetQueueActivity runs on the daemon's only event loop, polled 4x/s by
    every idle worker: it reads the queue's counts (a row per type and
    state), never its tasks, so it costs a few steps however deep the queue
    and whatever the type filter."""
    clock = ManualClock()
    for _ in range(10):
        sqlite.enqueue("q", [spec("t") for _ in range(1000)], clock.now())
    sqlite.enqueue("q", [spec("b") for _ in range(3)], clock.now())
    other, other_steps = _vm_steps(sqlite, lambda: sqlite.activity("q", ["other"]))
    typed, typed_steps = _vm_steps(sqlite, lambda: sqlite.activity("q", ["b"]))
    deep, deep_steps = _vm_steps(sqlite, lambda: sqlite.activity("q", []))
    assert (other, typed, deep) == (0, 3, MAX_ACTIVITY_COUNT)
    # Reading the counts is a step or two; walking the 1,000 index entries
    # the cap allows took about 90, counting the 10,000-task backlog ~900.
    assert other_steps < 5, other_steps
    assert typed_steps < 5, typed_steps
    assert deep_steps < 5, deep_steps


def test_the_finished_term_admits_exactly_the_finished_states() -> None:
    """Property: the finished-task indexes' range term holds SUCCEEDED, DEAD and
    CANCELLED and no other state (a state added above them would break it)."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE tasks (state INTEGER)")
    db.executemany("INSERT INTO tasks VALUES (?)", [(int(s),) for s in TaskState])
    admitted = db.execute(f"SELECT state FROM tasks WHERE {sqlite_schema.FINISHED_TERM}")
    assert {s for (s,) in admitted} == set(FINISHED)
    db.close()


def test_upkeep_checkpoints_the_wal_in_a_thread(sqlite: SyncEngine) -> None:
    """Property: while upkeep (`maintain`) runs, the WAL is copied back by
    its own connection in a worker thread -- the event loop's automatic
    checkpoint is moved out to a distant backstop -- so what was committed
    gets checkpointed without a COMMIT on the loop doing it; cancelled,
    upkeep hands the automatic checkpoint back at SQLite's default."""
    engine = sqlite.raw
    assert isinstance(engine, SQLiteEngine)
    db = _conn(sqlite)
    now = ManualClock().now()

    async def scenario() -> tuple[int, int, tuple[int, int]]:
        upkeep = asyncio.create_task(engine.maintain(interval=0.0))
        await asyncio.sleep(0)
        backstop = db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        # Each task's 16 KiB payload takes several pages of the WAL.
        for _ in range(40):
            await engine.enqueue("q", [spec(payload=bytes(16 * 1024))], now)
        # The writes stop; upkeep's next pass catches up (bounded wait). The
        # -shm header is the only witness, written by SQLite: polled.
        async with asyncio.timeout(10.0):
            while not _checkpointed(sqlite.scratch):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        upkeep.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await upkeep
        after = db.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        return backstop, after, _wal_header(sqlite.scratch)

    backstop, after, (logged, backfilled) = sqlite.run(scenario())
    assert backstop == sqlite_upkeep.BACKSTOP_PAGES
    assert after == 1000
    assert logged > 40  # the writes went to the WAL, short of the backstop...
    assert backfilled == logged  # ...and upkeep copied every frame back


def test_a_failed_checkpoint_is_logged_and_retried(
    sqlite: SyncEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a checkpoint that fails (a full disk, an I/O error) does
    not end upkeep -- which would end the daemon's task group -- and the
    next pass checkpoints what was committed; a run of failures is logged
    once, at its first failure, and a failure after a checkpoint that
    worked starts a new run (logged again)."""
    engine = sqlite.raw
    assert isinstance(engine, SQLiteEngine)
    real = sqlite_upkeep.off_loop
    outcomes = iter([False, False, True, False])  # then every pass works
    passes = 0
    logged_at: list[int] = []

    async def failing_at_first(db: sqlite3.Connection, sql: str) -> None:
        nonlocal passes
        passes += 1
        logged_at.extend([passes - 1] * (len(caplog.records) - len(logged_at)))
        if not next(outcomes, True):
            raise sqlite3.OperationalError("database or disk is full")
        await real(db, sql)

    monkeypatch.setattr(sqlite_engine, "off_loop", failing_at_first)
    now = ManualClock().now()

    async def until(count: int) -> None:
        async with asyncio.timeout(10.0):
            while passes < count:  # noqa: ASYNC110 (see above)
                await asyncio.sleep(0.01)

    async def scenario() -> bool:
        upkeep = asyncio.create_task(engine.maintain(interval=0.0))
        await asyncio.sleep(0.01)  # upkeep waits for commits from here on
        await engine.enqueue("q", [spec(payload=bytes(16 * 1024))], now)
        await until(3)  # failed, failed, checkpointed
        await engine.enqueue("q", [spec(payload=bytes(16 * 1024))], now)
        await until(5)  # failed, checkpointed
        async with asyncio.timeout(10.0):
            while not _checkpointed(sqlite.scratch):  # noqa: ASYNC110 (see above)
                await asyncio.sleep(0.01)
        alive = not upkeep.done()
        upkeep.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await upkeep
        return alive

    with caplog.at_level("WARNING", logger=sqlite_engine.__name__):
        assert sqlite.run(scenario())
    message = "WAL checkpoint failed (will retry): database or disk is full"
    assert [r.getMessage() for r in caplog.records] == [message, message]
    # Each logged before the pass after the failure it reports: passes 1 and 4.
    assert logged_at == [1, 4]


def test_upkeep_sleeps_while_nothing_is_committed(
    sqlite: SyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: an idle engine's upkeep waits for a commit, not on a timer
    -- no pass at all while nothing is committed, before the first commit or
    after a checkpoint -- and the first commit is checkpointed one interval
    later. (Polling, an idle daemon woke ten times a second, and a daemon on
    a test's virtual clock stepped through its days 0.1 s at a time.)"""
    engine = sqlite.raw
    assert isinstance(engine, SQLiteEngine)
    interval = 0.00123  # upkeep's passes are its sleeps of exactly this
    passes = 0
    checkpoints = 0
    real_sleep = asyncio.sleep
    real_off_loop = sqlite_upkeep.off_loop

    async def counted_sleep(delay: float) -> None:
        nonlocal passes
        passes += delay == interval
        await real_sleep(delay)

    async def counted_checkpoint(db: sqlite3.Connection, sql: str) -> None:
        nonlocal checkpoints
        checkpoints += 1
        await real_off_loop(db, sql)

    monkeypatch.setattr(sqlite_engine.asyncio, "sleep", counted_sleep)
    monkeypatch.setattr(sqlite_engine, "off_loop", counted_checkpoint)
    now = ManualClock().now()

    async def scenario() -> tuple[int, int, int]:
        upkeep = asyncio.create_task(engine.maintain(interval=interval))
        try:
            await real_sleep(0.1)  # idle: ~80 passes if it polled
            idle = passes
            await engine.enqueue("q", [spec()], now)
            async with asyncio.timeout(10.0):
                while not checkpoints:
                    await real_sleep(0.001)
            await real_sleep(0.1)  # idle again
            return idle, passes, checkpoints
        finally:
            upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upkeep

    assert sqlite.run(scenario()) == (0, 1, 1)
