"""Rows no request can write any more: values written before the limits
existed (or by hand), read back by both engines.

The service refuses every duration and time that would store a value beyond
what `datetime` and a protobuf Timestamp can express (`_limits.MAX_DELAY`,
`MAX_NOT_BEFORE`), so these rows are planted with SQL, exactly as an older
daemon could have left them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ringo_trio._contract.limits import MAX_ACTIVITY_COUNT, MAX_DELAY
from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.postgres.schema import schedule_of
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.storage import LEASE, SyncEngine, claim_one, ref_of, spec

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
# A protobuf Duration holds at most 10,000 years.
LONGEST = timedelta(seconds=315_576_000_000)


def plant(engine: SyncEngine, task_id: str, **columns: int) -> None:
    """Overwrite columns of one task row behind the engine's back."""
    sets = ", ".join(f"{name} = {value}" for name, value in columns.items())
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        raw._conn().execute(f"UPDATE tasks SET {sets} WHERE id = ?", (task_id,))
    else:
        assert isinstance(raw, PostgresEngine)
        sql = f"UPDATE {raw._sql.tasks} SET {sets} WHERE id = $1"
        engine.run(raw._live_pool().execute(sql, task_id))
        if any(name.startswith("backoff_") for name in columns):
            # As the row would read after the migration that stores each
            # task's retry delays (computed from its policy).
            engine.run(_refill_retry_delays(raw, task_id))


async def _refill_retry_delays(raw: PostgresEngine, task_id: str) -> None:
    pool = raw._live_pool()
    kind = await pool.fetchrow(
        "SELECT backoff_initial_us, backoff_max_us, backoff_multiplier, max_attempts"
        f" FROM {raw._sql.tasks} WHERE id = $1",
        task_id,
    )
    sql = f"UPDATE {raw._sql.tasks} SET retry_delays_us = $2 WHERE id = $1"
    await pool.execute(sql, task_id, schedule_of(*kind))


def test_a_time_beyond_year_9999_reads_as_the_latest_moment_and_spares_other_tasks(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: a PENDING task whose stored available_at lies past year 9999
    (a backoff of millions of days, from before the limits) fails no read:
    GetTask answers it with the latest representable moment, the other tasks
    of the queue stay readable and claimable, and next_wakeup (the long poll
    and idle Work stream's question) answers that moment instead of raising."""
    now = clock.now()
    poisoned, good, other = (o.task for o in engine.enqueue("q", [spec(), spec(), spec()], now))
    plant(engine, poisoned.id, available_at=INT64_MAX)
    # A due task with bad times of its own is still claimed.
    plant(engine, other.id, created_at=INT64_MIN, updated_at=INT64_MAX)
    task = engine.get("q", task_id=poisoned.id)
    assert task.state == TaskState.PENDING
    assert task.available_at == LATEST
    assert engine.get("q", task_id=good.id) == good
    claimed = engine.claim("q", [], 10, "w1", LEASE, now)
    assert [lt.task.id for lt in claimed] == [good.id, other.id]
    assert claimed[1].task.created_at == EARLIEST
    for lt in claimed:
        engine.ack(ref_of(lt), now)
    assert engine.next_wakeup("q", [], now) == LATEST
    assert engine.activity("q", []) == 1


def test_every_stored_time_and_duration_is_clamped_when_read(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: any int64 in any time or duration column reads as the nearest
    value a Task can carry (a Timestamp within years 1..9999, a Duration of
    at most 10,000 years), so one bad row never fails the call that reads it."""
    now = clock.now()
    [out] = engine.enqueue("q", [spec()], now)
    lt = claim_one(engine, now)
    engine.report_progress(ref_of(lt), 1, 2, "half", now)
    plant(
        engine,
        out.task.id,
        created_at=INT64_MIN,
        updated_at=INT64_MAX,
        progress_at=INT64_MAX,
        lease_until=INT64_MAX,
        backoff_initial_us=INT64_MAX,
        backoff_max_us=INT64_MAX,
    )
    task = engine.get("q", task_id=out.task.id)
    assert task.created_at == EARLIEST
    assert task.updated_at == task.lease_until == LATEST
    assert task.progress is not None
    assert task.progress.updated_at == LATEST
    assert task.retry_backoff is not None
    assert task.retry_backoff.initial == task.retry_backoff.maximum == LONGEST
    assert engine.next_wakeup("q", [], now) == LATEST


@pytest.mark.parametrize("end", ["nack", "expiry"])
def test_a_backoff_beyond_the_limits_is_capped_when_applied(
    engine: SyncEngine, clock: ManualClock, end: str
) -> None:
    """Property: a task whose stored backoff is the largest int64 (from before
    the limits) is retried after at most MAX_DELAY when its attempt ends by
    nack or by lease expiry; the write neither overflows (PostgreSQL: bigint
    out of range, failing every claim on the queue) nor stores a time
    nobody can read."""
    now = clock.now()
    [out] = engine.enqueue("q", [spec(), spec()], now)[:1]
    plant(engine, out.task.id, backoff_initial_us=INT64_MAX, backoff_max_us=INT64_MAX)
    lt = claim_one(engine, now)
    assert lt.task.id == out.task.id
    if end == "nack":
        engine.nack(ref_of(lt), "again", None, now)
        ended = now
    else:
        clock.advance(LEASE)
        ended = clock.now()
        [other] = engine.claim("q", [], 5, "w1", LEASE, ended)
        assert other.task.id != out.task.id
    task = engine.get("q", task_id=out.task.id)
    assert task.state == TaskState.PENDING
    assert task.available_at == ended + MAX_DELAY


@pytest.mark.parametrize("column", ["available_at", "lease_until"])
def test_retry_repairs_a_task_stuck_beyond_the_limits(
    engine: SyncEngine, clock: ManualClock, column: str
) -> None:
    """Property: a PENDING task due, or a LEASED task whose lease ends, beyond
    the limits would never run again by itself; retry accepts it (though it
    is not finished), makes it PENDING and due now with no lease, and the
    next claim leases it."""
    now = clock.now()
    [out] = engine.enqueue("q", [spec()], now)
    if column == "lease_until":
        claim_one(engine, now)
    plant(engine, out.task.id, **{column: INT64_MAX})
    clock.advance(timedelta(seconds=1))
    task = engine.retry("q", clock.now(), task_id=out.task.id)
    assert task.state == TaskState.PENDING
    assert task.available_at == clock.now()
    assert task.lease_until is None
    assert task.worker_id == ""
    assert claim_one(engine, clock.now()).task.id == out.task.id


def test_activity_saturates_at_its_cap(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: GetQueueActivity's count is exact up to MAX_ACTIVITY_COUNT
    and answers MAX_ACTIVITY_COUNT beyond it (PENDING and LEASED together),
    so its cost does not grow with the depth of the queue."""
    now = clock.now()
    engine.enqueue("q", [spec() for _ in range(MAX_ACTIVITY_COUNT)], now)
    engine.enqueue("q", [spec(task_type="b") for _ in range(5)], now)
    engine.claim("q", ["b"], 3, "w1", LEASE, now)
    assert engine.activity("q", ["b"]) == 5
    assert engine.activity("q", ["t"]) == MAX_ACTIVITY_COUNT
    assert engine.activity("q", []) == MAX_ACTIVITY_COUNT


def test_due_activity_leaves_out_scheduled_pending_tasks(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property: activity with `due_by` counts LEASED tasks and PENDING tasks
    whose time has come, never a PENDING task scheduled after `due_by`, so a
    worker can tell "idle but for scheduled work" from "busy"; without
    `due_by` the scheduled task counts as before."""
    now = clock.now()
    engine.enqueue("q", [spec(delay=timedelta(seconds=60))], now)
    engine.enqueue("q", [spec(task_type="b", delay=timedelta(seconds=60))], now)
    assert engine.activity("q", []) == 2
    assert engine.activity("q", [], due_by=now) == 0
    assert engine.activity("q", ["b"], due_by=now) == 0
    engine.enqueue("q", [spec(), spec(task_type="b")], now)
    claim_one(engine, now)
    assert engine.activity("q", [], due_by=now) == 2
    assert engine.activity("q", ["b"], due_by=now) == 1
    assert engine.activity("q", ["b"], due_by=now + timedelta(seconds=60)) == 2
    assert engine.activity("q", [], due_by=now + timedelta(seconds=60)) == 4


def test_due_activity_saturates_at_its_cap(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: the due-only count stops at MAX_ACTIVITY_COUNT like the full one."""
    now = clock.now()
    engine.enqueue("q", [spec() for _ in range(MAX_ACTIVITY_COUNT + 1)], now)
    assert engine.activity("q", [], due_by=now) == MAX_ACTIVITY_COUNT
    assert engine.activity("q", ["t"], due_by=now) == MAX_ACTIVITY_COUNT


def test_probe_commits_and_leaves_no_trace(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: the room probe (the daemon's test that writes work again)
    commits on a store with room and leaves no task behind in any queue."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    engine.probe(clock.now())
    engine.probe(clock.now())
    assert engine.activity("", []) == 0
    assert engine.activity("q", []) == 1
    raw = engine.raw
    if isinstance(raw, SQLiteEngine):
        count = raw._conn().execute("SELECT count(*) FROM tasks").fetchone()[0]
    else:
        assert isinstance(raw, PostgresEngine)
        count = engine.run(raw._live_pool().fetchval(f"SELECT count(*) FROM {raw._sql.tasks}"))
    assert count == 1
    assert engine.get("q", task_id=out.task.id) == out.task
