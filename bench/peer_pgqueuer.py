"""The PostgreSQL peer pgqueuer: its worker on the same server as our
PostgreSQL rows, measured the way ``bench/peer_procrastinate.py`` measures
procrastinate.

    python bench/peer_pgqueuer.py [--tasks 10000] [--concurrency 64] [--sleep 0]

Theory of operation.

* Storage: a fresh database on the server ``$RINGO_BENCH_POSTGRES`` names
  (``bench/_pg.py``; default the local test server), created for the run and
  dropped afterwards (also when it fails); pgqueuer's schema installed into it
  (``Queries.install()``, what ``pgq install`` runs).
* This process enqueues N jobs in bulk first (``Queries.enqueue`` with lists,
  1,000 jobs per call, like our ``enqueue_many`` calls of 1,000), over one
  asyncpg connection: timed on its own, as the enqueue rate.
* THEN ONE worker process runs them, started the way ``pgq run`` starts one
  (``pgqueuer.run(factory, ...)`` on ``uvloop.run``; the factory opens one
  asyncpg connection, ``AsyncpgDriver``, as pgqueuer's docs do). One
  entrypoint: ``noop`` (an ``async`` no-op, like our no-op handler) or, with
  ``--sleep 0.01``, ``sleep10`` (``asyncio.sleep(0.01)``). Settings for
  ``--concurrency C`` (64 for the no-op run, 256 for the 10 ms run):
  ``batch_size = C // 2`` (jobs per dequeue, and also the size at which its
  completion-log buffer flushes) and ``max_concurrent_tasks = C`` (the
  worker's hard cap on picked jobs, enforced in the dequeue SQL; pgqueuer
  requires it to be >= 2 * batch_size, so "batch = concurrency / 2" is the
  largest batch it allows). Without a cap, pgqueuer's fetch loop keeps
  dequeuing until the queue is empty: all N jobs would be in flight at once.
  The entrypoints' own ``concurrency_limit`` stays 0 (unlimited): with one
  worker and one entrypoint it would bind at the same C, but it switches the
  dequeue to capacity-gated SQL that costs 3-4x the PostgreSQL CPU per job
  (``ENTRYPOINT_LIMIT``).
  LISTEN/NOTIFY is on (a statement-level trigger on the queue table notifies
  on every insert, update and delete; the worker listens on its one
  connection); ``dequeue_timeout`` stays at
  its 30 s default, as it only bounds the wait when nothing is notified (the
  worker re-polls after 0.1 s anyway while eligible jobs are left).
  Heartbeats and the log -> statistics aggregation keep their defaults.
* The rate is the steady rate after the first completion, read by polling
  pgqueuer's queue table from this process every 20 ms (``count(*)`` of
  ``pgqueuer``: done = N - remaining, since a finished job is deleted from it
  in the same statement that logs it): the first poll that sees any done task
  (t1, c1) and the first that sees all N (tN): (N - c1) / (tN - t1). The
  worker's start-up is not in it.
* CPU over the same span: the worker process's own (/proc) and the
  database's server backends' (``_pg.server_cpu``). Peak RSS: the worker's
  ``VmHWM``, read before it is stopped.
* Then the worker is stopped (SIGTERM: pgqueuer sets its shutdown event on
  SIGINT/SIGTERM, drains in-flight jobs and flushes its buffers; killed after
  30 s) and ``pgqueuer_log`` must hold N ``successful`` rows, nothing that
  failed, and the queue table nothing.

How its contract differs from ours: pgqueuer keeps no finished job. A job's
row is deleted from the queue table when it is done (in batches: a worker
buffers finished jobs and writes them every ``batch_size`` jobs or 0.1 s),
and a row (job id, status, entrypoint, priority, traceback) is appended to
``pgqueuer_log``, which a timer folds into per-second counts in
``pgqueuer_statistics`` (the log rows are marked, not removed). Results are
not stored; a job that raises is logged as ``exception`` and deleted (its
default ``on_failure="delete"``), retries are opt-in per entrypoint. Jobs
are claimed with ``FOR UPDATE SKIP LOCKED`` and kept alive by heartbeats
(re-picked after 30 s without one).

The worker needs an importable module with the same entrypoints: it is
started as ``python -c "import peer_pgqueuer; ..."``.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import _peer
import _pg
import _proc

HERE = pathlib.Path(__file__).resolve().parent
POLL = 0.020  # seconds between counts of the queue table
BATCH = 1000  # jobs per enqueue call
# The entrypoints' own concurrency_limit: 0, unlimited. The worker's
# max_concurrent_tasks already caps what it has in flight at `concurrency`;
# a positive limit (which binds at the same point here) switches pgqueuer's
# dequeue to its capacity-gated SQL, which counts the picked rows of every
# worker on each dequeue: measured here at 3-4x the PostgreSQL CPU per job and
# about half the rate.
ENTRYPOINT_LIMIT = 0


def entrypoint_for(sleep: float) -> str:
    return "sleep10" if sleep else "noop"


async def _prepare(dsn: str, tasks: int, entrypoint: str) -> float:
    """Install the schema, enqueue `tasks` jobs in batches; the enqueue rate."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        t0 = time.perf_counter()
        for start in range(0, tasks, BATCH):
            n = min(BATCH, tasks - start)
            await queries.enqueue([entrypoint] * n, [None] * n, [0] * n)
        return tasks / (time.perf_counter() - t0)
    finally:
        await conn.close()


def worker(dsn: str, concurrency: int, sleep: float) -> None:
    """The worker process: runs jobs until SIGTERM / SIGINT (as ``pgq run``)."""
    import asyncpg
    import pgqueuer
    import uvloop
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    @asynccontextmanager
    async def factory() -> AsyncIterator[QueueManager]:
        conn = await asyncpg.connect(dsn)
        try:
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("noop", concurrency_limit=ENTRYPOINT_LIMIT)
            async def noop(job: Job) -> None:
                return None

            @qm.entrypoint("sleep10", concurrency_limit=ENTRYPOINT_LIMIT)
            async def sleep10(job: Job) -> None:
                await asyncio.sleep(sleep)

            yield qm
        finally:
            await conn.close()

    uvloop.run(
        pgqueuer.run(
            factory,
            batch_size=max(1, concurrency // 2),
            max_concurrent_tasks=concurrency,
        )
    )


async def _watch(
    dsn: str, tasks: int, proc: subprocess.Popen[bytes]
) -> tuple[tuple[float, int, float, dict[int, float]], float, float, float, float]:
    """Poll the queue table until all `tasks` are done: the first poll that saw
    any done (time, count, worker CPU, backends' CPU), the last poll's time,
    and the worker CPU, backends' CPU and worker peak RSS since the first."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        first: tuple[float, int, float, dict[int, float]] | None = None
        deadline = time.monotonic() + 600
        while True:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"pgqueuer: worker exited or stalled ({first})")
            done = tasks - int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))
            now = time.perf_counter()
            if first is None and done:
                first = (now, done, _proc.cpu_seconds(proc.pid), _pg.server_cpu(dsn))
            if done >= tasks:
                break
            await asyncio.sleep(POLL)
        assert first is not None
        worker_cpu = _proc.cpu_seconds(proc.pid) - first[2]
        server_cpu = _pg.cpu_since(dsn, first[3])
        peak_rss_mb = _proc.peak_rss_kb(proc.pid) / 1024
        return first, now, worker_cpu, server_cpu, peak_rss_mb
    finally:
        await conn.close()


async def _check(dsn: str, tasks: int) -> None:
    """After the worker stopped: N successful log rows, nothing else, nothing queued."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT status::text, count(*) FROM pgqueuer_log GROUP BY 1")
        queued = int(await conn.fetchval("SELECT count(*) FROM pgqueuer"))
    finally:
        await conn.close()
    counts = {str(r[0]): int(r[1]) for r in rows}
    if counts.get("successful", 0) != tasks or any(
        n for status, n in counts.items() if status not in ("successful", "queued", "picked")
    ):
        raise RuntimeError(f"pgqueuer: {tasks} jobs, log holds {counts}")
    if queued:
        raise RuntimeError(f"pgqueuer: {queued} job(s) left in the queue table")


def run(tasks: int, concurrency: int = 64, sleep: float = 0.0) -> _peer.PeerRun:
    """Enqueue `tasks`, then one worker process runs them; measured as the
    module docstring says."""
    with _pg.fresh_database() as dsn:
        enqueue_rate = asyncio.run(_prepare(dsn, tasks, entrypoint_for(sleep)))
        code = (
            "import sys, peer_pgqueuer as p;"
            " p.worker(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code, dsn, str(concurrency), str(sleep)],
            env={**os.environ, "PYTHONPATH": str(HERE)},
            stdout=subprocess.DEVNULL,
        )
        try:
            first, now, worker_cpu, server_cpu, peak_rss_mb = asyncio.run(_watch(dsn, tasks, proc))
        finally:
            # SIGTERM: the peer's graceful stop (killed after 30 s).
            _proc.stop(proc)
        asyncio.run(_check(dsn, tasks))
    return _peer.measured(
        tasks=tasks,
        concurrency=concurrency,
        enqueue_rate=enqueue_rate,
        first=(first[0], first[1]),
        last_at=now,
        worker_cpu=worker_cpu,
        server_cpu=server_cpu,
        peak_rss_mb=peak_rss_mb,
    )


def main() -> None:
    _peer.command(__doc__, run, lambda sleep: f"pgqueuer, {entrypoint_for(sleep)}")


if __name__ == "__main__":
    # As `peer_pgqueuer`, not `__main__`: one module for both processes.
    import peer_pgqueuer

    peer_pgqueuer.main()
