"""The PostgreSQL peer: procrastinate on the same server as our PostgreSQL
rows, run the way the issue names it (``bench/run.py`` runs it in the same
rounds as our one-, two- and three-daemon runs and reports ringo_trio /
procrastinate).

    python bench/peer_procrastinate.py [--tasks 10000] [--concurrency 64]

Theory of operation.

* Storage: a fresh database on the server ``$RINGO_BENCH_POSTGRES`` names
  (``bench/_pg.py``; default the local test server), created for the run and
  dropped afterwards (also when it fails); procrastinate's own schema applied
  to it (``SchemaManager.apply_schema_async``).
* This process defers N no-op tasks in bulk first (``Task.batch_defer_async``,
  1,000 jobs per call, like our ``enqueue_many`` calls of 1,000): timed on its
  own, as the enqueue rate.
* THEN ONE worker process (``App.run_worker_async``) runs them: an ``async``
  no-op task (ours is an async no-op handler), ``concurrency=64`` like our
  Worker's, a ``PsycopgConnector`` pool of at most 10 connections like
  ``ringod``'s default ``pool_size``, LISTEN/NOTIFY on (procrastinate's
  default), jobs kept after success (its default, ``delete_jobs="never"``), so
  they can be counted.
* The rate is the steady rate after the first completion, read by polling
  procrastinate's jobs table from this process every 20 ms (``count(*)`` of
  ``status = 'succeeded'``): the first poll that sees any done task (t1, c1)
  and the first that sees all N (tN): (N - c1) / (tN - t1). The worker's
  start-up is not in it; the polling granularity is well under 1 % of a run.
* CPU over the same span: the worker process's own (/proc) and the
  database's server backends' (``_pg.server_cpu``), to be read next to our
  worker + daemon + PostgreSQL CPU. Peak RSS: the worker's ``VmHWM``.
* Then the worker is stopped (SIGTERM: procrastinate's graceful stop) and the
  table must hold N succeeded jobs and nothing else.

The task module must have the same name in both processes (procrastinate
keys tasks by name, and the worker imports nothing): the worker is started
as ``python -c "import peer_procrastinate; ..."``.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import _peer
import _pg
import _proc

HERE = pathlib.Path(__file__).resolve().parent
POOL_SIZE = 10  # ringod's default PostgreSQL pool_size
POLL = 0.020  # seconds between counts of the jobs table
BATCH = 1000


def _app(dsn: str) -> tuple[Any, Any]:
    """A procrastinate App on `dsn` and its one task, an async no-op."""
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=POOL_SIZE)
    )

    @app.task(name="work")  # type: ignore[untyped-decorator]
    async def work() -> None:
        return None

    return app, work


async def _prepare(dsn: str, tasks: int) -> float:
    """Apply the schema, defer `tasks` jobs in batches; the deferral rate."""
    app, work = _app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        t0 = time.perf_counter()
        for start in range(0, tasks, BATCH):
            await work.batch_defer_async(*[{}] * min(BATCH, tasks - start))
        return tasks / (time.perf_counter() - t0)


def worker(dsn: str, concurrency: int) -> None:
    """The worker process: runs jobs until SIGTERM."""
    app, _ = _app(dsn)

    async def main() -> None:
        async with app.open_async():
            await app.run_worker_async(concurrency=concurrency)

    asyncio.run(main())


def run(tasks: int, concurrency: int = 64) -> _peer.PeerRun:
    """Defer `tasks`, then one worker process runs them; measured as the
    module docstring says."""
    import psycopg

    with _pg.fresh_database() as dsn:
        enqueue_rate = asyncio.run(_prepare(dsn, tasks))
        code = "import sys, peer_procrastinate as p; p.worker(sys.argv[1], int(sys.argv[2]))"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, dsn, str(concurrency)],
            env={**os.environ, "PYTHONPATH": str(HERE)},
            stdout=subprocess.DEVNULL,
        )
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                first = None
                deadline = time.monotonic() + 600
                while True:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"procrastinate: worker exited or stalled ({first})")
                    row = conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    ).fetchone()
                    done, now = int(row[0]) if row else 0, time.perf_counter()
                    if first is None and done:
                        first = (now, done, _proc.cpu_seconds(proc.pid), _pg.server_cpu(dsn))
                    if done >= tasks:
                        break
                    time.sleep(POLL)
                assert first is not None
                worker_cpu = _proc.cpu_seconds(proc.pid) - first[2]
                server_cpu = _pg.cpu_since(dsn, first[3])
                peak_rss_mb = _proc.peak_rss_kb(proc.pid) / 1024
                left = conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
                ).fetchone()
        finally:
            # SIGTERM: the peer's graceful stop (killed after 30 s).
            _proc.stop(proc)
        if left and left[0]:
            raise RuntimeError(f"procrastinate: {left[0]} job(s) not succeeded")
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
    _peer.command(
        __doc__,
        lambda tasks, concurrency, _: run(tasks, concurrency),
        lambda _: "procrastinate",
        sleeps=False,
    )


if __name__ == "__main__":
    # As `peer_procrastinate`, not `__main__`: one module for both processes.
    import peer_procrastinate

    peer_procrastinate.main()
