"""Inspection on both engines: ListTasks paging, filters and order; exact
queue stats through every lifecycle path, restarts and the migration that
introduced them; the listing and counting statements' plans."""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ringo_trio._contract.limits import MAX_LIST_ERROR_BYTES
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage import listing as _listing
from ringo_trio.server.storage.base import Ack, LeaseLost, Nack, Push, Reject, TaskFilter
from ringo_trio.server.storage.sqlite import claim as sqlite_claim
from ringo_trio.server.storage.sqlite import listing as sqlite_listing
from ringo_trio.server.storage.sqlite import operate as sqlite_operate
from ringo_trio.server.storage.sqlite import schema as sqlite_schema
from tests._kit.storage import (
    CANCELLED,
    DEAD,
    ENGINE_KINDS,
    LEASE,
    LEASED,
    PENDING,
    SUCCEEDED,
    EngineKind,
    SyncEngine,
    brute,
    counts_of,
    expected_counts,
    open_engine,
    postgres_kind,
    ref_of,
    spec,
    undo_limits,
    walk,
)


def test_paging_never_repeats_or_skips_while_tasks_change(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: a listing walked page by page while tasks are enqueued, leased
    and finished between the pages lists every task that matched throughout
    exactly once, in enqueue order (the cursor is a key, not an offset)."""
    first = engine.enqueue("q", [spec(f"t{i % 3}") for i in range(40)], clock.now())
    original = [o.task.id for o in first]

    def churn() -> None:
        engine.enqueue("q", [spec("t0"), spec("t1")], clock.now())
        for lt in engine.claim("q", [], 2, "w", LEASE, clock.now()):
            engine.ack(ref_of(lt), clock.now())

    seen = [t.id for t in walk(engine, between=churn)]
    assert len(seen) == len(set(seen))
    assert seen[: len(original)] == original
    # Newest first, with PENDING ones only: a task PENDING all along is listed once.
    still_pending = {t.id for t in brute(engine) if t.state == PENDING}
    listed = walk(engine, where=TaskFilter(states=(PENDING,)), newest_first=True, between=churn)
    ids = [t.id for t in listed]
    assert len(ids) == len(set(ids))
    assert still_pending - {t.id for t in brute(engine) if t.state != PENDING} <= set(ids)
    seqs = [original.index(i) if i in original else 10**6 for i in ids]
    assert [s for s in seqs if s < 10**6] == sorted((s for s in seqs if s < 10**6), reverse=True)


@pytest.mark.parametrize("arms_fallback", [False, True])
def test_filters_list_exactly_the_matching_tasks_in_order(
    engine: SyncEngine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, arms_fallback: bool
) -> None:
    """Property: every combination of state, type and unique-key-prefix filter,
    oldest or newest first, lists exactly the tasks a brute-force filter
    finds, in enqueue order (or its reverse), also when the types are checked
    per row instead of by index streams."""
    if arms_fallback:
        monkeypatch.setattr(_listing, "MAX_ARMS", 1)
    now = clock.now()
    engine.enqueue("q", [spec(f"t{i % 4}", unique_key=f"{'ab'[i % 2]}{i}") for i in range(60)], now)
    engine.enqueue("other", [spec("t0", unique_key="a0")], now)
    for lt in engine.claim("q", [], 20, "w", LEASE, now)[:15]:
        if lt.task.task_type == "t1":
            engine.reject(ref_of(lt), "no", now)
        elif lt.task.task_type == "t2":
            engine.ack(ref_of(lt), now)
    everything = brute(engine)
    filters = [
        TaskFilter(),
        TaskFilter(states=(PENDING,)),
        TaskFilter(states=(LEASED, DEAD)),
        TaskFilter(task_types=("t1",)),
        TaskFilter(task_types=("t1", "t2"), states=(DEAD, SUCCEEDED)),
        TaskFilter(unique_key_prefix="a"),
        TaskFilter(unique_key_prefix="b1", states=(PENDING,)),
        TaskFilter(unique_key_prefix="a", task_types=("t0", "t3")),
        TaskFilter(states=(CANCELLED,)),
        TaskFilter(task_types=("nope",)),
    ]
    for where in filters:
        want = [
            t.id
            for t in everything
            if (not where.states or int(t.state) in where.states)
            and (not where.task_types or t.task_type in where.task_types)
            and t.unique_key.startswith(where.unique_key_prefix)
        ]
        for newest_first in (False, True):
            got = [t.id for t in walk(engine, where=where, newest_first=newest_first, limit=4)]
            assert got == (want[::-1] if newest_first else want), (where, newest_first)


def test_listed_tasks_leave_out_payload_and_result_and_cut_the_error(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: a listed task carries no payload and no result, and its
    last_error is at most MAX_LIST_ERROR_BYTES of valid UTF-8 (GetTask keeps
    it whole); the other fields are as GetTask reads them."""
    now = clock.now()
    engine.enqueue("q", [spec(payload=b"x" * 5000)], now)
    lt = engine.claim("q", [], 1, "w", LEASE, now)[0]
    engine.reject(ref_of(lt), "é" * 3000, now)
    engine.enqueue("q", [spec(payload=b"y")], now)
    lt = engine.claim("q", [], 1, "w", LEASE, now)[0]
    engine.ack(ref_of(lt), now, b"result")
    page = engine.list_tasks("q", TaskFilter(), newest_first=False, after=None, limit=10)
    dead, done = page.tasks
    assert dead.payload == b""
    assert done.payload == b""
    assert done.result is None
    assert len(dead.last_error.encode()) <= MAX_LIST_ERROR_BYTES
    assert dead.last_error == "é" * (MAX_LIST_ERROR_BYTES // 2)
    full = engine.get("q", task_id=dead.id)
    assert full.last_error == "é" * 3000
    assert full.payload == b"x" * 5000
    full.payload, full.last_error = b"", dead.last_error
    assert dead == full


def test_every_listed_task_carries_its_cursor(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: `TaskPage.seqs` holds each listed task's cursor, so a page
    cut after any of its tasks (to fit a reply) goes on with the very next
    match, whatever the filter (index streams or a walked prefix) and order."""
    now = clock.now()
    engine.enqueue("q", [spec(f"t{i % 3}", unique_key=f"{'ab'[i % 2]}{i}") for i in range(24)], now)
    engine.claim("q", [], 5, "w", LEASE, now)
    for where in (TaskFilter(), TaskFilter(unique_key_prefix="a"), TaskFilter(states=(PENDING,))):
        for newest_first in (False, True):
            page = engine.list_tasks("q", where, newest_first=newest_first, after=None, limit=50)
            assert len(page.seqs) == len(page.tasks) > 0
            ids = [t.id for t in page.tasks]
            for index, seq in enumerate(page.seqs):
                rest = engine.list_tasks("q", where, newest_first=newest_first, after=seq, limit=50)
                assert [t.id for t in rest.tasks] == ids[index + 1 :], (where, newest_first)


def test_sparse_prefix_pages_walk_a_bounded_stretch_and_go_on(
    engine: SyncEngine, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a prefix filter that matches rarely never walks more than the
    scan budget per page: the page comes back short (even empty) with a
    cursor, and following the cursors still finds every match once."""
    monkeypatch.setattr(_listing, "MAX_LIST_SCAN", 10)
    now = clock.now()
    engine.enqueue(
        "q", [spec(unique_key=("hit" if i in (3, 37) else "miss") + str(i)) for i in range(50)], now
    )
    pages = []
    after = None
    while True:
        page = engine.list_tasks(
            "q", TaskFilter(unique_key_prefix="hit"), newest_first=False, after=after, limit=5
        )
        pages.append([t.unique_key for t in page.tasks])
        if page.next_after is None:
            break
        after = page.next_after
    assert [k for p in pages for k in p] == ["hit3", "hit37"]
    assert len(pages) >= 5  # 50 tasks, 10 walked per page
    assert [] in pages


def test_task_states_answer_every_known_id_and_omit_the_rest(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: `task_states` (the batched recheck that wakes WaitTask's
    parked calls) answers the state of every task asked for that exists and
    of no other id, whatever the batch's size: 1,203 ids, more than one of
    SQLite's bound-parameter chunks, with unknown ids among them. A task
    missing from the answer reads as deleted and wakes its waiters."""
    now = clock.now()
    ids = [o.task.id for o in engine.enqueue("q", [spec() for _ in range(1_200)], now)]
    leased = engine.claim("q", [], 3, "w", LEASE, now)
    engine.ack(ref_of(leased[0]), now)
    engine.reject(ref_of(leased[1]), "broken", now)
    expected = dict.fromkeys(ids, PENDING)
    expected[leased[0].task.id] = SUCCEEDED
    expected[leased[1].task.id] = DEAD
    expected[leased[2].task.id] = LEASED
    unknown = ["01ARZ3NDEKTSV4RRFFQ69G5FAV", "not-an-id", ""]
    asked = ids[:500] + unknown[:1] + ids[500:] + unknown[1:]
    assert engine.task_states(asked) == expected
    assert engine.task_states(ids[499:502]) == {i: expected[i] for i in ids[499:502]}
    assert engine.task_states(unknown) == {}
    assert engine.task_states([]) == {}


def test_stats_count_by_state_and_type_with_oldest_due_task(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: stats count every state per type; oldest_pending_at is the
    earliest available_at among PENDING tasks that are due (scheduled ones
    are counted as pending but are never the oldest due); an unknown queue
    answers zeros; ListQueues lists non-empty queues by name after a cursor."""
    start = clock.now()
    engine.enqueue("q", [spec("a", priority=5)], start)
    clock.advance(timedelta(seconds=10))
    engine.enqueue("q", [spec("b"), spec("a", delay=timedelta(hours=1))], clock.now())
    engine.enqueue("r", [spec("a", delay=timedelta(hours=1))], clock.now())
    engine.enqueue("p", [spec("x")], clock.now())
    stats = engine.queue_stats("q", clock.now(), by_type=True)
    assert (stats.pending, stats.leased, stats.succeeded) == (3, 0, 0)
    assert stats.oldest_pending_at == start
    assert stats.as_of == clock.now()
    assert [(t.task_type, t.pending) for t in stats.by_type] == [("a", 2), ("b", 1)]
    assert engine.queue_stats("r", clock.now(), by_type=True).oldest_pending_at is None
    empty = engine.queue_stats("none", clock.now(), by_type=True)
    assert (empty.pending, empty.by_type, empty.oldest_pending_at) == (0, [], None)
    assert [q.queue for q in engine.list_queues(clock.now(), after="", limit=10)] == ["p", "q", "r"]
    page = engine.list_queues(clock.now(), after="p", limit=1)
    assert [q.queue for q in page] == ["q"]
    assert page[0].by_type == []
    assert page[0].pending == 3


def test_a_queue_is_listed_while_it_holds_a_task_and_not_after(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """ListQueues lists a queue while it holds a task in any state, and no
    longer once its last task is deleted (its counts are then all zero,
    not gone), while a queue that still holds one is listed as before."""
    now = clock.now()
    [lone] = engine.enqueue("gone", [spec()], now)
    engine.enqueue("kept", [spec()], now)
    engine.cancel("gone", "not needed", now, task_id=lone.task.id)
    assert [q.queue for q in engine.list_queues(now, after="", limit=10)] == ["gone", "kept"]
    assert engine.delete_finished("gone", [CANCELLED], None, 10) == 1
    assert [q.queue for q in engine.list_queues(now, after="", limit=10)] == ["kept"]
    assert [q.queue for q in engine.list_queues(now, after="", limit=1)] == ["kept"]


@pytest.mark.parametrize("newest_first", [False, True])
@pytest.mark.parametrize("where", [TaskFilter(), TaskFilter(unique_key_prefix="k")])
def test_the_page_that_holds_the_last_task_says_there_is_no_next(
    engine: SyncEngine, clock: ManualClock, newest_first: bool, where: TaskFilter
) -> None:
    """A page that ends at the listing's last task carries no cursor, also
    when it is exactly full: a cursor there would send the dashboard and
    the CLI to a next page that is always empty. Both the plain listing
    and one whose filter is checked row by row (a key prefix)."""
    engine.enqueue("q", [spec(unique_key=f"k{i}") for i in range(5)], clock.now())

    def page(after: int | None, limit: int) -> tuple[int, int | None]:
        got = engine.list_tasks("q", where, newest_first=newest_first, after=after, limit=limit)
        return len(got.tasks), got.next_after

    assert page(None, 5) == (5, None)
    assert page(None, 6) == (5, None)
    size, cursor = page(None, 3)
    assert (size, cursor is not None) == (3, True)
    assert page(cursor, 2) == (2, None)


class _PushedLease:
    """A `Push` where the ops expect a LeasedTask (`ref_of` reads `.lease`)."""

    def __init__(self, push: Push) -> None:
        self.lease = push


def _apply(engine: SyncEngine, clock: ManualClock, ops: list[tuple[str, int]]) -> None:
    """Run a random operation sequence on queue "q" (every lifecycle path)."""
    leases: list[Any] = []
    for op, n in ops:
        now = clock.now()
        if op == "enqueue":
            engine.enqueue(
                "q", [spec(f"t{(n + i) % 3}", max_attempts=2) for i in range(n % 4 + 1)], now
            )
        elif op == "claim":
            leases += engine.claim("q", [], n % 3 + 1, "w", LEASE, now)
        elif op == "claim_pushes":
            leases += [
                _PushedLease(p) for p in engine.claim_pushes("q", [], n % 3 + 1, "w", LEASE, now)
            ]
        elif op == "settle_many" and leases:
            # A group as the Work stream sends it: acks, nacks and rejects of
            # several leases; n picks a mix, sometimes a lease twice.
            group = [leases.pop(i % len(leases)) for i in range(min(n % 5 + 1, len(leases)))]
            if n % 3 == 0:
                group.append(group[0])
            kinds = (Ack, Ack, Nack, Reject)
            engine.settle_many(
                [
                    Ack(ref_of(lt))
                    if kinds[(n + i) % 4] is Ack
                    else Nack(ref_of(lt), "e", timedelta(0))
                    if kinds[(n + i) % 4] is Nack
                    else Reject(ref_of(lt), "e")
                    for i, lt in enumerate(group)
                ],
                now,
            )
        elif op == "cancel":
            active = [t for t in brute(engine) if t.state in (PENDING, LEASED)]
            if active:
                engine.cancel("q", "op", now, task_id=active[n % len(active)].id)
        elif op in ("ack", "nack", "reject", "release") and leases:
            lt = leases.pop(n % len(leases))
            # A lease the expiry took back is LeaseLost and changes nothing.
            with contextlib.suppress(LeaseLost):
                if op == "ack":
                    engine.ack(ref_of(lt), now)
                elif op == "nack":
                    engine.nack(ref_of(lt), "e", timedelta(0), now)
                elif op == "reject":
                    engine.reject(ref_of(lt), "e", now)
                else:
                    engine.release([ref_of(lt)], now)
        elif op == "expire":
            clock.advance(LEASE)
            engine.expire_leases(clock.now())
        elif op == "retry":
            finished = [t for t in brute(engine) if t.state in (SUCCEEDED, DEAD)]
            if finished:
                engine.retry("q", now, task_id=finished[n % len(finished)].id)
        clock.advance(timedelta(seconds=1))


_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "enqueue",
                "claim",
                "claim_pushes",
                "ack",
                "nack",
                "reject",
                "release",
                "settle_many",
                "expire",
                "retry",
                "cancel",
            ]
        ),
        st.integers(0, 20),
    ),
    max_size=25,
)


@pytest.mark.parametrize("kind_name", ["sqlite", "postgres"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
# Group settlements down both paths: acks of different tasks together, and
# in order when a lease comes twice.
@example(ops=[("enqueue", 3), ("claim", 2), ("settle_many", 4)])
@example(ops=[("enqueue", 3), ("claim_pushes", 2), ("settle_many", 0)])
def test_stats_equal_a_brute_force_count(
    kind_name: str, ops: list[tuple[str, int]], request: pytest.FixtureRequest
) -> None:
    """Property: after any sequence of enqueue, claim (both forms), ack,
    nack, reject, release, group settlements (mixed, a lease sometimes
    twice), cancel, lease expiry and retry, the stats by state and type
    equal a count of the tasks themselves, and still do after a restart.
    (SQLite: the claim and the acks count their own transitions, which the
    trigger skips: this is what holds them to it.)"""
    kind = _kind(kind_name, request)
    with tempfile.TemporaryDirectory() as scratch, open_engine(kind, pathlib.Path(scratch)) as e:
        clock = ManualClock()
        _apply(e, clock, ops)
        tasks = brute(e)
        assert counts_of(e, "q", clock.now()) == expected_counts(tasks)
        e.reopen()
        assert counts_of(e, "q", clock.now()) == expected_counts(tasks)
        stats = e.queue_stats("q", clock.now(), by_type=False)
        assert stats.pending == sum(t.state == PENDING for t in tasks)
        assert stats.by_type == []


def _kind(name: str, request: pytest.FixtureRequest) -> EngineKind:
    if name == "postgres":
        return postgres_kind(request.getfixturevalue("storage_database"))
    return ENGINE_KINDS[name]


def test_migration_backfills_the_stats_of_stored_tasks(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: a database written before the inspection schema existed
    (tasks stored, counts and listing indexes absent) gets exact stats and
    working listings after the daemon restarts on the new code."""
    now = clock.now()
    engine.enqueue("q", [spec(f"t{i % 2}") for i in range(9)], now)
    for lt in engine.claim("q", [], 4, "w", LEASE, now)[:2]:
        engine.ack(ref_of(lt), now)
    before = brute(engine)
    _downgrade(engine)
    engine.reopen()
    assert counts_of(engine, "q", now) == expected_counts(before)
    assert [t.id for t in walk(engine, where=TaskFilter(states=(LEASED,)))] == [
        t.id for t in before if t.state == LEASED
    ]


_SQLITE_BEFORE_INSPECTION = 3
_SQLITE_IN_LIST_INDEXES = 5
_POSTGRES_BEFORE_INSPECTION = 4


def _downgrade(engine: SyncEngine) -> None:
    """Undo the inspection migration and the ones after it, as an older daemon
    left the store."""
    if engine.kind.name == "sqlite":
        db = engine.raw._db  # type: ignore[attr-defined]
        for trigger in ("task_counts_insert", "task_counts_delete", "task_counts_update"):
            db.execute(f"DROP TRIGGER {trigger}")
        for statement in (
            "DROP TABLE task_counts",
            "DROP TABLE paused_queues",
            "DROP TABLE schedules",
            "DROP INDEX tasks_finished",
            "DROP INDEX tasks_finished_age",
            "DROP INDEX tasks_finished_queue",
        ):
            db.execute(statement)
        for statement in undo_limits():
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {_SQLITE_BEFORE_INSPECTION}")
        return
    schema = engine.raw.schema  # type: ignore[attr-defined]

    async def down() -> None:
        async with engine.raw._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute(f'DROP INDEX "{schema}".tasks_finished')
            # (Gone since schema 14; the inspection migration makes it again.)
            await conn.execute(f'DROP INDEX IF EXISTS "{schema}".tasks_finished_age')
            await conn.execute(f'DROP INDEX "{schema}".tasks_finished_queue')
            await conn.execute(f'DROP INDEX "{schema}".tasks_active_type')
            await conn.execute(
                f'CREATE INDEX tasks_active_type ON "{schema}".tasks (queue, task_type)'
                f" WHERE state IN ({PENDING}, {LEASED})"
            )
            await conn.execute(f'DROP TABLE "{schema}".task_counts, "{schema}".task_count_deltas')
            for kind in ("insert", "delete", "update"):
                await conn.execute(f'DROP TRIGGER task_counts_{kind} ON "{schema}".tasks')
                await conn.execute(f'DROP FUNCTION "{schema}".ringo_count_{kind}')
            # Migration 7 (each task's retry delays), undone too.
            await conn.execute(f'ALTER TABLE "{schema}".tasks DROP COLUMN retry_delays_us')
            # The waits of minor 12 and the paused queues of minor 13.
            # (schema 9 already dropped schema 8's UPDATE trigger).
            await conn.execute(f'DROP TRIGGER task_waits_delete ON "{schema}".tasks')
            await conn.execute(f'DROP FUNCTION "{schema}".ringo_wait_delete')
            await conn.execute(
                f'DROP TABLE "{schema}".task_waits, "{schema}".paused_queues, "{schema}".schedules'
            )
            # The keyed-limits migration, undone too.
            for statement in undo_limits(f'"{schema}"'):
                await conn.execute(statement)
            await conn.execute(
                f'UPDATE "{schema}".ringo_schema SET version = {_POSTGRES_BEFORE_INSPECTION}'
            )

    engine.run(down())


def test_sqlite_finished_indexes_are_rebuilt_on_upgrade(tmp_path: pathlib.Path) -> None:
    """Property: a database left by schema 5 (the finished-task indexes on
    `state IN (...)`) opens with the same tasks and counts, its finished-task
    indexes rebuilt on the range term the queries spell, so listing, purge and
    bulk retry still seek them (no scan, no temporary sort)."""
    with open_engine(_kind_sqlite(), tmp_path) as engine:
        now = ManualClock().now()
        engine.enqueue("q", [spec(f"t{i % 2}") for i in range(8)], now)
        leased = engine.claim("q", [], 5, "w", LEASE, now)
        engine.ack(ref_of(leased[0]), now)
        for lt in leased[1:3]:
            engine.reject(ref_of(lt), "x", now)
        before = brute(engine)
        db = engine.raw._db  # type: ignore[attr-defined]
        for name, columns in sqlite_schema.FINISHED_INDEXES:
            db.execute(f"DROP INDEX {name}")
            db.execute(
                f"CREATE INDEX {name} ON tasks ({columns}) WHERE {sqlite_schema.FINISHED_IN}"
            )
        for statement in undo_limits():
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {_SQLITE_IN_LIST_INDEXES}")
        engine.reopen()
        db = engine.raw._db  # type: ignore[attr-defined]
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION
        assert brute(engine) == before
        assert counts_of(engine, "q", now) == expected_counts(before)
        dead = walk(engine, where=TaskFilter(states=(DEAD,)))
        assert [t.id for t in dead] == [t.id for t in before if t.state == DEAD]

        arms, _ = _listing.arms(db.execute(sqlite_listing.PRESENT, ("q",)), TaskFilter())
        listing = sqlite_listing.list_sql(sqlite_listing.LIST_COLS, arms, False)
        params = {"queue": "q", "after": 0, "limit": 10, **sqlite_listing.arm_params(arms)}
        _assert_indexed(_sqlite_plan(engine, listing, params), "tasks_finished")
        purge = {"queue": "q", "state": DEAD, "before": 0, "limit": 1}
        for sql, index in [
            (sqlite_operate.OLDEST_FINISHED, "tasks_finished_age"),
            (sqlite_operate.OLDEST_FINISHED_QUEUE, "tasks_finished_queue"),
        ]:
            _assert_indexed(_sqlite_plan(engine, sql, purge), index)
        retry = {"queue": "q", "now": 0, "before": 0, "limit": 1}
        plan = _sqlite_plan(engine, sqlite_operate.retry_dead_sql(""), retry)
        _assert_indexed(plan, "tasks_finished_queue")
        assert engine.retry_dead("q", [], None, 10, now) == 2


# -- plans -----------------------------------------------------------------------


def _sqlite_plan(engine: SyncEngine, sql: str, params: Any) -> list[str]:
    db = engine.raw._db  # type: ignore[attr-defined]
    return [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params)]


@pytest.mark.parametrize("newest_first", [False, True])
@pytest.mark.parametrize(
    "where",
    [
        TaskFilter(),
        TaskFilter(states=(DEAD,)),
        TaskFilter(task_types=("a", "b"), states=(PENDING, DEAD)),
        TaskFilter(unique_key_prefix="k"),
    ],
)
def test_sqlite_listing_is_index_streams_merged_without_sorting(
    tmp_path: pathlib.Path, where: TaskFilter, newest_first: bool
) -> None:
    """Property: every ListTasks statement seeks an index per stream and
    merges them; no scan of the table, no temporary sort (which would read
    every matching row before the first is returned)."""
    kind = _kind_sqlite()
    with open_engine(kind, tmp_path) as engine:
        now = ManualClock().now()
        engine.enqueue("q", [spec("a"), spec("b"), spec("a"), spec("b")], now)
        first, second = engine.claim("q", [], 2, "w", LEASE, now)
        engine.reject(ref_of(first), "x", now)
        engine.ack(ref_of(second), now)
        db = engine.raw._db  # type: ignore[attr-defined]
        arms, residual = _listing.arms(db.execute(sqlite_listing.PRESENT, ("q",)), where)
        params = {"queue": "q", "after": 0, "limit": 10, **sqlite_listing.arm_params(arms)}
        cols = sqlite_listing.LIST_COLS if residual is None else sqlite_listing.WALK_COLS
        plan = _sqlite_plan(engine, sqlite_listing.list_sql(cols, arms, newest_first), params)
        assert arms
        if where.states != (DEAD,):
            _assert_indexed(plan, "tasks_active_type")
        if where.states != (PENDING,):
            _assert_indexed(plan, "tasks_finished")
        for sql, args in [
            (sqlite_listing.QUEUE_COUNTS, ("q",)),
            (sqlite_listing.QUEUE_NAMES, ("", 10)),
            (sqlite_claim.soonest_sql(0, False), {"queue": "q", "prio": 0}),
            (sqlite_listing.PRESENT, ("q",)),
        ]:
            _assert_indexed(_sqlite_plan(engine, sql, args), "")


def _kind_sqlite() -> EngineKind:
    return ENGINE_KINDS["sqlite"]


def _assert_indexed(plan: list[str], index: str) -> None:
    assert any(index in step for step in plan), plan
    assert not [s for s in plan if s.startswith("SCAN") and "INDEX" not in s], plan
    assert not [s for s in plan if "TEMP B-TREE" in s], plan


def test_postgres_listing_and_counts_use_the_indexes(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> None:
    """Property: on PostgreSQL a filtered page is a Merge Append of index scans
    (no sort, no sequential scan), and the stats read the folded counts by
    their key, never the tasks."""
    from ringo_trio.server.storage.postgres import listing as postgres

    kind = _kind("postgres", request)
    with open_engine(kind, tmp_path) as engine:
        engine.enqueue("q", [spec(f"t{i % 2}") for i in range(200)], ManualClock().now())
        sql = engine.raw._sql  # type: ignore[attr-defined]
        arms, _ = _listing.arms([("t0", PENDING), ("t0", DEAD), ("t1", DEAD)], TaskFilter())
        listing = postgres.list_sql(sql.tasks, postgres.LIST_COLS, arms, False)

        async def explain() -> tuple[str, str]:
            async with engine.raw._conn() as conn, postgres.inspect_transaction(conn):  # type: ignore[attr-defined]
                await conn.execute("ANALYZE " + sql.tasks)
                a = await conn.fetch("EXPLAIN " + listing, "q", 0, 10, "t0", "t0", "t1")
                b = await conn.fetch("EXPLAIN " + sql.listing.queues_counts, ["q"])
            return "\n".join(r[0] for r in a), "\n".join(r[0] for r in b)

        plan_list, plan_counts = engine.run(explain())
        assert "Merge Append" in plan_list, plan_list
        assert "tasks_active_type" in plan_list, plan_list
        assert "tasks_finished" in plan_list, plan_list
        # A Merge Append has a "Sort Key" but no Sort node under it.
        assert "->  Sort " not in plan_list, plan_list
        assert not plan_list.startswith("Sort"), plan_list
        assert "Seq Scan" not in plan_list, plan_list
        assert "task_counts_pkey" in plan_counts, plan_counts


def test_sqlite_writes_keep_the_hot_path_plans(tmp_path: pathlib.Path) -> None:
    """Property: with the counting triggers in place a claim still touches the
    counts table only by its primary key (a trigger never scans)."""
    with open_engine(_kind_sqlite(), tmp_path) as engine:
        plan = _sqlite_plan(
            engine,
            sqlite_schema._COUNT_DOWN.format(row="t").replace("t.", ":"),
            {"queue": "q", "task_type": "t", "state": 1},
        )
        assert any("PRIMARY KEY" in s for s in plan), plan
