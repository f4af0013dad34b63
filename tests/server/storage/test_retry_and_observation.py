"""Retry of finished tasks, and the read-only views: activity and next_wakeup."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringo_trio._proto.ringo.v1 import RetryBackoff, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import FailedPrecondition, NotFound
from ringo_trio.server.storage.limits import Rule
from tests._kit.storage import LEASE, SyncEngine, claim_one, ref_of, spec

# -- retry ---------------------------------------------------------------------


@pytest.mark.parametrize("finish", ["ack", "reject", "exhaust"])
@pytest.mark.parametrize("by", ["task_id", "unique_key"])
def test_retry_reactivates_a_finished_task(
    engine: SyncEngine, clock: ManualClock, finish: str, by: str
) -> None:
    """Retry of a SUCCEEDED or DEAD task makes it PENDING and available now, keeps the
    attempt counter, clears finished_at, and grants it a fresh attempt budget."""
    [out] = engine.enqueue("q", [spec(unique_key="k", max_attempts=2)], clock.now())
    lt = claim_one(engine, clock.now())
    if finish == "ack":
        engine.ack(ref_of(lt), clock.now())
    elif finish == "reject":
        engine.reject(ref_of(lt), "no", clock.now())
    else:
        engine.nack(ref_of(lt), "once", timedelta(0), clock.now())
        engine.nack(ref_of(claim_one(engine, clock.now())), "twice", None, clock.now())
    finished = engine.get("q", task_id=out.task.id)
    assert finished.state in (TaskState.SUCCEEDED, TaskState.DEAD)
    clock.advance(timedelta(minutes=1))
    lookup = {"task_id": out.task.id} if by == "task_id" else {"unique_key": "k"}
    task = engine.retry("q", clock.now(), **lookup)
    assert task.state == TaskState.PENDING
    assert task.available_at == task.updated_at == clock.now()
    assert task.finished_at is None
    assert task.attempt == finished.attempt
    # Fresh budget: the enqueued max_attempts (2) more attempts.
    assert task.max_attempts == finished.attempt + 2
    assert task.last_error == finished.last_error
    assert engine.get("q", task_id=out.task.id) == task
    # ... and the budget is real: exactly two more leases, then DEAD.
    for expected_attempt in (finished.attempt + 1, finished.attempt + 2):
        lt = claim_one(engine, clock.now())
        assert lt.task.attempt == expected_attempt
        last = engine.nack(ref_of(lt), "again", timedelta(0), clock.now())
    assert last.state == TaskState.DEAD


@pytest.mark.parametrize("how", ["one", "bulk"])
def test_a_retried_task_backs_off_by_its_policy_past_its_first_budget(
    engine: SyncEngine, clock: ManualClock, how: str
) -> None:
    """Property (the policy holds for every attempt): a DEAD task retried,
    alone or by the bulk retry, waits after its later attempts as its
    backoff says for those attempts (1, 2, 4 s ...), not as the last delay
    its first budget held; the tasks it was retried with, each by its own."""
    policies = [
        RetryBackoff(initial=timedelta(seconds=s), maximum=timedelta(hours=1), multiplier=2.0)
        for s in (1, 3)
    ]
    outs = engine.enqueue(
        "q", [spec(max_attempts=2, retry_backoff=p) for p in policies], clock.now()
    )
    for _ in range(2):
        for lt in engine.claim("q", [], 2, "w", LEASE, clock.now()):
            engine.nack(ref_of(lt), "boom", None, clock.now())
        clock.advance(timedelta(seconds=10))
    assert all(engine.get("q", task_id=o.task.id).state == TaskState.DEAD for o in outs)
    if how == "one":
        for o in outs:
            engine.retry("q", clock.now(), task_id=o.task.id)
    else:
        assert engine.retry_dead("q", [], None, 10, clock.now()) == 2
    leased = engine.claim("q", [], 2, "w", LEASE, clock.now())
    assert [lt.task.attempt for lt in leased] == [3, 3]
    waits = {}
    for lt in leased:
        task = engine.nack(ref_of(lt), "again", None, clock.now())
        waits[task.id] = task.available_at - clock.now()
    assert [waits[o.task.id] for o in outs] == [timedelta(seconds=4), timedelta(seconds=12)]


@pytest.mark.parametrize("state", ["pending", "scheduled", "leased"])
def test_retry_of_an_active_task_is_refused(
    engine: SyncEngine, clock: ManualClock, state: str
) -> None:
    """Retry of a PENDING or LEASED task is FailedPrecondition and changes nothing."""
    delay = timedelta(hours=1) if state == "scheduled" else None
    [out] = engine.enqueue("q", [spec(delay=delay)], clock.now())
    if state == "leased":
        claim_one(engine, clock.now())
    before = engine.get("q", task_id=out.task.id)
    clock.advance(timedelta(seconds=1))
    with pytest.raises(FailedPrecondition):
        engine.retry("q", clock.now(), task_id=out.task.id)
    assert engine.get("q", task_id=out.task.id) == before


def test_retry_of_an_unknown_task_is_not_found(engine: SyncEngine, clock: ManualClock) -> None:
    """Retry names a task by id or key; neither existing is NotFound."""
    with pytest.raises(NotFound):
        engine.retry("q", clock.now(), task_id="nope")
    with pytest.raises(NotFound):
        engine.retry("q", clock.now(), unique_key="nope")
    with pytest.raises(ValueError, match="exactly one"):
        engine.retry("q", clock.now())


# -- activity ------------------------------------------------------------------


def test_activity_counts_pending_scheduled_and_leased(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """activity = PENDING (due or scheduled) + LEASED of the queue, optionally only of
    some types; finished tasks and other queues do not count."""
    now = clock.now()
    engine.enqueue(
        "q",
        [
            spec("a"),
            spec("a", delay=timedelta(days=1)),
            spec("b"),
            spec("b"),
            spec("c"),
            spec("c"),
        ],
        now,
    )
    engine.enqueue("other", [spec("a")] * 4, now)
    assert engine.activity("q", []) == 6
    [b1, b2] = engine.claim("q", ["b"], 2, "w", LEASE, now)  # LEASED still counts
    assert engine.activity("q", []) == 6
    c1, c2 = engine.claim("q", ["c"], 2, "w", LEASE, now)
    engine.ack(ref_of(c1), now)
    engine.reject(ref_of(c2), "x", now)
    assert engine.activity("q", []) == 4
    assert engine.activity("q", ["a"]) == 2
    assert engine.activity("q", ["b"]) == 2
    assert engine.activity("q", ["b", "c"]) == 2
    assert engine.activity("q", ["c"]) == 0
    assert engine.activity("q", ["zzz"]) == 0
    assert engine.activity("nowhere", []) == 0
    engine.nack(ref_of(b1), "x", None, now)  # back to PENDING: still active
    engine.ack(ref_of(b2), now)
    assert engine.activity("q", ["b"]) == 1


# -- next_wakeup ---------------------------------------------------------------


def test_next_wakeup_is_none_without_pending_or_leased_work(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Nothing pending or leased (empty queue, or only finished tasks) -> None."""
    assert engine.next_wakeup("q", [], clock.now()) is None
    engine.enqueue("q", [spec()], clock.now())
    engine.ack(ref_of(claim_one(engine, clock.now())), clock.now())
    assert engine.next_wakeup("q", [], clock.now()) is None


def test_next_wakeup_is_the_soonest_scheduled_task(engine: SyncEngine, clock: ManualClock) -> None:
    """With only scheduled tasks, the soonest available_at of the queue (any priority,
    filtered by type when asked)."""
    now = clock.now()
    engine.enqueue(
        "q",
        [
            spec("a", priority=9, delay=timedelta(seconds=50)),
            spec("b", priority=0, delay=timedelta(seconds=20)),
            spec("a", priority=-5, delay=timedelta(seconds=30)),
        ],
        now,
    )
    engine.enqueue("other", [spec("a", delay=timedelta(seconds=1))], now)
    assert engine.next_wakeup("q", [], now) == now + timedelta(seconds=20)
    assert engine.next_wakeup("q", ["a"], now) == now + timedelta(seconds=30)
    assert engine.next_wakeup("q", ["zzz"], now) is None


def test_next_wakeup_sees_lease_expiry(engine: SyncEngine, clock: ManualClock) -> None:
    """A leased task can come back when its lease expires: that deadline is a wakeup."""
    now = clock.now()
    engine.enqueue("q", [spec("a"), spec("b", delay=timedelta(minutes=5))], now)
    [lt] = engine.claim("q", ["a"], 1, "w", LEASE, now)
    assert engine.next_wakeup("q", [], now) == now + LEASE
    assert engine.next_wakeup("q", ["b"], now) == now + timedelta(minutes=5)
    engine.extend_lease(ref_of(lt), timedelta(minutes=10), now)
    assert engine.next_wakeup("q", [], now) == now + timedelta(minutes=5)


def test_next_wakeup_is_now_when_work_is_already_claimable(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A due task, or an overdue lease not yet reaped, means a claim could succeed now:
    never a moment in the past."""
    now = clock.now()
    engine.enqueue("q", [spec(delay=timedelta(minutes=1)), spec(delay=timedelta(hours=1))], now)
    clock.advance(timedelta(minutes=2))
    assert engine.next_wakeup("q", [], clock.now()) == clock.now()
    claim_one(engine, clock.now())
    clock.advance(timedelta(minutes=10))  # the lease is overdue, nobody reaped it
    assert engine.next_wakeup("q", [], clock.now()) == clock.now()


@pytest.mark.parametrize("limits", ["none", "unkeyed", "keyed"])
def test_next_wakeup_across_many_priorities(
    engine: SyncEngine, clock: ManualClock, limits: str
) -> None:
    """The soonest moment is found however many distinct priorities the queue has,
    of every task type or of the types asked for (each walked on its own), on a
    queue with keyed limits too: its tasks without a key, and a key's own tasks,
    are each walked priority by priority."""
    now = clock.now()
    key = "k:a" if limits == "keyed" else ""
    if limits != "none":
        # A rule no task is held by: "unkeyed" has no task it applies to.
        engine.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1000), now)
    specs = [
        spec(priority=p, delay=timedelta(seconds=100 + p), limit_key=key) for p in range(40, 0, -1)
    ]
    specs.append(spec(priority=-1, delay=timedelta(seconds=7), limit_key=key))
    specs += [
        spec("u", priority=p, delay=timedelta(seconds=50 + p), limit_key=key)
        for p in range(40, 0, -1)
    ]
    specs.append(spec("u", priority=-2, delay=timedelta(seconds=5), limit_key=key))
    specs.append(spec("v", priority=-3, delay=timedelta(seconds=3), limit_key=key))
    engine.enqueue("q", specs, now)
    assert engine.next_wakeup("q", [], now) == now + timedelta(seconds=3)
    assert engine.next_wakeup("q", ["t"], now) == now + timedelta(seconds=7)
    assert engine.next_wakeup("q", ["t", "u"], now) == now + timedelta(seconds=5)
    assert engine.next_wakeup("q", ["u", "w"], now) == now + timedelta(seconds=5)
    assert engine.next_wakeup("q", ["w"], now) is None
