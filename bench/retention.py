"""Health-check latency while ringod's retention purges 100,000 finished tasks.

    python bench/retention.py [--tasks 100000] [--batch 100 500 2000 10000]
                              [--payload 256] [--postgres DSN]

A ``ringod`` (SQLite in a temporary data dir, or the
PostgreSQL database ``--postgres`` names, in a schema of its own) is started
with every retention off and filled with ``--tasks`` DEAD tasks (EnqueueMany,
then one Claim per 1,000 with a 1 s lease and max_attempts 1: the lease
reaper finishes them). Health/Check is then timed back to back (a 5 ms pause
between calls) for a few seconds: *idle*. Then, per batch size, a daemon
starts on a copy of that data (a copied data dir; a copied schema) with
``--retain-dead 1s --retention-interval 1 --retention-batch N``: its first
retention pass starts a second after the start and deletes every task, batch
after batch; Health/Check is timed the same way, and the calls made while
the pass ran (by the duration the daemon logs) are *purging*. Prints
p50/p99/max of each, and how long the pass took.

DEAD and SUCCEEDED tasks cost the same to delete (same row, same indexes);
DEAD ones are just much faster to make.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from grpclib.client import Channel

from ringo_trio._contract.versions import MAJOR as PROTOCOL_MAJOR
from ringo_trio._contract.versions import MINOR as PROTOCOL_MINOR
from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthStub
from ringo_trio._proto.ringo.v1 import (
    ClaimRequest,
    EnqueueManyRequest,
    GetQueueActivityRequest,
    NegotiateRequest,
    QueueServiceStub,
    RequestContext,
    TaskSpec,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon

_KEEP = ["--retain-succeeded", "forever", "--retain-dead", "forever"]
_KEEP += ["--retain-cancelled", "forever"]
_PASS_LOGGED = re.compile(r"retention deleted (\d+) finished task\(s\) in ([0-9.]+)s")
_PROBE_PAUSE = 0.005
_IDLE_SECONDS = 3.0


async def _fill(endpoint: str, tasks: int, payload: int) -> None:
    host, _, port = endpoint.rpartition(":")
    channel = Channel(host, int(port))
    try:
        stub = QueueServiceStub(channel)
        session = await stub.negotiate(
            NegotiateRequest(protocol_major=PROTOCOL_MAJOR, protocol_minor=PROTOCOL_MINOR)
        )
        ctx = RequestContext(PROTOCOL_MAJOR, session.protocol_minor, session.session_token)
        spec = TaskSpec(task_type="t", payload=b"x" * payload, max_attempts=1)
        for i in range(0, tasks, 1000):
            n = min(1000, tasks - i)
            await stub.enqueue_many(EnqueueManyRequest(context=ctx, queue="q", tasks=[spec] * n))
            await stub.claim(
                ClaimRequest(
                    context=ctx,
                    queue="q",
                    worker_id="bench",
                    limit=n,
                    lease_duration=timedelta(seconds=1),
                )
            )
        # The reaper ends each lease (the last attempt: DEAD).
        activity = GetQueueActivityRequest(context=ctx, queue="q")
        while (await stub.get_queue_activity(activity)).active_task_count:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
    finally:
        channel.close()


async def _probe(
    endpoint: str, done: asyncio.Event, max_seconds: float
) -> list[tuple[float, float]]:
    """(start, latency) of Health/Check calls made one after another until `done`."""
    host, _, port = endpoint.rpartition(":")
    channel = Channel(host, int(port))
    try:
        health = HealthStub(channel)
        await health.check(HealthCheckRequest())  # connect
        samples = []
        deadline = time.perf_counter() + max_seconds
        while not done.is_set() and time.perf_counter() < deadline:
            started = time.perf_counter()
            await health.check(HealthCheckRequest())
            samples.append((started, time.perf_counter() - started))
            await asyncio.sleep(_PROBE_PAUSE)
        return samples
    finally:
        channel.close()


async def _purging(daemon: DaemonProcess, tasks: int) -> tuple[list[float], float]:
    """Latencies of the health checks made while the daemon's retention pass
    ran (from its logged duration back from when the log line showed up), and
    that duration."""
    done = asyncio.Event()

    async def watch_log() -> tuple[float, float]:
        while True:
            found = _PASS_LOGGED.search(daemon.stderr_text())
            if found:
                if int(found.group(1)) != tasks:
                    raise RuntimeError(f"the pass deleted {found.group(1)} of {tasks}")
                done.set()
                took = float(found.group(2))
                return time.perf_counter() - took, took
            await asyncio.sleep(0.01)

    probe = asyncio.ensure_future(_probe(daemon.endpoint, done, 600))
    began, took = await watch_log()
    return [latency for start, latency in await probe if start >= began], took


def _figures(latencies: list[float]) -> str:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"p50 {statistics.median(ms):6.2f} ms  p99 {p99:6.2f} ms  max {ms[-1]:6.2f} ms"
        f"  (n={len(ms)})"
    )


class _Sqlite:
    """Runs on copies of one filled data dir."""

    def __init__(self, root: Path) -> None:
        self.template = root / "template"
        self.root = root
        self.runs = 0

    def fill_args(self) -> tuple[Path | None, str | None, list[str]]:
        return self.template, None, []

    def copy(self) -> tuple[Path | None, str | None, list[str]]:
        self.runs += 1
        run = self.root / f"run{self.runs}"
        shutil.copytree(self.template, run)
        return run, None, []


class _Postgres:
    """Runs on copies of one filled schema, each a schema of its own (dropped at the end)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.prefix = f"bench_{uuid.uuid4().hex[:8]}"
        self.schemas = [f"{self.prefix}_template"]

    def fill_args(self) -> tuple[Path | None, str | None, list[str]]:
        return None, self.dsn, ["--postgres-schema", self.schemas[0]]

    def copy(self) -> tuple[Path | None, str | None, list[str]]:
        schema = f"{self.prefix}_run{len(self.schemas)}"
        self.schemas.append(schema)
        args = ["--postgres-schema", schema]
        with spawn_daemon(None, postgres_dsn=self.dsn, extra_args=[*args, *_KEEP]):
            pass  # creates the schema
        asyncio.run(
            self._sql(
                f'INSERT INTO "{schema}".tasks OVERRIDING SYSTEM VALUE'
                f' SELECT * FROM "{self.schemas[0]}".tasks',
                f'ANALYZE "{schema}".tasks',
            )
        )
        return None, self.dsn, args

    def drop(self) -> None:
        asyncio.run(self._sql(*(f'DROP SCHEMA IF EXISTS "{s}" CASCADE' for s in self.schemas)))

    async def _sql(self, *statements: str) -> None:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(self.dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()


def _run(store: _Sqlite | _Postgres, tasks: int, batches: list[int], payload: int) -> None:
    data_dir, dsn, extra = store.fill_args()
    with spawn_daemon(data_dir, postgres_dsn=dsn, extra_args=[*extra, *_KEEP]) as daemon:
        started = time.perf_counter()
        asyncio.run(_fill(daemon.endpoint, tasks, payload))
        print(f"filled {tasks} DEAD tasks in {time.perf_counter() - started:.1f} s", flush=True)
        idle = [x for _, x in asyncio.run(_probe(daemon.endpoint, asyncio.Event(), _IDLE_SECONDS))]
    print(f"idle          {_figures(idle)}", flush=True)
    for batch in batches:
        data_dir, dsn, extra = store.copy()
        purge = ["--retain-dead", "1s", "--retention-interval", "1"]
        purge += ["--retention-batch", str(batch)]
        with spawn_daemon(data_dir, postgres_dsn=dsn, extra_args=[*extra, *purge]) as daemon:
            busy, took = asyncio.run(_purging(daemon, tasks))
        print(f"batch {batch:>5}   {_figures(busy)}  pass {took:.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, nargs="+", default=[100, 500, 2000, 10_000])
    parser.add_argument("--payload", type=int, default=256, help="bytes per task")
    parser.add_argument("--postgres", default=None, help="DSN: PostgreSQL instead of SQLite")
    args = parser.parse_args()
    print(f"storage: {'PostgreSQL' if args.postgres else 'SQLite'}; {args.tasks} tasks")
    if args.postgres is None:
        with tempfile.TemporaryDirectory(prefix="ringo-retention-") as tmp:
            _run(_Sqlite(Path(tmp)), args.tasks, args.batch, args.payload)
        return
    store = _Postgres(args.postgres)
    try:
        _run(store, args.tasks, args.batch, args.payload)
    finally:
        store.drop()


if __name__ == "__main__":
    main()
