"""Leases settled one by one (`ack`) against group commits (`settle_many`).

    python bench/settle.py [--tasks 4096] [--groups 1 8 64] [--callers 64] [--repeat 5]
                           [--engine sqlite postgres] [--nacks 0.0]
                           [--checkpoint-off]

Straight on the storage engine, no daemon: per round a fresh store (an
SQLite file in a temporary dir; a fresh PostgreSQL schema in a fresh
database, `_pg.ADMIN`), `--tasks` tasks enqueued and all of them claimed
(untimed), then every lease settled, timed: by `ack` one at a time, or by
`settle_many` in groups of each `--groups` size, back to back on one
asyncio loop (uvloop when importable, as ringod), or by `--callers`
concurrent tasks (Work streams) each settling one lease at a time through
one `GroupCommit`, which forms the groups by itself. `--nacks` makes that share
of the settlements nacks (back to PENDING). Modes alternate within each
repeat, so a load change on the machine hits them alike. `--checkpoint-off`
turns SQLite's automatic WAL checkpoint off for the rounds (the question:
would moving checkpoints off the committing call pay?).

Prints, per engine and mode, the median over the repeats (min-max) of wall
µs per settlement, CPU µs per settlement of this process, of the PostgreSQL
backends too (when the server runs here), and the transactions committed
per settlement (one per engine call: counted; every settlement of these
rounds takes effect, so no miss-path statement runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _pg

from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
from ringo_trio.server.rpc.commit import GroupCommit
from ringo_trio.server.storage.base import Ack, Nack, Settlement, Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(hours=1)
CLAIM_BATCH = 500


async def _leases(engine: Storage, tasks: int) -> list[LeaseRef]:
    for start in range(0, tasks, 1000):
        specs = [TaskSpec(task_type="t") for _ in range(min(1000, tasks - start))]
        await engine.enqueue("q", specs, NOW)
    refs: list[LeaseRef] = []
    while len(refs) < tasks:
        for leased in await engine.claim("q", [], CLAIM_BATCH, "w", LEASE, NOW):
            assert leased.lease is not None
            lease = leased.lease
            refs.append(
                LeaseRef(
                    task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token
                )
            )
    return refs


def _items(refs: list[LeaseRef], nacks: float, seed: int) -> list[Settlement]:
    pick = random.Random(seed)
    return [Nack(r, "busy") if pick.random() < nacks else Ack(r) for r in refs]


async def _settle(engine: Storage, items: Sequence[Settlement], mode: tuple[str, int]) -> int:
    """Settle every item as `mode` says; the transactions it took."""
    how, n = mode
    if how == "ack":
        for item in items:
            if isinstance(item, Ack):
                await engine.ack(item.ref, NOW, item.result)
            else:
                assert isinstance(item, Nack)
                await engine.nack(item.ref, item.error, item.retry_delay, NOW)
        return len(items)
    if how == "many":
        for start in range(0, len(items), n):
            answers = await engine.settle_many(items[start : start + n], NOW)
            assert all(a == "q" for a in answers), answers
        return -(-len(items) // n)
    # `n` callers (Work streams) each settling one lease at a time, through
    # one GroupCommit: the groups form by themselves.
    commit = GroupCommit(engine)
    pending = iter(items)

    async def caller() -> None:
        for item in pending:
            assert await commit.settle([item], NOW) == ["q"]

    async with asyncio.TaskGroup() as tg:
        runner = tg.create_task(commit.run())
        async with asyncio.TaskGroup() as callers:
            for _ in range(n):
                callers.create_task(caller())
        runner.cancel()
    return commit.flushes


async def _round(
    make: Callable[[], Storage],
    dsn: str | None,
    args: argparse.Namespace,
    mode: tuple[str, int],
    seed: int,
) -> dict[str, float]:
    engine = make()
    await engine.open()
    try:
        if args.checkpoint_off and isinstance(engine, SQLiteEngine):
            # No commit runs a checkpoint: what the settlements cost if the
            # daemon checkpointed in its idle time instead.
            engine._conn().execute("PRAGMA wal_autocheckpoint = 0")
        refs = await _leases(engine, args.tasks)
        items = _items(refs, args.nacks, seed)
        server = _pg.server_cpu(dsn) if dsn else {}
        cpu, wall = time.process_time(), time.perf_counter()
        transactions = await _settle(engine, items, mode)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        n = len(items)
        out = {"wall": wall / n * 1e6, "cpu": cpu / n * 1e6, "tx": transactions / n}
        if dsn:
            out["server"] = _pg.cpu_since(dsn, server) / n * 1e6
        return out
    finally:
        await engine.close()


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4096)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--callers", type=int, nargs="+", default=[64])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--engine", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--nacks", type=float, default=0.0)
    parser.add_argument(
        "--checkpoint-off",
        action="store_true",
        help="SQLite: no automatic WAL checkpoint during the round",
    )
    args = parser.parse_args()
    try:
        import uvloop

        run: Callable[[Any], Any] = uvloop.run
    except ImportError:
        run = asyncio.run
    modes = [("ack", 0), *(("many", g) for g in args.groups)]
    modes += [("commit", c) for c in args.callers]
    label = {
        "ack": "ack one by one",
        "many": "settle_many, groups of {}",
        "commit": "GroupCommit, {} caller(s) settling one at a time",
    }
    print(f"{args.tasks} settlements per round, {args.nacks:.0%} nacks, median of {args.repeat}")
    print(f"python {sys.version.split()[0]}\n")
    print(
        "| engine | mode | wall µs/settlement | CPU µs (bench) | CPU µs (server) | tx/settlement |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind in args.engine:
        results: dict[tuple[str, int], list[dict[str, float]]] = {m: [] for m in modes}
        with contextlib.ExitStack() as stack:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            dsn = stack.enter_context(_pg.fresh_database()) if kind == "postgres" else None
            for r in range(args.repeat):
                for m in modes:
                    make: Callable[[], Storage]
                    if dsn is not None:
                        schema = f"s_{uuid.uuid4().hex[:12]}"
                        make = functools.partial(PostgresEngine, dsn, schema=schema)
                    else:
                        make = functools.partial(SQLiteEngine, scratch / f"{r}-{m[0]}{m[1]}.db")
                    results[m].append(run(_round(make, dsn, args, m, seed=r)))
        for m in modes:
            rows = results[m]
            cells = [
                _summary([x["wall"] for x in rows]),
                _summary([x["cpu"] for x in rows]),
                _summary([x["server"] for x in rows]) if dsn else "-",
                f"1/{1 / statistics.median(x['tx'] for x in rows):.3g}",
            ]
            print(f"| {kind} | {label[m[0]].format(m[1])} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
