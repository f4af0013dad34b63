"""Keyed limits on SQLite: the rules' storage, the limited claim and the
limited next wakeup (the plan is `storage.limits`'). Everything runs inside
the caller's transaction on the one connection: the write lock serializes
the claims, so a key's TAT and lease count cannot change under a claim."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ringo_trio._contract.limits import MAX_LIMIT_KEYS_LISTED, MAX_LIMIT_KEYS_PER_CLAIM

from ..limits import (
    Candidate,
    KeyState,
    Rule,
    RuleStatus,
    advance,
    grant,
    key_states,
    match,
    next_start,
    pick,
)
from ..rows import COLS, LEASED, PENDING
from .schema import LIMIT_LEASED, LIMIT_PENDING

RULES = "SELECT queue, prefix, rate, per_us, burst, concurrency FROM limit_rules"
# The distinct keys with waiting tasks, one seek of tasks_limit_pending each.
KEYS = f"""
    WITH RECURSIVE k(key) AS (
        SELECT (SELECT limit_key FROM tasks WHERE queue = :queue AND {LIMIT_PENDING}
                ORDER BY limit_key LIMIT 1)
        UNION ALL
        SELECT (SELECT limit_key FROM tasks WHERE queue = :queue AND {LIMIT_PENDING}
                AND limit_key > k.key ORDER BY limit_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL LIMIT {MAX_LIMIT_KEYS_PER_CLAIM + 1}
    )
    SELECT key FROM k WHERE key IS NOT NULL
"""
LEASED_OF = (
    f"SELECT count(*) FROM tasks WHERE queue = :queue AND limit_key = :key AND {LIMIT_LEASED}"
)
TAT_OF = "SELECT tat_us FROM limit_keys WHERE queue = :queue AND key = :key"
SET_TAT = (
    "INSERT INTO limit_keys (queue, key, tat_us) VALUES (:queue, :key, :tat)"
    " ON CONFLICT DO UPDATE SET tat_us = excluded.tat_us"
)


def heads_sql(types_clause: str) -> str:
    return f"""
        SELECT seq, priority, available_at FROM tasks
        WHERE queue = :queue AND limit_key = :key AND {LIMIT_PENDING}
            AND available_at <= :now{types_clause}
        ORDER BY priority DESC, available_at, seq LIMIT :n
    """


def unkeyed_sql(types_clause: str) -> str:
    return f"""
        SELECT seq, priority, available_at FROM tasks
        WHERE queue = :queue AND state = {PENDING} AND limit_key = ''
            AND available_at <= :now{types_clause}
        ORDER BY priority DESC, available_at, seq LIMIT :n
    """


def claim(
    db: sqlite3.Connection,
    rules: Sequence[Rule],
    types_clause: str,
    args: dict[str, Any],
    limit: int,
) -> list[Any]:
    """Lease up to `limit` due tasks within their keys' rules (the caller
    has expired the queue's overdue leases); the leased rows (`COLS`)."""
    now_us = args["now"]
    queue = args["queue"]
    found: list[Candidate] = [
        Candidate(seq, prio, avail, "")
        for seq, prio, avail in db.execute(unkeyed_sql(types_clause), {**args, "n": limit})
    ]
    limited: dict[str, tuple[Rule, int | None]] = {}
    keys = [k for (k,) in db.execute(KEYS, {"queue": queue})][:MAX_LIMIT_KEYS_PER_CLAIM]
    for key in keys:
        rule = match(rules, key)
        n = limit
        tat = None
        if rule is not None:
            at = {"queue": queue, "key": key}
            row = db.execute(TAT_OF, at).fetchone()
            tat = None if row is None else row[0]
            leased = db.execute(LEASED_OF, at).fetchone()[0]
            n = grant(rule, tat or 0, leased, now_us, limit)
            limited[key] = (rule, tat)
        if n:
            found += (
                Candidate(seq, prio, avail, key)
                for seq, prio, avail in db.execute(
                    heads_sql(types_clause), {**args, "key": key, "n": n}
                )
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
    db: sqlite3.Connection, rules: Sequence[Rule], types_clause: str, args: dict[str, Any]
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
    unkeyed = db.execute(
        f"SELECT min(available_at) FROM tasks WHERE queue = :queue AND state = {PENDING}"
        f" AND limit_key = ''{types_clause}",
        args,
    ).fetchone()[0]
    if unkeyed is not None:
        moments.append(unkeyed)
    for (key,) in db.execute(KEYS, {"queue": queue}).fetchall()[:MAX_LIMIT_KEYS_PER_CLAIM]:
        at = {**args, "key": key}
        head = db.execute(
            f"SELECT min(available_at) FROM tasks WHERE queue = :queue AND limit_key = :key"
            f" AND {LIMIT_PENDING}{types_clause}",
            at,
        ).fetchone()[0]
        if head is None:
            continue
        rule = match(rules, key)
        if rule is not None:
            row = db.execute(TAT_OF, at).fetchone()
            leased = db.execute(LEASED_OF, at).fetchone()[0]
            start = next_start(rule, None if row is None else row[0], leased, now_us)
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
