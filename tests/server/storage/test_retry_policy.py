"""The one retry policy (`storage.retry`), on its own: the formula both
engines used to spell (a Python function SQLite called, a PL/pgSQL copy on
PostgreSQL), float for float, and the schedule PostgreSQL stores per task."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from ringo_trio._contract.limits import MAX_DELAY
from ringo_trio.server.storage.retry import (
    MAX_DELAY_US,
    backoff_us,
    delay_us,
    override_us,
    schedule,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
ATTEMPTS = st.one_of(st.integers(0, 100), st.integers(0, 2**32), st.sampled_from([2**31, 2**32]))
MULTIPLIERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(1, 3),
    st.sampled_from([0.0, 0.5, 1.0, 1.0000001, 2.0, 10.0, 1e300]),
)
# What the service lets through (limits.MAX_DELAY for both durations,
# multiplier >= 1 and finite).
VALID_US = st.integers(0, MAX_DELAY_US)
VALID_MULTIPLIERS = st.one_of(st.floats(1, 1e6), st.sampled_from([1.0, 1.0000001, 2.0]))


def _old_backoff_us(initial_us: int, max_us: int, multiplier: float, attempt: int) -> int:
    """The SQLite engine's `_backoff_us` before the policy had a module of
    its own (the PL/pgSQL function matched it float for float)."""
    try:
        delay = initial_us * multiplier ** max(attempt - 1, 0)
    except OverflowError:
        delay = math.inf
    if not delay < max_us:
        return max_us
    return max(int(delay), 0)


@given(INT64, INT64, MULTIPLIERS, ATTEMPTS)
def test_the_policy_is_the_old_formula_float_for_float(
    initial: int, maximum: int, multiplier: float, attempt: int
) -> None:
    """Property: for any stored policy and attempt (large ones included) the
    delay is what the engines computed before, capped at MAX_DELAY as their
    statements capped it."""
    try:
        old = _old_backoff_us(initial, maximum, multiplier, attempt)
    except OverflowError:
        # A negative delay overflowing to -inf (a negative initial times a
        # huge power, or a huge negative multiplier), which the old formula
        # failed to convert (SQLite then failed the statement; the PL/pgSQL
        # copy answered the maximum): a negative delay is 0.
        assert initial * multiplier ** max(attempt - 1, 0) == -math.inf
        assert backoff_us(initial, maximum, multiplier, attempt) == 0
        return
    assert backoff_us(initial, maximum, multiplier, attempt) == old
    assert delay_us(initial, maximum, multiplier, attempt) == min(old, MAX_DELAY_US)


@given(VALID_US, VALID_US, VALID_MULTIPLIERS, ATTEMPTS)
def test_a_valid_policy_grows_and_is_capped(
    initial: int, maximum: int, multiplier: float, attempt: int
) -> None:
    """Property: within the limits, a later attempt never waits less, and no
    attempt waits longer than the policy's maximum or MAX_DELAY."""
    first = delay_us(initial, maximum, multiplier, attempt)
    assert 0 <= first <= min(maximum, MAX_DELAY_US)
    assert first <= delay_us(initial, maximum, multiplier, attempt + 1)


@given(INT64, INT64, MULTIPLIERS, st.integers(0, 300))
def test_the_schedule_holds_every_attempts_delay(
    initial: int, maximum: int, multiplier: float, attempts: int
) -> None:
    """Property: a schedule is never empty, entry min(n, len) is attempt n's
    delay for every n up to `attempts`, and one that stopped early (its
    delays settled) holds for every later attempt too."""
    delays = schedule(initial, maximum, multiplier, attempts)
    assert 1 <= len(delays) <= max(attempts, 1)
    checked = list(range(1, max(attempts, 1) + 3))
    if len(delays) < max(attempts, 1):
        checked += [10**6, 2**32]
    for attempt in checked:
        if attempt > max(attempts, 1) and len(delays) == max(attempts, 1):
            break
        assert delays[min(attempt, len(delays)) - 1] == delay_us(
            initial, maximum, multiplier, attempt
        )


@given(VALID_US, VALID_US, VALID_MULTIPLIERS, st.integers(0, 300))
def test_a_valid_schedule_stops_where_its_delays_settle(
    initial: int, maximum: int, multiplier: float, attempts: int
) -> None:
    """Property: within the limits a schedule is as short as its policy
    allows (PostgreSQL stores one per task): a constant policy is one
    entry; a growing one stops at the first attempt that reaches its cap,
    so no entry before the last is the cap, and one shorter than
    `attempts` ends on it."""
    delays = schedule(initial, maximum, multiplier, attempts)
    cap = min(maximum, MAX_DELAY_US)
    if multiplier == 1:
        assert len(delays) == 1
        return
    assert cap not in delays[:-1]
    if len(delays) < max(attempts, 1):
        assert delays[-1] == cap


def test_the_default_policy_and_the_edges_of_a_delay() -> None:
    """The default policy (1 s doubling to 5 min) is a schedule of 10
    entries; any delay stops at `MAX_DELAY`; a hand-written shrinking
    policy's delay rounds down to whole µs and never below 0."""
    default = schedule(1_000_000, 300_000_000, 2.0, 1_000)
    assert [d // 1_000_000 for d in default] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    huge = MAX_DELAY * 4 // timedelta(microseconds=1)
    assert timedelta(microseconds=delay_us(huge, huge, 2.0, 3)) == MAX_DELAY
    assert backoff_us(1, 10, 1.0, 1) == 1
    assert backoff_us(1, 10, 0.5, 2) == 0  # half a µs
    assert backoff_us(3, 10, 0.5, 2) == 1  # 1.5 µs


def test_a_nack_delay_replaces_the_policy_within_the_limits() -> None:
    assert override_us(None) is None
    assert override_us(timedelta(0)) == 0
    assert override_us(timedelta(seconds=-5)) == 0
    assert override_us(timedelta(seconds=3)) == 3_000_000
    assert override_us(timedelta.max) == MAX_DELAY_US
