"""The Node.js PostgreSQL peer: graphile-worker (the version ``bench/_node.py``
pins) on the same server as our PostgreSQL rows, measured like
``bench/peer_procrastinate.py``.

    python bench/peer_graphile.py [--tasks 10000] [--concurrency 64] [--sleep 0]

Theory of operation.

* Storage: a fresh database on the server ``$RINGO_BENCH_POSTGRES`` names
  (``bench/_pg.py``), created for the run and dropped afterwards (also when
  it fails); graphile-worker's schema installed in it (``runMigrations``).
* A node process (``bench/node/graphile_peer.mjs enqueue``) adds N jobs in
  bulk first: ``WorkerUtils.addJobs`` (one ``graphile_worker.add_jobs`` call)
  of 1,000 jobs each, timed on its own, as the enqueue rate.
* THEN ONE worker process (``node bench/node/graphile_peer.mjs work``,
  graphile-worker's ``run()``) runs them, in graphile's "perf
  configuration": ``concurrency`` 64 for the no-op run, 256 for the 10 ms run
  (the ``--concurrency`` given), ``preset.worker.localQueue.size`` 500 (the
  pool locks and fetches 500 jobs at a time and hands them to its workers),
  ``completeJobBatchDelay`` and ``failJobBatchDelay`` 0 (completions and
  failures batched into one statement per event-loop turn), ``pollInterval``
  its default (2 s; LISTEN/NOTIFY is on), ``noHandleSignals`` false (it stops
  gracefully on SIGTERM). The tasks are ``noop`` (an async no-op) and
  ``sleep10`` (awaits a 10 ms ``setTimeout``), chosen by ``--sleep`` (0 or
  0.01). The pg pool is 10 connections (graphile's default ``maxPoolSize``,
  and ``ringod``'s default ``pool_size``), opened in full before ``run()`` so
  their backends' pids are known; per-job success log lines are off.
* The rate is the steady rate after the first completion, counted in the
  worker: its ``job:success`` event (the task returned; emitted just before
  the job's delete is queued) stamps ``performance.now()`` at the first; at
  the N-th the worker polls ``count(*)`` of ``graphile_worker._private_jobs``
  every millisecond on a connection of its own until the last batched delete
  is committed, and stamps that: (N - 1) / (tN - t1). Start-up is not in it.
* CPU over the same span, read by this process when the worker's "first" and
  "done" lines arrive: the worker process's own (/proc) and the database's
  server backends' (the pre-opened pool's and the checking connection's pids
  read from /proc at "first", ``_pg.cpu_since`` at the end, so a backend
  opened later counts in full). Peak RSS: the worker's ``VmHWM``, read before
  it is stopped.
* Then the worker is stopped (SIGTERM; killed after 30 s) and the jobs table
  must be empty, with no job failure reported.

How it differs from our contract: graphile-worker DELETES a job when it
succeeds (there is no result and no record of success to read back), so
completions are counted by the worker and checked by the table emptying, not
by reading N succeeded rows as procrastinate's and ours are. With the local
queue a crashed worker's 500 locked jobs wait for the lock timeout (4 h by
default) before another worker may run them, and a batched completion may be
lost with the worker, running its job again.
"""

from __future__ import annotations

import _node
import _peer
import _pg
import _proc

TASKS = {0.0: "noop", 0.01: "sleep10"}  # --sleep → graphile task name


def run(tasks: int, concurrency: int = 64, sleep: float = 0.0) -> _peer.PeerRun:
    """Add `tasks` jobs, then one worker process runs them; measured as the
    module docstring says."""
    if tasks < 2:
        raise ValueError("a steady rate needs at least 2 tasks")
    if sleep not in TASKS:
        raise ValueError(f"graphile: --sleep must be one of {sorted(TASKS)}")
    with _pg.fresh_database() as dsn:
        enqueued = _node.run_json("graphile_peer.mjs", "enqueue", dsn, str(tasks), TASKS[sleep])
        proc = _node.spawn("graphile_peer.mjs", "work", dsn, str(tasks), str(concurrency))
        try:
            lines = _proc.Lines(proc, "the node worker")
            ready = lines.next(60)
            assert ready["event"] == "ready", ready
            first = lines.next(120)
            worker_cpu0 = _proc.cpu_seconds(proc.pid)
            server_cpu0 = {pid: _proc.cpu_seconds(pid) for pid in ready["pids"]}
            assert first["event"] == "first", first
            done = lines.next(600)
            worker_cpu = _proc.cpu_seconds(proc.pid) - worker_cpu0
            assert done["event"] == "done", done
            server_cpu = _pg.cpu_since(dsn, server_cpu0)
            peak_rss_mb = _proc.peak_rss_kb(proc.pid) / 1024
        finally:
            # SIGTERM: the peer's graceful stop (killed after 30 s).
            _proc.stop(proc)
        left = int(_pg.psql("SELECT count(*) FROM graphile_worker._private_jobs", dsn))
        if left or done["failed"]:
            raise RuntimeError(
                f"graphile-worker: {left} job(s) left, {done['failed']} failure(s) reported"
            )
    return _peer.measured(
        tasks=tasks,
        concurrency=concurrency,
        enqueue_rate=enqueued["rate"],
        first=(0.0, 1),  # timed from the first completion (node reports ms)
        last_at=(done["t"] - first["t"]) / 1000,
        worker_cpu=worker_cpu,
        server_cpu=server_cpu,
        peak_rss_mb=peak_rss_mb,
    )


def main() -> None:
    _peer.command(
        __doc__,
        run,
        lambda sleep: f"graphile-worker {_node.GRAPHILE_WORKER}, sleep {sleep * 1000:g} ms",
    )


if __name__ == "__main__":
    main()
