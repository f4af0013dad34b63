"""The daemon's request bounds at their edges, on the pure validators
(`server.rpc.validate`): each bound itself is accepted, one past it is
refused naming the field — the refusals end to end (INVALID_ARGUMENT,
nothing changed) are test_validation.py's; this file pins where each line
is drawn, which a request at a round number far past it never does."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import LimitRule, RetryBackoff, TaskSpec
from ringo_trio.server.rpc import validate
from ringo_trio.server.rpc.validate import FieldError
from ringo_trio.server.storage.limits import Rule

NOW = datetime(2030, 1, 1, tzinfo=UTC)
ONE_US = timedelta(microseconds=1)


def spec(**fields: Any) -> TaskSpec:
    return validate.task_spec(TaskSpec(task_type="t", **fields), "spec", NOW)


def rule(**fields: Any) -> Rule:
    fields.setdefault("prefix", "k:")
    fields.setdefault("concurrency", 1)
    return validate.limit_rule(LimitRule(**fields), "rule")


def backoff(**fields: Any) -> TaskSpec:
    return spec(retry_backoff=RetryBackoff(**fields))


# (what is built, at the edge, one past it, the field the refusal names)
EDGES: list[tuple[str, Callable[[Any], object], Any, Any, str]] = [
    ("task types", validate.task_types, ["t"] * limits.MAX_TASK_TYPES,
     ["t"] * (limits.MAX_TASK_TYPES + 1), "task_types"),
    ("max_attempts", lambda n: spec(max_attempts=n), limits.MAX_ATTEMPTS_LIMIT,
     limits.MAX_ATTEMPTS_LIMIT + 1, "spec.max_attempts"),
    ("delay", lambda d: spec(delay=d), limits.MAX_DELAY, limits.MAX_DELAY + ONE_US,
     "spec.delay"),
    ("not_before", lambda t: spec(not_before=t), limits.MAX_NOT_BEFORE,
     limits.MAX_NOT_BEFORE + ONE_US, "spec.not_before"),
    ("a negative delay", lambda d: spec(delay=d), timedelta(0), -ONE_US, "spec.delay"),
    ("the backoff's multiplier", lambda m: backoff(multiplier=m), 1.0, 0.999,
     "spec.retry_backoff.multiplier"),
    ("the backoff's maximum", lambda m: backoff(initial=timedelta(seconds=2), maximum=m),
     timedelta(seconds=2), timedelta(seconds=2) - ONE_US, "spec.retry_backoff.maximum"),
    ("a result", validate.result_value, b"x" * limits.MAX_RESULT_BYTES,
     b"x" * (limits.MAX_RESULT_BYTES + 1), "result"),
    ("a bulk call's limit", validate.batch_limit, limits.MAX_DELETE_BATCH,
     limits.MAX_DELETE_BATCH + 1, "limit"),
    ("a rule's rate", lambda r: rule(rate=r), limits.MAX_LIMIT_RATE,
     limits.MAX_LIMIT_RATE * 1.000001, "rule.rate"),
    ("a negative rate", lambda r: rule(rate=r), 0.0, -0.001, "rule.rate"),
    ("a rule's per", lambda p: rule(rate=1.0, per=p), limits.MAX_LIMIT_PER,
     limits.MAX_LIMIT_PER + ONE_US, "rule.per"),
    ("a zero per", lambda p: rule(rate=1.0, per=p), ONE_US, timedelta(0), "rule.per"),
    ("a rule's burst", lambda b: rule(rate=1.0, burst=b), limits.MAX_LIMIT_BURST,
     limits.MAX_LIMIT_BURST + 1, "rule.burst"),
    ("a rule's concurrency", lambda c: rule(concurrency=c), limits.MAX_LIMIT_CONCURRENCY,
     limits.MAX_LIMIT_CONCURRENCY + 1, "rule.concurrency"),
]  # fmt: skip


@pytest.mark.parametrize(("build", "at", "past", "field"), [e[1:] for e in EDGES],
                         ids=[e[0] for e in EDGES])  # fmt: skip
def test_each_bound_is_drawn_exactly_where_it_says(
    build: Callable[[Any], object], at: Any, past: Any, field: str
) -> None:
    build(at)
    with pytest.raises(FieldError) as refused:
        build(past)
    assert refused.value.path == field


def test_what_the_edges_normalize_to() -> None:
    """A rate below one per period is a rate; an unset per is a second; an
    unset burst is 1; a rule that limits nothing is refused; a bulk call's
    0 means the bound; WaitTask's timeout is clamped to `MAX_TASK_WAIT`,
    not refused."""
    slow = rule(rate=0.5, concurrency=0)
    assert (slow.rate, slow.per_us, slow.burst) == (0.5, 1_000_000, 1)
    assert rule(rate=2.0, burst=3).burst == 3
    with pytest.raises(FieldError) as nothing:
        rule(rate=0.0, concurrency=0)
    assert nothing.value.path == "rule"
    assert validate.batch_limit(0) == limits.MAX_DELETE_BATCH
    longest = limits.MAX_TASK_WAIT.total_seconds()
    assert validate.wait_timeout(limits.MAX_TASK_WAIT + timedelta(hours=1)) == longest
    assert validate.wait_timeout(timedelta(seconds=1)) == 1.0
    assert validate.wait_timeout(None) == 0.0
    assert validate.result_value(None) is None
