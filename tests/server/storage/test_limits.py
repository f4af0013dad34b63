"""Keyed limits in the claim path, on both engines (docs/limits.md)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from ringo_trio._contract.limits import MAX_LIMIT_KEYS_PER_CLAIM, MAX_LIMIT_RULES
from ringo_trio._proto.ringo.v1 import TaskSpec
from ringo_trio.server.storage.base import FailedPrecondition
from ringo_trio.server.storage.limits import KeyState, Rule
from ringo_trio.server.storage.rows import to_us
from tests._kit.storage import SyncEngine

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)


def _specs(key: str, n: int) -> list[TaskSpec]:
    return [TaskSpec(task_type="t", payload=b"", limit_key=key) for _ in range(n)]


def test_rate_spaces_starts_of_one_key(engine: SyncEngine) -> None:
    """Property: under a rate of 10/s with burst 1, a key starts one task
    per 100 ms however much is asked, and `next_wakeup` names the moment
    the next one may start (not now)."""
    engine.enqueue("q", _specs("api:a", 50), T0)
    engine.set_limit("q", Rule("api:", 10.0, 1_000_000, 1, 0), T0)
    starts = []
    now = T0
    for _ in range(100):
        got = engine.claim("q", [], 10, "w", LEASE, now)
        starts += [now] * len(got)
        assert len(got) <= 1
        wake = engine.next_wakeup("q", [], now)
        assert wake is not None
        if got:
            assert wake >= now + timedelta(milliseconds=100)
        now += timedelta(milliseconds=50)
    assert len(starts) == 50
    assert all(b - a >= timedelta(milliseconds=100) for a, b in itertools.pairwise(starts))


def test_concurrency_caps_leased_per_key_and_settling_frees_it(engine: SyncEngine) -> None:
    """Property: a key never holds more than its concurrency in leases; an
    ack frees a slot; another key and unkeyed tasks are not held."""
    engine.enqueue("q", _specs("c:a", 10) + _specs("c:b", 10), T0)
    engine.enqueue("q", [TaskSpec(task_type="t", payload=b"")] * 3, T0)
    engine.set_limit("q", Rule("c:", 0.0, 1_000_000, 1, 2), T0)
    got = engine.claim("q", [], 100, "w", LEASE, T0)
    keys = [g.task.limit_key for g in got]
    assert keys.count("c:a") == 2
    assert keys.count("c:b") == 2
    assert keys.count("") == 3
    assert engine.claim("q", [], 100, "w", LEASE, T0) == []
    first = next(g for g in got if g.task.limit_key == "c:a")
    engine.ack(first.lease_ref if hasattr(first, "lease_ref") else _ref(first), T0)
    again = engine.claim("q", [], 100, "w", LEASE, T0)
    assert [g.task.limit_key for g in again] == ["c:a"]


def test_longest_prefix_wins_and_no_rule_queue_unaffected(engine: SyncEngine) -> None:
    """Property: the rule with the longest matching prefix applies; a queue
    without rules leases everything asked."""
    engine.enqueue("q", _specs("api:vip:1", 5) + _specs("api:x", 5), T0)
    engine.set_limit("q", Rule("api:", 0.0, 1_000_000, 1, 1), T0)
    engine.set_limit("q", Rule("api:vip:", 0.0, 1_000_000, 1, 3), T0)
    keys = [g.task.limit_key for g in engine.claim("q", [], 100, "w", LEASE, T0)]
    assert keys.count("api:vip:1") == 3
    assert keys.count("api:x") == 1
    engine.enqueue("free", _specs("api:x", 5), T0)
    assert len(engine.claim("free", [], 100, "w", LEASE, T0)) == 5


def test_fairness_small_key_not_delayed_by_a_deep_one(engine: SyncEngine) -> None:
    """Property: a key with a deep backlog (enqueued first) does not delay
    a key with few tasks beyond that key's own rate."""
    engine.enqueue("q", _specs("f:big", 500), T0)
    engine.enqueue("q", _specs("f:small", 5), T0)
    engine.set_limit("q", Rule("f:", 10.0, 1_000_000, 1, 0), T0)
    small = []
    now = T0
    for _ in range(5):
        small += [
            now
            for g in engine.claim("q", [], 100, "w", LEASE, now)
            if g.task.limit_key == "f:small"
        ]
        now += timedelta(milliseconds=100)
    assert len(small) == 5


def test_a_claim_of_some_types_looks_at_the_keys_of_its_types(engine: SyncEngine) -> None:
    """Property: a claim looks at most at `MAX_LIMIT_KEYS_PER_CLAIM` keys,
    in key order, among the keys with waiting tasks of the types it claims:
    keys holding only other types' tasks, however many and however early in
    key order, never crowd its own out (a worker of one registry waited
    behind another registry's first 1,000 keys, its keyed tasks never
    claimed nor woken for), and its wake-up names its own key's task."""
    others = [
        TaskSpec(task_type="b", payload=b"", limit_key=f"a:{i:04}")
        for i in range(MAX_LIMIT_KEYS_PER_CLAIM + 1)
    ]
    engine.enqueue("q", others, T0)
    [mine] = engine.enqueue("q", _specs("z:1", 1), T0)
    engine.set_limit("q", Rule("z:", 0.0, 1_000_000, 1, 1), T0)
    assert engine.next_wakeup("q", ["t", "c"], T0) == T0
    got = engine.claim("q", ["c", "t"], 10, "w", LEASE, T0)
    assert [g.task.id for g in got] == [mine.task.id]
    # A claim of any type still looks at the first keys in key order.
    first = engine.claim("q", [], 10, "w", LEASE, T0)
    assert [g.task.limit_key for g in first] == [f"a:{i:04}" for i in range(10)]


def _ref(leased):  # type: ignore[no-untyped-def]
    from ringo_trio._proto.ringo.v1 import LeaseRef

    lease = leased.lease
    return LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token)


def test_a_queue_holds_at_most_max_limit_rules(engine: SyncEngine) -> None:
    """Property (both engines): a queue holds at most `MAX_LIMIT_RULES`
    rules; one rule more is refused (FailedPrecondition, naming the bound)
    and changes nothing, while a rule already held may still be replaced,
    and another queue is not counted against it."""
    for i in range(MAX_LIMIT_RULES):
        assert engine.set_limit("q", Rule(f"k{i}:", 0.0, 1_000_000, 1, 1), T0) is True
    with pytest.raises(FailedPrecondition, match=f"at most {MAX_LIMIT_RULES}"):
        engine.set_limit("q", Rule("one-more:", 0.0, 1_000_000, 1, 1), T0)
    held = {s.rule.prefix for s in engine.list_limits("q", T0, with_keys=False)}
    assert held == {f"k{i}:" for i in range(MAX_LIMIT_RULES)}
    assert engine.set_limit("q", Rule("k0:", 5.0, 1_000_000, 2, 0), T0) is False
    [replaced] = [
        s.rule for s in engine.list_limits("q", T0, with_keys=False) if s.rule.prefix == "k0:"
    ]
    assert (replaced.rate, replaced.burst, replaced.concurrency) == (5.0, 2, 0)
    assert engine.set_limit("other", Rule("one-more:", 0.0, 1_000_000, 1, 1), T0) is True


def test_listed_keys_count_their_own_queues_tasks_and_rate(engine: SyncEngine) -> None:
    """Property (both engines): ListLimits with keys reports, per key of the
    queue asked, its *due* waiting tasks (one enqueued at this very moment
    counts; one scheduled later does not), its leased ones, and when its
    rate lets it start next — from its own queue's rate state, never another
    queue's key of the same name, and counting nothing of another queue."""
    rule = Rule("k:", 1.0, 1_000_000, 1, 0)  # one start a second, burst 1
    for queue in ("q", "r"):
        engine.set_limit(queue, rule, T0)
    half = T0 + timedelta(milliseconds=500)
    engine.enqueue("q", _specs("k:a", 3), T0)
    engine.enqueue(
        "q",
        [
            TaskSpec(task_type="t", payload=b"", limit_key="k:a", delay=timedelta(hours=1)),
            TaskSpec(task_type="t", payload=b"", limit_key="k:b", delay=timedelta(seconds=0.5)),
        ],
        T0,
    )
    engine.enqueue("q", [TaskSpec(task_type="t", payload=b"")] * 2, T0)
    engine.enqueue("r", _specs("k:a", 3), T0)
    [r_now] = engine.list_limits("r", T0, with_keys=True)  # due this very moment
    assert list(r_now.keys) == [KeyState("k:a", waiting=3, leased=0, next_start_us=None)]
    got = engine.claim("q", [], 10, "w", LEASE, T0)
    assert sorted(g.task.limit_key for g in got) == ["", "", "k:a"]
    [late] = engine.claim("q", [], 10, "w", LEASE, half)
    assert late.task.limit_key == "k:b"
    [q_status] = engine.list_limits("q", half, with_keys=True)
    assert list(q_status.keys) == [
        KeyState("k:a", waiting=2, leased=1, next_start_us=to_us(T0 + timedelta(seconds=1))),
        KeyState("k:b", waiting=0, leased=1, next_start_us=to_us(half + timedelta(seconds=1))),
    ]
    [r_status] = engine.list_limits("r", half, with_keys=True)
    assert list(r_status.keys) == [KeyState("k:a", waiting=3, leased=0, next_start_us=None)]
    [plain] = engine.list_limits("q", half, with_keys=False)
    assert plain.keys == ()


def test_deleting_a_queues_last_rule_forgets_only_its_keys_rates(engine: SyncEngine) -> None:
    """Property (both engines): a key's rate state outlives the deletion of
    another rule of its queue (the key stays held), is forgotten when its
    queue's last rule goes (the rule set again starts it afresh), and is
    never touched by another queue's rules coming or going."""
    hourly = Rule("k:", 1.0, 3_600_000_000, 1, 0)
    for queue in ("q", "r"):
        engine.set_limit(queue, hourly, T0)
        engine.enqueue(queue, _specs("k:a", 3), T0)
        assert len(engine.claim(queue, [], 10, "w", LEASE, T0)) == 1
    engine.set_limit("q", Rule("j:", 0.0, 1_000_000, 1, 1), T0)
    assert engine.delete_limit("q", "j:", T0)
    assert engine.claim("q", [], 10, "w", LEASE, T0) == []  # still held by its rate
    assert engine.delete_limit("q", "k:", T0)
    engine.set_limit("q", hourly, T0)
    assert len(engine.claim("q", [], 10, "w", LEASE, T0)) == 1  # afresh: its burst
    assert engine.claim("r", [], 10, "w", LEASE, T0) == []  # r's key: still held
    assert engine.delete_limit("r", "k:", T0)
    engine.set_limit("r", hourly, T0)
    assert len(engine.claim("r", [], 10, "w", LEASE, T0)) == 1
    assert engine.claim("q", [], 10, "w", LEASE, T0) == []  # q's new state kept


@pytest.mark.parametrize("types", [[], ["t"]], ids=["any", "typed"])
def test_the_keys_a_claim_looks_at_are_its_own_queues_first(
    engine: SyncEngine, types: list[str]
) -> None:
    """Property (both engines): the `MAX_LIMIT_KEYS_PER_CLAIM` keys a claim
    looks at are the first of its own queue's keys with waiting tasks (of
    its types): a key of another queue, or (for a typed claim) of another
    type, sorting before them takes none of their places, so the last of
    them is still claimed."""
    keys = [f"k:{i:04}" for i in range(MAX_LIMIT_KEYS_PER_CLAIM)]
    engine.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), T0)
    # Every key but the last: a lease held (concurrency 1) and a task waiting.
    engine.enqueue("q", [spec for key in keys[:-1] for spec in _specs(key, 2)], T0)
    held = engine.claim("q", [], len(keys), "w", LEASE, T0)
    assert sorted(g.task.limit_key for g in held) == keys[:-1]
    engine.enqueue("other", _specs("k:", 1), T0)
    if types:
        engine.enqueue("q", [TaskSpec(task_type="u", payload=b"", limit_key="k:")], T0)
    engine.enqueue("q", _specs(keys[-1], 1), T0)
    got = engine.claim("q", types, 10, "w", LEASE, T0)
    assert [g.task.limit_key for g in got] == [keys[-1]]
