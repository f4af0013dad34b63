"""What both engines share for inspection (ListTasks, GetQueueStats, ListQueues).

Theory of operation
-------------------
A page of ListTasks is a k-way merge, by `seq`, of index-ordered streams,
each a range seek past the cursor. The database merges them (SQLite: MERGE
(UNION ALL); PostgreSQL: Merge Append) and stops after `limit + 1` rows, so
a page costs about `limit` index entries however deep the queue is, and
never sorts. Which streams depends on the engine's indexes (see each
engine's listing section): PostgreSQL has one per state, or per (task type,
state) when types are asked (`plan`); SQLite has one per active task type
and one per finished state, on partial indexes the claim path never
touches.

A filter the streams cannot express (a unique-key prefix; task types over
the finished states on SQLite; more streams than `MAX_ARMS`) is applied to
the merged rows instead. Such a page walks at most `MAX_LIST_SCAN` index
entries: when the walk ends before the page is full, the page comes back
short (possibly empty) with a cursor at the last entry walked, and the
next page continues from there. The walk reads only a few narrow columns;
the full rows of the matches are read afterwards.

Rows are listed without payload and result, and with last_error cut to
`MAX_LIST_ERROR_BYTES` in SQL (by characters, then by bytes here), so a
page's size is bounded whatever the tasks hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ringo_trio._contract.limits import MAX_LIST_ERROR_BYTES, MAX_LIST_SCAN
from ringo_trio._proto.ringo.v1 import QueueStats, TaskTypeStats

from .base import TaskFilter
from .rows import CANCELLED, DEAD, LEASED, PENDING, SUCCEEDED, from_us, to_us

# Every state a task can be in, in wire order.
ALL_STATES = (PENDING, LEASED, SUCCEEDED, DEAD, CANCELLED)
MAX_ARMS = 64
"""Most index streams one page merges; more (type, state) pairs fall back
to the state streams with the types checked per row."""
SEQ_MAX = 2**63 - 1


def first_after(after: int | None, newest_first: bool) -> int:
    """A page's cursor: the seq it starts after (the first page: past the
    end its order starts from)."""
    if after is not None:
        return after
    return SEQ_MAX if newest_first else -1


@dataclass(frozen=True, slots=True)
class Residual:
    """The per-row check of a page whose streams do not decide the filter
    alone; walked rows are `(seq, task_type, unique_key, state)`."""

    states: frozenset[int]
    types: frozenset[str]
    prefix: str

    def matches(self, task_type: str, unique_key: str, state: int) -> bool:
        if state not in self.states:
            return False
        if self.types and task_type not in self.types:
            return False
        return unique_key.startswith(self.prefix)


Arm = tuple[str, Any]
"""One ListTasks stream, seq-ordered on a partial index: ("active", type)
walks one type's PENDING and LEASED tasks (`tasks_active_type`);
("finished", (type, state)) one type's tasks in one finished state
(`tasks_finished`); ("scan", None) walks the queue by seq, budgeted, when
the streams would be more than `MAX_ARMS`."""


def arms(
    pairs: Iterable[tuple[str, int]], where: TaskFilter
) -> tuple[tuple[Arm, ...], Residual | None]:
    """The streams a page of `where` merges, from the (task type, state)
    pairs the counts say hold tasks, and the per-row check when the streams
    alone do not decide the filter."""
    states = tuple(dict.fromkeys(where.states)) or ALL_STATES
    types = set(where.task_types)
    wanted = [(t, s) for t, s in pairs if s in states and (not types or t in types)]
    out: list[Arm] = [
        ("active", t) for t in dict.fromkeys(t for t, s in wanted if s in (PENDING, LEASED))
    ]
    out += [("finished", (t, s)) for t, s in wanted if s not in (PENDING, LEASED)]
    # The active streams hold both states.
    exact = not where.unique_key_prefix and (PENDING in states) == (LEASED in states)
    if len(out) > MAX_ARMS:
        out = [("scan", None)]
        exact = False
    if exact:
        return tuple(out), None
    return tuple(out), Residual(frozenset(states), frozenset(types), where.unique_key_prefix)


def shape(arms: Sequence[Arm]) -> tuple[tuple[str, int | None], ...]:
    """What a page's SQL text depends on: the arms' kinds and finished
    states (task types are bound parameters)."""
    return tuple((kind, value[1] if kind == "finished" else None) for kind, value in arms)


def arm_types(arms: Sequence[Arm]) -> list[str]:
    """The task type of each typed arm, in order (the bound parameters)."""
    return [value if kind == "active" else value[0] for kind, value in arms if kind != "scan"]


def scan_budget(limit: int) -> int:
    return max(MAX_LIST_SCAN, limit + 1)


def pick(
    residual: Residual, walked: Sequence[Sequence[Any]], limit: int, budget: int
) -> tuple[list[int], int | None]:
    """From a budgeted walk's `(seq, task_type, unique_key)` rows: the seqs of
    the page's tasks (at most `limit`) and the cursor for the next page
    (None when the walk reached the end)."""
    seqs: list[int] = []
    for row in walked:
        if residual.matches(row[1], row[2], row[3]):
            if len(seqs) == limit:
                return seqs, seqs[-1]
            seqs.append(row[0])
    if len(walked) < budget:
        return seqs, None
    # The walk stopped at its budget: the next page goes on after it.
    return seqs, int(walked[-1][0])


def cut_error(text: str) -> str:
    """`text` cut to MAX_LIST_ERROR_BYTES of UTF-8, at a character boundary."""
    if len(text) <= MAX_LIST_ERROR_BYTES // 4:
        return text
    data = text.encode("utf-8")
    if len(data) <= MAX_LIST_ERROR_BYTES:
        return text
    return data[:MAX_LIST_ERROR_BYTES].decode("utf-8", "ignore")


def by_state(rows: Iterable[Sequence[Any]]) -> dict[str, dict[int, int]]:
    """`(task_type, state, n)` rows as {task_type: {state: n}}, n > 0 only."""
    out: dict[str, dict[int, int]] = {}
    for task_type, state, n in rows:
        if n > 0:
            counts = out.setdefault(task_type, {})
            counts[state] = counts.get(state, 0) + int(n)
    return out


def queue_stats(
    queue: str,
    counts: dict[str, dict[int, int]],
    oldest_us: int | None,
    now: datetime,
    *,
    by_type: bool,
    paused: bool = False,
) -> QueueStats:
    """The wire stats of `queue` from `by_state` counts and the earliest
    PENDING available_at (set in the reply only when it is due at `now`)."""
    totals = dict.fromkeys(ALL_STATES, 0)
    types: list[TaskTypeStats] = []
    for task_type in sorted(counts):
        per = counts[task_type]
        for state, n in per.items():
            totals[state] += n
        if by_type:
            types.append(
                TaskTypeStats(
                    task_type=task_type,
                    pending=per.get(PENDING, 0),
                    leased=per.get(LEASED, 0),
                    succeeded=per.get(SUCCEEDED, 0),
                    dead=per.get(DEAD, 0),
                    cancelled=per.get(CANCELLED, 0),
                )
            )
    oldest = None
    if oldest_us is not None and oldest_us <= to_us(now):
        oldest = from_us(oldest_us)
    return QueueStats(
        queue=queue,
        pending=totals[PENDING],
        leased=totals[LEASED],
        succeeded=totals[SUCCEEDED],
        dead=totals[DEAD],
        cancelled=totals[CANCELLED],
        oldest_pending_at=oldest,
        by_type=types,
        as_of=now,
        paused=paused,
    )
