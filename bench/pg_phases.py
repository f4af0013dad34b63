"""What each step of a no-op task's life costs PostgreSQL: ours against a
table as lean as graphile-worker's.

    python bench/pg_phases.py [--tasks 12800] [--batch 64] [--repeat 2]

Straight on the storage engine, no daemon, one connection's worth of calls
at a time (uvloop when importable, as ringod): `--tasks` tasks enqueued in
batches of `--batch`, all of them claimed `--batch` at a time, then all
acked in groups of `--batch`; then, on as many tasks enqueued again
(unmeasured), the steady shape of a worker's run: a claim of `--batch`,
then the ack of what it leased, in turn. Each step is measured alone: the
WAL it wrote and the CPU of the PostgreSQL backends (when the server runs
here), per task. Three stores, each in a fresh database (`_pg.ADMIN`), in turn
within each repeat:

* ``ours``: `PostgresEngine` as `ringod` runs it (succeeded tasks kept);
* ``ours, never``: `--retain-succeeded never` (an ack deletes its task);
* ``lean``: one table shaped like graphile-worker 0.18's jobs (a bigint
  key, a `key` unique index, the claim's partial index over the available
  jobs, no count trigger, no history), enqueued by one INSERT, claimed by
  `UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`, acked by
  `DELETE ... WHERE id = ANY`: the floor a queue with no lease guard, no
  counts and no ordered lock step pays for the same three steps.

Prints one line per store and step: the medians over the repeats (and
their range) of WAL bytes and PostgreSQL CPU µs per task.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import _pg
import asyncpg  # type: ignore[import-untyped]

from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
from ringo_trio.server.storage.base import Ack
from ringo_trio.server.storage.postgres import PostgresEngine

NOW = datetime(2030, 1, 1, tzinfo=UTC)
PAYLOAD = b"x" * 16
STEPS = ("enqueue", "claim", "ack", "claim, in turn", "ack, in turn")
LSN = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"

Step = Callable[[], Awaitable[None]]

LEAN_SCHEMA = """
    CREATE TABLE jobs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        queue text NOT NULL, task text NOT NULL, payload bytea,
        priority integer NOT NULL DEFAULT 0, run_at bigint NOT NULL,
        attempts integer NOT NULL DEFAULT 0, max_attempts integer NOT NULL DEFAULT 25,
        locked_at bigint, locked_by text, key text,
        is_available boolean GENERATED ALWAYS AS
            (locked_at IS NULL AND attempts < max_attempts) STORED);
    CREATE UNIQUE INDEX jobs_key ON jobs (key);
    CREATE INDEX jobs_main ON jobs (priority, run_at) INCLUDE (id, task) WHERE is_available
"""


CpuClock = Callable[[], Callable[[], float]]


async def _bracket(
    conn: asyncpg.Connection, start_cpu: CpuClock, step: Awaitable[None]
) -> tuple[float, float]:
    """(WAL bytes, CPU seconds) of `step`; `start_cpu()` starts a CPU clock
    and returns what reads it."""
    wal = await conn.fetchval(LSN)
    cpu_since = start_cpu()
    await step
    return float(await conn.fetchval(LSN) - wal), cpu_since()


async def _measure(
    dsn: str, conn: asyncpg.Connection, tasks: int, step: Step
) -> tuple[float, float]:
    """(WAL bytes, PostgreSQL CPU µs) per task of `step`."""

    def start_cpu() -> Callable[[], float]:
        before = _pg.server_cpu(dsn)
        return lambda: _pg.cpu_since(dsn, before)

    wal, cpu = await _bracket(conn, start_cpu, step())
    return wal / tasks, cpu / tasks * 1e6


Claim = Callable[[int], Awaitable[None]]


def _on_cpu_ns(pids: list[int]) -> int:
    """Nanoseconds on a CPU so far of the processes `pids` (the scheduler's
    own count: precise enough to time one statement, where /proc's CPU
    ticks are 10 ms)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/schedstat") as stat:
            total += int(stat.read().split()[0])
    return total


async def _steps(
    dsn: str,
    conn: asyncpg.Connection,
    args: argparse.Namespace,
    enqueue: Step,
    claim: Claim,
    ack: Step,
) -> dict[str, tuple[float, float]]:
    """Each of `STEPS` run in turn and measured alone. `claim(n)` leases
    batches until `n` leases are held, `ack` settles every lease held."""

    async def claim_all() -> None:
        await claim(args.tasks)

    costs = {
        name: await _measure(dsn, conn, args.tasks, step)
        for name, step in zip(STEPS, (enqueue, claim_all, ack), strict=False)
    }
    await enqueue()
    # The steady shape, each call timed apart on the store's own backends
    # (found once: `server_cpu` asks psql, far too slow to run per call).
    backends = [pid for pid in _pg.server_cpu(dsn) if pid != conn.get_server_pid()]
    spent = {name: [0.0, 0.0] for name in STEPS[3:]}

    def start_cpu() -> Callable[[], float]:
        before = _on_cpu_ns(backends)
        return lambda: (_on_cpu_ns(backends) - before) / 1e9

    async def timed(name: str, step: Awaitable[None]) -> None:
        wal, cpu = await _bracket(conn, start_cpu, step)
        spent[name][0] += wal
        spent[name][1] += cpu

    for _ in range(0, args.tasks, args.batch):
        await timed(STEPS[3], claim(args.batch))
        await timed(STEPS[4], ack())
    for name, (wal, cpu) in spent.items():
        costs[name] = (wal / args.tasks, cpu / args.tasks * 1e6)
    return costs


async def _ours(
    dsn: str, args: argparse.Namespace, *, never: bool
) -> dict[str, tuple[float, float]]:
    engine = PostgresEngine(dsn, schema="phases")
    engine.delete_succeeded = never
    await engine.open()
    conn = await asyncpg.connect(dsn)
    refs: list[LeaseRef] = []

    async def enqueue() -> None:
        for _ in range(0, args.tasks, args.batch):
            specs = [TaskSpec(task_type="t", payload=PAYLOAD) for _ in range(args.batch)]
            await engine.enqueue("q", specs, NOW)

    async def claim(upto: int) -> None:
        while len(refs) < upto:
            for leased in await engine.claim("q", [], args.batch, "w", timedelta(hours=1), NOW):
                lease = leased.lease
                assert lease is not None
                refs.append(LeaseRef(lease.task_id, lease.attempt, lease.lease_token))

    async def ack() -> None:
        for start in range(0, len(refs), args.batch):
            answers = await engine.settle_many(
                [Ack(r) for r in refs[start : start + args.batch]], NOW
            )
            assert all(a == "q" for a in answers), answers
        refs.clear()

    try:
        return await _steps(dsn, conn, args, enqueue, claim, ack)
    finally:
        await conn.close()
        await engine.close()


async def _lean(dsn: str, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    conn = await asyncpg.connect(dsn)
    # Its own connection, as `ours` has its pool: `conn` measures.
    work = await asyncpg.connect(dsn)
    await work.execute(LEAN_SCHEMA)
    ids: list[int] = []

    async def enqueue() -> None:
        for _ in range(0, args.tasks, args.batch):
            await work.execute(
                "INSERT INTO jobs (queue, task, payload, run_at)"
                " SELECT 'q', 't', p, 0 FROM unnest($1::bytea[]) p",
                [PAYLOAD] * args.batch,
            )

    async def claim(upto: int) -> None:
        while len(ids) < upto:
            rows = await work.fetch(
                """UPDATE jobs SET attempts = attempts + 1, locked_at = 1, locked_by = 'w'
                WHERE id IN (SELECT id FROM jobs WHERE is_available AND run_at <= 1
                    ORDER BY priority, run_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                RETURNING *""",
                args.batch,
            )
            ids.extend(r["id"] for r in rows)

    async def ack() -> None:
        for start in range(0, len(ids), args.batch):
            await work.execute(
                "DELETE FROM jobs WHERE id = ANY($1::bigint[]) AND locked_by = 'w'",
                ids[start : start + args.batch],
            )
        ids.clear()

    try:
        return await _steps(dsn, conn, args, enqueue, claim, ack)
    finally:
        await work.close()
        await conn.close()


async def _store(name: str, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    with _pg.fresh_database() as dsn:
        if name == "lean":
            return await _lean(dsn, args)
        return await _ours(dsn, args, never=name == "ours, never")


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}-{max(values):,.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=12_800)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    try:
        import uvloop  # type: ignore[import-not-found]

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    stores = ("ours", "ours, never", "lean")
    seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeat):
        for store in stores:
            for step, cost in run(_store(store, args)).items():
                seen.setdefault((store, step), []).append(cost)
    print("| store | step | WAL bytes per task | PostgreSQL CPU µs per task |")
    print("| --- | --- | --- | --- |")
    for store in stores:
        for step in STEPS:
            costs = seen[store, step]
            print(
                f"| {store} | {step} | {_cell([c[0] for c in costs])}"
                f" | {_cell([c[1] for c in costs])} |"
            )


if __name__ == "__main__":
    main()
