"""The benchmark's worker process: ONE `Worker` against a running daemon.

    python bench/worker.py ENDPOINT QUEUE --expect N [--concurrency C] [--prefetch P]
                           [--sleep S] [--stamp]

Prints one JSON line ``{"event": "registered", ...}`` once the worker is
registered, then works until its handler has seen N tasks, closes the worker
(every ack answered by the daemon) and prints ``{"event": "done", ...}``:
elapsed seconds and this process's CPU seconds from registration to the
close, enqueue→ack latencies (p50/p99, from the daemon's ``created_at`` to
the handler's return; with ``--stamp``: from the producer's clock, an 8-byte
double in the payload written just before its ``enqueue`` call, to the
handler's START), the first and the Nth handler return (for the steady rate
after the first completion, as the peers are measured) and this process's
peak RSS (``VmHWM``, not ``ru_maxrss``,
which Linux carries over ``execve`` from the parent: bench/_proc.py), so the
worker's memory is measured alone.
"""

from __future__ import annotations

import argparse
import array
import json
import struct
import sys
import time

import _proc
import _stats
import trio

import ringo_trio
from ringo_trio import Ringo, Task, TaskContext


def _emit(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    latencies = array.array("d")
    done = trio.Event()
    seen = 0
    first = last = 0.0
    sleep = args.sleep
    expect = args.expect
    stamp = args.stamp
    clock = time.time

    async def handle(task: Task, ctx: TaskContext) -> None:
        nonlocal seen, first, last
        if stamp:
            latencies.append(clock() - struct.unpack("d", task.payload)[0])
        if sleep:
            await trio.sleep(sleep)
        if not stamp and task.created_at is not None:
            latencies.append(clock() - task.created_at.timestamp())
        seen += 1
        if seen == 1:
            first = time.perf_counter()
        if seen >= expect:
            last = time.perf_counter()
            done.set()

    async with Ringo.connect(args.endpoint) as client:
        # Named only when set: a --start-tree / --baseline tree may predate it.
        options = {"prefetch": args.prefetch} if args.prefetch else {}
        worker = client.queue(args.queue).worker(handle, concurrency=args.concurrency, **options)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            started = time.perf_counter()
            cpu_started = time.process_time()
            _emit(event="registered", worker_id=worker.worker_id)
            await done.wait()
            await worker.close()
            closed = time.perf_counter()
            cpu = time.process_time() - cpu_started
    values = list(latencies)
    _emit(
        event="done",
        tasks=seen,
        elapsed=closed - started,
        first_handler=first - started,
        last_handler=last - started,
        cpu=cpu,
        p50=_stats.percentile(values, 0.50),
        p99=_stats.percentile(values, 0.99),
        peak_rss_kb=_proc.peak_rss_kb(),
    )


def tune_gc_if_known() -> None:
    """What docs/worker.md asks of a process whose main job is a worker
    (`ringo_trio.tune_gc`); a --start-tree / --baseline tree may predate it."""
    tune = getattr(ringo_trio, "tune_gc", None)
    if tune is not None:
        tune()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("endpoint")
    parser.add_argument("queue")
    parser.add_argument("--expect", type=int, required=True, help="tasks to wait for")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per handler")
    parser.add_argument(
        "--prefetch", type=int, default=0, help="leases held beyond concurrency (Worker prefetch)"
    )
    parser.add_argument(
        "--stamp", action="store_true", help="latency from the send time in the payload"
    )
    args = parser.parse_args()
    tune_gc_if_known()
    trio.run(_main, args)


if __name__ == "__main__":
    main()
