"""Claims behind a backlog they may not take (engine alone).

    PYTHONPATH=. python bench/claim_backlog.py [--case typed|keyed|keys|typed_limited|all]
        [--ahead 50000] [--claims 10] [--postgres DSN]

Per engine (SQLite in a temporary file; PostgreSQL in a scratch schema of
``--postgres``, dropped afterwards), ``--ahead`` PENDING tasks enqueued first
that the claims measured must not walk, then 2,000 they take (``keys``:
many keys instead):

* ``typed``: the backlog is of type ``b``, then 2,000 of type ``a``;
  ``--claims`` claims of 64 with ``task_types=["a"]``, as many with
  ``["a", "c"]`` (a type with no task: a second walk), as many without types
  (they take ``b`` tasks, the head of the queue), and as many wake-ups
  (`next_wakeup`) of ``["a"]``. Every registry's worker claims with its task
  types (docs/deployment.md, "Claims of some task types").
* ``keyed``: the queue has a rule (``tenant:``, concurrency 1) and the
  backlog is one key's (``tenant:big``), held by its rule after its first
  task is leased; then 2,000 tasks without a key. Claims of 64 (each takes
  unkeyed tasks: the key's one slot is taken), as many wake-ups, then (the
  unkeyed tasks all claimed) as many claims and wake-ups of the idle queue,
  which must find the key's next start: a limited queue's claim reads its
  unkeyed tasks apart from its keys' (docs/limits.md, "Fairness").
* ``keys``: the same rule at concurrency 2, ``--ahead`` / 10 keys with ten
  tasks each; claims of 64 while keys may start tasks, then (every key
  holding its two leases) claims and wake-ups of the idle queue, which look
  at every key (at most `MAX_LIMIT_KEYS_PER_CLAIM`, 1,000).

* ``typed_limited``: the queue has a rule (``tenant:``, concurrency 1),
  the backlog is of type ``b``, half without a key and half under the key
  ``tenant:b``, then ten tasks of type ``a`` under another key and 2,000 of
  type ``a`` without; claims of 64 and wake-ups with
  ``task_types=["a"]``: a registry's worker on a queue with keyed limits
  that another registry's backlog shares (docs/deployment.md, "Claims of
  some task types on a queue with keyed limits").

Prints the mean milliseconds of each, and of enqueueing the backlog (calls
of 1,000) per 1,000 tasks.
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
from ringo_trio.server.storage.limits import Rule
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

LEASE = timedelta(seconds=30)
BATCH = 64


async def enqueue_ms(engine: Storage, specs: list[TaskSpec], now: datetime) -> float:
    """Enqueue `specs` in calls of 1,000; ms per 1,000."""
    started = time.perf_counter()
    for start in range(0, len(specs), 1000):
        await engine.enqueue("q", specs[start : start + 1000], now)
    return (time.perf_counter() - started) / len(specs) * 1000 * 1000


def mean_ms(claims: int) -> Callable[[Callable[[], Awaitable[Any]]], Awaitable[float]]:
    async def mean(call: Callable[[], Awaitable[Any]]) -> float:
        started = time.perf_counter()
        for _ in range(claims):
            await call()
        return (time.perf_counter() - started) / claims * 1000

    return mean


async def idle(
    engine: Storage,
    mean: Callable[[Callable[[], Awaitable[Any]]], Awaitable[float]],
    later: datetime,
) -> dict[str, float]:
    """Claim every task that may start at `later`, then time the claims
    and wake-ups of the queue with nothing to take."""
    while await engine.claim("q", [], 1000, "w", LEASE, later):
        pass
    return {
        "claim, idle": await mean(lambda: engine.claim("q", [], BATCH, "w", LEASE, later)),
        "next_wakeup, idle": await mean(lambda: engine.next_wakeup("q", [], later)),
    }


async def typed(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    now = datetime.now(UTC)
    enqueue = await enqueue_ms(engine, [TaskSpec(task_type="b")] * ahead, now)
    await engine.enqueue("q", [TaskSpec(task_type="a")] * 2000, now)
    later = now + timedelta(seconds=1)
    mean = mean_ms(claims)
    return {
        "enqueue, per 1,000": enqueue,
        'claim ["a"]': await mean(lambda: engine.claim("q", ["a"], BATCH, "w", LEASE, later)),
        'claim ["a", "c"]': await mean(
            lambda: engine.claim("q", ["a", "c"], BATCH, "w", LEASE, later)
        ),
        "claim, no types": await mean(lambda: engine.claim("q", [], BATCH, "w", LEASE, later)),
        'next_wakeup ["a"]': await mean(lambda: engine.next_wakeup("q", ["a"], later)),
    }


async def keyed(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    now = datetime.now(UTC)
    await engine.set_limit("q", Rule("tenant:", 0.0, 1_000_000, 1, 1), now)
    enqueue = await enqueue_ms(
        engine, [TaskSpec(task_type="b", limit_key="tenant:big")] * ahead, now
    )
    await engine.enqueue("q", [TaskSpec(task_type="a")] * 2000, now)
    later = now + timedelta(seconds=1)
    mean = mean_ms(claims)
    return {
        "enqueue, per 1,000": enqueue,
        "claim": await mean(lambda: engine.claim("q", [], BATCH, "w", LEASE, later)),
        "next_wakeup": await mean(lambda: engine.next_wakeup("q", [], later)),
        # Nothing to take then: the key's one slot is leased, the unkeyed are gone.
        **await idle(engine, mean, later),
    }


async def keys(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    now = datetime.now(UTC)
    await engine.set_limit("q", Rule("tenant:", 0.0, 1_000_000, 1, 2), now)
    count = max(ahead // 10, 1)
    specs = [TaskSpec(task_type="a", limit_key=f"tenant:{k}") for k in range(count)]
    enqueue = await enqueue_ms(engine, specs * 10, now)
    later = now + timedelta(seconds=1)
    mean = mean_ms(claims)
    return {
        "enqueue, per 1,000": enqueue,
        "claim": await mean(lambda: engine.claim("q", [], BATCH, "w", LEASE, later)),
        # Every key holds its two leases then: nothing to take, every key to look at.
        **await idle(engine, mean, later),
    }


async def typed_limited(engine: Storage, ahead: int, claims: int) -> dict[str, float]:
    now = datetime.now(UTC)
    await engine.set_limit("q", Rule("tenant:", 0.0, 1_000_000, 1, 1), now)
    half = ahead // 2
    enqueue = await enqueue_ms(
        engine,
        [TaskSpec(task_type="b")] * half + [TaskSpec(task_type="b", limit_key="tenant:b")] * half,
        now,
    )
    await engine.enqueue("q", [TaskSpec(task_type="a", limit_key="tenant:big")] * 10, now)
    await engine.enqueue("q", [TaskSpec(task_type="a")] * 2000, now)
    later = now + timedelta(seconds=1)
    mean = mean_ms(claims)
    return {
        "enqueue, per 1,000": enqueue,
        'claim ["a"]': await mean(lambda: engine.claim("q", ["a"], BATCH, "w", LEASE, later)),
        'next_wakeup ["a"]': await mean(lambda: engine.next_wakeup("q", ["a"], later)),
    }


CASES = {"typed": typed, "keyed": keyed, "keys": keys, "typed_limited": typed_limited}


async def run(
    case: Callable[[Storage, int, int], Awaitable[dict[str, float]]],
    engine: Storage,
    ahead: int,
    claims: int,
) -> dict[str, float]:
    await engine.open()
    try:
        return await case(engine, ahead, claims)
    finally:
        await engine.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--ahead", type=int, default=50_000)
    parser.add_argument("--claims", type=int, default=10)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    for name in CASES if args.case == "all" else [args.case]:
        case = CASES[name]
        results: dict[str, dict[str, float]] = {}
        with tempfile.TemporaryDirectory() as scratch:
            sqlite = SQLiteEngine(pathlib.Path(scratch) / "ringo.db")
            results["sqlite"] = await run(case, sqlite, args.ahead, args.claims)
        schema = f"bench_claim_backlog_{time.time_ns()}"
        try:
            results["postgres"] = await run(
                case, PostgresEngine(args.postgres, schema=schema), args.ahead, args.claims
            )
        finally:
            conn = await asyncpg.connect(args.postgres)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
        print(f"{name}: {args.ahead:,} tasks ahead; ms per call (claims of {BATCH})")
        names = list(results["sqlite"])
        print(f"| {'':20} | " + " | ".join(f"{n:>18}" for n in names) + " |")
        for engine_name, row in results.items():
            print(f"| {engine_name:20} | " + " | ".join(f"{row[n]:18.2f}" for n in names) + " |")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
