"""Keyed limits against a model: a hypothesis state machine, both engines.

Random histories on one queue with keyed rules (rate, burst, concurrency,
overlapping prefixes), set, replaced and deleted between claims; tasks with
and without keys, of two types, two priorities, some scheduled ahead;
claims of some types or any; acks, nacks with a delay, hand-backs, lease
expiry and clock steps from 1 ms to seconds. After every claim the engine
must have leased exactly what the plan of `storage.limits` leases — each
key granted what its rule allows (`grant`, its TAT moved by `advance`), the
union taken in claim order — and every step the wake-up must name the
moment the model says the next claim could succeed.

The plan's arithmetic (`grant`, `advance`, `next_start`) is the model's
own: what is held here is that each engine's statements find the keys,
their leases, their TATs and their heads, and so start what the plan
allows, no more and no fewer. The concurrency bound and the spacing of a
rate are then also checked against plain counts, not the plan.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef, TaskSpec, TaskState
from ringo_trio.server.storage.limits import (
    Candidate,
    Rule,
    advance,
    grant,
    match,
    next_start,
    pick,
)
from ringo_trio.server.storage.retry import backoff_us
from ringo_trio.server.storage.rows import to_us
from tests._kit.storage import EngineKind, EngineStateMachine, assert_within_rate

Q = "q"
TYPES = ("x", "y")
TYPE_FILTERS: tuple[tuple[str, ...], ...] = ((), (), ("x",), ("y",), ("y", "x"))
# "a:b:1" falls under "a:" or "a:b:" (the longest held prefix wins); "z:1"
# has a key no rule matches: unlimited, as a task without a key.
KEYS = ("", "a:1", "a:1", "a:2", "a:b:1", "c:1", "z:1")
PREFIXES = ("a:", "a:b:", "c:")
RULES = st.builds(
    lambda prefix, rate, burst, concurrency: Rule(prefix, rate, 1_000_000, burst, concurrency),
    st.sampled_from(PREFIXES),
    st.sampled_from([0.0, 0.0, 2.0, 10.0, 40.0]),
    st.integers(1, 3),
    st.sampled_from([0, 1, 2, 3]),
).filter(lambda r: r.rate or r.concurrency)
ITEMS = st.tuples(
    st.sampled_from(KEYS),
    st.sampled_from(TYPES),
    st.integers(0, 1),  # priority
    st.sampled_from([0, 0, 0, 300]),  # delay, ms
)
STEPS_MS = (1, 10, 49, 100, 250, 1_000, 5_000)
LEASE = timedelta(seconds=2)


@dataclass
class Model:
    id: str
    key: str
    task_type: str
    priority: int
    seq: int
    available_at: int  # µs
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    lease_until: int | None = None
    token: str = ""


class LimitsMachine(EngineStateMachine):
    def __init__(self, kind: EngineKind) -> None:
        super().__init__(kind)
        self.tasks: dict[str, Model] = {}
        self.rules: dict[str, Rule] = {}
        self.tats: dict[str, int] = {}
        # Every start of a key under a rate, with the rule it started under.
        self.starts: dict[str, list[tuple[int, Rule]]] = {}
        self.seq = 0

    @property
    def now_us(self) -> int:
        return to_us(self.now)

    # -- model helpers ----------------------------------------------------------

    def held_rules(self) -> list[Rule]:
        return sorted(self.rules.values(), key=lambda r: -len(r.prefix))

    def leased_of(self, key: str) -> int:
        return sum(1 for t in self.tasks.values() if t.state == TaskState.LEASED and t.key == key)

    def due(self, types: tuple[str, ...]) -> list[Model]:
        return sorted(
            (
                t
                for t in self.tasks.values()
                if t.state == TaskState.PENDING
                and t.available_at <= self.now_us
                and (not types or t.task_type in types)
            ),
            key=lambda t: (-t.priority, t.available_at, t.seq),
        )

    def expire(self) -> None:
        for t in self.tasks.values():
            ended = t.lease_until is not None and t.lease_until <= self.now_us
            if t.state == TaskState.LEASED and ended:
                # The default backoff: 1 s, doubling, at most 5 min.
                backoff = backoff_us(1_000_000, 300_000_000, 2.0, t.attempt)
                self.back_to_pending(t, self.now_us + backoff)

    @staticmethod
    def back_to_pending(t: Model, available_at: int) -> None:
        t.state = TaskState.PENDING
        t.available_at = available_at
        t.lease_until = None
        t.token = ""

    def live(self) -> list[Model]:
        return [
            t
            for t in self.tasks.values()
            if t.state == TaskState.LEASED
            and t.lease_until is not None
            and t.lease_until > self.now_us
        ]

    def ref(self, t: Model) -> LeaseRef:
        return LeaseRef(task_id=t.id, attempt=t.attempt, lease_token=t.token)

    # -- rules ------------------------------------------------------------------

    @initialize(items=st.lists(ITEMS, min_size=2, max_size=8), first=RULES)
    def seed(self, items: list[tuple[str, str, int, int]], first: Rule) -> None:
        self.set_limit(first)
        self.enqueue(items)

    @rule(key=st.sampled_from(KEYS[1:]), items=st.lists(ITEMS, min_size=3, max_size=8))
    def enqueue_for_one_key(self, key: str, items: list[tuple[str, str, int, int]]) -> None:
        """A backlog for one key: what lets a key part held by its leases
        still have more due tasks than its rule lets start."""
        self.enqueue([(key, *item[1:]) for item in items])

    @rule(items=st.lists(ITEMS, min_size=1, max_size=6))
    def enqueue(self, items: list[tuple[str, str, int, int]]) -> None:
        specs = [
            TaskSpec(
                task_type=ttype,
                limit_key=key,
                priority=prio,
                delay=timedelta(milliseconds=delay) if delay else None,
                max_attempts=100,
            )
            for key, ttype, prio, delay in items
        ]
        outs = self.engine.enqueue(Q, specs, self.now)
        for (key, ttype, prio, delay), out in zip(items, outs, strict=True):
            assert out.created
            self.seq += 1
            self.tasks[out.task.id] = Model(
                id=out.task.id,
                key=key,
                task_type=ttype,
                priority=prio,
                seq=self.seq,
                available_at=self.now_us + delay * 1000,
            )

    @rule(new=RULES)
    def set_limit(self, new: Rule) -> None:
        created = self.engine.set_limit(Q, new, self.now)
        assert created == (new.prefix not in self.rules)
        self.rules[new.prefix] = new
        event(f"rule: rate {new.rate} burst {new.burst} concurrency {new.concurrency}")

    @precondition(lambda self: self.rules)
    @rule(data=st.data())
    def delete_limit(self, data: st.DataObject) -> None:
        prefix = data.draw(st.sampled_from(sorted(self.rules)))
        assert self.engine.delete_limit(Q, prefix, self.now) is True
        del self.rules[prefix]
        if not self.rules:
            # No rule left: the keys' rate states go with the last one.
            self.tats.clear()

    @rule(types=st.sampled_from(TYPE_FILTERS), limit=st.integers(1, 4))
    def claim(self, types: tuple[str, ...], limit: int) -> None:
        got: list[LeasedTask] = self.engine.claim(Q, list(types), limit, "w", LEASE, self.now)
        self.expire()
        now_us = self.now_us
        rules = self.held_rules()
        due = self.due(types)
        found = [Candidate(t.seq, t.priority, t.available_at, "") for t in due if not t.key]
        limited: dict[str, Rule] = {}
        for key in sorted({t.key for t in due if t.key}):
            key_rule = match(rules, key)
            n = limit
            if key_rule is not None:
                n = grant(key_rule, self.tats.get(key, 0), self.leased_of(key), now_us, limit)
                limited[key] = key_rule
            found += [
                Candidate(t.seq, t.priority, t.available_at, key) for t in due if t.key == key
            ][:n]
        chosen = pick(found, limit)
        by_seq = {t.seq: t for t in self.tasks.values()}
        expected = [by_seq[c.seq].id for c in chosen]
        assert [lt.task.id for lt in got] == expected, (
            f"leased {[(lt.task.id, lt.task.limit_key) for lt in got]}, the plan "
            f"{[(by_seq[c.seq].id, c.key) for c in chosen]}"
        )
        event(f"claim: leased {len(got)} of {limit}")
        started: dict[str, int] = {}
        for c, lt in zip(chosen, got, strict=True):
            t = by_seq[c.seq]
            t.state = TaskState.LEASED
            t.attempt += 1
            t.lease_until = to_us(lt.lease.until)
            assert t.lease_until == now_us + LEASE // timedelta(microseconds=1)
            t.token = lt.lease.lease_token
            if c.key in limited:
                started[c.key] = started.get(c.key, 0) + 1
        for key, count in started.items():
            key_rule = limited[key]
            if key_rule.interval_us:
                self.tats[key] = advance(key_rule, self.tats.get(key, 0), now_us, count)
                self.starts.setdefault(key, []).extend([(now_us, key_rule)] * count)
            if key_rule.concurrency:
                # The concurrency bound, by plain count: a key this claim
                # started holds at most its rule's concurrency.
                assert self.leased_of(key) <= key_rule.concurrency
                if self.leased_of(key) == key_rule.concurrency:
                    event("claim: a key filled its concurrency")

    @rule(types=st.sampled_from(TYPE_FILTERS), limit=st.integers(2, 4))
    def claim_one_then_more(self, types: tuple[str, ...], limit: int) -> None:
        """One start, then a claim at the same moment: the second finds
        keys part held by the first's leases and its TAT moved."""
        self.claim(types, 1)
        self.claim(types, limit)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), op=st.sampled_from(["ack", "nack", "release"]))
    def settle(self, data: st.DataObject, op: str) -> None:
        t = data.draw(st.sampled_from(self.live()))
        if op == "ack":
            self.engine.ack(self.ref(t), self.now)
            t.state = TaskState.SUCCEEDED
            t.lease_until = None
        elif op == "nack":
            self.engine.nack(self.ref(t), "no", timedelta(milliseconds=100), self.now)
            self.back_to_pending(t, self.now_us + 100_000)
        else:
            assert self.engine.release([self.ref(t)], self.now) == 1
            t.attempt -= 1
            self.back_to_pending(t, t.available_at)

    @rule(step=st.sampled_from(STEPS_MS))
    def advance(self, step: int) -> None:
        self.clock.advance(timedelta(milliseconds=step))

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def wakeup_matches_the_model(self) -> None:
        now_us = self.now_us
        rules = self.held_rules()
        for types in ((), ("x",), ("y", "x")):
            moments: list[int] = []
            heads: dict[str, int] = {}
            for t in self.tasks.values():
                if t.task_type not in types and types:
                    continue
                if t.state == TaskState.LEASED and t.lease_until is not None:
                    moments.append(t.lease_until)
                elif t.state == TaskState.PENDING:
                    if not t.key:
                        moments.append(t.available_at)
                    else:
                        heads[t.key] = min(heads.get(t.key, t.available_at), t.available_at)
            # A lease past its end counts as a lease: the claim reaps it.
            for key, head in heads.items():
                key_rule = match(rules, key)
                if key_rule is not None:
                    tat = self.tats.get(key) if key_rule.interval_us else None
                    start = next_start(key_rule, tat, self.leased_of(key), now_us)
                    if start is not None:
                        head = max(head, start)
                moments.append(head)
            expected = min(moments) if moments else None
            wake = self.engine.next_wakeup(Q, list(types), self.now)
            got = None if wake is None else to_us(wake)
            if expected is not None and expected <= now_us:
                assert got is not None, (types, expected, now_us)
                assert got <= now_us, (types, got, expected, now_us)
            else:
                assert got == expected, (types, got, expected, now_us)

    @invariant()
    def a_rate_spaces_its_starts(self) -> None:
        """No window holds more starts of a key than its rule allows:
        ``burst + (W + late credit) / interval`` (docs/limits.md), counted
        over the starts made under one unchanged rule."""
        for starts in self.starts.values():
            for key_rule, run in itertools.groupby(starts, key=lambda start: start[1]):
                assert_within_rate([at for at, _ in run], key_rule)


# Each step reads the wake-up of two type filters (a few statements each,
# over the wire on PostgreSQL): these budgets keep each engine near 15 s.
MAX_EXAMPLES = {"sqlite": 60, "postgres": 40}


def test_limited_claims_match_the_plan(engine_kind: EngineKind) -> None:
    """A limited claim leases exactly what the plan allows (no key over its
    concurrency or its rate, no task a key's rule would let start left
    behind, the union in claim order), across rule changes, settlements,
    hand-backs and expiry; the wake-up names the moment the next claim can
    succeed (never later: a worker would sleep past a task it may start)."""
    run_state_machine_as_test(
        lambda: LimitsMachine(engine_kind),
        settings=settings(
            max_examples=MAX_EXAMPLES[engine_kind.name],
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
