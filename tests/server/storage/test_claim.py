"""Claim: order, filters, what a lease is, and expiry before leasing."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from ringo_trio._proto.ringo.v1 import RetryBackoff, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import LeaseLost
from ringo_trio.server.storage.limits import Rule
from tests._kit.storage import LEASE, SyncEngine, claim_one, ref_of, spec


def _claim_ids(engine: SyncEngine, clock: ManualClock, limit: int, **kw: object) -> list[str]:
    types = kw.pop("task_types", [])
    leased = engine.claim(kw.pop("queue", "q"), types, limit, "w", LEASE, clock.now())
    return [lt.task.id for lt in leased]


def test_claim_order_is_priority_then_available_at_then_enqueue_order(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Claim order: highest priority first, then earliest available_at, then enqueue
    order -- both across claims and inside one claim's result."""
    t0 = clock.now()
    # Enqueued in an order that matches none of the three keys alone.
    late_low = engine.enqueue("q", [spec(priority=0, delay=timedelta(seconds=2))], t0)
    early_low_a = engine.enqueue("q", [spec(priority=0)], t0)
    high_late = engine.enqueue("q", [spec(priority=5, delay=timedelta(seconds=1))], t0)
    early_low_b = engine.enqueue("q", [spec(priority=0)], t0)
    high_early = engine.enqueue("q", [spec(priority=5)], t0)
    negative = engine.enqueue("q", [spec(priority=-1)], t0)
    expected = [
        high_early,
        high_late,
        early_low_a,
        early_low_b,
        late_low,
        negative,
    ]
    expected_ids = [outs[0].task.id for outs in expected]
    clock.advance(timedelta(seconds=3))
    assert _claim_ids(engine, clock, 3) == expected_ids[:3]
    assert _claim_ids(engine, clock, 10) == expected_ids[3:]


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
@pytest.mark.parametrize("claimed", [[], ["a", "b"], ["b", "c"]])
def test_order_holds_across_many_distinct_priorities(
    engine: SyncEngine, clock: ManualClock, claimed: list[str], limited: bool
) -> None:
    """Claim order holds however many distinct priorities a queue has (engines may walk
    priorities one by one and fall back to a scan past some number of them), for a
    claim of every type and for a claim of some types (which walks each type's own
    tasks and takes the first of them all), and on a queue with keyed limits, whose
    claim walks its tasks without a key on their own."""
    now = clock.now()
    if limited:
        engine.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), now)
    prios = [(i * 7919) % 61 - 30 for i in range(61)]  # every value in -30..30, shuffled
    # Two tasks of each priority, one per type, the first of the pair alternating.
    types = [("a", "b") if i % 2 else ("b", "a") for i in range(61)]
    specs = [spec(t, priority=p) for p, pair in zip(prios, types, strict=True) for t in pair]
    outs = engine.enqueue("q", specs, now)
    by_id = {o.task.id: o.task for o in outs}
    wanted = [o for o in outs if not claimed or o.task.task_type in claimed]
    expected = sorted(wanted, key=lambda o: -o.task.priority)  # stable: enqueue order kept
    got = _claim_ids(engine, clock, 50, task_types=claimed)
    got += _claim_ids(engine, clock, 1000, task_types=claimed)
    assert got == [o.task.id for o in expected]
    top = [30, 30, 29, 29] if len(wanted) == len(outs) else [30, 29, 28, 27]
    assert [by_id[i].priority for i in got][:4] == top


def test_scheduled_tasks_wait_for_their_time(engine: SyncEngine, clock: ManualClock) -> None:
    """A task is not leased before its available_at, at any priority, and is leased at it."""
    now = clock.now()
    [later] = engine.enqueue("q", [spec(priority=9, delay=timedelta(seconds=10))], now)
    [due] = engine.enqueue("q", [spec(priority=1)], now)
    assert _claim_ids(engine, clock, 10) == [due.task.id]
    assert _claim_ids(engine, clock, 10) == []
    clock.advance(timedelta(seconds=9, microseconds=999_999))
    assert _claim_ids(engine, clock, 10) == []
    clock.advance(timedelta(microseconds=1))
    assert _claim_ids(engine, clock, 10) == [later.task.id]


def test_claim_filters_by_task_type(engine: SyncEngine, clock: ManualClock) -> None:
    """Claim hands out only the requested types; empty task_types means every type."""
    outs = engine.enqueue("q", [spec("a"), spec("b"), spec("c"), spec("a")], clock.now())
    a1, b, c, a2 = (o.task.id for o in outs)
    assert _claim_ids(engine, clock, 10, task_types=["a"]) == [a1, a2]
    assert _claim_ids(engine, clock, 10, task_types=["zzz"]) == []
    assert _claim_ids(engine, clock, 10, task_types=["c", "b"]) == [b, c]
    engine.enqueue("q", [spec("d")], clock.now())
    assert len(_claim_ids(engine, clock, 10)) == 1


def test_claim_respects_limit_and_queue(engine: SyncEngine, clock: ManualClock) -> None:
    """Claim leases at most `limit` tasks, only from its own queue."""
    engine.enqueue("q", [spec()] * 5, clock.now())
    engine.enqueue("other", [spec()] * 5, clock.now())
    assert len(_claim_ids(engine, clock, 2)) == 2
    assert len(_claim_ids(engine, clock, 0)) == 0
    assert len(_claim_ids(engine, clock, 10)) == 3
    assert _claim_ids(engine, clock, 10) == []
    assert engine.activity("other", []) == 5
    assert engine.get("other", task_id=_claim_ids(engine, clock, 1, queue="other")[0])


def test_a_lease_bumps_attempt_mints_a_token_and_records_the_worker(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Every lease bumps attempt, mints a fresh token and sets worker_id and lease_until;
    the task comes back LEASED and storage agrees."""
    [out] = engine.enqueue(
        "q", [spec(retry_backoff=RetryBackoff(initial=timedelta(0)))], clock.now()
    )
    tokens = set()
    for attempt in (1, 2, 3):
        clock.advance(timedelta(seconds=1))
        [lt] = engine.claim("q", [], 1, f"worker-{attempt}", LEASE, clock.now())
        assert lt.lease is not None
        assert lt.task is not None
        assert lt.lease.task_id == lt.task.id == out.task.id
        assert lt.lease.attempt == lt.task.attempt == attempt
        assert lt.lease.worker_id == lt.task.worker_id == f"worker-{attempt}"
        assert lt.lease.until == lt.task.lease_until == clock.now() + LEASE
        assert lt.task.state == TaskState.LEASED
        assert lt.task.updated_at == clock.now()
        assert len(lt.lease.lease_token) >= 32
        tokens.add(lt.lease.lease_token)
        assert engine.get("q", task_id=out.task.id) == lt.task
        engine.nack(ref_of(lt), "again", timedelta(0), clock.now())
    assert len(tokens) == 3


def test_one_claim_mints_a_distinct_token_per_lease(engine: SyncEngine, clock: ManualClock) -> None:
    """Property (both engines, one minter): every lease of a claim gets its
    own token, 32 lowercase hex digits — the n-th task PostgreSQL leases
    takes the n-th token of one draw, SQLite calls the minter per row."""
    engine.enqueue("q", [spec() for _ in range(20)], clock.now())
    claimed = engine.claim("q", [], 20, "w", LEASE, clock.now())
    tokens = [lt.lease.lease_token for lt in claimed]
    assert len(tokens) == 20
    assert len(set(tokens)) == 20
    assert all(re.fullmatch(r"[0-9a-f]{32}", token) for token in tokens)


def test_an_expired_lease_is_never_handed_out_again_for_the_same_attempt(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Claim first expires overdue leases of its queue: the task comes back with a new
    attempt number and a fresh token, and the old lease is dead."""
    backoff = RetryBackoff(initial=timedelta(seconds=1))
    engine.enqueue("q", [spec(retry_backoff=backoff)], clock.now())
    first = claim_one(engine, clock.now())
    clock.advance(LEASE)  # until <= now: expired
    # Not yet due again: expiry applied the backoff.
    assert engine.claim("q", [], 1, "w2", LEASE, clock.now()) == []
    task = engine.get("q", task_id=first.task.id)
    assert task.state == TaskState.PENDING
    assert task.last_error == "lease expired"
    assert task.available_at == clock.now() + timedelta(seconds=1)
    assert task.lease_until is None
    assert task.worker_id == ""
    clock.advance(timedelta(seconds=1))
    second = claim_one(engine, clock.now())
    assert second.lease is not None
    assert first.lease is not None
    assert second.lease.attempt == 2
    assert second.lease.lease_token != first.lease.lease_token
    with pytest.raises(LeaseLost):
        engine.ack(ref_of(first), clock.now())
    engine.ack(ref_of(second), clock.now())


def test_claim_expires_only_its_own_queue(engine: SyncEngine, clock: ManualClock) -> None:
    """The expiry a claim runs first is scoped to its queue; other queues' overdue leases
    wait for their own claims or the reaper."""
    engine.enqueue("a", [spec()], clock.now())
    [lt] = engine.claim("a", [], 1, "w", LEASE, clock.now())
    clock.advance(2 * LEASE)
    engine.claim("b", [], 1, "w", LEASE, clock.now())
    assert engine.get("a", task_id=lt.task.id).state == TaskState.LEASED
    assert engine.expire_leases(clock.now()) == 1
    assert engine.get("a", task_id=lt.task.id).state == TaskState.PENDING


def test_an_expired_last_attempt_is_dead(engine: SyncEngine, clock: ManualClock) -> None:
    """Expiry of the last attempt makes the task DEAD, finished, never leased again."""
    [out] = engine.enqueue("q", [spec(max_attempts=1)], clock.now())
    claim_one(engine, clock.now())
    clock.advance(LEASE)
    assert engine.claim("q", [], 1, "w", LEASE, clock.now()) == []
    task = engine.get("q", task_id=out.task.id)
    assert task.state == TaskState.DEAD
    assert task.finished_at == clock.now()
    assert task.last_error == "lease expired"
    clock.advance(timedelta(days=1))
    assert engine.claim("q", [], 1, "w", LEASE, clock.now()) == []
