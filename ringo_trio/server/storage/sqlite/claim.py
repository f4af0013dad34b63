"""Tasks into the table and out to workers: the enqueue INSERTs, and the
claim (priority by priority, see the engine's docstring) with its lease
tokens and the counts it moves itself.

The two hot transitions count themselves. The count trigger fires per row
and its two statements cost ~3.5 us per claimed and acked task; it skips
PENDING -> LEASED (only a claim leases) and LEASED -> SUCCEEDED (only an ack
succeeds a task), and the claim and the acks move those counts with one
statement per (queue, task type) of the transaction (`move_counts`). Every
other write is still counted by the triggers, so a path added later is
counted unless it makes one of those two transitions.
"""

from __future__ import annotations

import collections
import functools
import itertools
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ringo_trio._proto.ringo.v1 import LeasedTask

from ..rows import COLS, LEASED, PENDING, leased
from .schema import COUNTS_DOWN, COUNTS_UP

_T = TypeVar("_T")

# A claim seeks priority by priority; a queue with more distinct priorities
# than this falls back to one ordered scan for the rest, bounding the seeks.
PRIORITY_PROBES = 16
# The tasks a walk steps through: every PENDING task of the queue
# (`tasks_pending`), unless a walk names others (a limited claim's unkeyed
# tasks, `schema.UNKEYED_PENDING`).
PENDING_TERM = f"state = {PENDING}"
_INSERT_HEAD = (
    "INSERT INTO tasks (id, queue, task_type, payload, unique_key, state, attempt,"
    " max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,"
    " backoff_multiplier, created_at, updated_at, available_at, last_error, worker_id,"
    " lease_token, limit_key) VALUES "
)
_INSERT_ROW = "(?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', '', '', ?)"
INSERT = _INSERT_HEAD + _INSERT_ROW
# Rows per multi-row INSERT, largest first: a batch is cut into these so
# that only four statements (each prepared once, in the statement cache)
# insert any batch. One statement per row (`executemany`) cost twice as much:
# SQLite evaluated each partial index's `state IN (...)` term with a table it
# builds once per statement execution, i.e. once per row (measured: 9.9 ->
# 4.4 ms per 1,000 rows, engine alone, before schema 6 put the finished-task
# indexes on a range term).
INSERT_CHUNKS = (512, 64, 8, 1)  # 512 rows x 17 parameters, far below 32766


@functools.cache
def insert_rows(count: int) -> str:
    return _INSERT_HEAD + ", ".join([_INSERT_ROW] * count)


def pieces(items: Sequence[_T], sizes: Sequence[int]) -> Iterator[Sequence[_T]]:
    """`items` in consecutive pieces of `sizes` (largest first, the last 1),
    so a batch of any length runs as a few statements, each of a size that
    stays prepared in the statement cache."""
    start = 0
    for size in sizes:
        while len(items) - start >= size:
            yield items[start : start + size]
            start += size


def insert_all(db: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    for piece in pieces(rows, INSERT_CHUNKS):
        db.execute(insert_rows(len(piece)), list(itertools.chain.from_iterable(piece)))


def types_filter(task_types: Sequence[str]) -> tuple[str, dict[str, str]]:
    """An `AND task_type IN (...)` filter and its named parameters :t0, :t1, ...
    (each type once: `each_type` walks them one by one)."""
    if not task_types:
        return "", {}
    unique = list(dict.fromkeys(task_types))
    names = [f"t{i}" for i in range(len(unique))]
    clause = " AND task_type IN (" + ", ".join(":" + n for n in names) + ")"
    return clause, dict(zip(names, unique, strict=True))


def each_type(arm: str, types: int, combine: str) -> str:
    """`arm`, a SELECT of one task type's PENDING tasks naming it `:type`,
    once per type (:t0, :t1, ...), UNION ALL'd into the `combine` template's
    `{arms}` (one type: the arm alone). Each arm seeks `tasks_pending_type`
    with its type in the key, so a typed walk never reads the tasks of other
    types (an `IN` list on `tasks_pending` read every task of the queue
    ahead of the first of its own types)."""
    if types == 1:
        return arm.replace(":type", ":t0")
    return combine.format(
        arms=" UNION ALL ".join(
            f"SELECT * FROM ({arm.replace(':type', f':t{i}')})" for i in range(types)
        )
    )


def _aggregate(fn: str, column: str, terms: str, types: int, pending: str) -> str:
    """`fn(column)` (min or max) over the `pending` tasks of the queue meeting
    `terms` (each ` AND ...`), of its `types` when any: the same of each
    type, combined."""
    where = f"queue = :queue AND {pending}{terms}"
    if not types:
        return f"SELECT {fn}({column}) FROM tasks WHERE {where}"
    arm = f"SELECT {fn}({column}) AS x FROM tasks WHERE {where} AND task_type = :type"
    return each_type(arm, types, f"SELECT {fn}(x) FROM ({{arms}})")


@functools.lru_cache(maxsize=256)
def priority_sql(types: int, below: bool, pending: str = PENDING_TERM) -> str:
    """The highest priority of the queue's `pending` tasks (of its `types`,
    when any), below :prio when `below`: one index seek (per type)."""
    return _aggregate("max", "priority", " AND priority < :prio" if below else "", types, pending)


@functools.lru_cache(maxsize=256)
def soonest_sql(types: int, rest: bool, pending: str = PENDING_TERM) -> str:
    """The soonest `available_at` of the `pending` tasks at :prio (at and
    below it when `rest`), of the queue's `types` when any."""
    return _aggregate(
        "min", "available_at", f" AND priority {'<=' if rest else '='} :prio", types, pending
    )


def due_at_step(rest: bool, pending: str = PENDING_TERM) -> tuple[str, str]:
    """A claim step's WHERE and ORDER BY: the queue's due `pending` tasks
    at :prio (`rest`: at and below it, in one ordered scan), in claim
    order."""
    prio = "priority <= :prio" if rest else "priority = :prio"
    where = f"queue = :queue AND {pending} AND {prio} AND available_at <= :now"
    return where, "priority DESC, available_at, seq" if rest else "available_at, seq"


def take_in_steps(
    db: sqlite3.Connection,
    args: dict[str, Any],
    limit: int,
    step_sql: Callable[[bool], str],
    types: int,
    pending: str = PENDING_TERM,
) -> list[Any]:
    """The rows of `step_sql(rest)` at each priority step of
    `priority_steps` (its :limit the room left) until `limit` of them."""
    rows: list[Any] = []
    for rest in priority_steps(db, args, types, pending):
        args["limit"] = limit - len(rows)
        rows += db.execute(step_sql(rest), args)
        if len(rows) >= limit:
            break
    return rows


@functools.lru_cache(maxsize=256)
def due_sql(types: int, rest: bool, pending: str = PENDING_TERM, columns: str = "seq") -> str:
    """`columns` of the first :limit due `pending` tasks at :prio (`rest`:
    at and below it, in one ordered scan), of the queue's `types` when any:
    each type's first :limit by its own walk, then the first :limit of
    those."""
    where, order = due_at_step(rest, pending)
    if not types:
        return f"SELECT {columns} FROM tasks WHERE {where} ORDER BY {order} LIMIT :limit"
    # The merge (of two types or more) sorts what the arms picked: at most
    # :limit per type.
    picked = "seq, priority, available_at" if types > 1 else columns
    arm = (
        f"SELECT {picked} FROM tasks"
        f" WHERE {where} AND task_type = :type ORDER BY {order} LIMIT :limit"
    )
    return each_type(arm, types, f"SELECT {columns} FROM ({{arms}}) ORDER BY {order} LIMIT :limit")


@functools.lru_cache(maxsize=256)
def claim_sql(types: int, rest: bool) -> str:
    """Lease the tasks `due_sql` picks."""
    return f"""
        UPDATE tasks SET state = {LEASED}, attempt = attempt + 1,
            lease_token = ringo_token(), worker_id = :worker, lease_until = :until,
            updated_at = :now, leased_at = :now, leased_by = :worker
        WHERE seq IN ({due_sql(types, rest)})
        RETURNING {COLS}
    """


def move_counts(
    db: sqlite3.Connection, moved: Sequence[tuple[str, str]], old: int, new: int
) -> None:
    """Move `task_counts` for tasks that went from state `old` to `new`, one
    (queue, task type) pair per task: the transitions the trigger skips."""
    if not moved:
        return
    by_kind = collections.Counter(moved)
    db.executemany(COUNTS_DOWN, [(n, q, t, old) for (q, t), n in by_kind.items()])
    db.executemany(COUNTS_UP, [(q, t, new, n) for (q, t), n in by_kind.items()])


def leased_rows(rows: list[Any]) -> list[LeasedTask]:
    return [leased(r) for r in rows]


def priority_steps(
    db: sqlite3.Connection, args: dict[str, Any], types: int, pending: str
) -> Iterator[bool]:
    """Steps through the distinct priorities of queue `args["queue"]`'s
    `pending` tasks (of its `types` task types :t0, :t1, ... of
    `types_filter` when any), highest first, one index seek (per type) each,
    setting `args["prio"]` to each. After `PRIORITY_PROBES` of them the last
    step yields `rest=True`: it stands for its priority and every lower one
    (the others yield False). Stop iterating as soon as you have enough; the
    next seek runs only on demand."""
    prio = db.execute(priority_sql(types, False, pending), args).fetchone()[0]
    probes = 0
    while prio is not None:
        rest = probes == PRIORITY_PROBES
        args["prio"] = prio
        yield rest
        if rest:
            return
        probes += 1
        prio = db.execute(priority_sql(types, True, pending), args).fetchone()[0]


def soonest_pending(
    db: sqlite3.Connection,
    args: dict[str, Any],
    types: int = 0,
    *,
    soonest: int | None = None,
    enough: int | None = None,
    pending: str = PENDING_TERM,
) -> int | None:
    """The soonest `available_at` of queue `args["queue"]`'s `pending` tasks
    (of its `types` task types when any), or `soonest` when that is sooner:
    one seek (per type) per distinct priority, stopping once the answer is
    at or before `enough`."""
    for rest in priority_steps(db, args, types, pending):
        first = db.execute(soonest_sql(types, rest, pending), args).fetchone()[0]
        if first is not None and (soonest is None or first < soonest):
            soonest = first
        if enough is not None and soonest is not None and soonest <= enough:
            break
    return soonest
