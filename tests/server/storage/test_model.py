"""The engine against a model: a hypothesis state machine.

Random sequences of enqueue (keyed, unkeyed, duplicate), claim, ack, nack (with and
without override), reject, extend, progress, clock advances, lease expiry and retry,
interleaved with operations on stale or forged lease refs. After every step the
engine must agree with a plain Python model of the state machine in `_base.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ringo_trio._contract.limits import DEFAULT_MAX_ATTEMPTS
from ringo_trio._proto.ringo.v1 import LeaseRef, RetryBackoff, TaskSpec, TaskState
from ringo_trio.server.storage.base import (
    Ack,
    FailedPrecondition,
    LeaseLost,
    Nack,
    NotFound,
    Reject,
    Settlement,
)
from ringo_trio.server.storage.retry import backoff_us
from tests._kit.storage import EngineKind, EngineStateMachine

QUEUES = ("q", "r")
TYPES = ("x", "y")
TYPE_FILTERS: tuple[tuple[str, ...], ...] = ((), ("x",), ("y",), ("x", "y"))
SPEC_ITEMS = st.tuples(
    st.sampled_from(("", "", "a", "b", "c")),  # unique key
    st.sampled_from(TYPES),
    st.integers(-1, 1),  # priority
    st.sampled_from([0, 0, 0, 2, 60]),  # delay, seconds
    st.sampled_from([0, 1, 2, 3]),  # max_attempts
    st.sampled_from(range(3)),  # index into BACKOFFS
)
LEASE_OPS = ("ack", "nack", "nack-override", "reject", "extend", "progress")
# (spec value, model value as (initial, maximum, multiplier))
BACKOFFS: tuple[tuple[RetryBackoff | None, tuple[timedelta, timedelta, float]], ...] = (
    (None, (timedelta(seconds=1), timedelta(minutes=5), 2.0)),
    (
        RetryBackoff(
            initial=timedelta(milliseconds=500), maximum=timedelta(seconds=2), multiplier=3
        ),
        (timedelta(milliseconds=500), timedelta(seconds=2), 3.0),
    ),
    (RetryBackoff(initial=timedelta(0)), (timedelta(0), timedelta(minutes=5), 2.0)),
)
STEPS = (
    timedelta(milliseconds=500),
    timedelta(seconds=1),
    timedelta(seconds=5),
    timedelta(seconds=30),
    timedelta(minutes=5),
)


@dataclass
class Model:
    id: str
    queue: str
    task_type: str
    key: str
    priority: int
    seq: int
    base: int
    backoff: tuple[timedelta, timedelta, float]
    state: TaskState
    max_attempts: int
    available_at: datetime
    attempt: int = 0
    lease_until: datetime | None = None
    token: str = ""
    worker: str = ""
    last_error: str = ""
    finished_at: datetime | None = None
    successes: int = 0
    reactivations_after_success: int = 0

    def backoff_after(self, attempt: int) -> timedelta:
        initial, maximum, multiplier = self.backoff
        micro = timedelta(microseconds=1)
        return micro * backoff_us(initial // micro, maximum // micro, multiplier, attempt)

    def release(self, now: datetime, error: str, delay: timedelta | None) -> None:
        """End the current attempt as nack / expiry do."""
        if self.attempt >= self.max_attempts:
            self.state = TaskState.DEAD
            self.finished_at = now
        else:
            self.state = TaskState.PENDING
            self.available_at = now + (
                delay if delay is not None else self.backoff_after(self.attempt)
            )
        self.last_error = error
        self.clear_lease()

    def clear_lease(self) -> None:
        self.lease_until = None
        self.token = ""
        self.worker = ""


class EngineMachine(EngineStateMachine):
    def __init__(self, kind: EngineKind) -> None:
        super().__init__(kind)
        self.tasks: dict[str, Model] = {}
        self.keys: dict[tuple[str, str], str] = {}
        self.refs: list[LeaseRef] = []
        self.seen_attempt: dict[str, int] = {}
        self.seq = 0

    # -- model helpers ----------------------------------------------------------

    def expire(self, queue: str | None) -> int:
        n = 0
        for t in self.tasks.values():
            if (
                t.state == TaskState.LEASED
                and (queue is None or t.queue == queue)
                and t.lease_until is not None
                and t.lease_until <= self.now
            ):
                t.release(self.now, "lease expired", None)
                n += 1
        return n

    def live(self, ref: LeaseRef) -> Model | None:
        """The model's task when `ref` is its live lease, else None."""
        t = self.tasks.get(ref.task_id)
        if (
            t is None
            or t.state != TaskState.LEASED
            or t.attempt != ref.attempt
            or t.token != ref.lease_token
            or t.lease_until is None
            or not t.lease_until > self.now
        ):
            return None
        return t

    # -- rules ------------------------------------------------------------------

    @initialize(
        q_items=st.lists(SPEC_ITEMS, min_size=1, max_size=4),
        r_items=st.lists(SPEC_ITEMS, max_size=2),
    )
    def seed(
        self,
        q_items: list[tuple[str, str, int, int, int, int]],
        r_items: list[tuple[str, str, int, int, int, int]],
    ) -> None:
        self.enqueue("q", q_items)
        if r_items:
            self.enqueue("r", r_items)

    @rule(queue=st.sampled_from(QUEUES), items=st.lists(SPEC_ITEMS, min_size=1, max_size=4))
    def enqueue(self, queue: str, items: list[tuple[str, str, int, int, int, int]]) -> None:
        specs = [
            TaskSpec(
                task_type=ttype,
                unique_key=key,
                priority=prio,
                delay=timedelta(seconds=delay) if delay else None,
                max_attempts=max_attempts,
                retry_backoff=BACKOFFS[b][0],
            )
            for key, ttype, prio, delay, max_attempts, b in items
        ]
        outs = self.engine.enqueue(queue, specs, self.now)
        assert len(outs) == len(specs)
        for (key, ttype, prio, delay, max_attempts, b), out in zip(items, outs, strict=True):
            existing = self.keys.get((queue, key)) if key else None
            if existing is not None:
                # A duplicate enqueue changes nothing and names the first task.
                assert not out.created
                assert out.task.id == existing
                event("enqueue: duplicate")
                continue
            assert out.created
            assert out.task.id not in self.tasks
            attempts = max_attempts or DEFAULT_MAX_ATTEMPTS
            self.seq += 1
            self.tasks[out.task.id] = Model(
                id=out.task.id,
                queue=queue,
                task_type=ttype,
                key=key,
                priority=prio,
                seq=self.seq,
                base=attempts,
                backoff=BACKOFFS[b][1],
                state=TaskState.PENDING,
                max_attempts=attempts,
                available_at=self.now + timedelta(seconds=delay),
            )
            if key:
                self.keys[(queue, key)] = out.task.id

    @rule(
        queue=st.sampled_from(QUEUES),
        types=st.sampled_from(TYPE_FILTERS),
        limit=st.integers(1, 3),
        lease=st.sampled_from([timedelta(seconds=1), timedelta(seconds=10), timedelta(seconds=30)]),
    )
    def claim(self, queue: str, types: tuple[str, ...], limit: int, lease: timedelta) -> None:
        got = self.engine.claim(queue, list(types), limit, "w", lease, self.now)
        if self.expire(queue):
            event("claim: expired a lease first")
        due = sorted(
            (
                t
                for t in self.tasks.values()
                if t.queue == queue
                and t.state == TaskState.PENDING
                and t.available_at <= self.now
                and (not types or t.task_type in types)
            ),
            key=lambda t: (-t.priority, t.available_at, t.seq),
        )[:limit]
        assert [lt.task.id for lt in got] == [t.id for t in due]
        event(f"claim: leased {len(got)}")
        for t, lt in zip(due, got, strict=True):
            t.state = TaskState.LEASED
            t.attempt += 1
            t.lease_until = self.now + lease
            t.worker = "w"
            assert lt.lease.attempt == t.attempt
            assert lt.lease.until == t.lease_until
            # Every lease mints a fresh token.
            assert lt.lease.lease_token not in {r.lease_token for r in self.refs}
            t.token = lt.lease.lease_token
            self.refs.append(LeaseRef(task_id=t.id, attempt=t.attempt, lease_token=t.token))

    @rule(queue=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def claim_any_type(self, queue: str, limit: int) -> None:
        self.claim(queue, (), limit, timedelta(seconds=10))

    @precondition(lambda self: any(self.live(r) for r in self.refs))
    @rule(data=st.data(), op=st.sampled_from(LEASE_OPS))
    def live_lease_op(self, data: st.DataObject, op: str) -> None:
        ref = data.draw(st.sampled_from([r for r in self.refs if self.live(r)]))
        self.lease_op(ref, op)

    @precondition(lambda self: self.refs)
    @rule(
        data=st.data(),
        op=st.sampled_from(LEASE_OPS),
        forge=st.sampled_from([None, "token", "attempt"]),
    )
    def any_lease_op(self, data: st.DataObject, op: str, forge: str | None) -> None:
        """Mostly stale refs: old attempts, finished tasks, forged tokens/attempts."""
        ref = data.draw(st.sampled_from(self.refs))
        if forge == "token":
            ref = LeaseRef(task_id=ref.task_id, attempt=ref.attempt, lease_token="f" * 32)
        elif forge == "attempt":
            ref = LeaseRef(
                task_id=ref.task_id, attempt=ref.attempt + 1, lease_token=ref.lease_token
            )
        self.lease_op(ref, op)

    def lease_op(self, ref: LeaseRef, op: str) -> None:
        target = self.live(ref)
        now = self.now
        override = timedelta(seconds=2) if op == "nack-override" else None
        calls: dict[str, Any] = {
            "ack": lambda: self.engine.ack(ref, now),
            "nack": lambda: self.engine.nack(ref, "nacked", override, now),
            "nack-override": lambda: self.engine.nack(ref, "nacked", override, now),
            "reject": lambda: self.engine.reject(ref, "rejected", now),
            "extend": lambda: self.engine.extend_lease(ref, timedelta(seconds=20), now),
            "progress": lambda: self.engine.report_progress(ref, 1, 2, "m", now),
        }
        if target is None:
            # A stale lease never changes a task (the invariants compare everything).
            event(f"lease op: stale {op}")
            with pytest.raises(LeaseLost):
                calls[op]()
            return
        event(f"lease op: live {op}")
        result = calls[op]()
        if op == "extend":
            target.lease_until = now + timedelta(seconds=20)
            assert result.until == target.lease_until
        elif op != "progress":
            self.settle(target, op, now)
            assert result.state == target.state

    @staticmethod
    def settle(target: Model, op: str, now: datetime) -> None:
        """The model's side of a live ack, nack or reject."""
        if op == "ack":
            target.state = TaskState.SUCCEEDED
            target.finished_at = now
            target.successes += 1
            target.clear_lease()
        elif op in ("nack", "nack-override"):
            override = timedelta(seconds=2) if op == "nack-override" else None
            target.release(now, "nacked", override)
            if target.state == TaskState.DEAD:
                event("nack: last attempt, DEAD")
        else:
            target.state = TaskState.DEAD
            target.finished_at = now
            target.last_error = "rejected"
            target.clear_lease()

    @precondition(lambda self: self.refs)
    @rule(
        data=st.data(),
        ops=st.lists(
            st.tuples(
                st.sampled_from(("ack", "nack", "nack-override", "reject")),
                st.sampled_from([None, None, "token"]),
            ),
            min_size=1,
            max_size=5,
        ),
    )
    def settle_many(self, data: st.DataObject, ops: list[tuple[str, str | None]]) -> None:
        """A group commit of live, stale and forged refs (a lease may come
        twice): per item, what the same call alone would do, in order."""
        now = self.now
        items: list[Settlement] = []
        expected: list[str | None] = []
        for op, forge in ops:
            ref = data.draw(st.sampled_from(self.refs))
            if forge == "token":
                ref = LeaseRef(task_id=ref.task_id, attempt=ref.attempt, lease_token="f" * 32)
            override = timedelta(seconds=2) if op == "nack-override" else None
            items.append(
                Ack(ref)
                if op == "ack"
                else Reject(ref, "rejected")
                if op == "reject"
                else Nack(ref, "nacked", override)
            )
            target = self.live(ref)
            expected.append(None if target is None else target.queue)
            if target is not None:
                self.settle(target, op, now)
        event(f"settle_many: {sum(e is not None for e in expected)} live")
        answers = self.engine.settle_many(items, now)
        assert [None if isinstance(a, LeaseLost) else a for a in answers] == expected

    @rule(step=st.sampled_from(STEPS), reap=st.booleans())
    def advance(self, step: timedelta, reap: bool) -> None:
        """Time passes; the daemon's reaper may or may not run (claims expire their own
        queue's leases either way)."""
        self.clock.advance(step)
        if reap:
            expired = self.expire(None)
            event(f"expire_leases: {min(expired, 2)}+")
            assert self.engine.expire_leases(self.now) == expired

    @precondition(lambda self: self.tasks)
    @rule(data=st.data(), by_key=st.booleans(), wrong_queue=st.booleans())
    def retry(self, data: st.DataObject, by_key: bool, wrong_queue: bool) -> None:
        drawn = data.draw(st.sampled_from(sorted(self.tasks.values(), key=lambda t: t.seq)))
        queue = next(q for q in QUEUES if q != drawn.queue) if wrong_queue else drawn.queue
        target: Model | None
        if by_key and drawn.key:
            lookup = {"unique_key": drawn.key}
            found = self.keys.get((queue, drawn.key))
            target = None if found is None else self.tasks[found]
        else:
            lookup = {"task_id": drawn.id}
            # Queues are isolated: a task id of another queue names nothing here.
            target = drawn if queue == drawn.queue else None
        if target is None:
            with pytest.raises(NotFound):
                self.engine.retry(queue, self.now, **lookup)
            return
        t = target
        if t.state in (TaskState.PENDING, TaskState.LEASED):
            with pytest.raises(FailedPrecondition):
                self.engine.retry(queue, self.now, **lookup)
            return
        task = self.engine.retry(queue, self.now, **lookup)
        event(f"retry: reactivated {t.state.name}")
        assert task.id == t.id
        if t.state == TaskState.SUCCEEDED:
            t.reactivations_after_success += 1
        t.state = TaskState.PENDING
        t.available_at = self.now
        t.finished_at = None
        t.max_attempts = t.attempt + t.base

    # -- invariants -------------------------------------------------------------

    @invariant()
    def every_task_matches_the_model(self) -> None:
        """No task lost: every created task is retrievable, in the model's state, and
        its attempt never decreased."""
        leased = 0
        for t in self.tasks.values():
            got = self.engine.get(t.queue, task_id=t.id)
            expected = (
                t.state,
                t.attempt,
                t.max_attempts,
                t.available_at,
                t.lease_until,
                t.worker,
                t.last_error,
                t.finished_at,
                t.priority,
                t.key,
            )
            actual = (
                got.state,
                got.attempt,
                got.max_attempts,
                got.available_at,
                got.lease_until,
                got.worker_id,
                got.last_error,
                got.finished_at,
                got.priority,
                got.unique_key,
            )
            assert actual == expected, t.id
            assert got.attempt >= self.seen_attempt.get(t.id, 0)
            self.seen_attempt[t.id] = got.attempt
            leased += got.state == TaskState.LEASED
            if t.key:
                assert self.engine.get(t.queue, unique_key=t.key).id == t.id
        assert leased == sum(t.state == TaskState.LEASED for t in self.tasks.values())

    @invariant()
    def no_task_succeeded_twice(self) -> None:
        """No task SUCCEEDED twice: one success per activation (the first, and each
        retry of a succeeded task)."""
        for t in self.tasks.values():
            assert t.successes <= 1 + t.reactivations_after_success

    @invariant()
    def activity_and_wakeup_match_the_model(self) -> None:
        for queue in QUEUES:
            for types in TYPE_FILTERS:
                active = [
                    t
                    for t in self.tasks.values()
                    if t.queue == queue
                    and t.state in (TaskState.PENDING, TaskState.LEASED)
                    and (not types or t.task_type in types)
                ]
                assert self.engine.activity(queue, list(types)) == len(active)
                if len(types) < 2:  # the due count too, on half the filters (cost)
                    due = [
                        t
                        for t in active
                        if t.state == TaskState.LEASED or t.available_at <= self.now
                    ]
                    assert self.engine.activity(queue, list(types), due_by=self.now) == len(due)
                moments = [
                    t.available_at if t.state == TaskState.PENDING else t.lease_until
                    for t in active
                ]
                expected = max(min(moments), self.now) if moments else None  # type: ignore[type-var]
                assert self.engine.next_wakeup(queue, list(types), self.now) == expected


# Every step checks every task, activity and next_wakeup over the wire on
# PostgreSQL (~20 round trips a step): fewer histories keep it near 20 s.
MAX_EXAMPLES = {"sqlite": 50, "postgres": 35}


def test_engine_matches_the_model(engine_kind: EngineKind) -> None:
    """No task lost, no task SUCCEEDED twice, a stale lease never changes a task,
    attempt never decreases, leased count equals the model's, the activity
    counts (all, and due only) equal the model's -- over random histories."""
    run_state_machine_as_test(
        lambda: EngineMachine(engine_kind),
        settings=settings(
            max_examples=MAX_EXAMPLES[engine_kind.name],
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
