"""Group commit (`Storage.settle_many`) on both engines.

The reference is the base class's one by one (`Storage.settle_many` called
on the engine): each example builds the same scene on two fresh queues of
one store, settles one group natively on the first and by the reference on
the second, and compares the answers and the tasks (ids and lease tokens,
random per task, are compared by position)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import pathlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef, Task, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import (
    Ack,
    LeaseLost,
    Nack,
    Reject,
    Settlement,
    Storage,
    StorageFull,
)
from ringo_trio.server.storage.postgres import PostgresEngine
from tests._kit.storage import (
    SyncEngine,
    brute,
    counts_of,
    expected_counts,
    make_full,
    make_room,
    open_engine,
    postgres_kind,
    ref_of,
    spec,
)

_queues = itertools.count()

SHORT = timedelta(seconds=2)
LONG = timedelta(minutes=5)


@dataclass(frozen=True)
class Scene:
    """Tasks enqueued, some leased short (expired by the time the group
    runs), some cancelled while leased."""

    max_attempts: tuple[int, ...]
    expired: frozenset[int]
    cancelled: frozenset[int]


@dataclass(frozen=True)
class Item:
    """A settlement of the lease of task `task`, whose ref is `ref`: "live",
    "token" (a wrong token) or "attempt" (a wrong attempt)."""

    task: int
    ref: str
    kind: str
    result: bytes | None
    delay: timedelta | None


def _scenes() -> st.SearchStrategy[Scene]:
    def build(max_attempts: list[int]) -> st.SearchStrategy[Scene]:
        n = len(max_attempts)
        subsets = st.frozensets(st.integers(0, n - 1))
        return st.builds(Scene, st.just(tuple(max_attempts)), subsets, subsets)

    return st.lists(st.integers(1, 3), min_size=1, max_size=6).flatmap(build)


def _items(n: int) -> st.SearchStrategy[list[Item]]:
    item = st.builds(
        Item,
        st.integers(0, n - 1),
        st.sampled_from(["live", "live", "live", "token", "attempt"]),
        st.sampled_from(["ack", "nack", "reject"]),
        st.none() | st.binary(max_size=8),
        st.none() | st.timedeltas(timedelta(0), timedelta(hours=1)),
    )
    return st.lists(item, max_size=12)


def _setup(engine: SyncEngine, queue: str, scene: Scene, now: datetime) -> list[LeasedTask]:
    """The scene on `queue`: every task leased, in enqueue order."""
    specs = [spec(f"t{i % 2}", max_attempts=m) for i, m in enumerate(scene.max_attempts)]
    engine.enqueue(queue, specs, now)
    leases: list[LeasedTask] = []
    # Claimed one at a time, so each task gets the lease length its role asks.
    for i in range(len(specs)):
        duration = SHORT if i in scene.expired else LONG
        [leased] = engine.claim(queue, [], 1, "w", duration, now)
        leases.append(leased)
    for i in scene.cancelled:
        assert leases[i].task is not None
        engine.cancel(queue, "stop", now, task_id=leases[i].task.id)
    return leases


def _realize(item: Item, leases: list[LeasedTask]) -> Settlement:
    live = ref_of(leases[item.task])
    ref = {
        "live": live,
        "token": LeaseRef(task_id=live.task_id, attempt=live.attempt, lease_token="0" * 32),
        "attempt": LeaseRef(
            task_id=live.task_id, attempt=live.attempt + 1, lease_token=live.lease_token
        ),
    }[item.ref]
    if item.kind == "ack":
        return Ack(ref, item.result)
    if item.kind == "nack":
        return Nack(ref, "boom", item.delay)
    return Reject(ref, "bad")


def _answer(answer: LeaseLost | str) -> Any:
    if isinstance(answer, LeaseLost):
        return ("lost", answer.cancelled)
    return ("ok", answer)


def _normal(task: Task, ids: dict[str, int]) -> Task:
    """The task with its id by position and without its queue."""
    return dataclasses.replace(task, id=str(ids[task.id]), queue="")


def _tasks(engine: SyncEngine, queue: str) -> list[Task]:
    tasks = brute(engine, queue)
    ids = {t.id: i for i, t in enumerate(tasks)}
    return [_normal(t, ids) for t in tasks]


def _by_scene(engine: SyncEngine, queue: str, leases: list[LeasedTask]) -> dict[int, Task]:
    """The queue's tasks by their place in the scene, without id and queue."""
    place = {ref_of(lease).task_id: i for i, lease in enumerate(leases)}
    return {
        place[task.id]: dataclasses.replace(task, id="", queue="") for task in brute(engine, queue)
    }


def _settle_both(
    engine: SyncEngine, scene: Scene, items: list[Item], settle_after: timedelta
) -> tuple[str, str, list[str | LeaseLost], list[str | LeaseLost], datetime]:
    """The scene on two fresh queues, `items` settled `settle_after` later:
    natively on the first, by the base class's one by one on the second;
    the queues, both answers and when they were settled."""
    n = next(_queues)
    native_q, reference_q = f"native{n}", f"reference{n}"
    now = ManualClock().now()
    native_leases = _setup(engine, native_q, scene, now)
    reference_leases = _setup(engine, reference_q, scene, now)
    later = now + settle_after
    native = engine.settle_many([_realize(i, native_leases) for i in items], later)
    reference = engine.run(
        Storage.settle_many(engine.raw, [_realize(i, reference_leases) for i in items], later)
    )
    return native_q, reference_q, native, reference, later


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(),
    scene=_scenes(),
    settle_after=st.sampled_from([SHORT, SHORT * 2]),
    distinct=st.booleans(),
)
def test_settle_many_equals_settling_one_by_one(
    engine: SyncEngine, data: st.DataObject, scene: Scene, settle_after: timedelta, distinct: bool
) -> None:
    """Property (group = sequence): a group of acks, nacks and rejects
    (live, stale-token, wrong-attempt, expired and cancelled refs, one lease
    listed several times, nacks to DEAD on the last attempt, results)
    answers exactly what settling its items one by one answers (LeaseLost
    where one call would raise it, with `cancelled` alike; the task's queue
    where it took effect), leaves the same tasks behind, and the queue stats
    equal a count of the tasks. Half the groups name each task at most once,
    as a Work stream's do (SQLite then acks them in one statement)."""
    items = data.draw(_items(len(scene.max_attempts)))
    if distinct:
        named: set[int] = set()
        items = [i for i in items if not (i.task in named or named.add(i.task))]
    native_q, reference_q, native, reference, later = _settle_both(
        engine, scene, items, settle_after
    )
    assert [_answer(a) for a in native] == [
        _answer(native_q if a == reference_q else a) for a in reference
    ]
    assert _tasks(engine, native_q) == _tasks(engine, reference_q)
    for queue in (native_q, reference_q):
        assert counts_of(engine, queue, later) == expected_counts(brute(engine, queue))


def test_acks_of_different_tasks_are_each_guarded_by_their_own_lease(
    engine: SyncEngine,
) -> None:
    """Property: in a group naming each task once (the Work stream's case,
    on SQLite one statement for all its acks), every ack is still checked
    against its own lease -- a wrong token, a wrong attempt, an expired or a
    cancelled lease is LeaseLost and changes nothing, the live ones succeed
    with their results -- exactly as settling them one by one."""
    scene = Scene((2,) * 8, expired=frozenset({3}), cancelled=frozenset({4}))
    items = [
        Item(0, "live", "ack", b"zero", None),
        Item(1, "token", "ack", None, None),
        Item(2, "attempt", "ack", None, None),
        Item(3, "live", "ack", None, None),
        Item(4, "live", "ack", None, None),
        Item(5, "live", "nack", None, None),
        Item(6, "live", "ack", None, None),
        Item(7, "live", "reject", None, None),
    ]
    native_q, reference_q, native, reference, later = _settle_both(engine, scene, items, SHORT)
    assert [_answer(a) for a in native] == [
        ("ok", native_q),
        ("lost", False),
        ("lost", False),
        ("lost", False),
        ("lost", True),
        ("ok", native_q),
        ("ok", native_q),
        ("ok", native_q),
    ]
    assert [_answer(native_q if a == reference_q else a) for a in reference] == [
        _answer(a) for a in native
    ]
    assert _tasks(engine, native_q) == _tasks(engine, reference_q)
    assert counts_of(engine, native_q, later) == expected_counts(brute(engine, native_q))


def test_a_large_group_settles_every_item(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: a group larger than any one statement takes (SQLite cuts
    its acks into statements of 256, 64, ... 1) settles every item once:
    300 acks, each answered with the queue, every task SUCCEEDED with its
    own result, and the stats equal a count of the tasks."""
    now = clock.now()
    engine.enqueue("q", [spec() for _ in range(301)], now)
    leases = engine.claim("q", [], 301, "w", LONG, now)
    items = [Ack(ref_of(lt), str(i).encode()) for i, lt in enumerate(leases[:300])]
    assert engine.settle_many(items, now) == ["q"] * 300
    results = {t.id: (t.state, t.result) for t in brute(engine, "q")}
    for i, lt in enumerate(leases[:300]):
        assert lt.task is not None
        assert results[lt.task.id] == (TaskState.SUCCEEDED, str(i).encode())
    assert sum(state == TaskState.LEASED for state, _ in results.values()) == 1
    assert counts_of(engine, "q", now) == expected_counts(brute(engine, "q"))


def test_settle_many_answers_the_queue_of_what_took_effect(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: settle_many answers the task's queue for each settled item
    and the LeaseLost for each lost one, in order, and an empty group is no
    call."""
    now = clock.now()
    leases = _setup(engine, "q", Scene((1, 1), frozenset(), frozenset()), now)
    first, second = (ref_of(x) for x in leases)
    answers = engine.settle_many([Ack(first, b"r"), Ack(first), Nack(second, "e")], now)
    assert answers[0] == "q"
    assert answers[2] == "q"
    assert isinstance(answers[1], LeaseLost)
    assert not answers[1].cancelled
    assert engine.settle_many([], now) == []
    assert leases[0].task is not None
    assert engine.get("q", task_id=leases[0].task.id).result == b"r"


def _fail_on(engine: SyncEngine, task_id: str) -> None:
    """Make the store run out of room when the group reaches task `task_id`:
    SQLite for real (its ack carries a result larger than the pages left),
    PostgreSQL by a trigger raising disk_full for that row."""
    make_full(engine, pages_left=2, on_task=task_id)


def test_a_group_that_fails_midway_leaves_nothing_applied(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (atomicity): when the store runs out of room partway
    through a group, StorageFull is raised and none of the group happened:
    the settled-before items are still leased, the counts unchanged, and the
    same group applies in full once there is room."""
    now = clock.now()
    leases = _setup(engine, "q", Scene((1, 1, 1, 1), frozenset(), frozenset()), now)
    before = brute(engine, "q")
    counts = counts_of(engine, "q", now)
    last = leases[-1].task
    assert last is not None
    group: list[Settlement] = [
        Ack(ref_of(leases[0])),
        Nack(ref_of(leases[1]), "e"),
        Reject(ref_of(leases[2]), "e"),
        Ack(ref_of(leases[3]), b"x" * 200_000),
    ]
    _fail_on(engine, last.id)
    with pytest.raises(StorageFull):
        engine.settle_many(group, now)
    assert brute(engine, "q") == before
    assert counts_of(engine, "q", now) == counts
    assert all(t.state == TaskState.LEASED for t in before)

    make_room(engine)
    assert engine.settle_many(group, now) == ["q"] * 4
    assert [t.state for t in brute(engine, "q")] == [
        TaskState.SUCCEEDED,
        TaskState.DEAD,
        TaskState.DEAD,
        TaskState.SUCCEEDED,
    ]


def test_a_cancelled_lease_in_a_group_says_so(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: a group's item whose task was cancelled at that attempt
    answers LeaseLost(cancelled=True); the other items take effect."""
    now = clock.now()
    leases = _setup(engine, "q", Scene((2, 2, 2), frozenset(), frozenset({1})), now)
    answers = engine.settle_many([Ack(ref_of(x)) for x in leases], now)
    assert answers[0] == "q"
    assert answers[2] == "q"
    assert isinstance(answers[1], LeaseLost)
    assert answers[1].cancelled


def test_the_first_settlement_of_a_lease_listed_twice_wins(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (first wins): in a large group where every lease is listed
    twice, an ack first and a reject later (and the reverse), each task takes
    its first item and the second answers LeaseLost."""
    now = clock.now()
    leases = _setup(engine, "q", Scene((1,) * 40, frozenset(), frozenset()), now)
    refs = [ref_of(x) for x in leases]
    firsts: list[Settlement] = [
        Ack(r) if i % 2 else Reject(r, "e") for i, r in enumerate(reversed(refs))
    ]
    seconds: list[Settlement] = [Reject(r, "e") if i % 2 else Ack(r) for i, r in enumerate(refs)]
    answers = engine.settle_many(firsts + seconds, now)
    assert answers[:40] == ["q"] * 40
    assert all(isinstance(a, LeaseLost) for a in answers[40:])
    states = {t.id: t.state for t in brute(engine, "q")}
    for item in firsts:
        want = TaskState.SUCCEEDED if isinstance(item, Ack) else TaskState.DEAD
        assert states[item.ref.task_id] == want


async def _waiting_on_locks(pool: Any, n: int) -> None:
    """Until `n` of the engine's backends in this database wait for a lock."""
    waiting = 0
    while waiting < n:
        await asyncio.sleep(0.01)
        waiting = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND application_name = 'ringod' AND datname = current_database()"
        )


def test_postgres_groups_meeting_on_rows_never_deadlock(
    storage_database: str, tmp_path: pathlib.Path, clock: ManualClock
) -> None:
    """Property (lock order): two groups naming the same two leases in
    opposite orders, both made to queue behind a third transaction's lock,
    finish without a deadlock: every group locks its rows in task-id order.
    Between them each lease is settled exactly once."""
    now = clock.now()
    with open_engine(postgres_kind(storage_database), tmp_path) as engine:
        leases = _setup(engine, "q", Scene((1, 1), frozenset(), frozenset()), now)
        low, high = sorted((ref_of(x) for x in leases), key=lambda r: r.task_id)
        raw = engine.raw
        assert isinstance(raw, PostgresEngine)
        pool = raw._live_pool()

        async def scene() -> list[Any]:
            async with asyncio.timeout(30), asyncio.TaskGroup() as tg:
                blocker = await pool.acquire()
                try:
                    async with blocker.transaction():
                        await blocker.execute(
                            f"SELECT 1 FROM {raw._sql.tasks} WHERE id = $1 FOR UPDATE",
                            low.task_id,
                        )
                        # Queued on `low` first: once it gets `low` it
                        # wants `high`, which the second may hold by then.
                        first = tg.create_task(raw.settle_many([Ack(low), Ack(high)], now))
                        await _waiting_on_locks(pool, 1)
                        second = tg.create_task(raw.settle_many([Ack(high), Ack(low)], now))
                        await _waiting_on_locks(pool, 2)
                finally:
                    await pool.release(blocker)
            return [*first.result(), *second.result()]

        answers = engine.run(scene())
        assert sorted(isinstance(a, str) for a in answers) == [False, False, True, True]
        assert {t.state for t in brute(engine, "q")} == {TaskState.SUCCEEDED}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), scene=_scenes(), settle_after=st.sampled_from([SHORT, SHORT * 2]))
def test_a_group_that_deletes_succeeded_tasks_leaves_the_rest_as_one_by_one(
    engine: SyncEngine, data: st.DataObject, scene: Scene, settle_after: timedelta
) -> None:
    """Property (``--retain-succeeded never``, `Storage.delete_succeeded`):
    a Work stream's group (each task named once) answers exactly what
    settling its items one by one answers, and leaves the same tasks behind
    but for the SUCCEEDED ones no WaitTask waits on, which are gone; a
    waited one stays SUCCEEDED with its result. The queue stats equal a
    count of the tasks left (a deleted task leaves no count behind)."""
    items = data.draw(_items(len(scene.max_attempts)))
    named: set[int] = set()
    items = [i for i in items if not (i.task in named or named.add(i.task))]
    waited = data.draw(st.frozensets(st.integers(0, len(scene.max_attempts) - 1)))
    n = next(_queues)
    native_q, reference_q = f"native{n}", f"reference{n}"
    now = ManualClock().now()
    native_leases = _setup(engine, native_q, scene, now)
    reference_leases = _setup(engine, reference_q, scene, now)
    waited_ids = [ref_of(native_leases[i]).task_id for i in waited]
    raw = engine.raw
    shared = raw.waits_across_processes
    registered = waited_ids[::2] if shared else []
    if registered:
        # Waits registered by any daemon; the rest are this daemon's own,
        # parked before their registration committed.
        engine.register_waits(add=registered, remove=[])
    raw.waited = frozenset(waited_ids[1::2] if shared else waited_ids)
    raw.delete_succeeded = True
    later = now + settle_after
    try:
        native = engine.settle_many([_realize(i, native_leases) for i in items], later)
    finally:
        raw.delete_succeeded = False
        raw.waited = frozenset()
        if registered:
            engine.register_waits(add=[], remove=registered)
    reference = engine.run(
        Storage.settle_many(engine.raw, [_realize(i, reference_leases) for i in items], later)
    )
    assert [_answer(a) for a in native] == [
        _answer(native_q if a == reference_q else a) for a in reference
    ]
    native_tasks = _by_scene(engine, native_q, native_leases)
    reference_tasks = _by_scene(engine, reference_q, reference_leases)
    assert native_tasks == {
        i: task
        for i, task in reference_tasks.items()
        if task.state is not TaskState.SUCCEEDED or i in waited
    }
    for queue in (native_q, reference_q):
        assert counts_of(engine, queue, later) == expected_counts(brute(engine, queue))


def test_a_deleting_group_frees_the_unique_key_and_keeps_the_waited_task(
    engine: SyncEngine,
) -> None:
    """Property (``--retain-succeeded never``): acks of a group delete their
    tasks, as retention would (the unique key can be enqueued again, no count
    is left), except the task a WaitTask waits on, which is SUCCEEDED with
    its result; a nack in the same group retries as ever."""
    now = ManualClock().now()
    engine.enqueue("q", [spec(unique_key=f"k{i}") for i in range(5)], now)
    leases = engine.claim("q", [], 5, "w", LONG, now)
    refs = [ref_of(lease) for lease in leases]
    raw = engine.raw
    if raw.waits_across_processes:
        # Task 4 waited on by another daemon, task 1 by this one.
        engine.register_waits(add=[refs[4].task_id], remove=[])
        raw.waited = frozenset({refs[1].task_id})
    else:
        raw.waited = frozenset({refs[1].task_id, refs[4].task_id})
    raw.delete_succeeded = True
    answers = engine.settle_many(
        [
            Ack(refs[0], b"a"),
            Ack(refs[1], b"b"),
            Nack(refs[2], "boom", None),
            Ack(refs[3], None),
            Ack(refs[4], b"e"),
        ],
        now,
    )
    assert answers == ["q"] * 5
    left = {task.id: task for task in brute(engine, "q")}
    assert set(left) == {refs[1].task_id, refs[2].task_id, refs[4].task_id}
    for i, result in ((1, b"b"), (4, b"e")):
        assert left[refs[i].task_id].state is TaskState.SUCCEEDED
        assert left[refs[i].task_id].result == result
    assert left[refs[2].task_id].state is TaskState.PENDING
    assert counts_of(engine, "q", now) == expected_counts(list(left.values()))
    [again] = engine.enqueue("q", [spec(unique_key="k0")], now)
    assert again.created
    assert again.task.id != refs[0].task_id
    # A deleted task's lease acked again is lost, as a kept one's would be.
    for lost in engine.settle_many([Ack(refs[0], None), Ack(refs[3], None)], now):
        assert isinstance(lost, LeaseLost)
        assert not lost.cancelled


def test_a_deleting_ack_at_the_moment_its_lease_expires_is_lost(engine: SyncEngine) -> None:
    """Property (a stale lease cannot complete a task, ``--retain-succeeded
    never``): an ack arriving at the very instant its lease ends is
    LeaseLost and deletes nothing; the task is still there for the next
    worker, as it is when succeeded tasks are kept."""
    now = ManualClock().now()
    engine.enqueue("q", [spec(), spec()], now)
    leases = engine.claim("q", [], 2, "w", SHORT, now)
    engine.raw.delete_succeeded = True
    answers = engine.settle_many([Ack(ref_of(lease), b"late") for lease in leases], now + SHORT)
    for answer in answers:
        assert isinstance(answer, LeaseLost)
        assert not answer.cancelled
    left = brute(engine, "q")
    assert sorted(task.id for task in left) == sorted(ref_of(lease).task_id for lease in leases)
    assert all(task.state is not TaskState.SUCCEEDED for task in left)


def test_a_deleting_group_of_one_ack_deletes_and_of_one_nack_retries(engine: SyncEngine) -> None:
    """Property (``--retain-succeeded never``): a group holding one ack (a
    quiet Work stream's flush) deletes its task like a larger group, and a
    group of one nack retries its task as ever."""
    now = ManualClock().now()
    engine.enqueue("q", [spec(), spec()], now)
    acked, nacked = (ref_of(lease) for lease in engine.claim("q", [], 2, "w", LONG, now))
    engine.raw.delete_succeeded = True
    assert engine.settle_many([Ack(acked, b"r")], now) == ["q"]
    assert engine.settle_many([Nack(nacked, "boom", None)], now) == ["q"]
    [left] = brute(engine, "q")
    assert left.id == nacked.task_id
    assert left.state is TaskState.PENDING
    assert counts_of(engine, "q", now) == expected_counts([left])
