"""Submission and lookup: enqueue, dedupe, TaskSpec defaults, get."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from ringo_trio._contract.limits import (
    DEFAULT_BACKOFF_INITIAL,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_BACKOFF_MULTIPLIER,
    DEFAULT_MAX_ATTEMPTS,
)
from ringo_trio._proto.ringo.v1 import RetryBackoff, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import NotFound
from tests._kit.storage import SyncEngine, ref_of, spec


def test_enqueue_creates_pending_tasks_with_the_spec_fields(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """A created task carries its spec and starts PENDING, attempt 0, available now."""
    now = clock.now()
    [out] = engine.enqueue(
        "q",
        [spec("email", payload=b"\x00body", max_attempts=7, priority=-3)],
        now,
    )
    assert out.created
    t = out.task
    assert (t.queue, t.task_type, t.payload, t.unique_key) == ("q", "email", b"\x00body", "")
    assert t.state == TaskState.PENDING
    assert (t.attempt, t.max_attempts, t.priority) == (0, 7, -3)
    assert t.created_at == t.updated_at == t.available_at == now
    assert t.finished_at is None
    assert t.lease_until is None
    assert t.worker_id == ""
    assert t.last_error == ""
    assert t.progress is None


def test_the_returned_task_is_what_get_reads_back(engine: SyncEngine, clock: ManualClock) -> None:
    """What enqueue returns and what storage holds are the same task, field for field
    (the engine builds the reply without re-reading the row)."""
    specs = [
        spec(payload=b"a"),
        spec("x", unique_key="k", delay=timedelta(seconds=5), priority=4),
        spec(retry_backoff=RetryBackoff(initial=timedelta(milliseconds=250), multiplier=1.5)),
        spec(not_before=clock.now() + timedelta(hours=1), max_attempts=1),
    ]
    for out in engine.enqueue("q", specs, clock.now()):
        assert engine.get("q", task_id=out.task.id) == out.task


def test_spec_defaults_are_filled_in(engine: SyncEngine, clock: ManualClock) -> None:
    """max_attempts 0 means the daemon default; a missing backoff (or a missing part of
    one) means the default backoff, with the maximum at least the initial delay."""
    outs = engine.enqueue(
        "q",
        [
            spec(),
            spec(retry_backoff=RetryBackoff(maximum=timedelta(seconds=9))),
            spec(retry_backoff=RetryBackoff(initial=timedelta(seconds=2), multiplier=3.0)),
            spec(retry_backoff=RetryBackoff(initial=timedelta(minutes=10))),
        ],
        clock.now(),
    )
    plain, only_max, no_max, long_initial = (o.task for o in outs)
    assert plain.max_attempts == DEFAULT_MAX_ATTEMPTS
    assert plain.retry_backoff == RetryBackoff(
        initial=DEFAULT_BACKOFF_INITIAL,
        maximum=DEFAULT_BACKOFF_MAX,
        multiplier=DEFAULT_BACKOFF_MULTIPLIER,
    )
    assert only_max.retry_backoff == RetryBackoff(
        initial=DEFAULT_BACKOFF_INITIAL,
        maximum=timedelta(seconds=9),
        multiplier=DEFAULT_BACKOFF_MULTIPLIER,
    )
    assert no_max.retry_backoff == RetryBackoff(
        initial=timedelta(seconds=2), maximum=DEFAULT_BACKOFF_MAX, multiplier=3.0
    )
    # An unset maximum never caps the backoff below its own initial delay (the
    # daemon's validator applies the same rule).
    assert long_initial.retry_backoff == RetryBackoff(
        initial=timedelta(minutes=10),
        maximum=timedelta(minutes=10),
        multiplier=DEFAULT_BACKOFF_MULTIPLIER,
    )


def test_delay_and_not_before_set_available_at(engine: SyncEngine, clock: ManualClock) -> None:
    """A scheduled task is available at now + delay or at not_before; a moment in the
    past means now (a task is never available before it exists); both given -> the later."""
    now = clock.now()
    hour = timedelta(hours=1)
    outs = engine.enqueue(
        "q",
        [
            spec(delay=timedelta(seconds=90)),
            spec(not_before=now + hour),
            spec(not_before=now - hour),
            spec(delay=-hour),
            spec(delay=timedelta(seconds=1), not_before=now + hour),
            spec(delay=2 * hour, not_before=now + hour),
        ],
        now,
    )
    assert [o.task.available_at for o in outs] == [
        now + timedelta(seconds=90),
        now + hour,
        now,
        now,
        now + hour,
        now + 2 * hour,
    ]


def test_times_come_back_as_aware_utc(engine: SyncEngine) -> None:
    """Times are stored as UTC microseconds: an aware non-UTC `now` comes back as the
    same instant in UTC, to the microsecond."""
    tz = datetime(2030, 6, 1, 12, 0, 0, 123456).astimezone().tzinfo
    now = datetime(2030, 6, 1, 12, 0, 0, 123456, tzinfo=tz)
    [out] = engine.enqueue("q", [spec()], now)
    got = engine.get("q", task_id=out.task.id)
    assert got.created_at == now
    assert got.created_at is not None
    assert got.created_at.utcoffset() == timedelta(0)
    assert got.created_at.microsecond == 123456


def test_a_duplicate_enqueue_changes_nothing(engine: SyncEngine, clock: ManualClock) -> None:
    """A duplicate enqueue changes nothing: same (queue, unique_key) returns the existing
    task, created=False, even when the duplicate's spec differs and time has moved."""
    [first] = engine.enqueue("q", [spec("a", unique_key="k", payload=b"1")], clock.now())
    before = engine.get("q", task_id=first.task.id)
    clock.advance(timedelta(minutes=5))
    [dup] = engine.enqueue("q", [spec("b", unique_key="k", payload=b"2", priority=9)], clock.now())
    assert not dup.created
    assert dup.task == before
    assert engine.get("q", task_id=first.task.id) == before
    assert engine.activity("q", []) == 1


def test_duplicates_inside_one_batch_resolve_to_the_first(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """In-batch dedupe: later specs with a key already in the batch resolve to the first
    task with that key; results stay in input order."""
    outs = engine.enqueue(
        "q",
        [
            spec(unique_key="a", payload=b"a1"),
            spec(unique_key="b"),
            spec(unique_key="a", payload=b"a2"),
            spec(),
            spec(unique_key="b"),
            spec(unique_key="a"),
        ],
        clock.now(),
    )
    assert [o.created for o in outs] == [True, True, False, True, False, False]
    assert outs[2].task == outs[0].task == outs[5].task
    assert outs[4].task == outs[1].task
    assert outs[2].task.payload == b"a1"
    assert engine.activity("q", []) == 3


def test_empty_unique_keys_never_dedupe(engine: SyncEngine, clock: ManualClock) -> None:
    """An empty key means "no dedupe": every such spec creates a task."""
    outs = engine.enqueue("q", [spec(), spec()], clock.now())
    outs += engine.enqueue("q", [spec()], clock.now())
    assert all(o.created for o in outs)
    assert len({o.task.id for o in outs}) == 3
    with pytest.raises(NotFound):
        engine.get("q", unique_key="")


def test_unique_keys_are_per_queue(engine: SyncEngine, clock: ManualClock) -> None:
    """Dedupe is scoped by (queue, unique_key): the same key in another queue is another task."""
    [a] = engine.enqueue("qa", [spec(unique_key="k")], clock.now())
    [b] = engine.enqueue("qb", [spec(unique_key="k")], clock.now())
    assert a.created
    assert b.created
    assert a.task.id != b.task.id
    assert engine.get("qa", unique_key="k") == a.task
    assert engine.get("qb", unique_key="k") == b.task


def test_a_finished_task_still_holds_its_key(engine: SyncEngine, clock: ManualClock) -> None:
    """The key dedupes for the task's whole life: a SUCCEEDED task still absorbs a
    duplicate (retry is how it runs again)."""
    [first] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    [leased] = engine.claim("q", [], 1, "w", timedelta(seconds=30), clock.now())
    assert leased.lease is not None
    engine.ack(ref_of(leased), clock.now())
    [dup] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    assert not dup.created
    assert dup.task.id == first.task.id
    assert dup.task.state == TaskState.SUCCEEDED


def test_a_large_keyed_batch_dedupes_against_earlier_batches(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Dedupe holds across a 1000-task batch (more keys than one lookup statement
    carries): exactly the new keys are created."""
    now = clock.now()
    engine.enqueue("q", [spec(unique_key=f"k{i}") for i in range(0, 1000, 2)], now)
    outs = engine.enqueue("q", [spec(unique_key=f"k{i}") for i in range(1000)], now)
    assert [o.created for o in outs] == [i % 2 == 1 for i in range(1000)]
    assert engine.activity("q", []) == 1000
    for i in (0, 1, 499, 500, 501, 998, 999):
        assert engine.get("q", unique_key=f"k{i}") == outs[i].task


def test_a_failed_batch_leaves_nothing_behind(engine: SyncEngine, clock: ManualClock) -> None:
    """One transaction per batch: a spec the engine cannot store (here a payload that is
    not bytes) fails the call and none of the batch, before or after it, exists."""
    bad = spec(unique_key="bad")
    bad.payload = object()  # type: ignore[assignment]
    batch = [spec(unique_key="a"), spec(), bad, spec(unique_key="c")]
    with pytest.raises(Exception):  # noqa: B017, PT011 - any engine's binding error
        engine.enqueue("q", batch, clock.now())
    assert engine.activity("q", []) == 0
    for key in ("a", "bad", "c"):
        with pytest.raises(NotFound):
            engine.get("q", unique_key=key)
    # The keys are free: nothing half-inserted holds them.
    outs = engine.enqueue("q", [spec(unique_key="a"), spec(unique_key="c")], clock.now())
    assert all(o.created for o in outs)


def test_task_ids_are_unique_and_roughly_time_ordered(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Ids are unique (also across a reopen) and sort by enqueue time at millisecond
    granularity."""
    ids: list[str] = []
    for _ in range(3):
        ids += [o.task.id for o in engine.enqueue("q", [spec()] * 200, clock.now())]
        clock.advance(timedelta(milliseconds=2))
    engine.reopen()
    ids += [o.task.id for o in engine.enqueue("q", [spec()] * 200, clock.now())]
    assert len(set(ids)) == len(ids) == 800
    batches = [ids[i : i + 200] for i in range(0, 800, 200)]
    for earlier, later in itertools.pairwise(batches):
        assert max(earlier) < min(later)


@pytest.mark.parametrize("history", [False, True], ids=["plain", "history"])
def test_get_by_id_and_by_key(engine: SyncEngine, clock: ManualClock, history: bool) -> None:
    """get finds a task by id or by unique key, with its history or without;
    an unknown one is NotFound, whatever other keyed tasks the queue (or
    another) holds."""
    [out] = engine.enqueue("q", [spec(unique_key="k")], clock.now())
    engine.enqueue("q", [spec(unique_key="k2")], clock.now())
    engine.enqueue("other", [spec(unique_key="k3")], clock.now())
    assert engine.get("q", task_id=out.task.id, history=history).id == out.task.id
    assert engine.get("q", unique_key="k", history=history).id == out.task.id
    if not history:
        assert engine.get("q", task_id=out.task.id) == engine.get("q", unique_key="k") == out.task
    with pytest.raises(NotFound):
        engine.get("q", task_id="no-such-task", history=history)
    for key in ("no-such-key", "k3"):
        with pytest.raises(NotFound):
            engine.get("q", unique_key=key, history=history)


def test_queues_are_isolated(engine: SyncEngine, clock: ManualClock) -> None:
    """A task of queue A looked up under queue B is NotFound, by id and by key."""
    [out] = engine.enqueue("a", [spec(unique_key="k")], clock.now())
    with pytest.raises(NotFound):
        engine.get("b", task_id=out.task.id)
    with pytest.raises(NotFound):
        engine.get("b", unique_key="k")
    with pytest.raises(NotFound):
        engine.retry("b", clock.now(), task_id=out.task.id)
    assert engine.claim("b", [], 10, "w", timedelta(seconds=1), clock.now()) == []


def test_get_needs_exactly_one_lookup(engine: SyncEngine) -> None:
    """Exactly one of task_id / unique_key."""
    with pytest.raises(ValueError, match="exactly one"):
        engine.get("q")
    with pytest.raises(ValueError, match="exactly one"):
        engine.get("q", task_id="x", unique_key="y")


def test_an_empty_batch_is_a_no_op(engine: SyncEngine) -> None:
    """Enqueueing nothing returns nothing and creates nothing."""
    assert engine.enqueue("q", [], datetime(2030, 1, 1, tzinfo=UTC)) == []
    assert engine.activity("q", []) == 0


@pytest.mark.parametrize("size", [1, 9, 65, 577, 1000])
def test_every_task_of_a_batch_is_stored_as_returned(
    engine: SyncEngine, clock: ManualClock, size: int
) -> None:
    """Batch insert (SQLite cuts a batch into multi-row INSERTs of 512, 64, 8
    and 1 rows): whatever the size, every task of the batch — fresh ones and
    in-batch duplicates — is stored exactly as returned, in submission order,
    and counted once."""
    specs = [
        spec(
            "a" if i % 3 else "b",
            payload=bytes([i % 256]),
            unique_key=f"k{i % (size - 1)}" if size > 1 and i % 2 else "",
            priority=i % 5,
        )
        for i in range(size)
    ]
    outs = engine.enqueue("q", specs, clock.now())
    fresh = [out.task for out in outs if out.created]
    assert len({task.id for task in fresh}) == len(fresh)
    for out, sent in zip(outs, specs, strict=True):
        assert (out.task.task_type, out.task.unique_key) == (sent.task_type, sent.unique_key)
        assert engine.get("q", task_id=out.task.id) == out.task
        if out.created:
            assert out.task.payload == sent.payload
    stats = engine.queue_stats("q", clock.now(), by_type=False)
    assert stats.pending == len(fresh)
