"""`ringo` command line: `ringo demo` runs the main job end to end on the embedded default."""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TextIO

import trio

from ._client import Ringo
from ._models import TaskSpec
from ._queue import LeasedTask, TaskQueue


@dataclass
class _DemoStats:
    total: int
    done: int = 0
    succeeded: int = 0
    retries: int = 0
    dead: int = 0
    latencies: list[float] = field(default_factory=list)


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def _bar(stats: _DemoStats, started: float, out: TextIO) -> None:
    width = 30
    filled = int(width * stats.done / stats.total) if stats.total else width
    elapsed = max(time.monotonic() - started, 1e-9)
    out.write(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {stats.done}/{stats.total}"
        f"  {stats.done / elapsed:,.0f} tasks/s  retries {stats.retries}  dead {stats.dead}"
    )
    out.flush()


async def _process(
    leased: LeasedTask, stats: _DemoStats, enqueued_at: dict[str, float], args: argparse.Namespace
) -> None:
    if args.sleep > 0:
        await trio.sleep(args.sleep)
    if random.random() < args.failure_rate:
        await leased.nack("demo failure", delay=timedelta(0))
        if leased.attempt >= leased.task.max_attempts:
            # The daemon turns a failed last attempt into DEAD; it is never delivered again.
            stats.dead += 1
            stats.done += 1
        else:
            stats.retries += 1
        return
    await leased.ack()
    stats.done += 1
    stats.succeeded += 1
    stats.latencies.append(time.monotonic() - enqueued_at[leased.task.id])


async def _claim_loop(
    queue: TaskQueue,
    stats: _DemoStats,
    enqueued_at: dict[str, float],
    args: argparse.Namespace,
) -> None:
    while stats.done < stats.total:
        batch = await queue.claim(
            min(args.batch, 1000),
            wait_timeout=timedelta(milliseconds=200),
            lease_duration=timedelta(seconds=30),
        )
        async with trio.open_nursery() as nursery:
            for leased in batch:
                nursery.start_soon(_process, leased, stats, enqueued_at, args)


async def _demo(args: argparse.Namespace, out: TextIO) -> None:
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="ringo-demo-")
    out.write(f"ringo demo: private daemon on SQLite in {data_dir}\n")
    async with Ringo.local(data_dir) as client:
        queue = client.queue(args.queue)
        specs = [
            TaskSpec(task_type="demo", payload=f"task-{i}".encode(), max_attempts=args.max_attempts)
            for i in range(args.tasks)
        ]
        t0 = time.monotonic()
        result = await queue.enqueue_many(specs)
        enqueue_seconds = time.monotonic() - t0
        enqueued_at = {r.task.id: t0 for r in result.results}
        stats = _DemoStats(total=len(enqueued_at))
        started = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(args.concurrency):
                nursery.start_soon(_claim_loop, queue, stats, enqueued_at, args)
            while stats.done < stats.total:
                _bar(stats, started, out)
                await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        _bar(stats, started, out)
        elapsed = time.monotonic() - started
        latencies = sorted(stats.latencies)
        out.write("\n\n")
        rows = [
            ("tasks", f"{stats.total:,}"),
            ("enqueue (enqueue_many)", f"{stats.total / max(enqueue_seconds, 1e-9):,.0f} tasks/s"),
            ("processed", f"{stats.total / max(elapsed, 1e-9):,.0f} tasks/s in {elapsed:.2f} s"),
            ("latency p50 enqueue→ack", f"{_percentile(latencies, 0.50) * 1000:,.0f} ms"),
            ("latency p99 enqueue→ack", f"{_percentile(latencies, 0.99) * 1000:,.0f} ms"),
            ("succeeded", f"{stats.succeeded:,}"),
            ("retries", f"{stats.retries:,}"),
            ("dead", f"{stats.dead:,}"),
        ]
        width = max(len(name) for name, _ in rows)
        out.write(f"| {'metric'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|\n")
        for name, value in rows:
            out.write(f"| {name.ljust(width)} | {value} |\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringo", description="Ringo task queue tools")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="enqueue and process tasks on a private SQLite daemon, then summarize"
    )
    demo.add_argument("-n", "--tasks", type=int, default=10_000, help="tasks to run (10000)")
    demo.add_argument("-c", "--concurrency", type=int, default=8, help="parallel claim loops (8)")
    demo.add_argument("--batch", type=int, default=64, help="tasks claimed per call (64)")
    demo.add_argument(
        "--failure-rate", type=float, default=0.0, help="fraction of attempts that nack (0)"
    )
    demo.add_argument("--sleep", type=float, default=0.0, help="seconds each handler sleeps (0)")
    demo.add_argument("--max-attempts", type=int, default=3, help="attempts per task (3)")
    demo.add_argument("--queue", default="demo", help="queue name (demo)")
    demo.add_argument("--data-dir", default=None, help="data dir (default: a fresh temp dir)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        if args.tasks < 1 or args.concurrency < 1 or args.batch < 1:
            print("ringo demo: --tasks, --concurrency and --batch must be >= 1", file=sys.stderr)
            return 2
        if not 0.0 <= args.failure_rate < 1.0:
            print("ringo demo: --failure-rate must be in [0, 1)", file=sys.stderr)
            return 2
        try:
            trio.run(_demo, args, sys.stdout)
        except KeyboardInterrupt:
            return 130
    return 0
