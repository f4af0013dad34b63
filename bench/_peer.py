"""What every peer benchmark (`bench/peer_*.py`) reports: one run of its
worker process, and the line its command line prints."""

from __future__ import annotations

import json
from dataclasses import dataclass


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
