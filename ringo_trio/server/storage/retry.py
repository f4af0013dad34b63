"""The one retry policy: how long a task waits after a failed attempt.

Attempt N (1-based) that ends by a nack without a delay of its own, or by
its lease expiring, makes the task wait ``initial * multiplier ** (N - 1)``
microseconds, capped at the task's ``maximum`` and at `MAX_DELAY` (a row
from before the limits may hold any policy). A nack's explicit
``retry_delay`` replaces that (zero allowed), capped at `MAX_DELAY` alike.

Both engines apply exactly this, with no backoff arithmetic in SQL: SQLite
runs in the daemon's process, so its statements call `delay_us` (registered
as a SQL function); a PostgreSQL statement cannot call back into Python, so
each task stores its `schedule` (computed here at enqueue, on retry, and by
the migration that introduced it), and a statement reads the entry of the
attempt that ended.
"""

from __future__ import annotations

import math
from datetime import timedelta

from ringo_trio._contract.limits import MAX_DELAY

__all__ = ["MAX_DELAY_US", "backoff_us", "delay_us", "override_us", "schedule"]

MAX_DELAY_US = MAX_DELAY // timedelta(microseconds=1)


def backoff_us(initial_us: int, max_us: int, multiplier: float, attempt: int) -> int:
    """``initial * multiplier ** (attempt - 1)`` µs, capped at ``max_us``:
    an overflow or a NaN caps, a negative delay is 0."""
    try:
        delay = initial_us * multiplier ** max(attempt - 1, 0)
    except OverflowError:
        delay = math.inf
    # `not <` also sends NaN to the cap.
    if not delay < max_us:
        return max_us
    # A negative initial (only a hand-written row has one) may reach -inf.
    return max(int(delay), 0) if delay > 0 else 0


def delay_us(initial_us: int, max_us: int, multiplier: float, attempt: int) -> int:
    """How long the task waits after `attempt` failed (`backoff_us`, at most
    `MAX_DELAY_US`)."""
    return min(backoff_us(initial_us, max_us, multiplier, attempt), MAX_DELAY_US)


def override_us(retry_delay: timedelta | None) -> int | None:
    """A nack's own retry delay in µs (0 at least, `MAX_DELAY_US` at most);
    None: the policy's."""
    if retry_delay is None:
        return None
    return min(max(retry_delay // timedelta(microseconds=1), 0), MAX_DELAY_US)


def schedule(initial_us: int, max_us: int, multiplier: float, attempts: int) -> list[int]:
    """`delay_us` of attempts 1, 2, ...: entry ``min(n, len) - 1`` is attempt
    n's delay for every n up to `attempts` (the last one to keep: one past a
    task's max_attempts ends it instead), and the list stops as soon as every
    later delay equals its last entry, so a task's schedule is a few entries
    (the default policy: 10) and never empty."""
    delays: list[int] = []
    # Where the delays stop changing: a growing (or NaN) policy at its cap,
    # a shrinking one at 0; only for a policy within the limits (anything
    # else, say a negative one from a hand-written row, runs to `attempts`).
    growing = multiplier >= 1 or math.isnan(multiplier)
    monotone = initial_us >= 0 and max_us >= 0 and (growing or multiplier >= 0)
    settled_at = min(max_us, MAX_DELAY_US) if growing else 0
    for attempt in range(1, max(attempts, 1) + 1):
        delay = delay_us(initial_us, max_us, multiplier, attempt)
        delays.append(delay)
        if multiplier == 1 or (monotone and delay == settled_at):
            break
    return delays
