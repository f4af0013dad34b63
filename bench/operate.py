"""Inspection at 1,000,000 tasks: ListTasks, GetQueueStats, ListQueues on both engines.

Run: ``python bench/operate.py [--tasks N] [--repeat R] [--engine sqlite|postgres|both]
[--postgres ADMIN_DSN]`` (default 1,000,000 tasks, 50 repeats, both engines,
the local test server at 127.0.0.1:5432 database ``test``; a schema of its
own, dropped afterwards).

Fills one queue ``big`` with N tasks through the engine's own ``enqueue`` (calls
of 1000; 10% of them with a unique key ``k<n>``, task types ``a``/``b`` and a
rare ``c`` every 1,000th), plus 200 small queues of 5 tasks, then moves tasks
to a realistic mix of states with one UPDATE per state (70% SUCCEEDED, 5%
DEAD, 1% LEASED, the rest PENDING; on SQLite the counting triggers see those
UPDATEs like any other). It then times the engine calls the RPCs make -- on
SQLite this is exactly the time the daemon's event loop is held -- and
prints p50 / p99 / max in milliseconds:

* ListTasks first page (100, oldest first), newest first, a deep page (cursor
  at 90% of the queue), a DEAD-only page (first and deep), a rare type's
  page, a unique-key-prefix page (the budgeted walk), a 1000-task page;
* GetQueueStats of ``big`` (by type), ListQueues first page (100 queues) and
  a page after ``big``.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from ringo_trio._proto.ringo.v1 import TaskSpec, TaskState
from ringo_trio.server.clock import Clock
from ringo_trio.server.storage.base import Storage, TaskFilter
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

BATCH = 1000
SMALL_QUEUES = 200
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def fill(engine: Storage, tasks: int) -> None:
    now = Clock().now()
    started = time.perf_counter()
    for start in range(0, tasks, BATCH):
        specs = []
        for n in range(start, min(start + BATCH, tasks)):
            task_type = "c" if n % 1000 == 999 else "ab"[n % 2]
            key = f"k{n:07d}" if n % 10 == 0 else ""
            specs.append(TaskSpec(task_type=task_type, payload=b"x" * 100, unique_key=key))
        await engine.enqueue("big", specs, now)
    for q in range(SMALL_QUEUES):
        await engine.enqueue(f"small-{q:03d}", [TaskSpec(task_type="a")] * 5, now)
    print(f"  filled {tasks:,} tasks in {time.perf_counter() - started:.0f} s", flush=True)


# state, seq % 100 below which the big queue's tasks get it (applied in order).
MIX = [(int(TaskState.SUCCEEDED), 70), (int(TaskState.DEAD), 75), (int(TaskState.LEASED), 76)]


def mix_sql(table: str, placeholder: str) -> list[str]:
    out = []
    low = 0
    for state, high in MIX:
        extra = ""
        if state == int(TaskState.LEASED):
            extra = f", lease_until = {placeholder}, worker_id = 'w', lease_token = 't'"
        else:
            extra = f", finished_at = {placeholder}"
        out.append(
            f"UPDATE {table} SET state = {state}{extra} WHERE queue = 'big'"
            f" AND seq % 100 >= {low} AND seq % 100 < {high}"
        )
        low = high
    return out


async def mix_sqlite(engine: SQLiteEngine) -> None:
    db = engine._db
    assert db is not None
    now_us = int(time.time() * 1e6)
    db.execute("BEGIN IMMEDIATE")
    for sql in mix_sql("tasks", "?"):
        db.execute(sql, (now_us + 3600 * 10**6 if "lease_until" in sql else now_us,))
    db.execute("COMMIT")
    db.execute("ANALYZE")


async def mix_postgres(engine: PostgresEngine) -> None:
    now_us = int(time.time() * 1e6)
    async with engine._conn() as conn:
        for sql in mix_sql(engine._sql.tasks, "$1"):
            await conn.execute(sql, now_us + 3600 * 10**6 if "lease_until" in sql else now_us)
        await conn.execute(f"VACUUM ANALYZE {engine._sql.tasks}")


async def timed(repeat: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float, float]:
    await call()  # warm caches and statement caches
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return statistics.median(samples), p99, samples[-1]


async def measure(engine: Storage, tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    now = Clock().now()
    deep = int(tasks * 0.9)
    dead = TaskFilter(states=(int(TaskState.DEAD),))

    def page(where: TaskFilter | None = None, **kw: Any) -> Callable[[], Awaitable[Any]]:
        args = {"newest_first": False, "after": None, "limit": 100, **kw}
        return lambda: engine.list_tasks("big", where or TaskFilter(), **args)

    cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("ListTasks first page (100)", page()),
        ("ListTasks first page, newest first", page(newest_first=True)),
        ("ListTasks deep page (cursor at 90%)", page(after=deep)),
        ("ListTasks 1000-task page", page(limit=1000)),
        ("ListTasks DEAD only, first page", page(dead)),
        ("ListTasks DEAD only, deep page", page(dead, after=deep)),
        ("ListTasks rare type (0.1%), first page", page(TaskFilter(task_types=("c",)))),
        ("ListTasks key prefix, first page", page(TaskFilter(unique_key_prefix="k09"))),
        ("GetQueueStats (by type)", lambda: engine.queue_stats("big", now, by_type=True)),
        ("ListQueues first page (100)", lambda: engine.list_queues(now, after="", limit=101)),
        ("ListQueues page after 'big'", lambda: engine.list_queues(now, after="big", limit=101)),
    ]
    results = []
    for name, call in cases:
        figures = await timed(repeat, call)
        print(f"  {name}: p50 {figures[0]:.2f} ms, p99 {figures[1]:.2f} ms", flush=True)
        results.append((name, figures))
    return results


async def run_sqlite(tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    with tempfile.TemporaryDirectory(prefix="ringo-operate-") as scratch:
        engine = SQLiteEngine(pathlib.Path(scratch) / "ringo.db")
        await engine.open()
        try:
            await fill(engine, tasks)
            await mix_sqlite(engine)
            return await measure(engine, tasks, repeat)
        finally:
            await engine.close()


async def run_postgres(dsn: str, tasks: int, repeat: int) -> list[tuple[str, tuple[float, ...]]]:
    schema = "bench_operate_" + secrets.token_hex(4)
    engine = PostgresEngine(dsn, schema=schema)
    await engine.open()
    try:
        await fill(engine, tasks)
        await mix_postgres(engine)
        return await measure(engine, tasks, repeat)
    finally:
        async with engine._conn() as conn:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--engine", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--postgres", default=DEFAULT_DSN, help="database to make a schema in")
    args = parser.parse_args()
    tables = {}
    if args.engine in ("sqlite", "both"):
        print("SQLite:", flush=True)
        tables["SQLite"] = asyncio.run(run_sqlite(args.tasks, args.repeat))
    if args.engine in ("postgres", "both"):
        print("PostgreSQL:", flush=True)
        tables["PostgreSQL"] = asyncio.run(run_postgres(args.postgres, args.tasks, args.repeat))
    names = list(tables)
    print()
    print(f"{args.tasks:,} tasks, {args.repeat} repeats, milliseconds (p50 / p99):")
    print()
    print("| call | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for i, (call, _) in enumerate(next(iter(tables.values()))):
        cells = [f"{t[i][1][0]:.2f} / {t[i][1][1]:.2f}" for t in tables.values()]
        print(f"| {call} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
