"""Attempt history (protocol minor 14), on both engines: every way an attempt
ends leaves one entry (start, end, worker, outcome, error), oldest first,
bounded, and the running or succeeded attempt is built from the row."""

from __future__ import annotations

from datetime import timedelta

from ringo_trio._contract.limits import MAX_HISTORY_ERROR_CHARS, MAX_TASK_HISTORY
from ringo_trio._proto.ringo.v1 import AttemptOutcome, LeasedTask, Task, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import Nack, Reject
from tests._kit.storage import LEASE, SyncEngine, ref_of, spec

NOW = timedelta(0)


def _claim(engine: SyncEngine, clock: ManualClock, worker: str) -> LeasedTask:
    [leased] = engine.claim("q", [], 1, worker, LEASE, clock.now())
    return leased  # type: ignore[no-any-return]


def _history(engine: SyncEngine, task_id: str) -> Task:
    return engine.get("q", task_id=task_id, history=True)  # type: ignore[no-any-return]


def _outcomes(task: Task) -> list[tuple[int, str, AttemptOutcome]]:
    return [(a.attempt, a.worker_id, a.outcome) for a in task.history]


def test_retries_then_success_are_three_attempts_in_order(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (what happened on attempts 1 and 2): two nacks then an ack
    leave FAILED, FAILED, SUCCEEDED with each attempt's worker, start, end
    and error, oldest first; get without history carries none."""
    [out] = engine.enqueue("q", [spec(max_attempts=5)], clock.now())
    starts, ends = [], []
    for n, worker in enumerate(["w1", "w2"], start=1):
        starts.append(clock.now())
        leased = _claim(engine, clock, worker)
        clock.advance(timedelta(seconds=n))
        ends.append(clock.now())
        engine.nack(ref_of(leased), f"boom {n}", NOW, clock.now())
    starts.append(clock.now())
    leased = _claim(engine, clock, "w3")
    running = _history(engine, out.task.id)
    assert _outcomes(running)[-1] == (3, "w3", AttemptOutcome.UNSPECIFIED)
    assert running.history[-1].ended_at is None
    clock.advance(timedelta(seconds=3))
    ends.append(clock.now())
    engine.ack(ref_of(leased), clock.now(), b"ok")

    task = _history(engine, out.task.id)
    assert task.state == TaskState.SUCCEEDED
    assert _outcomes(task) == [
        (1, "w1", AttemptOutcome.FAILED),
        (2, "w2", AttemptOutcome.FAILED),
        (3, "w3", AttemptOutcome.SUCCEEDED),
    ]
    assert [a.started_at for a in task.history] == starts
    assert [a.ended_at for a in task.history] == ends
    assert [a.error for a in task.history] == ["boom 1", "boom 2", ""]
    assert engine.get("q", task_id=out.task.id).history == []


def _one(engine: SyncEngine, clock: ManualClock, queue: str) -> LeasedTask:
    engine.enqueue(queue, [spec(max_attempts=9)], clock.now())
    [leased] = engine.claim(queue, [], 1, "w1", LEASE, clock.now())
    return leased  # type: ignore[no-any-return]


def _ended(engine: SyncEngine, queue: str, task_id: str) -> list[tuple[int, str, str]]:
    task = engine.get(queue, task_id=task_id, history=True)
    return [(a.attempt, a.outcome.name, a.error) for a in task.history if a.ended_at]


def test_every_way_an_attempt_ends_is_recorded(engine: SyncEngine, clock: ManualClock) -> None:
    """Property (no ending unrecorded): a reject, an expired lease (by the
    expiry pass and inside a claim), a release (the attempt number given
    again), a group-committed nack and reject, and a cancel while leased
    each leave their outcome and error, with the worker that held the lease."""
    now = clock.now
    rejected = _one(engine, clock, "reject")
    engine.reject(ref_of(rejected), "bad input", now())
    released = _one(engine, clock, "release")
    assert engine.release([ref_of(released)], now()) == 1
    [again] = engine.claim("release", [], 1, "w2", LEASE, now())
    expired = _one(engine, clock, "expire")
    in_claim = _one(engine, clock, "in-claim")
    grouped = [_one(engine, clock, "group"), _one(engine, clock, "group")]
    cancelled = _one(engine, clock, "cancel")
    engine.cancel("cancel", "operator", now(), task_id=cancelled.task.id)
    engine.enqueue("cancel", [spec(unique_key="never-leased")], now())
    engine.cancel("cancel", "", now(), unique_key="never-leased")
    assert engine.settle_many(
        [Nack(ref_of(grouped[0]), "nope", NOW), Reject(ref_of(grouped[1]), "never")], now()
    ) == ["group", "group"]
    clock.advance(LEASE)
    # A claim expires its queue's overdue leases itself, before the pass.
    engine.claim("in-claim", [], 1, "w3", LEASE, now())
    assert _ended(engine, "in-claim", in_claim.task.id) == [(1, "EXPIRED", "lease expired")]
    assert engine.expire_leases(now()) >= 2

    assert _ended(engine, "reject", rejected.task.id) == [(1, "REJECTED", "bad input")]
    # The released attempt is not spent: the next lease (expired since) is 1 again.
    assert again.lease.attempt == 1
    assert _ended(engine, "release", released.task.id) == [
        (1, "RELEASED", ""),
        (1, "EXPIRED", "lease expired"),
    ]
    assert _ended(engine, "expire", expired.task.id) == [(1, "EXPIRED", "lease expired")]
    assert _ended(engine, "group", grouped[0].task.id) == [(1, "FAILED", "nope")]
    assert _ended(engine, "group", grouped[1].task.id) == [(1, "REJECTED", "never")]
    task = engine.get("cancel", task_id=cancelled.task.id, history=True)
    assert [(a.worker_id, a.outcome, a.error) for a in task.history] == [
        ("w1", AttemptOutcome.CANCELLED, "cancelled: operator")
    ]
    assert engine.get("cancel", unique_key="never-leased", history=True).history == []


def test_history_keeps_the_newest_attempts_and_cuts_errors(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (bounded): after 25 failed attempts the history holds the
    newest MAX_TASK_HISTORY (6..25), each error cut to
    MAX_HISTORY_ERROR_CHARS characters (multi-byte ones whole); the task's
    last_error keeps the whole error."""
    [out] = engine.enqueue("q", [spec(max_attempts=25)], clock.now())
    error = "é" * (MAX_HISTORY_ERROR_CHARS + 100)
    for _ in range(25):
        leased = _claim(engine, clock, "w")
        engine.nack(ref_of(leased), error, NOW, clock.now())
    task = _history(engine, out.task.id)
    assert task.state == TaskState.DEAD
    assert [a.attempt for a in task.history] == list(range(26 - MAX_TASK_HISTORY, 26))
    assert {a.error for a in task.history} == {"é" * MAX_HISTORY_ERROR_CHARS}
    assert task.last_error == error


def test_a_retried_success_stays_in_the_history(engine: SyncEngine, clock: ManualClock) -> None:
    """Property: retrying a SUCCEEDED task keeps its successful attempt
    (stored as it goes back to PENDING), and the next attempt follows it;
    a purge takes the history with the task."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    engine.ack(ref_of(_claim(engine, clock, "w1")), clock.now(), None)
    clock.advance(timedelta(seconds=1))
    engine.retry("q", clock.now(), task_id=out.task.id)
    leased = _claim(engine, clock, "w2")
    engine.nack(ref_of(leased), "again", NOW, clock.now())
    assert _outcomes(_history(engine, out.task.id)) == [
        (1, "w1", AttemptOutcome.SUCCEEDED),
        (2, "w2", AttemptOutcome.FAILED),
    ]


def test_a_first_attempt_shows_while_it_runs_and_once_it_succeeds(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (the attempt in progress is visible from the first): a
    task's first attempt is in its history while its lease is held
    (started, not ended, no outcome yet) and once acked (SUCCEEDED), both
    built from the row, nothing stored yet."""
    [out] = engine.enqueue("q", [spec()], clock.now())
    started = clock.now()
    leased = _claim(engine, clock, "w1")
    running = _history(engine, out.task.id)
    assert _outcomes(running) == [(1, "w1", AttemptOutcome.UNSPECIFIED)]
    assert (running.history[0].started_at, running.history[0].ended_at) == (started, None)
    clock.advance(timedelta(seconds=2))
    engine.ack(ref_of(leased), clock.now(), b"ok")
    done = _history(engine, out.task.id)
    assert _outcomes(done) == [(1, "w1", AttemptOutcome.SUCCEEDED)]
    assert (done.history[0].started_at, done.history[0].ended_at) == (started, clock.now())


def test_a_retried_dead_task_keeps_its_history_as_it_was(
    engine: SyncEngine, clock: ManualClock
) -> None:
    """Property (no attempt invented): retrying a DEAD task adds nothing to
    its history (only a SUCCEEDED one's success, built from the row until
    then, is stored as it goes back to PENDING)."""
    [out] = engine.enqueue("q", [spec(max_attempts=1)], clock.now())
    engine.reject(ref_of(_claim(engine, clock, "w1")), "bad", clock.now())
    dead = _outcomes(_history(engine, out.task.id))
    assert dead == [(1, "w1", AttemptOutcome.REJECTED)]
    clock.advance(timedelta(seconds=1))
    engine.retry("q", clock.now(), task_id=out.task.id)
    assert _outcomes(_history(engine, out.task.id)) == dead
