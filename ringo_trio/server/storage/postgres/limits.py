"""Keyed limits on PostgreSQL: the rules' storage, the limited claim and the
limited next wakeup (the plan is `storage.limits`').

Concurrency (READ COMMITTED): a limited claim runs in one transaction. It
first reads every limited key's TAT and leases without locks, and leaves
alone the keys their rules hold (a key it skips on a stale read is one whose
lease ended meanwhile: that settlement wakes the claimers). It locks the
`limit_keys` row of every other key (created when missing; in key order, so
two claims never deadlock) BEFORE it reads the key's TAT and counts the
key's leases again, each in a statement of its own, so it sees every lease
another daemon's claim of that key committed: the claims of one key are
serialized across daemons while it holds that lock, and the rate and the
concurrency hold globally. Heads are picked FOR UPDATE SKIP
LOCKED as in the plain claim. Settling, expiry, cancel and release need no
change: they end leases, which the next claim counts.

Walks: the tasks without a key by their own index (`tasks_pending_unkeyed`,
schema 16) and each key's by `tasks_limit_pending`, each priority by
priority, so neither a key's backlog held by its rule nor tasks scheduled
far ahead are read by a claim or a wake-up of the queue.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]

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
from .schema import (
    LIMIT_LEASED,
    LIMIT_PENDING,
    LIMIT_PENDING_BY_TYPE,
    UNKEYED_BY_TYPE,
    UNKEYED_PENDING,
    ident,
)
from .settle import expire
from .sql import Spelling, types_filter


class LimitSql:
    def __init__(self, s: Spelling) -> None:
        t = s.tasks
        sc = ident(s.schema)
        self.rules = f"SELECT queue, prefix, rate, per_us, burst, concurrency FROM {sc}.limit_rules"
        self.rule_count = f"SELECT count(*) FROM {sc}.limit_rules WHERE queue = $1"
        self.rule_exists = f"SELECT 1 FROM {sc}.limit_rules WHERE queue = $1 AND prefix = $2"
        self.upsert = f"""
            INSERT INTO {sc}.limit_rules (queue, prefix, rate, per_us, burst, concurrency)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (queue, prefix) DO UPDATE SET rate = excluded.rate,
                per_us = excluded.per_us, burst = excluded.burst,
                concurrency = excluded.concurrency
        """
        self.delete = f"DELETE FROM {sc}.limit_rules WHERE queue = $1 AND prefix = $2"
        self.drop_keys = f"""
            DELETE FROM {sc}.limit_keys WHERE queue = $1
                AND NOT EXISTS (SELECT 1 FROM {sc}.limit_rules WHERE queue = $1)
        """
        # Serialize the rule's (queue) writers, so the count of rules holds.
        self.lock_queue = "SELECT pg_advisory_xact_lock(hashtextextended($1, 27))"
        self.expire = f"""
            WITH expired AS ({expire(s, "$2", " AND queue = $1")})
            SELECT count(*), {s.notify_pending("expired")}, count(waited) FROM expired
        """
        self.keys = f"""
            WITH RECURSIVE k(key) AS (
                (SELECT limit_key FROM {t} WHERE queue = $1 AND {LIMIT_PENDING}
                 ORDER BY limit_key LIMIT 1)
                UNION ALL
                SELECT (SELECT limit_key FROM {t} WHERE queue = $1 AND {LIMIT_PENDING}
                        AND limit_key > k.key ORDER BY limit_key LIMIT 1)
                FROM k WHERE k.key IS NOT NULL
            )
            SELECT key FROM k WHERE key IS NOT NULL LIMIT {MAX_LIMIT_KEYS_PER_CLAIM}
        """
        # The same among the keys with waiting tasks of the types $2: each
        # type's keys in key order on `tasks_limit_pending_type` (type
        # before key: one seek per key), at most the cap of each, then the
        # first of those, so keys holding only other types' tasks never
        # crowd a claim's own out.
        self.keys_typed = f"""
            WITH RECURSIVE claimed_types(t) AS (SELECT DISTINCT unnest($2::text[])),
            k(t, key, n) AS (
                SELECT ct.t, (SELECT limit_key FROM {t} WHERE queue = $1 AND {LIMIT_PENDING_BY_TYPE}
                              AND task_type = ct.t ORDER BY limit_key LIMIT 1), 1
                FROM claimed_types ct
                UNION ALL
                SELECT k.t, (SELECT limit_key FROM {t} WHERE queue = $1 AND {LIMIT_PENDING_BY_TYPE}
                             AND task_type = k.t AND limit_key > k.key
                             ORDER BY limit_key LIMIT 1), k.n + 1
                FROM k WHERE k.key IS NOT NULL AND k.n < {MAX_LIMIT_KEYS_PER_CLAIM}
            )
            SELECT DISTINCT key FROM k WHERE key IS NOT NULL
            ORDER BY key LIMIT {MAX_LIMIT_KEYS_PER_CLAIM}
        """
        self.ensure_keys = f"""
            INSERT INTO {sc}.limit_keys (queue, key, tat_us)
            SELECT $1, unnest($2::text[]), 0 ON CONFLICT DO NOTHING
        """
        # The keys' rows, one index seek per key, whatever the statistics:
        # `key = ANY($2)` (or a join the planner may turn around) compared
        # every row of the queue with every key of the array (1,000 keys:
        # 9 ms on every claim and wake-up). The locks are taken in key
        # order, one lookup each inside the LATERAL (which the planner
        # cannot flatten), so two claims never deadlock.
        self.lock_keys = f"""
            SELECT l.key, l.tat_us
            FROM (SELECT key FROM unnest($2::text[]) AS u(key) ORDER BY key) k
            CROSS JOIN LATERAL (
                SELECT key, tat_us FROM {sc}.limit_keys WHERE queue = $1 AND key = k.key
                FOR UPDATE) l
        """
        self.read_keys = f"""
            SELECT k.key, (SELECT tat_us FROM {sc}.limit_keys WHERE queue = $1 AND key = k.key)
            FROM unnest($2::text[]) AS k(key)
        """
        # Every keyed lease of the queue, counted per key: as many rows as
        # the queue's workers hold leases, by either index the plan takes
        # (a filter on the keys asked compared each lease with each key:
        # 1,000 keys with 2 leases each, 17 ms).
        self.leased = f"""
            SELECT limit_key, count(*) FROM {t} WHERE queue = $1 AND {LIMIT_LEASED}
            GROUP BY limit_key
        """
        # Each key's first n due tasks (`heads_typed`: of the types $5,
        # each type among the key's tasks on its own, on
        # `tasks_limit_pending_type`, then the first n of those), so a
        # key's backlog of other types is not read.
        key_due = f"queue = $1 AND limit_key = k.key AND {LIMIT_PENDING} AND available_at <= $4"
        key_due_typed = key_due.replace(LIMIT_PENDING, LIMIT_PENDING_BY_TYPE)
        claim_order = "priority DESC, available_at, seq"
        self.heads = f"""
            SELECT c.seq, c.priority, c.available_at, k.key
            FROM unnest($2::text[], $3::bigint[]) AS k(key, n) CROSS JOIN LATERAL (
                SELECT seq, priority, available_at FROM {t} WHERE {key_due}
                ORDER BY {claim_order} LIMIT k.n
                FOR UPDATE SKIP LOCKED) c
        """
        self.heads_typed = f"""
            WITH claimed_types(t) AS (SELECT DISTINCT unnest($5::text[]))
            SELECT c.seq, c.priority, c.available_at, k.key
            FROM unnest($2::text[], $3::bigint[]) AS k(key, n) CROSS JOIN LATERAL (
                SELECT d.seq, d.priority, d.available_at
                FROM claimed_types CROSS JOIN LATERAL (
                    SELECT seq, priority, available_at FROM {t}
                    WHERE {key_due_typed} AND task_type = claimed_types.t
                    ORDER BY {claim_order} LIMIT k.n
                    FOR UPDATE SKIP LOCKED) d
                ORDER BY d.priority DESC, d.available_at, d.seq LIMIT k.n) c
        """
        # The tasks without a key, priority by priority on
        # `tasks_pending_unkeyed` (`unkeyed_typed`, of the types $4: each
        # type on its own on `tasks_pending_unkeyed_type`, the first $3 of
        # each, then the first $3 of those): neither the keys' tasks, nor
        # tasks of other types, nor tasks scheduled far ahead are read.
        due = f"queue = $1 AND priority = prios.p AND {UNKEYED_PENDING} AND available_at <= $2"
        due_typed = due.replace(UNKEYED_PENDING, UNKEYED_BY_TYPE)
        self.unkeyed = f"""
            WITH RECURSIVE {s.prios_of(UNKEYED_PENDING)}
            SELECT c.seq, prios.p, c.available_at FROM prios CROSS JOIN LATERAL (
                SELECT seq, available_at FROM {t} WHERE {due}
                ORDER BY available_at, seq LIMIT $3
                FOR UPDATE SKIP LOCKED) c
            LIMIT $3
        """
        self.unkeyed_typed = f"""
            WITH RECURSIVE {s.typed_prios(4, UNKEYED_BY_TYPE)}
            SELECT c.seq, prios.p, c.available_at FROM prios CROSS JOIN LATERAL (
                SELECT d.seq, d.available_at FROM claimed_types CROSS JOIN LATERAL (
                    SELECT seq, available_at FROM {t}
                    WHERE {due_typed} AND task_type = claimed_types.t
                    ORDER BY available_at, seq LIMIT $3
                    FOR UPDATE SKIP LOCKED) d
                ORDER BY d.available_at, d.seq LIMIT $3) c
            LIMIT $3
        """
        self.lease = f"""
            UPDATE {t} k SET state = {LEASED}, attempt = k.attempt + 1,
                lease_token = u.token, worker_id = $3, lease_until = $4, updated_at = $5,
                leased_at = $5, leased_by = $3
            FROM unnest($1::bigint[], $2::text[]) AS u(seq, token)
            WHERE k.seq = u.seq
            RETURNING {", ".join("k." + c.strip() for c in COLS.split(","))}
        """
        self.set_tats = f"""
            UPDATE {sc}.limit_keys l SET tat_us = u.tat
            FROM unnest($2::text[], $3::bigint[]) AS u(key, tat)
            WHERE l.queue = $1 AND l.key = u.key
        """
        self.soonest_lease = f"""
            SELECT min(lease_until) FROM {t} WHERE queue = $1 AND state = {LEASED}
                {types_filter(2)}
        """
        self.unkeyed_head = f"""
            WITH RECURSIVE {s.prios_of(UNKEYED_PENDING)}
            SELECT min(f.available_at) FROM prios CROSS JOIN LATERAL (
                SELECT available_at FROM {t}
                WHERE queue = $1 AND priority = prios.p AND {UNKEYED_PENDING}
                ORDER BY available_at LIMIT 1) f
        """
        self.unkeyed_head_typed = f"""
            WITH RECURSIVE {s.typed_prios(2, UNKEYED_BY_TYPE)}
            SELECT min(f.available_at) FROM prios CROSS JOIN LATERAL (
                SELECT available_at FROM claimed_types CROSS JOIN LATERAL (
                    SELECT available_at FROM {t}
                    WHERE queue = $1 AND priority = prios.p AND {UNKEYED_BY_TYPE}
                        AND task_type = claimed_types.t
                    ORDER BY available_at LIMIT 1) d) f
        """

        # Each key's soonest waiting task, priority by priority (one seek
        # of `tasks_limit_pending` per key and priority; `key_heads_typed`:
        # of `tasks_limit_pending_type` per key, type of $3 and priority): a
        # key's backlog is not read whole, nor its tasks of other types.
        def key_heads(typed: bool) -> str:
            of_type = " AND task_type = kp.t" if typed else ""
            pending = LIMIT_PENDING_BY_TYPE if typed else LIMIT_PENDING
            start = (
                "SELECT k.key, ty.t FROM unnest($2::text[]) AS k(key)"
                " CROSS JOIN (SELECT DISTINCT unnest($3::text[])) AS ty(t)"
                if typed
                else "SELECT key, NULL::text FROM unnest($2::text[]) AS k(key)"
            )

            def key_prio(below: str) -> str:
                return f"""(SELECT priority FROM {t} WHERE queue = $1 AND limit_key = kp.key
                    AND {pending}{of_type}{below} ORDER BY priority DESC LIMIT 1)"""

            return f"""
                WITH RECURSIVE kp(key, t, p) AS (
                    SELECT kp.key, kp.t, {key_prio("")} FROM ({start}) AS kp(key, t)
                    UNION ALL
                    SELECT kp.key, kp.t, {key_prio(" AND priority < kp.p")} FROM kp
                    WHERE kp.p IS NOT NULL
                )
                SELECT kp.key, min(f.available_at) FROM kp CROSS JOIN LATERAL (
                    SELECT available_at FROM {t}
                    WHERE queue = $1 AND limit_key = kp.key AND {pending}
                        AND priority = kp.p{of_type}
                    ORDER BY available_at LIMIT 1) f
                GROUP BY kp.key
            """

        self.key_heads = key_heads(typed=False)
        self.key_heads_typed = key_heads(typed=True)
        self.key_rows = f"""
            SELECT t.limit_key,
                count(*) FILTER (WHERE t.state = {PENDING} AND t.available_at <= $2),
                count(*) FILTER (WHERE t.state = {LEASED}), max(k.tat_us)
            FROM (SELECT limit_key, state, available_at FROM {t}
                    WHERE queue = $1 AND {LIMIT_PENDING}
                UNION ALL SELECT limit_key, state, available_at FROM {t}
                    WHERE queue = $1 AND {LIMIT_LEASED}) t
            LEFT JOIN {sc}.limit_keys k ON k.queue = $1 AND k.key = t.limit_key
            GROUP BY t.limit_key
        """


def _by_types(plain: str, typed: str, types: list[str] | None, *args: Any) -> tuple[Any, ...]:
    """A walk's statement and arguments: `typed`, the claim's types its last
    parameter, when the claim names types; `plain` otherwise."""
    return (plain, *args) if types is None else (typed, *args, types)


async def _keys(
    conn: asyncpg.Connection, sql: LimitSql, queue: str, types: list[str] | None
) -> list[str]:
    """The keys a claim (of `types`) looks at."""
    return [r[0] for r in await conn.fetch(*_by_types(sql.keys, sql.keys_typed, types, queue))]


async def claim(
    conn: asyncpg.Connection,
    sql: LimitSql,
    rules: Sequence[Rule],
    queue: str,
    types: list[str] | None,
    limit: int,
    worker_id: str,
    now_us: int,
    until: int,
    tokens: list[str],
) -> tuple[list[Any], int]:
    """(leased rows, leases expired) of one limited claim, in one
    transaction; a claim that expired leases leases nothing (the caller
    claims again, as the plain claim does)."""
    async with conn.transaction():
        expired = await conn.fetchval(sql.expire, queue, now_us)
        if expired:
            return [], int(expired)
        keys = await _keys(conn, sql, queue, types)
        rule_of = {k: rule for k in keys if (rule := match(rules, k)) is not None}
        tats: dict[str, int] = {}
        leased: dict[str, int] = {}
        if rule_of:
            # A first look without locks: a key its rule holds is left
            # alone, its state row neither created nor locked (1,000 held
            # keys: a row lock written per key on every claim). What another
            # claim commits meanwhile only holds a key more; a lease ended
            # meanwhile frees a slot this claim misses, as one ended just
            # after it would, and its settlement wakes the claimers.
            seen = dict(await conn.fetch(sql.read_keys, queue, list(rule_of)))
            seen_leased = dict(await conn.fetch(sql.leased, queue))
            may_start = sorted(
                k
                for k, rule in rule_of.items()
                if grant(rule, seen.get(k) or 0, seen_leased.get(k, 0), now_us, limit)
            )
            if may_start:
                await conn.execute(sql.ensure_keys, queue, may_start)
                tats = dict(await conn.fetch(sql.lock_keys, queue, may_start))
                # After the locks: a statement of its own sees the leases
                # every other claim of these keys committed.
                leased = dict(await conn.fetch(sql.leased, queue))
        unkeyed = _by_types(sql.unkeyed, sql.unkeyed_typed, types, queue, now_us, limit)
        found = [Candidate(r[0], r[1], r[2], "") for r in await conn.fetch(*unkeyed)]
        grants: list[int] = []
        for key in keys:
            rule = rule_of.get(key)
            if rule is None:
                grants.append(limit)
            elif key in tats:
                grants.append(grant(rule, tats[key], leased.get(key, 0), now_us, limit))
            else:
                grants.append(0)  # held at the first look: not locked, not started
        asked = [(k, n) for k, n in zip(keys, grants, strict=True) if n]
        if asked:
            heads = (queue, [k for k, _ in asked], [n for _, n in asked], now_us)
            rows = await conn.fetch(*_by_types(sql.heads, sql.heads_typed, types, *heads))
            found += (Candidate(r[0], r[1], r[2], r[3]) for r in rows)
        chosen = pick(found, limit)
        if not chosen:
            return [], 0
        started: dict[str, int] = {}
        for c in chosen:
            if c.key in tats:
                started[c.key] = started.get(c.key, 0) + 1
        moved = []
        for key, count in started.items():
            rule = rule_of[key]
            if rule.interval_us:
                moved.append((key, advance(rule, tats[key], now_us, count)))
        if moved:
            await conn.execute(
                sql.set_tats, queue, [k for k, _ in moved], [tat for _, tat in moved]
            )
        rows = await conn.fetch(
            sql.lease,
            [c.seq for c in chosen],
            tokens[: len(chosen)],
            worker_id,
            until,
            now_us,
        )
        return rows, 0


async def next_wakeup(
    conn: asyncpg.Connection,
    sql: LimitSql,
    rules: Sequence[Rule],
    queue: str,
    types: list[str] | None,
    now_us: int,
) -> int | None:
    moments: list[int] = []
    async with conn.transaction(readonly=True, isolation="repeatable_read"):
        soonest_lease = await conn.fetchval(sql.soonest_lease, queue, types)
        unkeyed = await conn.fetchval(
            *_by_types(sql.unkeyed_head, sql.unkeyed_head_typed, types, queue)
        )
        moments += (m for m in (soonest_lease, unkeyed) if m is not None)
        keys = await _keys(conn, sql, queue, types)
        if keys:
            tats = dict(await conn.fetch(sql.read_keys, queue, keys))
            leased = dict(await conn.fetch(sql.leased, queue))
            heads = _by_types(sql.key_heads, sql.key_heads_typed, types, queue, keys)
            for key, head in await conn.fetch(*heads):
                if head is None:
                    continue
                rule = match(rules, key)
                if rule is not None:
                    start = next_start(rule, tats.get(key), leased.get(key, 0), now_us)
                    if start is not None:
                        head = max(head, start)
                moments.append(head)
    return min(moments) if moments else None


async def statuses(
    conn: asyncpg.Connection,
    sql: LimitSql,
    by_queue: dict[str, tuple[Rule, ...]],
    now_us: int,
    with_keys: bool,
) -> list[RuleStatus]:
    out: list[RuleStatus] = []
    for queue in sorted(by_queue):
        rules = by_queue[queue]
        states: dict[str, list[KeyState]] = {}
        if with_keys:
            rows = await conn.fetch(sql.key_rows, queue, now_us)
            states = key_states(rules, [tuple(r) for r in rows], now_us, MAX_LIMIT_KEYS_LISTED)
        for rule in sorted(rules, key=lambda r: r.prefix):
            out.append(RuleStatus(queue, rule, tuple(states.get(rule.prefix, ()))))
    return out


class PostgresLimits:
    """`Storage`'s keyed-limit methods for `PostgresEngine` (which provides
    the rest), and the rules cache its claims read (`limit_rules`): a
    change is told to every daemon of the schema on `limits_channel`."""

    _rules: RuleCache
    _sql: Any
    limits_channel: str

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        raise NotImplementedError

    async def _fetch(self, sql: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def limit_rules(self, queue: str, now_us: int) -> tuple[Rule, ...]:
        if self._rules.stale(now_us):
            self._rules.load(await self._fetch(self._sql.limits.rules), now_us)
        return self._rules.get(queue)

    def limited(self, queue: str) -> bool:
        return bool(self._rules.get(queue))

    async def _tell_rules(self, conn: asyncpg.Connection, queue: str) -> None:
        await conn.execute("SELECT pg_notify($1, $2)", self.limits_channel, queue)

    async def set_limit(self, queue: str, rule: Rule, now: datetime) -> bool:
        sql = self._sql.limits
        async with self._conn() as conn, conn.transaction():
            await conn.execute(sql.lock_queue, queue)
            exists = await conn.fetchval(sql.rule_exists, queue, rule.prefix)
            if exists is None:
                refuse_rule_over(queue, await conn.fetchval(sql.rule_count, queue))
            await conn.execute(
                sql.upsert,
                queue,
                rule.prefix,
                rule.rate,
                rule.per_us,
                rule.burst,
                rule.concurrency,
            )
            await self._tell_rules(conn, queue)
        self._rules.invalidate()
        return exists is None

    async def delete_limit(self, queue: str, prefix: str, now: datetime) -> bool:
        sql = self._sql.limits
        async with self._conn() as conn, conn.transaction():
            await conn.execute(sql.lock_queue, queue)
            deleted = await conn.execute(sql.delete, queue, prefix)
            await conn.execute(sql.drop_keys, queue)
            await self._tell_rules(conn, queue)
        self._rules.invalidate()
        return bool(deleted != "DELETE 0")

    async def list_limits(
        self, queue: str | None, now: datetime, *, with_keys: bool
    ) -> list[RuleStatus]:
        now_us = to_us(now)
        self._rules.load(await self._fetch(self._sql.limits.rules), now_us)
        by_queue = self._rules.listed(queue)
        async with self._conn() as conn:
            return await statuses(conn, self._sql.limits, by_queue, now_us, with_keys)
