"""What only the PostgreSQL engine has: several engines (daemons) on one database at
once, versioned migrations, LISTEN/NOTIFY wake-ups and connection loss.

Every test talks to the real server (tests/_kit/postgres.py). Several engines on one
database stand for several daemons on several machines: each has its own pool and
sessions, exactly as separate processes would.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import random
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from ringo_trio._proto.ringo.v1 import LeasedTask, RetryBackoff, TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import SchemaTooNew, StorageUnavailable
from ringo_trio.server.storage.limits import Rule
from ringo_trio.server.storage.postgres import SCHEMA_VERSION, PostgresEngine, listen
from ringo_trio.server.storage.postgres import schema as pg
from ringo_trio.server.storage.rows import to_us
from tests._kit.postgres import ADMIN_DSN
from tests._kit.storage import (
    LEASE,
    Notes,
    assert_within_rate,
    engines,
    ref_of,
    run,
    spec,
    watching,
)


@pytest.fixture
def dsn(storage_database: str) -> str:
    """The session's storage database; each test works in its own schema (below)."""
    return storage_database


@pytest.fixture
def schema(request: pytest.FixtureRequest) -> str:
    # Cut to PostgreSQL's 63-byte names; the digest keeps parametrized ids apart.
    name = request.node.name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return "x_" + name.replace("[", "_").replace("]", "")[:40].lower() + "_" + digest


async def admin(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn)


def test_an_engine_without_a_connection_or_a_schema_is_refused() -> None:
    """A pool of no connection would wait forever on its first call, and an
    empty schema name spells no tables: both are refused when the engine is
    made, before any connection; a pool of one is an engine."""
    dsn = "postgresql://nobody@127.0.0.1:1/none"
    for pool_size in (0, -1):
        with pytest.raises(ValueError, match="pool_size must be at least 1"):
            PostgresEngine(dsn, pool_size=pool_size)
    with pytest.raises(ValueError, match="schema must not be empty"):
        PostgresEngine(dsn, schema="")
    assert PostgresEngine(dsn, pool_size=1).pool_size == 1


def test_an_enqueue_that_meets_a_deadlock_is_retried_a_bounded_number_of_times(
    dsn: str, schema: str
) -> None:
    """Property: an enqueue whose insert PostgreSQL aborts as a deadlock (two
    batches taking the same unique keys in another order) is run again, up
    to three times in all: two deadlocks in a row store the tasks once,
    three are the caller's error and store nothing."""

    async def scenario() -> tuple[int, int]:
        async with engines(dsn, schema, 1) as (e,):
            real = e._fetchrow
            budget = 2

            async def deadlocking(sql: str, *args: Any) -> Any:
                nonlocal budget
                if sql == e._sql.claim.insert and budget > 0:
                    budget -= 1
                    raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
                return await real(sql, *args)

            e._fetchrow = deadlocking  # type: ignore[method-assign]
            now = ManualClock().now()
            outcomes = await e.enqueue("q", [spec(unique_key="a"), spec(unique_key="b")], now)
            assert [o.created for o in outcomes] == [True, True]
            budget = 3
            with pytest.raises(asyncpg.exceptions.DeadlockDetectedError):
                await e.enqueue("q", [spec(unique_key="c")], now)
            stats = await e.queue_stats("q", now, by_type=False)
            return stats.pending, budget

    assert run(scenario()) == (2, 0)


def test_stats_read_among_other_queues_unfolded_counts_are_their_own(dsn: str, schema: str) -> None:
    """Property: a queue's stats are its folded counts plus the deltas
    committed since the fold -- its own deltas only, also when other
    daemons' commits to other queues land between this daemon's fold and
    its read (here: the fold skipped, every queue's deltas left waiting)."""

    async def scenario() -> list[tuple[str, int]]:
        async with engines(dsn, schema, 1) as (e,):
            now = ManualClock().now()
            for queue, n in (("p", 1), ("q", 2), ("r", 3)):
                await e.enqueue(queue, [spec() for _ in range(n)], now)
            await e.fold_counts()
            for queue in ("p", "q", "r"):
                await e.enqueue(queue, [spec()], now)

            async def not_folding() -> None:
                return None

            e.fold_counts = not_folding  # type: ignore[method-assign]
            q = await e.queue_stats("q", now, by_type=False)
            page = await e.list_queues(now, after="p", limit=1)
            return [("q", q.pending)] + [(s.queue, s.pending) for s in page]

    assert run(scenario()) == [("q", 3), ("q", 3)]


def test_stats_never_wait_for_another_daemons_fold(dsn: str, schema: str) -> None:
    """Property: a stats read (GetQueueStats, ListQueues) never waits for
    another daemon's fold of the count deltas, and is exact while that fold
    is in progress; the deltas fold once the other is done, each once.
    Here the other folder holds the fold's lock in an open transaction."""

    async def scenario() -> tuple[int, int, list[tuple[str, int]], int, int]:
        async with engines(dsn, schema, 1) as (e,):
            now = ManualClock().now()
            await e.enqueue("q", [spec() for _ in range(3)], now)
            other = await admin(dsn)
            try:
                async with other.transaction():
                    await other.execute(
                        "SELECT pg_advisory_xact_lock($1)", pg.lock_key(schema + " counts")
                    )
                    async with asyncio.timeout(5):
                        stats = await e.queue_stats("q", now, by_type=False)
                        await e.enqueue("q", [spec()], now)
                        again = await e.queue_stats("q", now, by_type=False)
                        page = await e.list_queues(now, after="", limit=10)
                unfolded = await other.fetchval(
                    f'SELECT coalesce(sum(d), 0) FROM "{schema}".task_count_deltas'
                )
                await e.fold_counts()
                left = await other.fetchval(f'SELECT count(*) FROM "{schema}".task_count_deltas')
                folded = await other.fetchval(
                    f'SELECT n FROM "{schema}".task_counts WHERE queue = $1 AND state = $2',
                    "q",
                    int(TaskState.PENDING),
                )
            finally:
                await other.close()
            assert unfolded == 4, "the fold ran under another folder's lock"
            return stats.pending, again.pending, [(s.queue, s.pending) for s in page], left, folded

    assert run(scenario()) == (3, 4, [("q", 4)], 0, 4)


# -- several daemons on one database -------------------------------------------


@pytest.mark.parametrize("types", [[], ["t", "u"]])
def test_concurrent_claims_never_lease_a_task_twice(
    dsn: str, schema: str, types: list[str]
) -> None:
    """No two daemons lease the same task: two engines on one database, 16 coroutines
    claiming at once (small batches, so they fight over the same head of the queue),
    lease every task exactly once between them -- also when they claim by task type
    (each type's walk locks its own candidates, more than the claim takes)."""
    clock = ManualClock()
    n_tasks = 600

    async def main() -> None:
        async with engines(dsn, schema, 2, pool_size=8) as (a, b):
            await a.enqueue("q", [spec("tu"[i % 2]) for i in range(n_tasks)], clock.now())
            leased: list[tuple[str, int]] = []

            async def claimer(engine: PostgresEngine, worker: str) -> None:
                while True:
                    got = await engine.claim("q", types, 3, worker, LEASE, clock.now())
                    if not got:
                        return
                    leased.extend((lt.task.id, lt.lease.attempt) for lt in got)

            async with asyncio.TaskGroup() as tg:
                for i in range(8):
                    tg.create_task(claimer(a, f"a{i}"))
                    tg.create_task(claimer(b, f"b{i}"))
            ids = [task_id for task_id, _ in leased]
            assert len(ids) == len(set(ids)) == n_tasks
            assert {attempt for _, attempt in leased} == {1}
            assert await a.activity("q", []) == n_tasks
            assert await b.claim("q", [], 10, "late", LEASE, clock.now()) == []

    run(main())


def test_a_claim_leaves_the_keys_its_rules_hold_unlocked(dsn: str, schema: str) -> None:
    """Property: a claim on a queue with keyed limits locks the state row
    of a key only when the key may start a task: a key held by its
    concurrency costs no row lock per claim (1,000 held keys: a lock
    written per key on every claim), so a transaction holding a held key's
    row (another daemon mid-claim of that key) does not stall the claims of
    other keys. A key that may start is still locked: its claim waits."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 1) as (engine,):
            await engine.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), clock.now())
            await engine.enqueue("q", [spec(limit_key="k:held") for _ in range(2)], clock.now())
            [first] = await engine.claim("q", [], 10, "w", LEASE, clock.now())
            assert first.task.limit_key == "k:held"
            other = await admin(dsn)
            try:
                async with asyncio.TaskGroup() as tg, other.transaction():
                    await other.execute(
                        f'SELECT 1 FROM "{schema}".limit_keys WHERE key = $1 FOR UPDATE',
                        "k:held",
                    )
                    await engine.enqueue("q", [spec(limit_key="k:free")], clock.now())
                    async with asyncio.timeout(5):
                        [free] = await engine.claim("q", [], 10, "w", LEASE, clock.now())
                    assert free.task.limit_key == "k:free"
                    # The held key's slot frees: its claim must take the lock now.
                    await engine.ack(ref_of(first), clock.now())
                    claim = tg.create_task(engine.claim("q", [], 10, "w", LEASE, clock.now()))
                    await asyncio.sleep(0.3)
                    assert not claim.done()
                [second] = claim.result()
                assert second.task.limit_key == "k:held"
            finally:
                await other.close()

    run(main())


@pytest.mark.parametrize("seed", range(4))
def test_racing_limited_claims_of_two_daemons_keep_every_rule(
    dsn: str, schema: str, seed: int
) -> None:
    """Property: a key's concurrency and its rate hold across daemons. Two
    engines on one database race 12 limited claims at a time (each at its
    own `now`, up to 2 ms apart, of random types and sizes) over keys under
    a concurrency rule and a rate rule, half the leases acked between
    rounds: no key ever holds more leases than its concurrency, and no
    window of W µs holds more of a rate key's starts than ``burst + (W +
    late credit) / interval`` (docs/limits.md) -- whichever daemon started
    them. Red when a claim grants from its first look without locks (the
    leases or the TAT read before the key's lock)."""
    rnd = random.Random(seed)
    clock = ManualClock()
    held_rule = Rule("c:", 0.0, 1_000_000, 1, rnd.randint(1, 3))
    rate_rule = Rule(
        "r:", float(rnd.choice([5, 20, 100])), 1_000_000, rnd.randint(1, 3), rnd.choice([0, 2])
    )
    keys = ["c:1", "c:2", "r:1", "r:2", "", "z:1"]

    async def main() -> dict[str, list[int]]:
        starts: dict[str, list[int]] = {}
        async with engines(dsn, schema, 2, pool_size=8) as (a, b):
            for limit_rule in (held_rule, rate_rule):
                await a.set_limit("q", limit_rule, clock.now())
            await a.enqueue(
                "q",
                [spec(rnd.choice("tu"), limit_key=rnd.choice(keys)) for _ in range(300)],
                clock.now(),
            )
            held: list[LeasedTask] = []
            for _ in range(20):
                nows = [
                    clock.now() + timedelta(microseconds=rnd.randint(0, 2000)) for _ in range(12)
                ]
                claims = await asyncio.gather(
                    *(
                        (a, b)[i % 2].claim(
                            "q", rnd.choice([[], ["t"], ["u"]]), rnd.randint(1, 8), "w", LEASE, now
                        )
                        for i, now in enumerate(nows)
                    )
                )
                for leased, now in zip(claims, nows, strict=True):
                    held += leased
                    for lt in leased:
                        starts.setdefault(lt.task.limit_key, []).append(to_us(now))
                leases = collections.Counter(lt.task.limit_key for lt in held)
                for key in ("c:1", "c:2"):
                    assert leases[key] <= held_rule.concurrency, (key, leases, held_rule)
                for key in ("r:1", "r:2"):
                    assert leases[key] <= (rate_rule.concurrency or len(held)), (key, leases)
                rnd.shuffle(held)
                done, held = held[: len(held) // 2], held[len(held) // 2 :]
                await asyncio.gather(
                    *((a, b)[i % 2].ack(ref_of(lt), clock.now()) for i, lt in enumerate(done))
                )
                clock.advance(timedelta(milliseconds=rnd.choice([1, 10, 50, 200])))
        return starts

    starts = run(main())
    assert sum(map(len, starts.values())) > 100  # the rounds did start tasks
    for key in ("r:1", "r:2"):
        assert_within_rate(sorted(starts.get(key, [])), rate_rule)


def test_concurrent_expiry_processes_each_lease_once(dsn: str, schema: str) -> None:
    """Each expired lease is processed once: two engines (8 coroutines each) expiring
    the same overdue leases at once end each attempt once -- the counts add up to the
    number of leases, every task is PENDING with attempt 1 and exactly one backoff
    after the expiry that processed it; and claims that expire first (the claim path)
    racing the reapers do not double-process either."""
    clock = ManualClock()
    n_tasks = 400
    backoff = RetryBackoff(initial=timedelta(seconds=10), maximum=timedelta(hours=1))

    async def main() -> None:
        async with engines(dsn, schema, 2, pool_size=8) as (a, b):
            await a.enqueue("q", [spec(retry_backoff=backoff) for _ in range(n_tasks)], clock.now())
            claimed = await a.claim("q", [], n_tasks, "w", LEASE, clock.now())
            assert len(claimed) == n_tasks
            clock.advance(LEASE)
            t0 = clock.now()
            # Each reaper runs at its own `now` (as separate machines would), so a
            # second processing of a row would move its available_at.
            nows = [t0 + timedelta(microseconds=i) for i in range(16)]
            results = await asyncio.gather(
                *(
                    (a if i % 2 else b).expire_leases(now)
                    if i % 4
                    else (a if i % 2 else b).claim("q", [], 1, "w2", LEASE, now)
                    for i, now in enumerate(nows)
                )
            )
            expired = sum(r for r in results if isinstance(r, int))
            reclaimed = [lt for r in results if isinstance(r, list) for lt in r]
            assert reclaimed == []  # every expired task backs off 10 s first
            tasks = [await a.get("q", task_id=lt.task.id) for lt in claimed]
            # The claims expired some too; together every lease ended exactly once.
            assert expired <= n_tasks
            assert all(t.state == TaskState.PENDING for t in tasks)
            assert all(t.attempt == 1 for t in tasks)
            assert all(t.last_error == "lease expired" for t in tasks)
            for t in tasks:
                assert t.updated_at in nows
                assert t.available_at == t.updated_at + timedelta(seconds=10)
            assert await a.expire_leases(t0 + timedelta(seconds=1)) == 0

    run(main())


def test_expiry_counts_add_up_across_daemons(dsn: str, schema: str) -> None:
    """Each expired lease is processed once, counted: many concurrent expire_leases
    calls from two engines report exactly as many changed tasks as there were leases."""
    clock = ManualClock()
    n_tasks = 400

    async def main() -> None:
        async with engines(dsn, schema, 2, pool_size=8) as (a, b):
            await a.enqueue("q", [spec() for _ in range(n_tasks)], clock.now())
            await a.claim("q", [], n_tasks, "w", LEASE, clock.now())
            clock.advance(LEASE)
            counts = await asyncio.gather(
                *((a, b)[i % 2].expire_leases(clock.now()) for i in range(16))
            )
            assert sum(counts) == n_tasks

    run(main())


def test_concurrent_opens_migrate_an_empty_database_once(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N daemons opening an empty database at once migrate it exactly once: all opens
    succeed, the schema (missing before) is created, the version is current, and a
    migration step with a visible side effect ran once."""
    base = pg.migrations
    monkeypatch.setattr(
        pg,
        "migrations",
        lambda s: (
            *base(s)[:-1],
            (*base(s)[-1], f"CREATE TABLE {s}.ran (n int)", f"INSERT INTO {s}.ran VALUES (1)"),
        ),
    )

    async def main() -> None:
        opened = [PostgresEngine(postgres_dsn, schema="fresh", pool_size=2) for _ in range(6)]
        try:
            await asyncio.gather(*(e.open() for e in opened))
        finally:
            for e in opened:
                await e.close()
        conn = await admin(postgres_dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM fresh.ran") == 1
            assert await conn.fetch("SELECT version FROM fresh.ringo_schema") == [(SCHEMA_VERSION,)]
        finally:
            await conn.close()

    run(main())


# -- schema versions -------------------------------------------------------------


def test_a_newer_schema_is_refused_and_left_untouched(dsn: str, schema: str) -> None:
    """A database written by a newer ringo_trio is refused with SchemaTooNew naming
    both versions, and is not modified (its data and version stay)."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 1) as (e,):
            await e.enqueue("q", [spec()], clock.now())
        conn = await admin(dsn)
        try:
            await conn.execute(f"UPDATE {schema}.ringo_schema SET version = version + 1")
            with pytest.raises(SchemaTooNew, match=rf"version {SCHEMA_VERSION + 1} is newer"):
                await PostgresEngine(dsn, schema=schema).open()
            assert await conn.fetchval(f"SELECT version FROM {schema}.ringo_schema") == (
                SCHEMA_VERSION + 1
            )
            assert await conn.fetchval(f"SELECT count(*) FROM {schema}.tasks") == 1
        finally:
            await conn.close()

    run(main())


def test_migrations_apply_in_order_and_a_failed_one_changes_nothing(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older schema is brought to the current version by the missing migrations, in
    order, keeping its data; a failing migration leaves version and schema as before."""
    clock = ManualClock()
    base = pg.migrations

    async def main() -> None:
        async with engines(dsn, schema, 1) as (e,):
            [out] = await e.enqueue("q", [spec(unique_key="k")], clock.now())
        with monkeypatch.context() as m:
            m.setattr(
                pg,
                "migrations",
                lambda s: (*base(s), (f"CREATE TABLE {s}.half (x int)", "THIS IS NOT SQL")),
            )
            m.setattr(pg, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
            with pytest.raises(asyncpg.PostgresSyntaxError):
                await PostgresEngine(dsn, schema=schema).open()
        conn = await admin(dsn)
        try:
            assert await conn.fetchval(f"SELECT version FROM {schema}.ringo_schema") == (
                SCHEMA_VERSION
            )
            assert await conn.fetchval(f"SELECT to_regclass('{schema}.half')") is None
            with monkeypatch.context() as m:
                m.setattr(
                    pg,
                    "migrations",
                    lambda s: (
                        *base(s),
                        (f"CREATE TABLE {s}.m2 (step int)", f"INSERT INTO {s}.m2 VALUES (2)"),
                        (f"INSERT INTO {s}.m2 SELECT max(step) + 1 FROM {s}.m2",),
                    ),
                )
                m.setattr(pg, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
                async with engines(dsn, schema, 1) as (e,):
                    assert await e.get("q", unique_key="k") == out.task
            steps = await conn.fetch(f"SELECT step FROM {schema}.m2 ORDER BY step")
            assert [r[0] for r in steps] == [2, 3]
            assert await conn.fetchval(f"SELECT version FROM {schema}.ringo_schema") == (
                SCHEMA_VERSION + 2
            )
        finally:
            await conn.close()

    run(main())


def test_two_schemas_in_one_database_are_separate(dsn: str, schema: str) -> None:
    """Schemas isolate deployments: tasks, dedupe keys, claims and wake-ups of one
    schema are invisible to the other."""
    clock = ManualClock()

    async def main() -> None:
        async with (
            engines(dsn, schema + "_a", 1) as (a,),
            engines(dsn, schema + "_b", 2) as (b, b2),
            watching(a) as at_a,
            watching(b2) as at_b2,
        ):
            [x] = await a.enqueue("q", [spec(unique_key="k")], clock.now())
            [y] = await b.enqueue("q", [spec(unique_key="k")], clock.now())
            assert x.created
            assert y.created
            assert x.task.id != y.task.id
            [lt] = await b.claim("q", [], 5, "w", LEASE, clock.now())
            assert lt.task.id == y.task.id
            await a.enqueue("marker", [spec()], clock.now())
            await at_b2.wait_for("q")  # b's enqueue; a's went to another channel
            await b.enqueue("marker", [spec()], clock.now())
            await at_b2.wait_for("marker")
            assert at_b2.seen == [None, "q", "marker"]
            assert at_a.seen == [None]

    run(main())


# -- wake-ups across daemons -----------------------------------------------------


def test_notifications_reach_other_engines_but_not_their_sender(dsn: str, schema: str) -> None:
    """Cross-daemon wake-ups: every change that may make a task claimable (enqueue,
    nack back to PENDING, retry, release, expiry back to PENDING) reaches another
    engine's watch naming its queue; the sender's own watch never hears them; changes
    that make nothing claimable (ack) send nothing."""
    clock = ManualClock()
    fast = RetryBackoff(initial=timedelta(0))

    async def main() -> None:
        async with engines(dsn, schema, 2) as (a, b), watching(a) as at_a, watching(b) as at_b:
            await b.enqueue("enq", [spec(retry_backoff=fast, max_attempts=9)], clock.now())
            await at_a.wait_for("enq")
            [lt] = await b.claim("enq", [], 1, "w", LEASE, clock.now())
            await b.nack(ref_of(lt), "x", None, clock.now())
            await at_a.wait_for("enq", 2)
            [lt] = await b.claim("enq", [], 1, "w", LEASE, clock.now())
            assert await b.release([ref_of(lt)], clock.now()) == 1
            await at_a.wait_for("enq", 3)
            [lt] = await b.claim("enq", [], 1, "w", LEASE, clock.now())
            clock.advance(LEASE)
            assert await b.expire_leases(clock.now()) == 1
            await at_a.wait_for("enq", 4)
            [lt] = await b.claim("enq", [], 1, "w", LEASE, clock.now())
            await b.ack(ref_of(lt), clock.now())
            await b.retry("enq", clock.now(), task_id=lt.task.id)
            await at_a.wait_for("enq", 5)
            # A marker: notifications of one sender arrive in commit order, so once
            # it is in, everything b sent before it is too.
            await b.enqueue("marker", [spec()], clock.now())
            await at_a.wait_for("marker")
            assert at_a.seen == [None, "enq", "enq", "enq", "enq", "enq", "marker"]
            assert at_b.seen == [None]
            # And the other way round.
            await a.enqueue("back", [spec()], clock.now())
            await at_b.wait_for("back")
            assert at_a.seen[-1] == "marker"

    run(main())


def test_long_schema_names_get_channels_of_their_own(dsn: str, schema: str) -> None:
    """Property: PostgreSQL cuts channel names at 63 bytes, so a schema
    whose channel (``ringo:<schema>``) would be longer gets a hashed one of
    at most 63 bytes: two deployments whose 63-byte schema names share all
    but their last byte wake their own daemons only; a name that fits is
    its channel as it is."""
    assert listen.channel("s" * 57) == "ringo:" + "s" * 57
    for long in ("s" * 58, "s" * 63, "é" * 31):
        assert listen.channel(long).startswith("ringo:")
        assert len(listen.channel(long).encode()) <= 63
    assert listen.channel("s" * 58) != listen.channel("s" * 57 + "t")
    long_a = (schema + "_" * 63)[:62] + "a"
    long_b = long_a[:-1] + "b"
    now = ManualClock().now()

    async def main() -> None:
        async with (
            engines(dsn, long_a, 2) as (a1, a2),
            engines(dsn, long_b, 2) as (b1, b2),
            watching(a2) as at_a2,
            watching(b1) as at_b1,
        ):
            await a1.enqueue("q", [spec()], now)
            await at_a2.wait_for("q")
            await b2.enqueue("marker", [spec()], now)
            await at_b1.wait_for("marker")
            assert at_b1.seen == [None, "marker"]

    run(main())


class _Enough(Exception):
    pass


def test_a_listener_backs_off_doubling_to_its_cap_and_starts_over_once_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Property: a listener that cannot connect tries again after 0.1 s,
    then twice as long each time up to 5 s (a database that is down is not
    hammered, and is found again within 5 s once up); once a listener had
    been up and is lost, the wait starts over at 0.1 s."""
    waited: list[float] = []

    async def sleep(delay: float) -> None:
        waited.append(delay)
        if len(waited) == 10:
            raise _Enough

    monkeypatch.setattr(listen.asyncio, "sleep", sleep)
    failures = iter([OSError("refused")] * 7 + [listen.Listened()] + [OSError("refused")] * 9)

    async def listen_once() -> None:
        raise next(failures)

    with pytest.raises(_Enough):
        run(listen._keep_listening("test listener", listen_once))
    assert waited == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 0.1, 0.2, 0.4]


class _Relay:
    """A TCP relay to the PostgreSQL server that can go silent: the
    connections it relays at that moment stay open and carry nothing more
    (a peer gone without a FIN: a NAT or a firewall that forgot the flow),
    while new connections are relayed as before."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._opened = 0
        self._silent_below = 0
        self._tasks: list[asyncio.Task[None]] = []

    def silence(self) -> None:
        self._silent_below = self._opened

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[int]:
        """The relay's port while the block runs; every relayed connection
        is closed when it ends."""
        async with asyncio.TaskGroup() as tg:
            server = await asyncio.start_server(lambda r, w: self._start(tg, r, w), "127.0.0.1", 0)
            try:
                yield server.sockets[0].getsockname()[1]
            finally:
                server.close()
                for task in self._tasks:
                    task.cancel()

    def _start(
        self, tg: asyncio.TaskGroup, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._tasks.append(tg.create_task(self._relay(self._opened, reader, writer)))
        self._opened += 1

    async def _relay(
        self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if number >= self._silent_below:
                    dst.write(data)
                    await dst.drain()
            dst.close()

        try:
            async with asyncio.TaskGroup() as pumps:
                pumps.create_task(pump(reader, up_writer))
                pumps.create_task(pump(up_reader, writer))
        except* OSError:
            pass
        finally:
            writer.close()
            up_writer.close()


@pytest.mark.parametrize("listener", ["wake-ups", "waits"])
def test_a_listener_whose_connection_goes_silent_listens_again(
    dsn: str, listener: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a listening connection dropped without a FIN delivers
    nothing and never reports itself closed; each listener (the wake-ups',
    the waits') proves its connection alive every `WATCH_PING` of silence,
    gives up one that does not answer and listens again on a new one, so
    the notifications sent after that are heard (without the ping, never:
    another daemon's enqueues and settlements would go unheard)."""
    monkeypatch.setattr(listen, "WATCH_PING", 0.2)
    channel = f"ringo:silent_{random.getrandbits(48):x}"
    server = urlsplit(dsn)
    relay = _Relay((server.hostname or "127.0.0.1", server.port or 5432))

    async def main() -> tuple[list[str | None], str]:
        notes = Notes()
        async with relay.serving() as port, asyncio.TaskGroup() as tg, asyncio.timeout(10):
            user = server.netloc.rpartition("@")[0]
            relayed = server._replace(netloc=f"{user}@127.0.0.1:{port}").geturl()
            if listener == "wake-ups":
                watched = listen.watch(relayed, channel, "me", notes, fold=_nothing)
                payload, heard = "another q", "q"
            else:
                watched = listen.watch_settled(relayed, f"'{channel}'", notes, ready=lambda: None)
                payload = heard = "task-1"
            task = tg.create_task(watched)
            try:
                await notes.wait_for(None)  # listening
                relay.silence()
                await notes.wait_for(None, count=2)  # listening again
                direct = await asyncpg.connect(dsn)
                try:
                    await direct.execute("SELECT pg_notify($1, $2)", channel, payload)
                finally:
                    await direct.close()
                await notes.wait_for(heard)
            finally:
                task.cancel()
        return notes.seen, heard

    seen, heard = run(main())
    assert seen == [None, None, heard]


async def _nothing() -> None:
    pass


def test_a_rule_set_through_one_daemon_holds_on_another_at_once(dsn: str, schema: str) -> None:
    """Property: a limit rule set through one daemon reaches every other
    daemon of the database at once (a notification on the rules' channel),
    not at its next reload (`RULES_REFRESH_US`, 2 s): on a clock that does
    not move, the other daemon's very next claim keeps the new rule."""
    clock = ManualClock()

    async def main() -> int:
        async with engines(dsn, schema, 2) as (a, b), watching(b) as at_b:
            await b.enqueue("q", [spec(limit_key="k:1") for _ in range(2)], clock.now())
            assert await b.limit_rules("q", to_us(clock.now())) == ()  # read, fresh
            await a.set_limit("q", Rule("k:", 0.0, 1_000_000, 1, 1), clock.now())
            async with asyncio.timeout(10):
                await at_b.wait_for("q")
            return len(await b.claim("q", [], 2, "w", LEASE, clock.now()))

    assert run(main()) == 1


def test_a_daemons_waits_outlive_another_daemons_withdrawal_and_start(
    dsn: str, schema: str
) -> None:
    """Property: settlements notify the daemons waiting on the task (WaitTask
    across daemons), and a registration stays until its own daemon
    withdraws it: another daemon withdrawing its wait on the same task, or
    starting (which clears the registrations of vanished daemons,
    `STALE_WAITS` old), leaves it, and a daemon withdrawing one wait keeps
    its others -- so each settlement is heard at once."""
    clock = ManualClock()

    async def main() -> set[str | None]:
        heard: set[str | None] = set()
        wanted: set[str] = set()
        listening, all_heard = asyncio.Event(), asyncio.Event()

        def note(task_id: str | None) -> None:
            heard.add(task_id)
            if wanted and wanted <= heard:
                all_heard.set()

        async with engines(dsn, schema, 1) as (a,), asyncio.TaskGroup() as tg:
            ids = [o.task.id for o in await a.enqueue("q", [spec(), spec()], clock.now())]
            wanted.update(ids)
            watcher = tg.create_task(a.watch_settled(note, listening.set))
            await listening.wait()
            await a.register_waits(add=ids[:1], remove=[])
            async with engines(dsn, schema, 1) as (b,):
                await b.register_waits(add=ids, remove=[])
                await b.register_waits(add=[], remove=ids[:1])
                for leased in await b.claim("q", [], 2, "w", LEASE, clock.now()):
                    await b.ack(ref_of(leased), clock.now())
            async with asyncio.timeout(10):
                await all_heard.wait()
            watcher.cancel()
        return heard - {None}

    assert len(run(main())) == 2


def test_a_rolled_back_change_sends_no_notification(dsn: str, schema: str) -> None:
    """A notification is sent at commit, never for a rolled-back change: an enqueue the
    server refuses (a NUL byte in a text column) wakes nobody."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 2) as (a, b), watching(a) as at_a:
            with pytest.raises(asyncpg.PostgresError):
                await b.enqueue("refused", [spec(), spec("bad\x00type")], clock.now())
            assert await b.activity("refused", []) == 0
            await b.enqueue("marker", [spec()], clock.now())
            await at_a.wait_for("marker")
            assert at_a.seen == [None, "marker"]

    run(main())


def test_a_duplicate_enqueue_sends_no_notification(dsn: str, schema: str) -> None:
    """An enqueue that created nothing (all duplicates) made nothing claimable: no
    notification."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 2) as (a, b):
            await b.enqueue("dup", [spec(unique_key="k")], clock.now())
            async with watching(a) as at_a:
                [out] = await b.enqueue("dup", [spec(unique_key="k")], clock.now())
                assert not out.created
                await b.enqueue("marker", [spec()], clock.now())
                await at_a.wait_for("marker")
                assert at_a.seen == [None, "marker"]

    run(main())


# -- connection loss -------------------------------------------------------------


async def terminate_backends(dsn: str) -> int:
    """Terminate every other backend of the database and wait until they are gone."""
    conn = await admin(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))"
                " FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await conn.close()


def test_the_engine_recovers_from_terminated_connections(dsn: str, schema: str) -> None:
    """Connection loss is StorageUnavailable, and the pool recovers by itself: after the
    server terminates every backend of the engine, the next call succeeds or raises
    StorageUnavailable, and the call after that succeeds -- no reopen; a claimed lease
    is still live afterwards; the watch reconnects and reports None (anything may have
    changed while it was deaf), then hears notifications again."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 2, pool_size=4) as (a, b), watching(a) as at_a:
            await b.enqueue("q", [spec(), spec()], clock.now())
            await at_a.wait_for("q")
            # Busy pools: several connections open in each engine.
            await asyncio.gather(*(e.activity("q", []) for e in (a, b) for _ in range(4)))
            [lt] = await a.claim("q", [], 1, "w", LEASE, clock.now())
            assert await terminate_backends(dsn) >= 3
            for engine in (a, b):
                with contextlib.suppress(StorageUnavailable):
                    await engine.activity("q", [])
                assert await engine.activity("q", []) == 2
            await at_a.wait_for(None, 2)  # the watch reconnected
            assert (await a.ack(ref_of(lt), clock.now())).state == TaskState.SUCCEEDED
            await b.enqueue("after", [spec()], clock.now())
            await at_a.wait_for("after")

    run(main())


def test_every_call_recovers_from_a_terminated_connection(dsn: str, schema: str) -> None:
    """Whatever operation meets a terminated connection either succeeds or reports
    StorageUnavailable (never a driver error), and a retry of it succeeds."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 1, pool_size=1) as (e,):
            await e.enqueue("q", [spec(unique_key="k")], clock.now())
            calls: list[Any] = [
                lambda: e.enqueue("q", [spec()], clock.now()),
                lambda: e.get("q", unique_key="k"),
                lambda: e.claim("q", [], 1, "w", LEASE, clock.now()),
                lambda: e.expire_leases(clock.now()),
                lambda: e.activity("q", []),
                lambda: e.next_wakeup("q", [], clock.now()),
                lambda: e.release([], clock.now()),
            ]
            for call in calls:
                await terminate_backends(dsn)
                # Whether the pool noticed the FATAL before the call or the call
                # meets the dead socket depends on timing: both are legal.
                with contextlib.suppress(StorageUnavailable):
                    await call()
                await call()

    run(main())


def test_a_connection_lost_mid_call_is_storage_unavailable(dsn: str, schema: str) -> None:
    """A call whose connection dies while it runs raises StorageUnavailable, changed
    nothing (the ack was not committed), and the next call succeeds on a fresh
    connection of the same engine."""
    clock = ManualClock()

    async def main() -> None:
        async with engines(dsn, schema, 1, pool_size=1) as (e,):
            await e.enqueue("q", [spec()], clock.now())
            [lt] = await e.claim("q", [], 1, "w", LEASE, clock.now())
            conn = await admin(dsn)
            try:
                async with conn.transaction():
                    # Hold the task's row so the engine's ack waits in the server.
                    await conn.execute(
                        f"SELECT 1 FROM {schema}.tasks WHERE id = $1 FOR UPDATE", lt.task.id
                    )

                    async def ack() -> None:
                        with pytest.raises(StorageUnavailable):
                            await e.ack(ref_of(lt), clock.now())

                    async with asyncio.TaskGroup() as tg:
                        acking = tg.create_task(ack())
                        pid = None
                        while pid is None:
                            await asyncio.sleep(0.01)
                            pid = await conn.fetchval(
                                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                " AND application_name = 'ringod' AND datname = current_database()"
                            )
                        await conn.execute("SELECT pg_terminate_backend($1)", pid)
                        await acking
            finally:
                await conn.close()
            task = await e.get("q", task_id=lt.task.id)
            assert task.state == TaskState.LEASED
            assert (await e.ack(ref_of(lt), clock.now())).state == TaskState.SUCCEEDED

    run(main())


def test_an_unreachable_server_is_storage_unavailable(unused_tcp_port: int) -> None:
    """No server listening: open raises StorageUnavailable (retryable), not a socket error."""
    engine = PostgresEngine(f"postgresql://postgres@127.0.0.1:{unused_tcp_port}/x")
    with pytest.raises(StorageUnavailable):
        run(engine.open())
    run(engine.close())


def test_a_database_refusing_connections_is_storage_unavailable(postgres_dsn: str) -> None:
    """A database that exists but refuses connections (ALLOW_CONNECTIONS false,
    as during maintenance or a shutdown) is a retryable outage, not an internal error."""
    from tests._kit.postgres import ADMIN_DSN

    name = postgres_dsn.rsplit("/", 1)[1]

    async def main() -> None:
        admin_conn = await asyncpg.connect(ADMIN_DSN)
        try:
            await admin_conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            engine = PostgresEngine(postgres_dsn)
            with pytest.raises(StorageUnavailable):
                await engine.open()
            await engine.close()
        finally:
            await admin_conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await admin_conn.close()

    run(main())


def test_close_is_idempotent_and_a_closed_engine_refuses_calls(dsn: str, schema: str) -> None:
    """close() twice is fine; a call on a closed engine fails loudly instead of
    reconnecting behind the caller's back."""

    async def main() -> None:
        engine = PostgresEngine(dsn, schema=schema)
        with pytest.raises(RuntimeError, match="not open"):
            await engine.activity("q", [])
        await engine.open()
        await engine.open()  # a second open is a no-op
        await engine.close()
        await engine.close()
        with pytest.raises(RuntimeError, match="not open"):
            await engine.expire_leases(ManualClock().now())

    run(main())


@pytest.fixture
def unused_tcp_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_reported_and_ping_says_so(dsn: str, schema: str) -> None:
    """Properties (the daemon's reach probe relies on them): an operation that
    fails for want of a connection tells `unavailable_listener` the very
    `StorageUnavailable` it raises; `ping` answers while the server can be
    reached, raises `StorageUnavailable` while it cannot (connections cut,
    new ones refused), and answers again once it can, on a fresh connection."""

    async def main() -> None:
        async with engines(dsn, schema, 1, pool_size=1) as (e,):
            told: list[StorageUnavailable] = []
            e.unavailable_listener = told.append
            await e.ping()
            name = urlsplit(dsn).path.lstrip("/")
            database = _ident_of(name)
            # From another database: a database cannot shut its own door.
            conn = await asyncpg.connect(ADMIN_DSN)
            try:
                await conn.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS false")
                await conn.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))"
                    " FROM pg_stat_activity WHERE datname = $1",
                    name,
                )
                with pytest.raises(StorageUnavailable) as raised:
                    await e.activity("q", [])
                assert told == [raised.value]
                with pytest.raises(StorageUnavailable):
                    await e.ping()
            finally:
                await conn.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS true")
                await conn.close()
            await e.ping()
            assert await e.activity("q", []) == 0

    run(main())


def _ident_of(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
