"""Keyed limits in real time, on two ``ringod`` processes sharing one fresh
PostgreSQL database (bench/_pg.py), four workers (two per daemon) in this
process:

1. **rate**: 50/s with burst 1 on one key, 30 s of starts: the measured rate
   (starts in the window / 30 s) against 50/s (goal: within 5%), and the
   smallest gap between two starts.
2. **fairness**: a key with 10,000 tasks, then a key with 10, both 20/s
   burst 1: how late each small-key task starts after its own schedule
   (the i-th due i/20 s after the workers start; goal: all within 1 s).

    python bench/limits.py [--seconds 30] [--rate 50]

Real time, so it is a benchmark, not a test (tests assert no timing; the
same properties are held on virtual time in tests/queue/test_limits.py).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager
from pathlib import Path

import trio

# The bench helpers, and this tree's ringo_trio before the installed one.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _pg

from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskSpec
from ringo_trio.testing import DaemonProcess

WORKERS_PER_DAEMON = 2


@asynccontextmanager
async def setup(dsn: str) -> AsyncIterator[list[RingoClient]]:
    with ExitStack() as stack:
        daemons = []
        for _ in range(2):
            daemon = DaemonProcess(None, postgres_dsn=dsn)
            daemon.start()
            stack.callback(daemon.stop)
            daemons.append(daemon)
        async with AsyncExitStack() as clients:
            yield [await clients.enter_async_context(Ringo.connect(d.endpoint)) for d in daemons]


async def run_workers(
    clients: Sequence[RingoClient],
    queue: str,
    seconds: float,
    starts: dict[str, list[float]],
    leased: list[float] | None = None,
) -> None:
    if leased is None:
        leased = []

    async def handle(task: Task, ctx: TaskContext) -> None:
        starts.setdefault(task.limit_key or "", []).append(time.monotonic())
        if task.lease_until is not None:
            # Every lease is granted for the same duration: its end, less
            # that, is the claim's instant on the daemon (µs).
            leased.append(task.lease_until.timestamp())

    async with trio.open_nursery() as nursery:
        for client in clients:
            for _ in range(WORKERS_PER_DAEMON):
                worker = client.queue(queue).worker(handle, concurrency=8)
                await nursery.start(worker.run)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def enqueue(client: RingoClient, queue: str, key: str, n: int) -> None:
    q = client.queue(queue)
    for start in range(0, n, 1000):
        await q.enqueue_many([TaskSpec("t", limit_key=key) for _ in range(min(1000, n - start))])


async def rate_round(clients: list[RingoClient], rate: float, seconds: float) -> None:
    queue = "bench-rate"
    await clients[0].queue(queue).set_limit("api:", rate=rate, burst=1)
    await enqueue(clients[0], queue, "api:x", int(rate * seconds * 1.5) + 100)
    starts: dict[str, list[float]] = {}
    claimed: list[float] = []
    await run_workers(clients, queue, seconds + 2, starts, claimed)
    claimed.sort()
    claim_gaps = [b - a for a, b in itertools.pairwise(claimed)]
    times = sorted(starts["api:x"])
    t0 = times[0]
    window = [t for t in times if t - t0 < seconds]
    measured = len(window) / seconds
    gaps = [b - a for a, b in itertools.pairwise(window)]
    off = (measured - rate) / rate
    print(f"rate: {len(window)} starts in {seconds:g} s = {measured:.2f}/s against {rate:g}/s"
          f" ({off:+.1%}; goal within 5%: {'met' if abs(off) <= 0.05 else 'NOT met'});"
          f" gaps min {min(gaps) * 1000:.1f} ms, median"
          f" {sorted(gaps)[len(gaps) // 2] * 1000:.1f} ms at the handlers (delivery jitter"
          f" included); at the claims (daemon clock, from lease_until) min"
          f" {min(claim_gaps) * 1000:.1f} ms, median"
          f" {sorted(claim_gaps)[len(claim_gaps) // 2] * 1000:.1f} ms")  # fmt: skip


async def fairness_round(clients: list[RingoClient]) -> None:
    queue = "bench-fair"
    await clients[0].queue(queue).set_limit("", rate=20, burst=1)
    await enqueue(clients[0], queue, "deep", 10_000)
    await enqueue(clients[1], queue, "small", 10)
    starts: dict[str, list[float]] = {}
    began = time.monotonic()
    await run_workers(clients, queue, 3, starts)
    small = sorted(starts.get("small", []))
    late = [at - (began + i / 20) for i, at in enumerate(small)]
    met = len(small) == 10 and max(late) <= 1
    print(f"fairness: {len(small)}/10 small-key tasks started beside 10,000 of another key"
          f" ({len(starts.get('deep', []))} deep starts in 3 s); lateness after own schedule"
          f" max {max(late):.3f} s, each {[round(x, 3) for x in late]}"
          f" (goal all within 1 s: {'met' if met else 'NOT met'})")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    with _pg.fresh_database() as dsn:
        async with setup(dsn) as clients:
            await rate_round(clients, args.rate, args.seconds)
            await fairness_round(clients)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0)
    trio.run(main, parser.parse_args())
