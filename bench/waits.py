"""WaitTask with many parked calls: the daemon's memory and its health latency.

    python bench/waits.py [--waiters 5000] [--connections 100] [--seconds 10]
                          [--postgres] [--claims]

Starts a private ``ringod`` (SQLite in a temporary data dir, or a fresh
PostgreSQL database with ``--postgres``) with ``--max-waits`` above
``--waiters``, enqueues one task per waiter, and parks ``--waiters`` WaitTask
calls (60 s each) spread over ``--connections`` connections (at most
64 per connection, the protocol's limit). Reports the daemon's RSS
(``VmRSS``) before parking and ``--settle`` seconds later (6: all are
parked by then), and the p50 / p99 / max
of gRPC ``Health/Check`` calls made one after another on their own
connection (one every ~10 ms) for ``--seconds`` while they stay parked
(the same yardstick as bench/http_abuse.py); then acks nothing, and checks
that every call answers when the daemon stops (graceful shutdown).
``--claims`` parks as many long-poll Claim calls (60 s, one empty queue
each) instead: the yardstick for what a parked unary call costs the daemon
before WaitTask's own share.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _pg

from ringo_trio._contract.limits import MAX_WAITS_PER_CONNECTION
from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    EnqueueManyRequest,
    TaskSpec,
    WaitTaskRequest,
)
from ringo_trio.testing import spawn_daemon
from tests._kit.grpc_client import Client, connect

PROBE_PERIOD = 0.01


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _enqueue(client: Client, queue: str, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 1000):
        reply = await client.stub.enqueue_many(
            EnqueueManyRequest(
                context=client.context,
                queue=queue,
                tasks=[TaskSpec(task_type="t") for _ in range(min(1000, n - start))],
            )
        )
        ids.extend(r.task.id for r in reply.results if r.task is not None)
    return ids


async def run(args: argparse.Namespace) -> dict[str, float]:
    with ExitStack() as stack:
        extra = ["--max-waits", str(args.waiters + 100)]
        if args.postgres:
            dsn = stack.enter_context(_pg.fresh_database())
            daemon = stack.enter_context(spawn_daemon(None, postgres_dsn=dsn, extra_args=extra))
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ringo-waits-"))
            daemon = stack.enter_context(spawn_daemon(Path(tmp) / "data", extra_args=extra))
        async with AsyncExitStack() as clients:
            producer = await clients.enter_async_context(connect(daemon))
            ids = await _enqueue(producer, "waits", args.waiters)
            conns = [
                await clients.enter_async_context(connect(daemon)) for _ in range(args.connections)
            ]
            prober = await clients.enter_async_context(connect(daemon))
            await prober.health.check(HealthCheckRequest())
            await asyncio.sleep(1.0)
            before = rss_kib(daemon.pid)
            calls = [
                asyncio.create_task(
                    conns[i % len(conns)].stub.claim(
                        ClaimRequest(
                            context=conns[i % len(conns)].context,
                            queue=f"empty-{i}",
                            worker_id="w",
                            limit=1,
                            wait_timeout=timedelta(seconds=60),
                        ),
                        timeout=120,
                    )
                    if args.claims
                    else conns[i % len(conns)].stub.wait_task(
                        WaitTaskRequest(
                            context=conns[i % len(conns)].context,
                            queue="waits",
                            task_id=task_id,
                            timeout=timedelta(seconds=60),
                        ),
                        timeout=120,
                    )
                )
                for i, task_id in enumerate(ids)
            ]
            # Parked: nothing answers for 60 s; give the daemon time to take them.
            await asyncio.sleep(args.settle)
            assert not any(c.done() for c in calls), [c for c in calls if c.done()][:1]
            after = rss_kib(daemon.pid)
            latencies: list[float] = []
            until = time.monotonic() + args.seconds
            while time.monotonic() < until:
                began = time.perf_counter()
                await prober.health.check(HealthCheckRequest())
                latencies.append(time.perf_counter() - began)
                await asyncio.sleep(PROBE_PERIOD)
            assert not any(c.done() for c in calls)
            peak = rss_kib(daemon.pid)
            stopped = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, daemon.stop)
            answered = await asyncio.gather(*calls, return_exceptions=True)
            ok = sum(1 for a in answered if not isinstance(a, BaseException))
            failures = collections.Counter(
                f"{type(a).__name__}: {a}"[:120] for a in answered if isinstance(a, BaseException)
            )
            for failure, n in failures.most_common(3):
                print(f"{n} calls failed at stop: {failure}", file=sys.stderr)
            ordered = sorted(latencies)
            return {
                "rss_before_mib": before / 1024,
                "rss_parked_mib": after / 1024,
                "rss_end_mib": peak / 1024,
                "per_waiter_bytes": (after - before) * 1024 / args.waiters,
                "p50_ms": statistics.median(ordered) * 1000,
                "p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
                "max_ms": ordered[-1] * 1000,
                "probes": len(ordered),
                "answered_at_stop": ok,
                "stop_s": time.monotonic() - stopped,
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=5000)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--claims", action="store_true")
    parser.add_argument(
        "--settle", type=float, default=6.0, help="seconds the daemon gets to park them all"
    )
    args = parser.parse_args()
    if args.waiters > args.connections * MAX_WAITS_PER_CONNECTION:
        parser.error("more waiters than the connections may park")
    result = asyncio.run(run(args))
    for key, value in result.items():
        print(f"{key:18} {value:,.1f}")


if __name__ == "__main__":
    main()
