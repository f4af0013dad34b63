"""The Node.js Redis peer: BullMQ (the version ``bench/_node.py`` pins, with
ioredis) on the local Redis, measured like ``bench/peer_procrastinate.py``.

    python bench/peer_bullmq.py [--tasks 10000] [--concurrency 64] [--sleep 0]

Theory of operation.

* Storage: the Redis at ``$RINGO_BENCH_REDIS`` (``host:port``, default
  ``127.0.0.1:6379``; the bench's runs without persistence), a fresh queue
  name per run (``ringo-bench-<random>``, BullMQ's ``bull:`` key prefix),
  obliterated afterwards (``Queue.obliterate({force: true})``: all its keys),
  also when the run fails.
* A node process (``bench/node/bullmq_peer.mjs enqueue``) adds N jobs first
  with ``Queue.addBulk`` in calls of 1,000 (one MULTI of 1,000 ``addJob``
  scripts), timed on its own, as the enqueue rate.
* THEN ONE worker process (``node bench/node/bullmq_peer.mjs work``) runs
  them: ``new Worker(name, processor, {connection, concurrency, autorun:
  true})``, ``concurrency`` 64 for the no-op run and 256 for the 10 ms run
  (the ``--concurrency`` given); the processor runs ``noop`` (an async no-op)
  or ``sleep10`` (awaits a 10 ms ``setTimeout``) by job name, chosen by
  ``--sleep`` (0 or 0.01). ``removeOnComplete`` is left at BullMQ's default:
  completed jobs are KEPT (their hash, and an entry in the completed sorted
  set), as procrastinate keeps its jobs, so they can be counted. Everything
  else is BullMQ's default (a blocking connection plus a command connection,
  ``moveToCompleted`` fetching the next job in the same script call, the
  events stream capped at ~10,000 entries, stalled-job checks every 30 s).
* The rate is the steady rate after the first completion, counted in the
  worker: its ``completed`` event (emitted after ``moveToCompleted`` has
  returned from Redis) stamps ``performance.now()`` at the first and at the
  N-th: (N - 1) / (tN - t1). Start-up is not in it.
* CPU over the same span, read by this process when the worker's "first" and
  "done" lines arrive: the worker process's own and the ``redis-server``
  process's (``pgrep -x redis-server``, /proc; 0 when it cannot be read,
  e.g. a remote Redis; the whole server, so anything else using that Redis
  meanwhile counts too). Peak RSS: the worker's ``VmHWM``, read before it is
  stopped.
* Then the worker is stopped (SIGTERM: ``Worker.close()``; killed after
  30 s) and the queue must count N completed jobs, none failed and nothing
  else left.

How it differs from our contract: the queue's whole state is in Redis, which
here runs without persistence (no RDB snapshots, no AOF): a Redis restart
loses every queued, running and completed job, where ours (and the PostgreSQL
peers) are on disk before the enqueue returns. BullMQ's results live in the
job hash like ours, but its at-least-once guarantee rests on the stalled-job
check (a lock of 30 s), not on a transaction.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess

import _node
import _peer
import _proc

REDIS = os.environ.get("RINGO_BENCH_REDIS", "127.0.0.1:6379")
JOBS = {0.0: "noop", 0.01: "sleep10"}  # --sleep → BullMQ job name


def redis_pids() -> list[int]:
    """The local redis-server process(es) (none if pgrep finds or runs none)."""
    try:
        out = subprocess.run(
            ["pgrep", "-x", "redis-server"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(pid) for pid in out.split()]


def redis_cpu(pids: list[int]) -> float:
    """CPU seconds so far of `pids` (0 for one that cannot be read)."""
    return sum(_proc.cpu_seconds(pid) for pid in pids)


def run(tasks: int, concurrency: int = 64, sleep: float = 0.0) -> _peer.PeerRun:
    """Add `tasks` jobs, then one worker process runs them; measured as the
    module docstring says."""
    if tasks < 2:
        raise ValueError("a steady rate needs at least 2 tasks")
    if sleep not in JOBS:
        raise ValueError(f"bullmq: --sleep must be one of {sorted(JOBS)}")
    queue = f"ringo-bench-{os.getpid()}-{secrets.token_hex(4)}"
    servers = redis_pids()  # found once: no pgrep between the readings
    try:
        enqueued = _node.run_json(
            "bullmq_peer.mjs", "enqueue", REDIS, queue, str(tasks), JOBS[sleep]
        )
        proc = _node.spawn("bullmq_peer.mjs", "work", REDIS, queue, str(tasks), str(concurrency))
        try:
            lines = _proc.Lines(proc, "the node worker")
            first = lines.next(120)
            worker_cpu0, server_cpu0 = _proc.cpu_seconds(proc.pid), redis_cpu(servers)
            assert first["event"] == "first", first
            done = lines.next(600)
            worker_cpu, server_cpu = _proc.cpu_seconds(proc.pid), redis_cpu(servers)
            assert done["event"] == "done", done
            peak_rss_mb = _proc.peak_rss_kb(proc.pid) / 1024
        finally:
            # SIGTERM: the peer's graceful stop (killed after 30 s).
            _proc.stop(proc)
    except BaseException:
        # Obliterate the queue anyway; the first error is the one to see.
        with contextlib.suppress(Exception):
            _node.run_json("bullmq_peer.mjs", "finish", REDIS, queue)
        raise
    counts = _node.run_json("bullmq_peer.mjs", "finish", REDIS, queue)
    others = {state: n for state, n in counts.items() if n and state != "completed"}
    if counts.get("completed") != tasks or others or done["failed"]:
        raise RuntimeError(f"bullmq: {counts} after {tasks} jobs, {done['failed']} failure(s)")
    return _peer.measured(
        tasks=tasks,
        concurrency=concurrency,
        enqueue_rate=enqueued["rate"],
        first=(0.0, 1),  # timed from the first completion (node reports ms)
        last_at=(done["t"] - first["t"]) / 1000,
        worker_cpu=worker_cpu - worker_cpu0,
        server_cpu=server_cpu - server_cpu0,
        peak_rss_mb=peak_rss_mb,
    )


def main() -> None:
    _peer.command(
        __doc__,
        run,
        lambda sleep: f"BullMQ {_node.BULLMQ}, sleep {sleep * 1000:g} ms",
        server="redis-server",
    )


if __name__ == "__main__":
    main()
