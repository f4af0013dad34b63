"""A claim of some task types behind a backlog of other types (engine alone).

    PYTHONPATH=. python bench/typed_claim.py [--ahead 50000] [--claims 10]
                                             [--postgres DSN]

Per engine (SQLite in a temporary file; PostgreSQL in a scratch schema of
``--postgres``, dropped afterwards): ``--ahead`` PENDING tasks of type ``b``
enqueued first, then 2,000 of type ``a``; then ``--claims`` claims of 64 with
``task_types=["a"]``, as many with ``["a", "c"]`` (a type with no task: a
second walk), as many without types (they take ``b`` tasks, the head of the
queue), and as many wake-ups (`next_wakeup`) of ``["a"]``. Prints the mean
milliseconds of each, and of enqueueing the backlog (calls of 1,000), per
1,000 tasks. Every registry's worker claims with its task types, so
a claim that walks the other types' backlog grows with it (docs/deployment.md,
"Claims of some task types").
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from ringo_trio._proto.ringo.v1 import TaskSpec
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

LEASE = timedelta(seconds=30)
BATCH = 64


async def measure(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    now = datetime.now(UTC)
    started = time.perf_counter()
    for start in range(0, ahead, 1000):
        await engine.enqueue("q", [TaskSpec(task_type="b")] * min(1000, ahead - start), now)
    enqueue_ms = (time.perf_counter() - started) / ahead * 1000 * 1000
    await engine.enqueue("q", [TaskSpec(task_type="a")] * 2000, now)
    later = now + timedelta(seconds=1)

    async def mean_ms(call: Callable[[], Awaitable[Any]]) -> float:
        started = time.perf_counter()
        for _ in range(claims):
            await call()
        return (time.perf_counter() - started) / claims * 1000

    return {
        "enqueue, per 1,000": enqueue_ms,
        'claim ["a"]': await mean_ms(lambda: engine.claim("q", ["a"], BATCH, "w", LEASE, later)),
        'claim ["a", "c"]': await mean_ms(
            lambda: engine.claim("q", ["a", "c"], BATCH, "w", LEASE, later)
        ),
        "claim, no types": await mean_ms(lambda: engine.claim("q", [], BATCH, "w", LEASE, later)),
        'next_wakeup ["a"]': await mean_ms(lambda: engine.next_wakeup("q", ["a"], later)),
    }


async def run(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    await engine.open()
    try:
        return await measure(engine, ahead, claims)
    finally:
        await engine.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ahead", type=int, default=50_000)
    parser.add_argument("--claims", type=int, default=10)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        sqlite = SQLiteEngine(pathlib.Path(scratch) / "ringo.db")
        results["sqlite"] = await run(sqlite, args.ahead, args.claims)
    schema = f"bench_typed_claim_{time.time_ns()}"
    try:
        results["postgres"] = await run(
            PostgresEngine(args.postgres, schema=schema), args.ahead, args.claims
        )
    finally:
        conn = await asyncpg.connect(args.postgres)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    print(f"{args.ahead:,} tasks of another type ahead; ms per call (claims of {BATCH})")
    names = list(results["sqlite"])
    print(f"| {'':20} | " + " | ".join(f"{n:>18}" for n in names) + " |")
    for engine_name, row in results.items():
        print(f"| {engine_name:20} | " + " | ".join(f"{row[n]:18.2f}" for n in names) + " |")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
