"""Keyed limits on SQLite: the rules' storage, the limited claim and the
limited next wakeup (the plan is `storage.limits`'). Everything runs inside
the caller's transaction on the one connection: the write lock serializes
the claims, so a key's TAT and lease count cannot change under a claim."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ringo_trio._contract.limits import (
    MAX_LIMIT_KEYS_LISTED,
    MAX_LIMIT_KEYS_PER_CLAIM,
)

from ..base import refuse_rule_over
from ..limits import (
    Candidate,
    KeyState,
    Rule,
    RuleCache,
    RuleStatus,
    advance,
    grant,
    key_states,
    match,
    next_start,
    pick,
)
from ..rows import COLS, LEASED, PENDING, to_us
from .claim import due_sql, each_type, soonest_pending, take_in_steps
from .schema import LIMIT_LEASED, LIMIT_PENDING, UNKEYED_PENDING

RULES = "SELECT queue, prefix, rate, per_us, burst, concurrency FROM limit_rules"
# A key's own tasks: with one type SQLite's planner took
# `tasks_pending_type` for an untyped walk of a key, a walk of that type's
# tasks of every key, once per key. A claim of some types walks each of its
# types on its own (`tasks_limit_pending_type`, type before key): the keys
# with waiting tasks of its types, and each key's tasks of each type, so
# neither a key's backlog of other types nor a key holding only such a
# backlog is read.
KEY_TASKS = "tasks INDEXED BY tasks_limit_pending"
KEY_TYPE_TASKS = "tasks INDEXED BY tasks_limit_pending_type"
_KEY_PENDING = f"queue = :queue AND {LIMIT_PENDING}"


def _types_named(types: int) -> str:
    return " UNION ALL ".join(f"SELECT :t{i}" for i in range(types))


@functools.lru_cache(maxsize=256)
def keys_cte(types: int) -> str:
    """`keys(key)`: the distinct keys with waiting tasks (of the claim's
    `types` when any, then also `ty(type)`), the first
    `MAX_LIMIT_KEYS_PER_CLAIM` in key order: one seek each (per type)."""
    if not types:
        return f"""
            k(key) AS (
                SELECT (SELECT limit_key FROM tasks WHERE {_KEY_PENDING}
                        ORDER BY limit_key LIMIT 1)
                UNION ALL
                SELECT (SELECT limit_key FROM tasks WHERE {_KEY_PENDING}
                        AND limit_key > k.key ORDER BY limit_key LIMIT 1)
                FROM k WHERE k.key IS NOT NULL LIMIT {MAX_LIMIT_KEYS_PER_CLAIM}
            ), keys(key) AS (SELECT key FROM k WHERE key IS NOT NULL)
        """
    return f"""
        ty(type) AS ({_types_named(types)}), k(type, key, n) AS (
            SELECT type, (SELECT limit_key FROM {KEY_TYPE_TASKS}
                          WHERE {_KEY_PENDING} AND task_type = ty.type
                          ORDER BY limit_key LIMIT 1), 1
            FROM ty
            UNION ALL
            SELECT type, (SELECT limit_key FROM {KEY_TYPE_TASKS}
                          WHERE {_KEY_PENDING} AND task_type = k.type AND limit_key > k.key
                          ORDER BY limit_key LIMIT 1), n + 1
            FROM k WHERE k.key IS NOT NULL AND n < {MAX_LIMIT_KEYS_PER_CLAIM}
        ), keys(key) AS (
            SELECT DISTINCT key FROM k WHERE key IS NOT NULL
            ORDER BY key LIMIT {MAX_LIMIT_KEYS_PER_CLAIM}
        )
    """


@functools.lru_cache(maxsize=256)
def keys_sql(types: int) -> str:
    return f"WITH RECURSIVE {keys_cte(types)} SELECT key FROM keys"


@functools.lru_cache(maxsize=256)
def key_heads_sql(types: int) -> str:
    """(key, soonest waiting task at one of its priorities) of the keys
    `keys_sql` names, of the claim's `types` when any: one statement for
    every key, one seek per key (and type) and priority, never a walk of a
    key's backlog."""
    if not types:
        return f"""
            WITH RECURSIVE {keys_cte(0)}, kp(key, prio) AS (
                SELECT key, (SELECT max(priority) FROM {KEY_TASKS}
                             WHERE {_KEY_PENDING} AND limit_key = keys.key)
                FROM keys
                UNION ALL
                SELECT key, (SELECT max(priority) FROM {KEY_TASKS}
                             WHERE {_KEY_PENDING} AND limit_key = kp.key AND priority < kp.prio)
                FROM kp WHERE prio IS NOT NULL
            )
            SELECT key, (SELECT min(available_at) FROM {KEY_TASKS}
                         WHERE {_KEY_PENDING} AND limit_key = kp.key AND priority = kp.prio)
            FROM kp WHERE prio IS NOT NULL
        """
    of_type = f"{_KEY_PENDING} AND limit_key = kp.key AND task_type = kp.type"
    return f"""
        WITH RECURSIVE {keys_cte(types)}, kp(key, type, prio) AS (
            SELECT keys.key, ty.type, (SELECT max(priority) FROM {KEY_TYPE_TASKS}
                WHERE {_KEY_PENDING} AND limit_key = keys.key AND task_type = ty.type)
            FROM keys, ty
            UNION ALL
            SELECT key, type, (SELECT max(priority) FROM {KEY_TYPE_TASKS}
                               WHERE {of_type} AND priority < kp.prio)
            FROM kp WHERE prio IS NOT NULL
        )
        SELECT key, (SELECT min(available_at) FROM {KEY_TYPE_TASKS}
                     WHERE {of_type} AND priority = kp.prio)
        FROM kp WHERE prio IS NOT NULL
    """


# Every keyed lease of the queue, counted per key: one statement for all
# the keys of a claim (as many rows as the queue's workers hold leases),
# not one per key (1,000 keys: 10 ms a claim in statements alone).
LEASED_BY_KEY = (
    f"SELECT limit_key, count(*) FROM tasks WHERE queue = :queue AND {LIMIT_LEASED}"
    " GROUP BY limit_key"
)
TAT_OF = "SELECT tat_us FROM limit_keys WHERE queue = :queue AND key = :key"


def tat_of(db: sqlite3.Connection, rule: Rule, queue: str, key: str) -> int | None:
    """The key's TAT; None when it has none, or its rule no rate (the TAT
    is not read then)."""
    if not rule.interval_us:
        return None
    row = db.execute(TAT_OF, {"queue": queue, "key": key}).fetchone()
    return None if row is None else int(row[0])


SET_TAT = (
    "INSERT INTO limit_keys (queue, key, tat_us) VALUES (:queue, :key, :tat)"
    " ON CONFLICT DO UPDATE SET tat_us = excluded.tat_us"
)


@functools.lru_cache(maxsize=256)
def heads_sql(types: int) -> str:
    """A key's first :n due tasks (of the claim's `types` when any: each
    type's by its own walk, then the first :n of those), in claim order."""
    where = f"{_KEY_PENDING} AND limit_key = :key AND available_at <= :now"
    order = "priority DESC, available_at, seq"
    if not types:
        return (
            f"SELECT seq, priority, available_at FROM {KEY_TASKS}"
            f" WHERE {where} ORDER BY {order} LIMIT :n"
        )
    arm = (
        f"SELECT seq, priority, available_at FROM {KEY_TYPE_TASKS}"
        f" WHERE {where} AND task_type = :type ORDER BY {order} LIMIT :n"
    )
    return each_type(arm, types, f"SELECT * FROM ({{arms}}) ORDER BY {order} LIMIT :n")


def unkeyed_heads(
    db: sqlite3.Connection, types: int, args: dict[str, Any], limit: int
) -> list[Candidate]:
    """The first `limit` due tasks without a key (of the claim's `types`
    when any), in claim order: priority by priority on
    `tasks_pending_unkeyed`, or each type on its own on
    `tasks_pending_unkeyed_type`, so neither the keys' tasks, nor tasks of
    other types, nor tasks scheduled far ahead are read."""
    step_sql = functools.partial(
        due_sql, types, pending=UNKEYED_PENDING, columns="seq, priority, available_at"
    )
    rows = take_in_steps(db, dict(args), limit, step_sql, types, UNKEYED_PENDING)
    return [Candidate(seq, prio, avail, "") for seq, prio, avail in rows]


def claim(
    db: sqlite3.Connection,
    rules: Sequence[Rule],
    types: int,
    args: dict[str, Any],
    limit: int,
) -> list[Any]:
    """Lease up to `limit` due tasks within their keys' rules (the caller
    has expired the queue's overdue leases); the leased rows (`COLS`)."""
    now_us = args["now"]
    queue = args["queue"]
    found = unkeyed_heads(db, types, args, limit)
    limited: dict[str, tuple[Rule, int | None]] = {}
    keys = [k for (k,) in db.execute(keys_sql(types), args)]
    leased = dict(db.execute(LEASED_BY_KEY, {"queue": queue})) if keys else {}
    for key in keys:
        rule = match(rules, key)
        n = limit
        tat = None
        if rule is not None:
            tat = tat_of(db, rule, queue, key)
            n = grant(rule, tat or 0, leased.get(key, 0), now_us, limit)
            limited[key] = (rule, tat)
        if n:
            found += (
                Candidate(seq, prio, avail, key)
                for seq, prio, avail in db.execute(heads_sql(types), {**args, "key": key, "n": n})
            )
    chosen = pick(found, limit)
    if not chosen:
        return []
    started: dict[str, int] = {}
    for c in chosen:
        if c.key in limited:
            started[c.key] = started.get(c.key, 0) + 1
    for key, count in started.items():
        rule, tat = limited[key]
        if rule.interval_us:
            db.execute(
                SET_TAT,
                {"queue": queue, "key": key, "tat": advance(rule, tat or 0, now_us, count)},
            )
    marks = ", ".join("?" * len(chosen))
    return db.execute(
        f"UPDATE tasks SET state = {LEASED}, attempt = attempt + 1,"
        " lease_token = ringo_token(), worker_id = ?1, lease_until = ?2, updated_at = ?3,"
        " leased_at = ?3, leased_by = ?1"
        f" WHERE seq IN ({marks}) RETURNING {COLS}",
        (args["worker"], args["until"], now_us, *(c.seq for c in chosen)),
    ).fetchall()


def next_wakeup(
    db: sqlite3.Connection,
    rules: Sequence[Rule],
    types: int,
    types_clause: str,
    args: dict[str, Any],
) -> int | None:
    """The soonest moment (µs) a waiting task of the queue may start within
    its key's rule, or a lease of it ends; inside the caller's read
    transaction."""
    now_us = args["now"]
    queue = args["queue"]
    moments: list[int] = []
    soonest_lease = db.execute(
        f"SELECT min(lease_until) FROM tasks WHERE queue = :queue AND state = {LEASED}"
        f"{types_clause}",
        args,
    ).fetchone()[0]
    if soonest_lease is not None:
        moments.append(soonest_lease)
    unkeyed = soonest_pending(db, dict(args), types, enough=now_us, pending=UNKEYED_PENDING)
    if unkeyed is not None:
        moments.append(unkeyed)
    heads: dict[str, int] = {}
    for key, first in db.execute(key_heads_sql(types), args):
        if first is not None and (key not in heads or first < heads[key]):
            heads[key] = first
    leased = dict(db.execute(LEASED_BY_KEY, {"queue": queue})) if heads else {}
    for key, head in heads.items():
        rule = match(rules, key)
        if rule is not None:
            start = next_start(rule, tat_of(db, rule, queue, key), leased.get(key, 0), now_us)
            if start is not None:
                head = max(head, start)
        moments.append(head)
        if head <= now_us:
            break
    return min(moments) if moments else None


def statuses(
    db: sqlite3.Connection,
    by_queue: dict[str, tuple[Rule, ...]],
    now_us: int,
    with_keys: bool,
) -> list[RuleStatus]:
    out: list[RuleStatus] = []
    for queue in sorted(by_queue):
        rules = by_queue[queue]
        states: dict[str, list[KeyState]] = {}
        if with_keys:
            rows = db.execute(
                f"""
                SELECT t.limit_key, sum(t.state = {PENDING} AND t.available_at <= :now),
                    sum(t.state = {LEASED}), k.tat_us
                FROM tasks t LEFT JOIN limit_keys k ON k.queue = t.queue AND k.key = t.limit_key
                WHERE t.queue = :queue AND t.state IN ({PENDING}, {LEASED}) AND t.limit_key != ''
                GROUP BY t.limit_key
                """,
                {"queue": queue, "now": now_us},
            ).fetchall()
            states = key_states(rules, rows, now_us, MAX_LIMIT_KEYS_LISTED)
        for rule in sorted(rules, key=lambda r: r.prefix):
            out.append(RuleStatus(queue, rule, tuple(states.get(rule.prefix, ()))))
    return out


class SQLiteLimits:
    """`Storage`'s keyed-limit methods for `SQLiteEngine` (which provides
    the rest), and the rules cache its claims read (`limit_rules`)."""

    _rules: RuleCache

    def _conn(self) -> sqlite3.Connection:
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def limit_rules(self, queue: str, now_us: int) -> tuple[Rule, ...]:
        if self._rules.stale(now_us):
            self._rules.load(self._conn().execute(RULES).fetchall(), now_us)
        return self._rules.get(queue)

    def limited(self, queue: str) -> bool:
        return bool(self._rules.get(queue))

    async def set_limit(self, queue: str, rule: Rule, now: datetime) -> bool:
        with self._write() as db:
            exists = db.execute(
                "SELECT 1 FROM limit_rules WHERE queue = ? AND prefix = ?", (queue, rule.prefix)
            ).fetchone()
            if exists is None:
                held = db.execute(
                    "SELECT count(*) FROM limit_rules WHERE queue = ?", (queue,)
                ).fetchone()[0]
                refuse_rule_over(queue, held)
            db.execute(
                "INSERT INTO limit_rules (queue, prefix, rate, per_us, burst, concurrency)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET rate = excluded.rate,"
                " per_us = excluded.per_us, burst = excluded.burst,"
                " concurrency = excluded.concurrency",
                (queue, rule.prefix, rule.rate, rule.per_us, rule.burst, rule.concurrency),
            )
        self._rules.invalidate()
        return exists is None

    async def delete_limit(self, queue: str, prefix: str, now: datetime) -> bool:
        with self._write() as db:
            deleted = db.execute(
                "DELETE FROM limit_rules WHERE queue = ? AND prefix = ?", (queue, prefix)
            ).rowcount
            if not db.execute("SELECT 1 FROM limit_rules WHERE queue = ?", (queue,)).fetchone():
                # No rule left: the keys' rate states mean nothing any more.
                db.execute("DELETE FROM limit_keys WHERE queue = ?", (queue,))
        self._rules.invalidate()
        return bool(deleted)

    async def list_limits(
        self, queue: str | None, now: datetime, *, with_keys: bool
    ) -> list[RuleStatus]:
        now_us = to_us(now)
        self._rules.load(self._conn().execute(RULES).fetchall(), now_us)
        by_queue = self._rules.listed(queue)
        return statuses(self._conn(), by_queue, now_us, with_keys)
