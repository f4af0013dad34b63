"""What every peer benchmark (`bench/peer_*.py`) reports: one run of its
worker process, and the line its command line prints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass

import _stats


@dataclass
class PeerRun:
    tasks: int
    concurrency: int
    enqueue_rate: float  # tasks/s, the peer's bulk enqueue in calls of 1000
    rate: float  # steady rate after the first completion
    worker_cpu: float  # CPU seconds of the worker process, first → last completion
    server_cpu: float  # CPU seconds of the database's backends (or redis-server), same span
    peak_rss_mb: float
    elapsed: float  # first → last completion

    @property
    def counted(self) -> int:
        """Tasks the CPU figures are about (those done after the first)."""
        return max(1, round(self.rate * self.elapsed))


def measured(
    *,
    tasks: int,
    concurrency: int,
    enqueue_rate: float,
    first: tuple[float, int],
    last_at: float,
    worker_cpu: float,
    server_cpu: float,
    peak_rss_mb: float,
) -> PeerRun:
    """A run timed from its first observed completions (`first`: the time,
    and how many were done then) to its last (`last_at`, seconds)."""
    first_at, done_at_first = first
    return PeerRun(
        tasks=tasks,
        concurrency=concurrency,
        enqueue_rate=enqueue_rate,
        rate=_stats.steady_rate(tasks, done_at_first, first_at, last_at),
        worker_cpu=worker_cpu,
        server_cpu=server_cpu,
        peak_rss_mb=peak_rss_mb,
        elapsed=last_at - first_at,
    )


def report(result: PeerRun, what: str, server: str = "PostgreSQL") -> str:
    """The JSON line of `result` (bench/run.py reads it) and a line for people."""
    per = 1000 / result.counted
    return (
        json.dumps(result.__dict__)
        + f"\n{what}, concurrency {result.concurrency}, {result.tasks:,} tasks:"
        f" {result.rate:,.0f} tasks/s steady ({result.elapsed:.2f} s), CPU per 1,000:"
        f" worker {result.worker_cpu * per:.3f} s, {server} {result.server_cpu * per:.3f} s;"
        f" peak RSS {result.peak_rss_mb:.1f} MB; enqueue {result.enqueue_rate:,.0f} tasks/s"
    )


def command(
    doc: str | None,
    run: Callable[[int, int, float], PeerRun],
    what: Callable[[float], str],
    *,
    sleeps: bool = True,
    server: str = "PostgreSQL",
) -> None:
    """A peer benchmark's command line: ``--tasks``, ``--concurrency`` and
    (with `sleeps`) ``--sleep``, 0 (no-op) or 0.01 (10 ms); runs `run` and
    prints `report` of it, named `what(sleep)`."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    if sleeps:
        parser.add_argument(
            "--sleep", type=float, default=0.0, help="the handler's sleep: 0 or 0.01 (10 ms)"
        )
    args = parser.parse_args()
    sleep = args.sleep if sleeps else 0.0
    if sleep not in (0.0, 0.01):
        parser.error("--sleep is 0 (no-op) or 0.01 (10 ms)")
    print(report(run(args.tasks, args.concurrency, sleep), what(sleep), server=server))
