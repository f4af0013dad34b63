"""Pure arithmetic shared by the bench processes (tests/test_bench_tools.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (NaN for no values): p50 of 200 values is
    the 100th smallest, p99 the 198th."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def steady_rate(total: int, first_count: int, t_first: float, t_last: float) -> float:
    """Completions per second after the first observation: `first_count` of
    `total` tasks were done at `t_first` (1 when each completion is seen, more
    when the count is polled), all of them at `t_last`. Start-up (process
    start, connecting, the first fetch) is not in it."""
    if t_last <= t_first or total <= first_count:
        raise ValueError("a steady rate needs completions after the first observation")
    return (total - first_count) / (t_last - t_first)
