"""Raw daemon throughput from a plain grpclib client (no SDK): sequential unary
Enqueue calls/s and sequential Claim+Ack pairs/s.

    python bench/daemon_unary.py [--n 2000] [--loop auto|asyncio|uvloop]

Starts a private ``ringod`` (ringo_trio.testing.spawn_daemon) on a temporary
data dir, so the numbers include SQLite commits (WAL, synchronous=NORMAL).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import timedelta

from grpclib.client import Channel

from ringo_trio._contract.versions import MAJOR as PROTOCOL_MAJOR
from ringo_trio._contract.versions import MINOR as PROTOCOL_MINOR
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    ClaimRequest,
    EnqueueManyRequest,
    EnqueueRequest,
    LeaseRef,
    NegotiateRequest,
    QueueServiceStub,
    RequestContext,
    TaskSpec,
)
from ringo_trio.testing import spawn_daemon


async def _bench(host: str, port: int, n: int) -> tuple[float, float]:
    channel = Channel(host, port)
    try:
        stub = QueueServiceStub(channel)
        session = await stub.negotiate(
            NegotiateRequest(protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR)
        )
        ctx = RequestContext(PROTOCOL_MAJOR, session.protocol_minor, session.session_token)
        spec = TaskSpec(task_type="t", payload=b"x" * 100)
        for _ in range(50):  # warm-up
            await stub.enqueue(EnqueueRequest(context=ctx, queue="warm", task=spec))

        started = time.perf_counter()
        for _ in range(n):
            await stub.enqueue(EnqueueRequest(context=ctx, queue="enq", task=spec))
        enqueue_rate = n / (time.perf_counter() - started)

        for i in range(0, n, 1000):
            await stub.enqueue_many(
                EnqueueManyRequest(context=ctx, queue="work", tasks=[spec] * min(1000, n - i))
            )
        started = time.perf_counter()
        for _ in range(n):
            claimed = await stub.claim(
                ClaimRequest(
                    context=ctx,
                    queue="work",
                    worker_id="bench",
                    limit=1,
                    lease_duration=timedelta(seconds=60),
                )
            )
            lease = claimed.tasks[0].lease
            assert lease is not None
            await stub.ack(
                AckRequest(
                    context=ctx,
                    lease=LeaseRef(lease.task_id, lease.attempt, lease.lease_token),
                )
            )
        pair_rate = n / (time.perf_counter() - started)
        return enqueue_rate, pair_rate
    finally:
        channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        spawn_daemon(
            f"{tmp}/data", extra_args=["--loop", args.loop, "--log-level", "warning"]
        ) as daemon,
    ):
        enqueue_rate, pair_rate = asyncio.run(_bench(daemon.host, daemon.port, args.n))
        print(
            f"daemon loop={daemon.info['loop']}  n={args.n}\n"
            f"  sequential Enqueue:   {enqueue_rate:8.0f} calls/s\n"
            f"  sequential Claim+Ack: {pair_rate:8.0f} pairs/s"
        )


if __name__ == "__main__":
    main()
