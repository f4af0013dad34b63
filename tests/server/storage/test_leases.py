"""Operations on a lease: ack, nack, reject, extend, progress, expiry -- and the
lease check that guards every one of them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ringo_trio._proto.ringo.v1 import LeaseRef, Progress, RetryBackoff, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import LeaseLost
from tests._kit.storage import LEASE, SyncEngine, claim_one, ref_of, spec

# Every LeaseRef operation, as (name, call(engine, ref, now)).
OPERATIONS: list[tuple[str, Callable[[SyncEngine, LeaseRef, Any], Any]]] = [
    ("ack", lambda e, r, now: e.ack(r, now)),
    ("nack", lambda e, r, now: e.nack(r, "boom", None, now)),
    ("nack-override", lambda e, r, now: e.nack(r, "boom", timedelta(seconds=3), now)),
    ("reject", lambda e, r, now: e.reject(r, "bad", now)),
    ("extend", lambda e, r, now: e.extend_lease(r, timedelta(minutes=5), now)),
    ("progress", lambda e, r, now: e.report_progress(r, 1.0, 2.0, "half", now)),
]
OP_IDS = [name for name, _ in OPERATIONS]


def _stale(kind: str, engine: SyncEngine, clock: ManualClock) -> tuple[LeaseRef, str]:
    """A ref that is not the live lease of its task, in each way one can be stale, and
    the task's id; the task is in whatever state that staleness leaves it."""
    engine.enqueue("q", [spec(retry_backoff=RetryBackoff(initial=timedelta(0)))], clock.now())
    lt = claim_one(engine, clock.now())
    ref = ref_of(lt)
    return _staled(kind, engine, clock, ref), lt.task.id


def _staled(kind: str, engine: SyncEngine, clock: ManualClock, ref: LeaseRef) -> LeaseRef:
    if kind == "wrong-token":
        return LeaseRef(task_id=ref.task_id, attempt=ref.attempt, lease_token="0" * 32)
    if kind == "empty-token":
        return LeaseRef(task_id=ref.task_id, attempt=ref.attempt, lease_token="")
    if kind == "wrong-attempt":
        return LeaseRef(task_id=ref.task_id, attempt=ref.attempt + 1, lease_token=ref.lease_token)
    if kind == "unknown-task":
        return LeaseRef(task_id="nope", attempt=ref.attempt, lease_token=ref.lease_token)
    if kind == "expired-unreaped":
        clock.advance(LEASE)  # until == now: the lease is over
        return ref
    if kind == "previous-attempt":
        clock.advance(LEASE)
        clock.advance(timedelta(seconds=1))
        claim_one(engine, clock.now())  # expires the old lease, leases attempt 2
        return ref
    if kind == "after-ack":
        engine.ack(ref, clock.now())
        return ref
    if kind == "after-nack":
        engine.nack(ref, "x", timedelta(hours=1), clock.now())
        return ref
    if kind == "after-reject":
        engine.reject(ref, "x", clock.now())
        return ref
    raise AssertionError(kind)


STALE_KINDS = [
    "wrong-token",
    "empty-token",
    "wrong-attempt",
    "unknown-task",
    "expired-unreaped",
    "previous-attempt",
    "after-ack",
    "after-nack",
    "after-reject",
]


@pytest.mark.parametrize("kind", STALE_KINDS)
@pytest.mark.parametrize("operation", [op for _, op in OPERATIONS], ids=OP_IDS)
def test_a_stale_lease_never_changes_a_task(
    engine: SyncEngine,
    clock: ManualClock,
    kind: str,
    operation: Callable[[SyncEngine, LeaseRef, Any], Any],
) -> None:
    """A stale lease never changes a task: a LeaseRef that is not the task's current,
    live lease gets LeaseLost from every operation, and the task is exactly as before."""
    ref, task_id = _stale(kind, engine, clock)
    before = engine.get("q", task_id=task_id)
    clock.advance(timedelta(milliseconds=1))
    with pytest.raises(LeaseLost):
        operation(engine, ref, clock.now())
    assert engine.get("q", task_id=task_id) == before


@pytest.mark.parametrize("operation", [op for _, op in OPERATIONS], ids=OP_IDS)
def test_a_lease_is_over_at_its_deadline(
    engine: SyncEngine,
    clock: ManualClock,
    operation: Callable[[SyncEngine, LeaseRef, Any], Any],
) -> None:
    """A lease is live while now < until: at now == until every operation is LeaseLost
    and changes nothing (the same instant expiry and claim treat as expired)."""
    engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    clock.advance(LEASE)
    before = engine.get("q", task_id=lt.task.id)
    with pytest.raises(LeaseLost):
        operation(engine, ref_of(lt), clock.now())
    assert engine.get("q", task_id=lt.task.id) == before


@pytest.mark.parametrize("operation", [op for _, op in OPERATIONS], ids=OP_IDS)
def test_the_live_lease_is_accepted_up_to_its_last_microsecond(
    engine: SyncEngine,
    clock: ManualClock,
    operation: Callable[[SyncEngine, LeaseRef, Any], Any],
) -> None:
    """A lease is live while now < until: every operation succeeds one microsecond
    before the deadline."""
    engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    clock.advance(LEASE - timedelta(microseconds=1))
    operation(engine, ref_of(lt), clock.now())


def test_ack_succeeds_a_task_once(engine: SyncEngine, clock: ManualClock) -> None:
    """Ack makes the task SUCCEEDED with finished_at, clears the lease, keeps the last
    error; a second ack of the same lease is LeaseLost -- no task SUCCEEDED twice."""
    [out] = engine.enqueue(
        "q", [spec(retry_backoff=RetryBackoff(initial=timedelta(0)))], clock.now()
    )
    engine.nack(ref_of(claim_one(engine, clock.now())), "first try failed", None, clock.now())
    lt = claim_one(engine, clock.now())
    clock.advance(timedelta(seconds=1))
    task = engine.ack(ref_of(lt), clock.now())
    assert task.state == TaskState.SUCCEEDED
    assert task.finished_at == task.updated_at == clock.now()
    assert task.attempt == 2
    assert task.last_error == "first try failed"
    assert task.lease_until is None
    assert task.worker_id == ""
    assert engine.get("q", task_id=out.task.id) == task
    with pytest.raises(LeaseLost):
        engine.ack(ref_of(lt), clock.now())
    assert engine.claim("q", [], 1, "w", LEASE, clock.now()) == []


@pytest.mark.parametrize(
    ("attempts_before", "expected"),
    [
        (1, timedelta(seconds=2)),  # initial
        (2, timedelta(seconds=6)),  # initial * 3
        (3, timedelta(seconds=18)),  # initial * 3^2
        (4, timedelta(seconds=50)),  # 54, capped
        (9, timedelta(seconds=50)),
    ],
)
def test_nack_backs_off_exponentially_up_to_the_cap(
    engine: SyncEngine, clock: ManualClock, attempts_before: int, expected: timedelta
) -> None:
    """A nack returns the task to PENDING at now + initial * multiplier^(attempt-1),
    capped at the maximum, and records the error."""
    backoff = RetryBackoff(
        initial=timedelta(seconds=2), maximum=timedelta(seconds=50), multiplier=3
    )
    [out] = engine.enqueue("q", [spec(max_attempts=100, retry_backoff=backoff)], clock.now())
    for _ in range(attempts_before - 1):
        engine.nack(ref_of(claim_one(engine, clock.now())), "x", timedelta(0), clock.now())
    lt = claim_one(engine, clock.now())
    assert lt.task.attempt == attempts_before
    clock.advance(timedelta(seconds=7))
    task = engine.nack(ref_of(lt), f"failure {attempts_before}", None, clock.now())
    assert task.state == TaskState.PENDING
    assert task.available_at == clock.now() + expected
    assert task.last_error == f"failure {attempts_before}"
    assert task.lease_until is None
    assert task.worker_id == ""
    assert task.finished_at is None
    assert task.updated_at == clock.now()
    assert engine.get("q", task_id=out.task.id) == task


def test_backoff_survives_absurd_exponents(engine: SyncEngine, clock: ManualClock) -> None:
    """A huge attempt number caps at the maximum instead of overflowing."""
    backoff = RetryBackoff(
        initial=timedelta(seconds=1), maximum=timedelta(hours=2), multiplier=1e300
    )
    engine.enqueue("q", [spec(max_attempts=10, retry_backoff=backoff)], clock.now())
    engine.nack(ref_of(claim_one(engine, clock.now())), "x", timedelta(0), clock.now())
    engine.nack(ref_of(claim_one(engine, clock.now())), "x", timedelta(0), clock.now())
    task = engine.nack(ref_of(claim_one(engine, clock.now())), "x", None, clock.now())
    assert task.available_at == clock.now() + timedelta(hours=2)


@pytest.mark.parametrize("override", [timedelta(0), timedelta(seconds=3), timedelta(hours=9)])
def test_a_nack_override_replaces_the_backoff(
    engine: SyncEngine, clock: ManualClock, override: timedelta
) -> None:
    """retry_delay replaces the task's backoff for this retry (uncapped, zero allowed)."""
    engine.enqueue("q", [spec()], clock.now())
    task = engine.nack(ref_of(claim_one(engine, clock.now())), "x", override, clock.now())
    assert task.state == TaskState.PENDING
    assert task.available_at == clock.now() + override


def test_a_nack_of_the_last_attempt_is_dead(engine: SyncEngine, clock: ManualClock) -> None:
    """When the nacked attempt was the last one the task is DEAD, even with an override."""
    [out] = engine.enqueue("q", [spec(max_attempts=2)], clock.now())
    engine.nack(ref_of(claim_one(engine, clock.now())), "one", timedelta(0), clock.now())
    task = engine.nack(ref_of(claim_one(engine, clock.now())), "two", timedelta(0), clock.now())
    assert task.state == TaskState.DEAD
    assert task.attempt == task.max_attempts == 2
    assert task.finished_at == clock.now()
    assert task.last_error == "two"
    assert engine.get("q", task_id=out.task.id) == task
    assert engine.claim("q", [], 1, "w", LEASE, clock.now()) == []


def test_reject_is_dead_at_once(engine: SyncEngine, clock: ManualClock) -> None:
    """Reject makes the task DEAD whatever attempts remain, with its error."""
    [out] = engine.enqueue("q", [spec(max_attempts=50)], clock.now())
    task = engine.reject(ref_of(claim_one(engine, clock.now())), "malformed", clock.now())
    assert task.state == TaskState.DEAD
    assert task.attempt == 1
    assert task.finished_at == clock.now()
    assert task.last_error == "malformed"
    assert task.lease_until is None
    assert engine.get("q", task_id=out.task.id) == task


def test_extend_resets_the_deadline_absolutely(engine: SyncEngine, clock: ManualClock) -> None:
    """extend: until = now + extension (a reset, not an addition), the token stays valid,
    and the lease then outlives its original deadline."""
    engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    assert lt.lease is not None
    clock.advance(timedelta(seconds=20))
    lease = engine.extend_lease(ref_of(lt), timedelta(seconds=30), clock.now())
    assert lease.until == clock.now() + timedelta(seconds=30)
    assert (lease.task_id, lease.attempt, lease.lease_token, lease.worker_id) == (
        lt.lease.task_id,
        lt.lease.attempt,
        lt.lease.lease_token,
        lt.lease.worker_id,
    )
    task = engine.get("q", task_id=lt.task.id)
    assert task.lease_until == lease.until
    assert task.updated_at == clock.now()
    # Shrinking is allowed too: it is a reset.
    lease = engine.extend_lease(ref_of(lt), timedelta(seconds=5), clock.now())
    assert lease.until == clock.now() + timedelta(seconds=5)
    clock.advance(timedelta(seconds=4))  # past nothing yet; original deadline was +30
    assert engine.expire_leases(clock.now()) == 0
    engine.ack(ref_of(lt), clock.now())


def test_an_extended_lease_outlives_its_first_deadline(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """After an extension neither claim nor the reaper takes the task at the old deadline."""
    engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    engine.extend_lease(ref_of(lt), 2 * LEASE, clock.now())
    clock.advance(LEASE)
    assert engine.claim("q", [], 1, "w2", LEASE, clock.now()) == []
    assert engine.expire_leases(clock.now()) == 0
    assert engine.ack(ref_of(lt), clock.now()).state == TaskState.SUCCEEDED


def test_progress_is_stored_on_the_task(engine: SyncEngine, clock: ManualClock) -> None:
    """Progress lands on Task.progress with its time; the latest report wins and it is
    kept when the attempt ends."""
    engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    assert engine.get("q", task_id=lt.task.id).progress is None
    engine.report_progress(ref_of(lt), 1, 10, "started", clock.now())
    clock.advance(timedelta(seconds=1))
    engine.report_progress(ref_of(lt), 2.5, 10, "going", clock.now())
    task = engine.get("q", task_id=lt.task.id)
    assert task.progress == Progress(
        current=2.5, total=10.0, message="going", updated_at=clock.now()
    )
    assert task.updated_at == clock.now()
    assert task.state == TaskState.LEASED
    done = engine.ack(ref_of(lt), clock.now())
    assert done.progress == task.progress


def test_expire_leases_returns_overdue_leases(engine: SyncEngine, clock: ManualClock) -> None:
    """expire_leases moves every lease with until <= now (any queue) to PENDING with
    backoff, or DEAD on the last attempt, and counts them; live leases are untouched."""
    backoff = RetryBackoff(initial=timedelta(seconds=4))
    engine.enqueue("a", [spec(retry_backoff=backoff), spec(max_attempts=1)], clock.now())
    engine.enqueue("b", [spec(retry_backoff=backoff)], clock.now())
    retried, last = engine.claim("a", [], 2, "w", LEASE, clock.now())
    clock.advance(timedelta(seconds=10))
    [other] = engine.claim("b", [], 1, "w", LEASE, clock.now())
    clock.advance(LEASE - timedelta(seconds=10))  # a's leases exactly due, b's not
    assert engine.expire_leases(clock.now()) == 2
    assert engine.expire_leases(clock.now()) == 0
    t = engine.get("a", task_id=retried.task.id)
    assert (t.state, t.available_at, t.last_error) == (
        TaskState.PENDING,
        clock.now() + timedelta(seconds=4),
        "lease expired",
    )
    assert (t.lease_until, t.worker_id, t.updated_at) == (None, "", clock.now())
    t = engine.get("a", task_id=last.task.id)
    assert (t.state, t.finished_at, t.last_error) == (
        TaskState.DEAD,
        clock.now(),
        "lease expired",
    )
    assert engine.get("b", task_id=other.task.id).state == TaskState.LEASED
    engine.ack(ref_of(other), clock.now())


# -- release: a lease the daemon claimed but could not deliver -----------------


def test_release_returns_undelivered_leases_without_spending_an_attempt(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """release puts each live lease's task back to PENDING, claimable at once and in
    its old place in claim order, lease cleared and `attempt` decremented (even the
    last attempt is not spent); a re-claim mints a fresh token, so the released ref
    stays powerless; the count is the number of tasks changed."""
    outcomes = engine.enqueue("q", [spec(priority=5), spec(max_attempts=1), spec()], clock.now())
    ids = [o.task.id for o in outcomes]
    first, second = engine.claim("q", [], 2, "w1", LEASE, clock.now())
    assert [first.task.id, second.task.id] == ids[:2]
    before = [engine.get("q", task_id=i) for i in ids]
    clock.advance(timedelta(seconds=1))
    assert engine.release([ref_of(first), ref_of(second)], clock.now()) == 2
    for task_id in ids[:2]:
        task = engine.get("q", task_id=task_id)
        assert task.state == TaskState.PENDING
        assert task.attempt == 0
        assert (task.worker_id, task.lease_until, task.finished_at) == ("", None, None)
        assert task.available_at <= clock.now()
        assert task.updated_at == clock.now()
    assert engine.get("q", task_id=ids[0]).available_at == before[0].available_at
    again = engine.claim("q", [], 3, "w2", LEASE, clock.now())
    assert [lt.task.id for lt in again] == ids
    assert [lt.lease.attempt for lt in again] == [1, 1, 1]
    assert again[0].lease.lease_token != first.lease.lease_token
    assert again[1].lease.lease_token != second.lease.lease_token
    with pytest.raises(LeaseLost):
        engine.ack(ref_of(first), clock.now())
    assert engine.release([ref_of(second)], clock.now()) == 0
    assert engine.get("q", task_id=ids[1]).state == TaskState.LEASED


@pytest.mark.parametrize("kind", STALE_KINDS)
def test_release_skips_a_ref_that_is_not_the_live_lease(
    engine: SyncEngine, clock: ManualClock, kind: str
) -> None:
    """release never touches a task whose lease the ref does not name (it may
    belong to a worker now), and counts nothing for it."""
    ref, task_id = _stale(kind, engine, clock)
    before = engine.get("q", task_id=task_id)
    clock.advance(timedelta(milliseconds=1))
    assert engine.release([ref], clock.now()) == 0
    assert engine.get("q", task_id=task_id) == before


def test_release_is_refused_at_the_deadline_and_accepted_before_it(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (one deadline for every lease operation): a lease handed
    back at the very microsecond it ends is over, as for ack or extend, so
    its attempt stays spent (expiry records it); one microsecond before,
    the hand-back returns the task with the attempt unspent."""
    engine.enqueue("q", [spec(), spec()], clock.now())
    late, early = engine.claim("q", [], 2, "w1", LEASE, clock.now())
    clock.advance(LEASE - timedelta(microseconds=1))
    assert engine.release([ref_of(early)], clock.now()) == 1
    assert engine.get("q", task_id=early.task.id).attempt == 0
    clock.advance(timedelta(microseconds=1))
    before = engine.get("q", task_id=late.task.id)
    assert engine.release([ref_of(late)], clock.now()) == 0
    assert engine.get("q", task_id=late.task.id) == before


def test_release_of_a_mixed_batch_changes_only_the_live_leases(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """In one call, live refs are released and stale ones skipped; an empty batch is 0."""
    engine.enqueue("q", [spec(), spec()], clock.now())
    live, acked = engine.claim("q", [], 2, "w1", LEASE, clock.now())
    engine.ack(ref_of(acked), clock.now())
    assert engine.release([ref_of(acked), ref_of(live)], clock.now()) == 1
    assert engine.get("q", task_id=live.task.id).state == TaskState.PENDING
    assert engine.get("q", task_id=acked.task.id).state == TaskState.SUCCEEDED
    assert engine.release([], clock.now()) == 0
