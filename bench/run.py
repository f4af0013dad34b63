"""Benchmarks: one private daemon on SQLite, one SDK process under trio.

Writes a results table to bench/results.md (and prints it). Numbers from a
shared 2-core machine are noisy; each row is the best of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import trio

from ringo_trio import Ringo, RingoClient, TaskSpec

RESULTS = pathlib.Path(__file__).with_name("results.md")


async def _sequential_enqueue(client: RingoClient, n: int) -> float:
    q = client.queue("bench-seq")
    t0 = time.perf_counter()
    for _ in range(n):
        await q.enqueue(task_type="t", payload=b"x")
    return n / (time.perf_counter() - t0)


async def _concurrent_enqueue(client: RingoClient, n: int, width: int = 40) -> float:
    q = client.queue("bench-conc")
    per = n // width

    async def one() -> None:
        for _ in range(per):
            await q.enqueue(task_type="t", payload=b"x")

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(one)
    return per * width / (time.perf_counter() - t0)


async def _enqueue_many(client: RingoClient, n: int) -> float:
    q = client.queue("bench-many")
    specs = [TaskSpec(task_type="t", payload=b"x" * 64) for _ in range(n)]
    t0 = time.perf_counter()
    await q.enqueue_many(specs)
    return n / (time.perf_counter() - t0)


async def _claim_ack(client: RingoClient, n: int, width: int = 16) -> float:
    q = client.queue("bench-claim")
    await q.enqueue_many([TaskSpec(task_type="t", payload=b"x") for _ in range(n)])
    done = 0

    async def loop() -> None:
        nonlocal done
        while done < n:
            batch = await q.claim(32, lease_duration=timedelta(seconds=60))
            if not batch:
                return
            for leased in batch:
                await leased.ack()
                done += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(loop)
    return done / (time.perf_counter() - t0)


async def _best(repeat: int, fn: Callable[[], Awaitable[float]]) -> float:
    return max([await fn() for _ in range(repeat)])


async def _run(args: argparse.Namespace) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    n = args.n
    with tempfile.TemporaryDirectory(prefix="ringo-bench-") as data_dir:
        async with Ringo.local(data_dir) as client:
            cases: list[tuple[str, str, Callable[[], Awaitable[float]]]] = [
                ("Enqueue, sequential", "calls/s", lambda: _sequential_enqueue(client, n)),
                ("Enqueue, 40 concurrent", "calls/s", lambda: _concurrent_enqueue(client, n)),
                (
                    "enqueue_many (batches of 1000)",
                    "tasks/s",
                    lambda: _enqueue_many(client, 10 * n),
                ),
                (
                    "manual claim(32) + unary ack, 16 loops",
                    "tasks/s",
                    lambda: _claim_ack(client, n),
                ),
            ]
            for name, unit, fn in cases:
                rows.append((name, f"{await _best(args.repeat, fn):,.0f} {unit}"))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rows.append(("SDK process peak RSS", f"{rss_mb:.0f} MB"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=2000, help="operations per measurement")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = trio.run(_run, args)
    header = (
        f"# Benchmarks\n\n{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}; best of {args.repeat}, n={args.n}.\n"
        "One private daemon (SQLite, uvloop) and one SDK process under trio.\n\n"
    )
    table = "| measurement | result |\n| --- | --- |\n" + "".join(
        f"| {name} | {value} |\n" for name, value in rows
    )
    RESULTS.write_text(header + table)
    sys.stdout.write(header + table)


if __name__ == "__main__":
    main()
