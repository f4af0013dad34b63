"""asyncpg vs psycopg 3 (async + psycopg_pool) for the storage engine's hot path.

Run: ``python bench/pg_driver.py [ADMIN_DSN]`` (default: the test server at
127.0.0.1:5432, database ``test``). It creates a scratch database, measures
on uvloop (the daemon's loop) with each driver

* enqueue: batches of 1000 rows in one transaction, one statement (unnest of
  arrays) -- rows/s;
* claim-1 + ack: 8 coroutines over a pool of 8 connections, each claiming one
  task (a CTE ``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``)
  and acking it by id -- round-trip pairs/s;

and drops the database. The engine chose its driver from these numbers
(ringo_trio/server/storage/postgres.py). The last row is the engine itself
(`PostgresEngine`, full task rows, claim-1 + ack through the storage API) on
the same loads, in a schema of its own.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import uvloop

from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
from ringo_trio.server.clock import Clock
from ringo_trio.server.storage.postgres import PostgresEngine

BATCH = 1000
BATCHES = 30
CONCURRENCY = 8
CLAIMS = 6000
ROUNDS = 5

SCHEMA = """
CREATE TABLE tasks (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL,
    queue TEXT NOT NULL,
    state SMALLINT NOT NULL,
    priority INTEGER NOT NULL,
    available_at BIGINT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    payload BYTEA NOT NULL,
    token TEXT NOT NULL DEFAULT '',
    lease_until BIGINT
);
CREATE INDEX tasks_pending ON tasks (queue, priority DESC, available_at, seq) WHERE state = 1;
"""
# $n placeholders for asyncpg, %s for psycopg.
ENQUEUE = (
    "INSERT INTO tasks (id, queue, state, priority, available_at, payload)"
    " SELECT i, 'q', 1, 0, 0, p FROM unnest({0}::text[], {1}::bytea[]) AS u(i, p)"
)
CLAIM = """
    UPDATE tasks t SET state = 2, attempt = t.attempt + 1, token = md5(random()::text),
        lease_until = {0}
    FROM (SELECT seq FROM tasks WHERE queue = 'q' AND state = 1 AND available_at <= {0}
          ORDER BY priority DESC, available_at, seq LIMIT 1 FOR UPDATE SKIP LOCKED) c
    WHERE t.seq = c.seq RETURNING t.seq, t.token
"""
ACK = "UPDATE tasks SET state = 3, token = '' WHERE seq = {0} AND token = {1} RETURNING seq"


def _dsn(admin: str, database: str) -> str:
    return urlunsplit(urlsplit(admin)._replace(path="/" + database))


def _rows() -> tuple[list[str], list[bytes]]:
    return [secrets.token_hex(16) for _ in range(BATCH)], [b"x" * 64] * BATCH


async def _timed(fn: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    n = await fn()
    return n / (time.perf_counter() - start)


async def _no_reset(conn: asyncpg.Connection) -> None:
    """By default asyncpg's pool runs a reset query (one more round trip) on
    every release; psycopg_pool does not, and the engine never leaves session
    state behind."""


async def _asyncpg(dsn: str) -> dict[str, float]:
    pool = await asyncpg.create_pool(
        dsn, min_size=CONCURRENCY, max_size=CONCURRENCY, reset=_no_reset
    )
    try:
        enqueue = ENQUEUE.format("$1", "$2")
        claim, ack = CLAIM.format("$1"), ACK.format("$1", "$2")

        async def do_enqueue() -> int:
            for _ in range(BATCHES):
                ids, payloads = _rows()
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(enqueue, ids, payloads)
            return BATCH * BATCHES

        async def do_claims() -> int:
            left = CLAIMS

            async def one() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    async with pool.acquire() as conn:
                        row = await conn.fetchrow(claim, 1)
                    async with pool.acquire() as conn:
                        await conn.fetchrow(ack, row[0], row[1])

            await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
            return CLAIMS

        return await _measure(do_enqueue, do_claims, lambda: pool.execute("TRUNCATE tasks"))
    finally:
        await pool.close()


async def _psycopg(dsn: str) -> dict[str, float]:
    # Not a dependency of ringo_trio: `pip install "psycopg[binary,pool]"` to compare.
    import psycopg_pool

    pool = psycopg_pool.AsyncConnectionPool(
        dsn,
        min_size=CONCURRENCY,
        max_size=CONCURRENCY,
        open=False,
        # Fair to psycopg: without autocommit every pooled use is BEGIN..COMMIT,
        # an extra round trip asyncpg does not make.
        kwargs={"autocommit": True},
    )
    await pool.open(wait=True)
    try:
        enqueue = ENQUEUE.format("%s", "%s")
        claim, ack = CLAIM.format("%(now)s"), ACK.format("%s", "%s")

        async def do_enqueue() -> int:
            for _ in range(BATCHES):
                ids, payloads = _rows()
                async with pool.connection() as conn, conn.transaction():
                    await conn.execute(enqueue, (ids, payloads))
            return BATCH * BATCHES

        async def do_claims() -> int:
            left = CLAIMS

            async def one() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    async with pool.connection() as conn:
                        cur = await conn.execute(claim, {"now": 1}, prepare=True)
                        row = await cur.fetchone()
                    assert row is not None
                    async with pool.connection() as conn:
                        await conn.execute(ack, (row[0], row[1]), prepare=True)

            await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
            return CLAIMS

        async def truncate() -> Any:
            async with pool.connection() as conn:
                await conn.execute("TRUNCATE tasks")

        return await _measure(do_enqueue, do_claims, truncate)
    finally:
        await pool.close()


async def _engine(dsn: str) -> dict[str, float]:
    engine = PostgresEngine(dsn, schema="ringo_bench", pool_size=CONCURRENCY)
    await engine.open()
    clock = Clock()
    lease = timedelta(minutes=5)
    try:

        async def do_enqueue() -> int:
            for _ in range(BATCHES):
                specs = [TaskSpec(task_type="t", payload=b"x" * 64) for _ in range(BATCH)]
                await engine.enqueue("q", specs, clock.now())
            return BATCH * BATCHES

        async def do_claims() -> int:
            left = CLAIMS

            async def one() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    [lt] = await engine.claim("q", [], 1, "w", lease, clock.now())
                    ref = LeaseRef(
                        task_id=lt.lease.task_id,
                        attempt=lt.lease.attempt,
                        lease_token=lt.lease.lease_token,
                    )
                    await engine.ack(ref, clock.now())

            await asyncio.gather(*(one() for _ in range(CONCURRENCY)))
            return CLAIMS

        async def truncate() -> Any:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("TRUNCATE ringo_bench.tasks")
            finally:
                await conn.close()

        return await _measure(do_enqueue, do_claims, truncate)
    finally:
        await engine.close()


async def _measure(
    do_enqueue: Callable[[], Awaitable[int]],
    do_claims: Callable[[], Awaitable[int]],
    truncate: Callable[[], Awaitable[Any]],
) -> dict[str, float]:
    best = {"enqueue rows/s": 0.0, "claim+ack pairs/s": 0.0}
    for _ in range(ROUNDS):
        await truncate()
        best["enqueue rows/s"] = max(best["enqueue rows/s"], await _timed(do_enqueue))
        best["claim+ack pairs/s"] = max(best["claim+ack pairs/s"], await _timed(do_claims))
    return best


def _have_psycopg() -> bool:
    try:
        import psycopg_pool  # noqa: F401
    except ImportError:
        print("psycopg_pool not installed: its row is skipped")
        return False
    return True


async def main(admin: str) -> None:
    name = f"ringo_bench_{secrets.token_hex(4)}"
    admin_conn = await asyncpg.connect(admin)
    await admin_conn.execute(f'CREATE DATABASE "{name}"')
    try:
        dsn = _dsn(admin, name)
        setup = await asyncpg.connect(dsn)
        await setup.execute(SCHEMA)
        await setup.close()
        results = {
            "asyncpg": await _asyncpg(dsn),
            **({"psycopg": await _psycopg(dsn)} if _have_psycopg() else {}),
            "engine": await _engine(dsn),
        }
    finally:
        await admin_conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin_conn.close()
    print(f"{'driver':<10} {'enqueue rows/s':>16} {'claim+ack pairs/s':>19}")
    for driver, numbers in results.items():
        print(
            f"{driver:<10} {numbers['enqueue rows/s']:>16,.0f}"
            f" {numbers['claim+ack pairs/s']:>19,.0f}"
        )


if __name__ == "__main__":
    uvloop.run(main(sys.argv[1] if len(sys.argv) > 1 else "postgresql://postgres@127.0.0.1/test"))
