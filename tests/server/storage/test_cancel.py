"""CancelTask, bulk retry of DEAD tasks and result values, on both engines.

The lifecycle these pin down (storage/base.py): PENDING | LEASED --cancel-->
CANCELLED (terminal; retry brings it back); a cancelled lease is gone at once
and the worker's next command on it is LeaseLost *saying* it was cancelled.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ringo_trio._proto.ringo.v1 import LeaseRef, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import FailedPrecondition, LeaseLost, NotFound
from tests._kit.storage import LEASE, SyncEngine, claim_one, ref_of, spec


def _lease_ops(engine: SyncEngine, ref: LeaseRef, clock: ManualClock) -> dict[str, object]:
    """Every lease operation on `ref`, each a thunk."""
    now = clock.now()
    return {
        "ack": lambda: engine.ack(ref, now, b"late"),
        "nack": lambda: engine.nack(ref, "x", None, now),
        "reject": lambda: engine.reject(ref, "x", now),
        "extend": lambda: engine.extend_lease(ref, LEASE, now),
        "progress": lambda: engine.report_progress(ref, 1, 2, "m", now),
    }


@pytest.mark.parametrize("by", ["task_id", "unique_key"])
def test_cancel_of_a_pending_task_makes_it_cancelled_and_never_claimed(
    engine: SyncEngine, clock: ManualClock, by: str
) -> None:
    """A PENDING task cancelled (by id or by key) is CANCELLED at once: finished_at
    is now, last_error carries the reason; no claim hands it out and it no longer
    counts as active."""
    [out] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    clock.advance(timedelta(seconds=3))
    lookup = {"task_id": out.task.id} if by == "task_id" else {"unique_key": "k"}
    task = engine.cancel("q", "operator said so", clock.now(), **lookup)
    assert task.state == TaskState.CANCELLED
    assert task.finished_at == task.updated_at == clock.now()
    assert task.last_error == "cancelled: operator said so"
    assert task.attempt == 0
    assert engine.get("q", task_id=out.task.id) == task
    assert engine.claim("q", [], 10, "w", LEASE, clock.now()) == []
    assert engine.activity("q", []) == 0
    assert engine.next_wakeup("q", [], clock.now()) is None


def test_cancel_without_a_reason_says_cancelled(engine: SyncEngine, clock: ManualClock) -> None:
    """No reason: last_error is just "cancelled"."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    assert engine.cancel("q", "", clock.now(), task_id=out.task.id).last_error == "cancelled"


@pytest.mark.parametrize("op", ["ack", "nack", "reject", "extend", "progress"])
def test_a_cancelled_lease_is_lost_and_says_cancelled(
    engine: SyncEngine, clock: ManualClock, op: str
) -> None:
    """Cancelling a LEASED task clears its lease: every lease operation of the
    worker that held it is LeaseLost with cancelled=True, and the task stays
    CANCELLED (a late ack never resurrects it as SUCCEEDED)."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    cancelled = engine.cancel("q", "stop", clock.now(), task_id=out.task.id)
    assert cancelled.state == TaskState.CANCELLED
    assert cancelled.worker_id == ""
    assert cancelled.lease_until is None
    assert cancelled.attempt == 1
    with pytest.raises(LeaseLost) as lost:
        _lease_ops(engine, ref_of(lt), clock)[op]()  # type: ignore[operator]
    assert lost.value.cancelled
    assert "cancelled" in str(lost.value)
    assert engine.get("q", task_id=out.task.id) == cancelled
    # A release (a stopping worker handing the lease back) changes nothing either.
    assert engine.release([ref_of(lt)], clock.now()) == 0
    assert engine.get("q", task_id=out.task.id) == cancelled
    assert engine.claim("q", [], 10, "w", LEASE, clock.now()) == []


def test_only_the_cancelled_attempt_is_told_cancelled(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A stale ref of an earlier attempt (its lease expired, the task was leased
    again, then cancelled) is LeaseLost without cancelled: that attempt ended by
    expiry, not by the cancel. A plain stale ref of a live task is not cancelled."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    first = claim_one(engine, clock.now(), lease=timedelta(seconds=1))
    clock.advance(timedelta(seconds=1))
    assert engine.expire_leases(clock.now()) == 1
    clock.advance(timedelta(minutes=10))  # past the backoff
    second = claim_one(engine, clock.now())
    assert second.lease is not None
    assert second.lease.attempt == 2
    with pytest.raises(LeaseLost) as stale:
        engine.ack(ref_of(first), clock.now())
    assert not stale.value.cancelled
    engine.cancel("q", "", clock.now(), task_id=out.task.id)
    with pytest.raises(LeaseLost) as old:
        engine.ack(ref_of(first), clock.now())
    assert not old.value.cancelled
    with pytest.raises(LeaseLost) as current:
        engine.ack(ref_of(second), clock.now())
    assert current.value.cancelled


def test_cancel_of_a_cancelled_task_returns_it_unchanged(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Cancel is idempotent: a second cancel returns the task as the first left it
    (its reason and finished_at are kept)."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    first = engine.cancel("q", "one", clock.now(), task_id=out.task.id)
    clock.advance(timedelta(minutes=1))
    assert engine.cancel("q", "two", clock.now(), task_id=out.task.id) == first
    assert engine.get("q", task_id=out.task.id) == first


@pytest.mark.parametrize("finish", ["ack", "reject"])
def test_cancel_of_a_finished_task_is_refused(
    engine: SyncEngine, clock: ManualClock, finish: str
) -> None:
    """SUCCEEDED and DEAD tasks cannot be cancelled: FailedPrecondition naming the
    state, and the task is unchanged."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    lt = claim_one(engine, clock.now())
    if finish == "ack":
        engine.ack(ref_of(lt), clock.now(), b"r")
    else:
        engine.reject(ref_of(lt), "no", clock.now())
    before = engine.get("q", task_id=out.task.id)
    with pytest.raises(FailedPrecondition, match=r"SUCCEEDED|DEAD"):
        engine.cancel("q", "", clock.now(), task_id=out.task.id)
    assert engine.get("q", task_id=out.task.id) == before


def test_cancel_of_an_unknown_task_is_not_found(engine: SyncEngine, clock: ManualClock) -> None:
    """Unknown id, unknown key, or a task of another queue: NotFound."""
    [out] = engine.enqueue("other", [spec(unique_key="k")], clock.now())
    with pytest.raises(NotFound):
        engine.cancel("q", "", clock.now(), task_id="nope")
    with pytest.raises(NotFound):
        engine.cancel("q", "", clock.now(), unique_key="k")
    with pytest.raises(NotFound):
        engine.cancel("q", "", clock.now(), task_id=out.task.id)


def test_retry_of_a_cancelled_task_makes_it_claimable(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Retry accepts CANCELLED: PENDING now, a fresh attempt budget, and the next
    claim leases it with the next attempt number."""
    [out] = engine.enqueue("q", [spec(unique_key="k", max_attempts=2)], clock.now())
    claim_one(engine, clock.now())
    engine.cancel("q", "", clock.now(), unique_key="k")
    clock.advance(timedelta(seconds=5))
    task = engine.retry("q", clock.now(), unique_key="k")
    assert task.state == TaskState.PENDING
    assert task.finished_at is None
    assert task.max_attempts == 1 + 2
    again = claim_one(engine, clock.now())
    assert again.task.id == out.task.id
    assert again.lease is not None
    assert again.lease.attempt == 2


# -- results --------------------------------------------------------------------


def test_a_result_is_stored_with_success_and_retry_clears_it(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """ack stores the handler's return value with the SUCCEEDED task; get reads it
    back; retry clears it (a new run has no result yet); ack without one stores none."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    acked = engine.ack(ref_of(claim_one(engine, clock.now())), clock.now(), b"\x00answer")
    assert acked.result == b"\x00answer"
    assert engine.get("q", task_id=out.task.id).result == b"\x00answer"
    retried = engine.retry("q", clock.now(), task_id=out.task.id)
    assert retried.result is None
    assert engine.ack(ref_of(claim_one(engine, clock.now())), clock.now()).result is None
    assert engine.get("q", task_id=out.task.id).result is None


# -- bulk retry of DEAD tasks ----------------------------------------------------


def _dead(engine: SyncEngine, clock: ManualClock, task_type: str = "t", n: int = 1) -> list[str]:
    """`n` tasks of `task_type` made DEAD one second apart; their ids in death order."""
    engine.enqueue("q", [spec(task_type) for _ in range(n)], clock.now())
    ids = []
    for _ in range(n):
        [lt] = engine.claim("q", [task_type], 1, "w", LEASE, clock.now())
        engine.reject(ref_of(lt), "boom", clock.now())
        ids.append(lt.task.id)
        clock.advance(timedelta(seconds=1))
    return ids


def test_retry_dead_reactivates_the_oldest_dead_tasks_up_to_the_limit(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """retry_dead takes DEAD tasks oldest finished first, at most `limit`, and makes
    each PENDING as retry does (fresh budget, finished_at cleared); other states are
    never touched; the count says how many changed."""
    ids = _dead(engine, clock, n=5)
    [ok] = engine.enqueue("q", [spec()], clock.now())
    succeeded = engine.ack(ref_of(claim_one(engine, clock.now())), clock.now(), b"r")
    [pending] = engine.enqueue("q", [spec()], clock.now())
    assert engine.retry_dead("q", [], None, 3, clock.now()) == 3
    states = {i: engine.get("q", task_id=i).state for i in ids}
    assert [states[i] for i in ids] == [TaskState.PENDING] * 3 + [TaskState.DEAD] * 2
    first = engine.get("q", task_id=ids[0])
    assert first.finished_at is None
    assert first.available_at == clock.now()
    assert first.max_attempts == first.attempt + 5
    assert engine.get("q", task_id=ok.task.id) == succeeded
    assert engine.get("q", task_id=pending.task.id).state == TaskState.PENDING
    assert engine.retry_dead("q", [], None, 1, clock.now()) == 1  # a batch of one
    assert engine.get("q", task_id=ids[3]).state == TaskState.PENDING
    assert engine.retry_dead("q", [], None, 3, clock.now()) == 1
    assert engine.retry_dead("q", [], None, 3, clock.now()) == 0
    assert engine.retry_dead("q", [], None, 0, clock.now()) == 0


def test_retry_dead_filters_by_type_age_and_queue(engine: SyncEngine, clock: ManualClock) -> None:
    """Only DEAD tasks of the given types, of this queue, finished strictly before
    `finished_before` are retried."""
    old_a = _dead(engine, clock, "a", 2)
    cutoff = clock.now()
    young_a = _dead(engine, clock, "a", 1)
    b = _dead(engine, clock, "b", 1)
    engine.enqueue("other", [spec("a")], clock.now())
    [lt] = engine.claim("other", [], 1, "w", LEASE, clock.now())
    engine.reject(ref_of(lt), "x", clock.now())
    assert engine.retry_dead("q", ["a"], cutoff, 100, clock.now()) == 2
    assert {engine.get("q", task_id=i).state for i in old_a} == {TaskState.PENDING}
    assert engine.get("q", task_id=young_a[0]).state == TaskState.DEAD
    assert engine.get("q", task_id=b[0]).state == TaskState.DEAD
    assert engine.get("other", task_id=lt.task.id).state == TaskState.DEAD
    assert engine.retry_dead("q", ["b", "zzz"], None, 100, clock.now()) == 1
    assert engine.retry_dead("q", [], None, 100, clock.now()) == 1
    assert engine.get("other", task_id=lt.task.id).state == TaskState.DEAD


def test_bulk_retry_wakes_other_postgres_daemons(storage_database: str) -> None:
    """PostgreSQL: a bulk retry that made tasks claimable notifies the other
    engines' watches (naming the queue), as a single retry does; one that
    changed nothing sends nothing."""
    from tests._kit.storage import engines, run, watching

    clock = ManualClock()

    async def main() -> None:
        async with (
            engines(storage_database, "x_bulk_retry_wakes", 2) as (a, b),
            watching(a) as at_a,
        ):
            await b.enqueue("bulk", [spec(), spec()], clock.now())
            await at_a.wait_for("bulk")
            for lt in await b.claim("bulk", [], 2, "w", LEASE, clock.now()):
                await b.reject(ref_of(lt), "x", clock.now())
            assert await b.retry_dead("bulk", ["other-type"], None, 10, clock.now()) == 0
            assert await b.retry_dead("bulk", [], None, 10, clock.now()) == 2
            await at_a.wait_for("bulk", 2)
            await b.enqueue("marker", [spec()], clock.now())
            await at_a.wait_for("marker")
            assert at_a.seen == [None, "bulk", "bulk", "marker"]

    run(main())
