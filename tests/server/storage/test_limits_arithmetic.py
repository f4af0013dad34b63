"""The keyed limits' arithmetic (`storage.limits`), against what docs/limits.md
promises, not against itself.

Both engines and the claim model (test_limits_model.py) call `grant`,
`advance` and `next_start`, so a slip in them would pass every engine test
alike: these properties pin them down from the outside — a burst is exactly
``burst`` starts, a key never runs over its rate in any window, a claimer
that wakes when told (or a little late) gets the whole rate, the wake-up
names the first moment a start is allowed, and the rules cache is re-read
on time.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringo_trio.server.storage.limits import (
    LATE_CREDIT_US,
    RECHECK_US,
    RULES_REFRESH_US,
    KeyState,
    Rule,
    RuleCache,
    advance,
    grant,
    key_states,
    next_start,
    rate_start,
)
from tests._kit.storage import assert_within_rate

T0 = 1_800_000_000_000_000  # µs: a realistic epoch moment
RATED = st.builds(
    lambda rate, per_s, burst: Rule("k:", rate, per_s * 1_000_000, burst, 0),
    st.sampled_from([0.5, 1.0, 3.0, 10.0, 25.0, 100.0, 1000.0]),
    st.sampled_from([1, 60]),
    st.integers(1, 5),
)


def test_a_rate_below_one_per_period_is_still_a_rate() -> None:
    """0.5 a second is one start every 2 s, not "no rate"."""
    rule = Rule("k:", 0.5, 1_000_000, 1, 0)
    assert rule.interval_us == 2_000_000
    assert grant(rule, 0, 0, T0, 5) == 1
    assert grant(rule, advance(rule, 0, T0, 1), 0, T0 + 1_000_000, 5) == 0
    assert Rule("k:", 0.0, 1_000_000, 1, 2).interval_us == 0


@given(rule=RATED, want=st.integers(1, 10), idle_us=st.integers(0, 10**9))
def test_an_idle_key_starts_exactly_its_burst(rule: Rule, want: int, idle_us: int) -> None:
    """A key idle since its TAT starts ``min(want, burst)`` at once, and
    at that moment only what is left of its burst."""
    now = T0 + idle_us
    n = grant(rule, T0, 0, now, want)
    assert n == min(want, rule.burst)
    tat = advance(rule, T0, now, n)
    assert grant(rule, tat, 0, now, rule.burst) == rule.burst - n


@pytest.mark.parametrize("rate", [1.5, 3.0, 7.0, 33.0])
@pytest.mark.parametrize("burst", [2, 3, 5])
def test_a_fractional_interval_keeps_the_whole_burst(rate: float, burst: int) -> None:
    """Regression (found by the property above in CI): at 3/s an interval
    is 333,333.3 µs, and an epoch in µs plus that fraction rounds to a
    quarter µs; the grant and the TAT's rounding up cut a burst of 2 to 1
    start. Now an idle key starts its whole burst, also in several claims
    at one instant, and no more."""
    rule = Rule("k:", rate, 1_000_000, burst, 0)
    for now in (T0, T0 + 7):
        assert grant(rule, 0, 0, now, 100) == burst
        for started in range(1, burst + 1):
            tat = advance(rule, 0, now, started)
            assert grant(rule, tat, 0, now, 100) == burst - started


@given(rule=RATED, leased=st.integers(0, 5), concurrency=st.integers(1, 4))
def test_concurrency_caps_what_the_rate_would_allow(
    rule: Rule, leased: int, concurrency: int
) -> None:
    """Concurrency alone: ``concurrency - leased`` more, never fewer than 0;
    a key at its concurrency is tried again `RECHECK_US` on, a key with a
    slot left is told by its rate alone."""
    held = Rule(rule.prefix, 0.0, rule.per_us, rule.burst, concurrency)
    assert grant(held, 0, leased, T0, 10) == max(concurrency - leased, 0)
    both = Rule(rule.prefix, rule.rate, rule.per_us, rule.burst, concurrency)
    assert grant(both, 0, leased, T0, 10) == min(max(concurrency - leased, 0), rule.burst)
    expected = T0 + RECHECK_US if leased >= concurrency else None
    assert next_start(both, None, leased, T0) == expected


@given(
    rule=RATED,
    gaps=st.lists(st.integers(0, 3_000_000), min_size=1, max_size=60),
    wants=st.lists(st.integers(1, 8), min_size=60, max_size=60),
)
def test_no_window_holds_more_starts_than_the_rate_allows(
    rule: Rule, gaps: list[int], wants: list[int]
) -> None:
    """Claims at arbitrary moments, each taking what `grant` allows: no
    window of W µs holds more than ``burst + (W + late credit) / interval``
    starts (docs/limits.md)."""
    tat, now, starts = 0, T0, []
    for gap, want in zip(gaps, wants, strict=False):
        now += gap
        n = grant(rule, tat, 0, now, want)
        tat = advance(rule, tat, now, n)
        starts += [now] * n
    assert_within_rate(starts, rule)


@given(
    rule=RATED,
    lateness=st.lists(st.integers(0, LATE_CREDIT_US), min_size=20, max_size=20),
)
def test_a_claimer_waking_when_told_gets_the_whole_rate(rule: Rule, lateness: list[int]) -> None:
    """A claimer that sleeps until the wake-up (`rate_start`) and wakes up
    to the late credit late — a dispatcher's wake-up plus its round trip —
    still starts at the rule's rate: the k-th start after the burst comes
    no later than ``k * interval`` plus one lateness, so lateness does not
    add up (plain GCRA would charge each start its lateness); the TAT's
    rounding up to a whole µs may add one µs a start."""
    credit = min(rule.interval_us / 2, LATE_CREDIT_US)
    tat = advance(rule, 0, T0, grant(rule, 0, 0, T0, rule.burst))
    now = T0
    for started, late in enumerate(lateness, 1):
        wake = rate_start(rule, tat, now)
        assert wake is not None  # the burst is spent: the next start waits
        now = wake + min(late, int(credit))
        n = grant(rule, tat, 0, now, 1)
        assert n == 1, (wake, now, tat)
        tat = advance(rule, tat, now, n)
        assert now <= T0 + started * rule.interval_us + credit + started


@given(rule=RATED, tat_ahead=st.integers(-5_000_000, 5_000_000), now_step=st.integers(0, 10**6))
def test_the_wake_up_is_the_first_moment_a_start_is_allowed(
    rule: Rule, tat_ahead: int, now_step: int
) -> None:
    """`rate_start` is None exactly when `grant` allows a start now; else it
    is the first µs at which one is allowed (one µs earlier none is)."""
    now = T0 + now_step
    tat = now + tat_ahead
    at = rate_start(rule, tat, now)
    if at is None:
        assert grant(rule, tat, 0, now, 1) == 1
        return
    assert at > now
    assert grant(rule, tat, 0, now, 1) == 0
    assert grant(rule, tat, 0, at, 1) == 1
    assert grant(rule, tat, 0, at - 1, 1) == 0
    assert rate_start(rule, None, now) is None  # a key with no TAT yet may start


def test_the_rules_cache_is_read_again_on_time() -> None:
    """Fresh from its load for `RULES_REFRESH_US`, stale after it, stale when
    never loaded or invalidated, and stale if the clock runs backwards (a
    stepped clock must not keep old rules for ever)."""
    cache = RuleCache()
    assert cache.stale(T0)
    cache.load([("q", "a:", 1.0, 1_000_000, 1, 0), ("q", "a:b:", 0.0, 1_000_000, 1, 2)], T0)
    assert [r.prefix for r in cache.get("q")] == ["a:b:", "a:"]  # longest prefix first
    assert not cache.stale(T0)
    assert not cache.stale(T0 + RULES_REFRESH_US - 1)
    assert cache.stale(T0 + RULES_REFRESH_US)
    assert cache.stale(T0 - 1)
    cache.invalidate()
    assert cache.stale(T0)


def test_listed_keys_are_the_busy_ones_most_waiting_first() -> None:
    """ListLimits' keys: only keys with waiting or leased tasks, grouped
    under their rule, the most waiting first (then the most leased, then
    by name), at most `cap` a rule; the next start from the key's TAT."""
    rules = [Rule("a:b:", 0.0, 1_000_000, 1, 1), Rule("a:", 1.0, 1_000_000, 1, 0)]
    rows = [
        ("a:1", 1, 0, None),
        ("a:2", 5, 0, T0 + 3_000_000),
        ("a:3", 0, 0, None),  # nothing waiting or leased: not listed
        ("a:4", 1, 2, None),
        ("a:b:1", 0, 1, None),
        ("z:1", 9, 9, None),  # no rule
    ]
    states = key_states(rules, rows, T0, cap=2)
    assert states["a:"] == [
        KeyState("a:2", 5, 0, T0 + 3_000_000),
        KeyState("a:4", 1, 2, None),
    ]
    assert states["a:b:"] == [KeyState("a:b:1", 0, 1, None)]
