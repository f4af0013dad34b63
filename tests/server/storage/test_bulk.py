"""Bulk actions by filter (storage/bulk.py), on both engines: one call
takes at most its `limit` of the matching tasks and says whether more may
match, and its cutoffs mean what the direct statements' mean."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringo_trio._proto.ringo.v1 import AttemptOutcome, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage import bulk
from ringo_trio.server.storage.base import NotFound, TaskFilter
from tests._kit.storage import SyncEngine, ref_of, spec

ACTIVE = (int(TaskState.PENDING), int(TaskState.LEASED))
DEAD = (int(TaskState.DEAD),)


def test_a_call_takes_up_to_its_limit_and_says_whether_more_match(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (a batch is a batch): CancelTasks' walk cancels up to its
    `limit` of the matching tasks per call, oldest enqueued first, and says
    `more` while matching tasks may be left; tasks the filter does not match
    are never touched."""
    others = engine.enqueue("q", [spec("o", unique_key=f"b:{n}") for n in range(5)], clock.now())
    mine = engine.enqueue("q", [spec("t", unique_key=f"a:{n}") for n in range(25)], clock.now())
    # The first of each is leased.
    [held] = engine.claim("q", ["o"], 1, "w", timedelta(seconds=30), clock.now())
    [leased] = engine.claim("q", ["t"], 1, "w", timedelta(seconds=30), clock.now())
    assert (held.task.id, leased.task.id) == (others[0].task.id, mine[0].task.id)
    where = TaskFilter(ACTIVE, (), "a:")
    # The third call's limit is met by the queue's last task: nothing left.
    calls = [
        engine.run(bulk.cancel_matching(engine.raw, "q", where, None, "r", limit, clock.now()))
        for limit in (10, 10, 5, 10)
    ]
    assert [(len(ids), more) for ids, more in calls] == [
        (10, True),
        (10, True),
        (5, False),
        (0, False),
    ]
    # Oldest enqueued first, call after call (within one, in no order).
    ids = [o.task.id for o in mine]
    assert [{task_id for task_id, _ in got} for got, _ in calls] == [
        set(ids[:10]),
        set(ids[10:20]),
        set(ids[20:]),
        set(),
    ]
    states = {o.task.id: engine.get("q", task_id=o.task.id).state for o in mine + others}
    assert all(states[o.task.id] == TaskState.CANCELLED for o in mine)
    assert [states[o.task.id] for o in others] == [TaskState.LEASED] + [TaskState.PENDING] * 4
    # As CancelTask: the attempt a cancel ends is in the history; a task
    # cancelled while PENDING had none running.
    history = [engine.get("q", task_id=o.task.id, history=True).history for o in mine[:2]]
    assert [[(a.attempt, a.outcome, a.error) for a in h] for h in history] == [
        [(1, AttemptOutcome.CANCELLED, "cancelled: r")],
        [],
    ]


def test_created_before_ends_the_walk_at_the_first_newer_task(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: CancelTasks with `created_before` cancels the matching tasks
    enqueued up to that moment (the cutoff included: the SDK's cutoff is the
    daemon's clock when its call began) and none after, and says no more
    match: the newer tasks are all that is left."""
    older = engine.enqueue("q", [spec(unique_key=f"a:{n}") for n in range(3)], clock.now())
    cutoff = clock.now()
    clock.advance(timedelta(microseconds=1))
    newer = engine.enqueue("q", [spec(unique_key=f"a:{n}") for n in range(3, 5)], clock.now())
    where = TaskFilter(ACTIVE, (), "a:")
    ids, more = engine.run(
        bulk.cancel_matching(engine.raw, "q", where, cutoff, "r", 10, clock.now())
    )
    assert ([task_id for task_id, _ in ids], more) == ([o.task.id for o in older], False)
    assert [engine.get("q", task_id=o.task.id).state for o in newer] == [TaskState.PENDING] * 2


def test_finished_before_is_strict_as_in_the_direct_statements(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (one meaning of a cutoff): a task that finished exactly at
    `finished_before` is not "finished before" it, for a retry or a delete
    by key prefix (the listing walk) as for one without (the direct
    statements): both leave it."""
    cutoff = clock.now() + timedelta(seconds=1)
    finished = []  # x:0, y:0 before the cutoff; x:1, y:1 at it
    for n in range(2):
        outs = engine.enqueue(
            "q", [spec(unique_key=f"{p}:{n}", max_attempts=1) for p in "xy"], clock.now()
        )
        for leased in engine.claim("q", [], 2, "w", timedelta(seconds=30), clock.now()):
            engine.reject(ref_of(leased), "no", clock.now())
        finished += [o.task.id for o in outs]
        clock.advance(timedelta(seconds=1))
    direct, walked = finished[0::2], finished[1::2]
    clock.advance(timedelta(seconds=5))
    by_walk = engine.run(
        bulk.retry_matching(engine.raw, "q", TaskFilter(DEAD, (), "y:"), cutoff, 10, clock.now())
    )
    assert by_walk == (1, False)
    assert engine.retry_dead("q", [], cutoff, 10, clock.now()) == 1
    states = [engine.get("q", task_id=i).state for i in direct + walked]
    assert states == [TaskState.PENDING, TaskState.DEAD] * 2
    by_walk = engine.run(
        bulk.delete_matching(engine.raw, "q", TaskFilter(DEAD, (), "y:"), cutoff, 10)
    )
    assert by_walk == (0, False)  # the one left DEAD finished at the cutoff
    assert engine.delete_finished("q", list(DEAD), cutoff, 10) == 0
    # A microsecond later both paths take their one: the rest stay.
    after = cutoff + timedelta(microseconds=1)
    by_walk = engine.run(
        bulk.delete_matching(engine.raw, "q", TaskFilter(DEAD, (), "y:"), after, 10)
    )
    assert by_walk == (1, False)
    with pytest.raises(NotFound):  # y:1, the one the walk matched
        engine.get("q", task_id=finished[3])
    assert engine.delete_finished("q", list(DEAD), after, 10) == 1
    left = [
        t.id
        for t in engine.list_tasks(
            "q", TaskFilter(), newest_first=False, after=None, limit=100
        ).tasks
    ]
    assert left == [finished[0], finished[1]]  # x:0 and y:0, retried: PENDING
