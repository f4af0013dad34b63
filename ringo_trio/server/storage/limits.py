"""Keyed limits, what both engines share: a rule, the choice of a key's rule,
the GCRA arithmetic, the plan of a limited claim, and the per-engine cache
of which queues have rules.

Theory of operation
-------------------
A rule of a queue applies separately to every distinct ``limit_key`` that
starts with its prefix (the longest matching prefix wins; a task without a
key is never limited). Rate is GCRA: each limited key keeps one
"theoretical arrival time" (TAT, µs); a start at ``now`` is allowed while
``max(TAT, now) - now <= tolerance`` (``tolerance = (burst - 1) * interval``,
``interval = per / rate``) and moves the TAT to ``max(TAT, now) + interval``.
Concurrency counts the key's LEASED tasks through a partial index at claim
time, so no settling path has a counter to keep.

A claim on a queue that has rules (`claim_plan`): the keys with waiting
tasks are walked one index seek each (at most `MAX_LIMIT_KEYS_PER_CLAIM`),
each key is granted what its own rule allows (its TAT and its leases read
under the key's lock on PostgreSQL, under the write lock on SQLite), the
due heads of each key up to its grant are read, and the grants' union is
leased in claim order. A key with a deep backlog gets its grant, not the
queue's order: a key with few tasks behind it is delayed by nothing but its
own rule. A queue without rules takes the plain claim path: the engine's
`RuleCache` says so without a query.

Staleness: an engine caches every queue's rules, reloaded when older than
`RULES_REFRESH` (by the callers' clock) or at once when told (SetLimit and
DeleteLimit on this engine; on PostgreSQL the other daemons hear it through
LISTEN/NOTIFY), so a rule change reaches every daemon within that bound even
when a notification is lost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "LATE_CREDIT_US",
    "RULES_REFRESH_US",
    "RECHECK_US",
    "Rule",
    "RuleCache",
    "grant",
    "match",
]

RULES_REFRESH_US = 2_000_000
"""Longest a cached rule set serves without being read again."""
LATE_CREDIT_US = 20_000
"""At most this much of a start's lateness is forgiven (`advance`)."""
RECHECK_US = 250_000
"""A key held by its concurrency alone is tried again this often. A lease
that ends on this daemon wakes its queue's claimers at once (the RPC layer
notifies on every settlement of a queue with rules); this recheck is the
backstop for a lease that ends on another daemon sharing the database."""


# Far below one start (a burst is at most `MAX_LIMIT_BURST`, 1e5), far
# above a float's rounding of a quotient of that size.
_ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class Rule:
    prefix: str
    rate: float
    per_us: int
    burst: int
    concurrency: int

    @property
    def interval_us(self) -> float:
        """µs between starts at the rate; 0 for no rate limit."""
        return self.per_us / self.rate if self.rate > 0 else 0.0

    @property
    def tolerance_us(self) -> float:
        return (max(self.burst, 1) - 1) * self.interval_us


def match(rules: Sequence[Rule], key: str) -> Rule | None:
    """The rule of `key`: the longest prefix of it (`rules` longest prefix
    first); None for a key no rule matches and for no key."""
    if not key:
        return None
    for rule in rules:
        if key.startswith(rule.prefix):
            return rule
    return None


def grant(rule: Rule, tat_us: int, leased: int, now_us: int, want: int) -> int:
    """How many of a key's tasks may start at `now_us`."""
    n = want
    if rule.concurrency:
        n = min(n, max(rule.concurrency - leased, 0))
    interval = rule.interval_us
    if interval and n:
        # The integers first: an epoch in µs (~1.8e15) plus a fractional
        # tolerance rounds to a quarter µs, which cut a burst of 2 at 3/s
        # to 1 start; `_ROUNDING` absorbs the last bit of ((b-1) * I) / I.
        slack = now_us - max(tat_us, now_us) + rule.tolerance_us
        n = 0 if slack < 0 else min(n, math.floor(slack / interval + _ROUNDING) + 1)
    return n


def late_credit_us(rule: Rule) -> float:
    """How late a start may come after its key's TAT and still count as on
    time (see `advance`)."""
    return min(rule.interval_us / 2, LATE_CREDIT_US)


def advance(rule: Rule, tat_us: int, now_us: int, started: int) -> int:
    """The key's TAT after `started` starts at `now_us`.

    Plain GCRA moves the TAT to ``max(TAT, now) + interval``, so every start
    that comes late — a dispatcher wakes after the TAT, plus its claim's
    round trip — is charged its lateness, and at burst 1 the key runs
    measurably under its rate (a 2 ms-late wake-up costs 2% at 10/s, 10% at
    50/s). A start at most `late_credit_us` after the TAT is charged from
    the TAT instead: the long-run rate is the rule's, while two starts are
    never closer than ``interval - late_credit_us`` and no window of W holds
    more than ``burst + (W + late_credit_us) / interval`` starts. A key idle
    for longer starts from `now_us`, as plain GCRA."""
    interval = rule.interval_us
    if not interval:
        return tat_us
    base = tat_us if tat_us >= now_us - late_credit_us(rule) else now_us
    # Whole µs, rounded down and added to the integer: rounded up, a TAT a
    # fraction of a µs late took the rest of a burst's starts at that
    # instant (2 at 3/s started 1); down, a key runs at most 1 µs a claim
    # ahead of its rate.
    return base + math.floor(started * interval)


def rate_start(rule: Rule, tat_us: int | None, now_us: int) -> int | None:
    """When the key's rate lets it start a task next (µs, > now); None when
    it may now."""
    if rule.interval_us and tat_us is not None:
        # The first whole µs `grant` allows, computed as it computes.
        at = tat_us - math.floor(rule.tolerance_us)
        if at > now_us:
            return at
    return None


def next_start(rule: Rule, tat_us: int | None, leased: int, now_us: int) -> int | None:
    """When the key may start a task next (µs, > now), None when it may
    now; a key held by its concurrency is tried again `RECHECK_US` on."""
    if rule.concurrency and leased >= rule.concurrency:
        return now_us + RECHECK_US
    return rate_start(rule, tat_us, now_us)


class RuleCache:
    """Every queue's rules as one engine last read them (see the module
    docstring for how stale they may be)."""

    def __init__(self) -> None:
        self._rules: dict[str, tuple[Rule, ...]] = {}
        self._loaded_us: int | None = None

    def stale(self, now_us: int) -> bool:
        loaded = self._loaded_us
        return loaded is None or not loaded <= now_us < loaded + RULES_REFRESH_US

    def load(self, rows: Iterable[tuple[str, str, float, int, int, int]], now_us: int) -> None:
        """Rows of (queue, prefix, rate, per_us, burst, concurrency)."""
        rules: dict[str, list[Rule]] = {}
        for queue, prefix, rate, per_us, burst, concurrency in rows:
            rules.setdefault(queue, []).append(
                Rule(prefix, float(rate), int(per_us), int(burst), int(concurrency))
            )
        self._rules = {
            q: tuple(sorted(r, key=lambda rule: -len(rule.prefix))) for q, r in rules.items()
        }
        self._loaded_us = now_us

    def invalidate(self) -> None:
        self._loaded_us = None

    def get(self, queue: str) -> tuple[Rule, ...]:
        return self._rules.get(queue, ())

    def listed(self, queue: str | None) -> dict[str, tuple[Rule, ...]]:
        """ListLimits' rules by queue: every queue's, or `queue`'s alone."""
        if queue is None:
            return dict(self._rules)
        return {queue: self._rules[queue]} if queue in self._rules else {}


@dataclass(frozen=True, slots=True)
class KeyState:
    """One key of a rule as ListLimits reports it."""

    key: str
    waiting: int
    leased: int
    next_start_us: int | None


@dataclass(frozen=True, slots=True)
class RuleStatus:
    queue: str
    rule: Rule
    keys: tuple[KeyState, ...] = ()


@dataclass(slots=True)
class Candidate:
    """A due head of some key: what a limited claim orders and leases."""

    seq: int
    priority: int
    available_at: int
    key: str


def pick(candidates: list[Candidate], limit: int) -> list[Candidate]:
    """The first `limit` candidates in claim order."""
    candidates.sort(key=lambda c: (-c.priority, c.available_at, c.seq))
    return candidates[:limit]


def key_states(
    rules: Sequence[Rule],
    rows: Iterable[tuple[str, int, int, int | None]],
    now_us: int,
    cap: int,
) -> dict[str, list[KeyState]]:
    """Rows of (key, waiting, leased, tat_us) grouped by the prefix of their
    rule, the most waiting first, at most `cap` per rule."""
    by_prefix: dict[str, list[KeyState]] = {r.prefix: [] for r in rules}
    for key, waiting, leased, tat in rows:
        rule = match(rules, key)
        if rule is None or not (waiting or leased):
            continue
        by_prefix[rule.prefix].append(KeyState(key, waiting, leased, rate_start(rule, tat, now_us)))
    for states in by_prefix.values():
        states.sort(key=lambda s: (-s.waiting, -s.leased, s.key))
        del states[cap:]
    return by_prefix
