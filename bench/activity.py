"""Health latency of a daemon whose queue is deep while idle workers poll it.

    python bench/activity.py [--pending 1000000] [--pollers 4] [--seconds 20]
                             [--base DIR] [--task-type T ...]

Builds a SQLite data dir holding `--pending` PENDING tasks in one queue
(written straight into the database: enqueueing a million through the daemon
would measure the enqueue), starts a private ``ringod`` on it, and runs
`--pollers` clients that call ``GetQueueActivity`` on that queue every
250 ms, as a worker's ``on_idle`` does, while one prober calls
``grpc.health.v1.Health/Check`` every 20 ms. Prints the percentiles of both.

`--base DIR` runs the daemon from another copy of the source tree (e.g.
``git archive <commit> | tar -x -C DIR``) for a before/after comparison; the
data dir is built by this tree's schema, which both share.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpclib.client import Channel

from ringo_trio._contract.versions import MAJOR as PROTOCOL_MAJOR
from ringo_trio._contract.versions import MINOR as PROTOCOL_MINOR
from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthStub
from ringo_trio._proto.ringo.v1 import (
    GetQueueActivityRequest,
    NegotiateRequest,
    QueueServiceStub,
    RequestContext,
)
from ringo_trio.testing import spawn_daemon

QUEUE = "deep"
POLL_INTERVAL = 0.25
PROBE_INTERVAL = 0.02


def build(path: Path, pending: int, base: Path | None) -> None:
    # The schema of the tree the daemon runs from (`--base` may be older).
    subprocess.run(
        [
            sys.executable,
            "-c",
            _prelude(base)
            + "import asyncio, pathlib; from ringo_trio.server.storage.sqlite import SQLiteEngine;"
            f" engine = SQLiteEngine(pathlib.Path({str(path)!r}));"
            " asyncio.run(engine.open()); asyncio.run(engine.close())",
        ],
        check=True,
    )
    db = sqlite3.connect(path, isolation_level=None)
    now_us = int(time.time() * 1_000_000)
    db.execute("BEGIN")
    chunk = 10_000
    for start in range(0, pending, chunk):
        db.executemany(
            "INSERT INTO tasks (id, queue, task_type, payload, unique_key, state, attempt,"
            " max_attempts, base_max_attempts, priority, backoff_initial_us, backoff_max_us,"
            " backoff_multiplier, created_at, updated_at, available_at, last_error,"
            " worker_id, lease_token) VALUES (?, ?, 't', x'', '', 1, 0, 5, 5, 0, 1000000,"
            " 300000000, 2.0, ?, ?, ?, '', '', '')",
            (
                (secrets.token_hex(16), QUEUE, now_us, now_us, now_us + i)
                for i in range(start, min(start + chunk, pending))
            ),
        )
    db.execute("COMMIT")
    db.close()


def _prelude(base: Path | None) -> str:
    # Not PYTHONPATH: `python -m` puts the working directory (this tree)
    # ahead of it.
    return "" if base is None else f"import sys; sys.path.insert(0, {str(base)!r}); "


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    cuts = statistics.quantiles(ms, n=100)
    return f"n={len(ms)} p50={cuts[49]:.2f} ms p99={cuts[98]:.2f} ms max={ms[-1]:.2f} ms"


async def measure(
    host: str, port: int, pollers: int, seconds: float, task_types: list[str]
) -> None:
    channel = Channel(host, port)
    try:
        stub = QueueServiceStub(channel)
        health = HealthStub(channel)
        session = await stub.negotiate(
            NegotiateRequest(protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR)
        )
        context = RequestContext(
            protocol_major=session.protocol_major,
            protocol_minor=session.protocol_minor,
            session_token=session.session_token,
        )
        request = GetQueueActivityRequest(context=context, queue=QUEUE, task_types=task_types)
        first = await stub.get_queue_activity(request)
        print(f"active_task_count answered: {first.active_task_count}")
        deadline = time.monotonic() + seconds
        health_samples: list[float] = []
        activity_samples: list[float] = []

        async def poll(offset: float) -> None:
            await asyncio.sleep(offset)
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await stub.get_queue_activity(request)
                activity_samples.append(time.perf_counter() - started)
                await asyncio.sleep(POLL_INTERVAL)

        async def probe() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await health.check(HealthCheckRequest())
                health_samples.append(time.perf_counter() - started)
                await asyncio.sleep(PROBE_INTERVAL)

        async with asyncio.TaskGroup() as tasks:
            for i in range(pollers):
                tasks.create_task(poll(i * POLL_INTERVAL / max(pollers, 1)))
            tasks.create_task(probe())
        print(f"Health/Check      {percentiles(health_samples)}")
        if activity_samples:
            print(f"GetQueueActivity  {percentiles(activity_samples)}")
    finally:
        channel.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--base", type=Path, default=None)
    parser.add_argument(
        "--task-type",
        action="append",
        default=[],
        help="the pollers' task-type filter (every task is of type 't')",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ringo-activity-") as scratch:
        data_dir = Path(scratch) / "data"
        data_dir.mkdir()
        started = time.perf_counter()
        build(data_dir / "ringo.db", args.pending, args.base)
        print(f"built {args.pending:,} pending tasks in {time.perf_counter() - started:.1f} s")
        command = [
            sys.executable,
            "-c",
            _prelude(args.base)
            + "import runpy; runpy.run_module('ringo_trio.server', run_name='__main__',"
            " alter_sys=True)",
        ]
        with spawn_daemon(data_dir, command=command) as daemon:
            print(f"{args.pollers} pollers every {POLL_INTERVAL * 1000:.0f} ms, {args.seconds:g} s")
            asyncio.run(
                measure(daemon.host, daemon.port, args.pollers, args.seconds, args.task_type)
            )


if __name__ == "__main__":
    main()
