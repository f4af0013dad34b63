"""Typed tasks against the raw API, in the same run (issue 26).

    python bench/typed.py [--tasks 10000] [--rounds 3] [--round-trips 200]

One private ``ringod`` on SQLite (``Ringo.local`` on a temporary data dir),
the producer and the worker in this process, concurrency 64:

* **throughput**: ``--tasks`` no-op tasks enqueued in batches of 1,000, then
  a worker started; timed from ``worker.run`` starting until the last
  handler call finished. *raw*: ``queue.enqueue_many`` of `TaskSpec`s with
  the same JSON payload and ``queue.worker(handler)``; *typed*:
  ``noop.enqueue_many`` and ``registry.worker`` (the router decodes and
  validates each payload, calls the function, encodes its ``None``). The
  two alternate for ``--rounds`` rounds, each on a fresh queue; medians.
* **round trip**: an idle typed worker, then ``--round-trips`` times in a
  row ``await (await echo.enqueue(client, n=i)).result()``: enqueue, push,
  run, ack, and the ``WaitTask`` wake-up; p50 and p99.

Prints a Markdown table (the bench/results.md section "Typed tasks").
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stats import percentile
from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskRegistry, TaskSpec

registry = TaskRegistry()


@registry.task(name="bench-noop")
async def noop(n: int) -> None:
    return None


@registry.task(name="bench-echo", queue="echo")
async def echo(n: int) -> int:
    return n


async def _run_until(client: RingoClient, worker_of: object, count: int) -> float:
    done = 0
    finished = trio.Event()

    def counted() -> None:
        nonlocal done
        done += 1
        if done == count:
            finished.set()

    return await _timed(client, worker_of, counted, finished)


async def _timed(
    client: RingoClient, make_worker: object, counted: object, finished: trio.Event
) -> float:
    assert callable(make_worker)
    worker = make_worker(counted)
    async with trio.open_nursery() as nursery:
        start = time.perf_counter()
        nursery.start_soon(worker.run)
        await finished.wait()
        elapsed = time.perf_counter() - start
        await worker.close()
    return elapsed


async def raw_round(client: RingoClient, queue: str, tasks: int) -> float:
    q = client.queue(queue)
    for first in range(0, tasks, 1000):
        specs = [
            TaskSpec(task_type="bench-noop", payload=json.dumps({"n": n}).encode())
            for n in range(first, min(first + 1000, tasks))
        ]
        await q.enqueue_many(specs)

    def make(counted: object) -> object:
        assert callable(counted)

        async def handler(task: Task, ctx: TaskContext) -> None:
            counted()

        return q.worker(handler, concurrency=64)

    return await _run_until(client, make, tasks)


async def typed_round(client: RingoClient, queue: str, tasks: int) -> float:
    call = noop.configure(queue=queue)
    for first in range(0, tasks, 1000):
        await call.enqueue_many(client, [{"n": n} for n in range(first, min(first + 1000, tasks))])
    local = TaskRegistry(queue=queue)
    counter: list[object] = []

    @local.task(name="bench-noop")
    async def counting_noop(n: int) -> None:
        counter[0]()  # type: ignore[operator]

    def make(counted: object) -> object:
        counter[:] = [counted]
        return local.worker(client, concurrency=64)

    return await _run_until(client, make, tasks)


async def round_trips(client: RingoClient, count: int) -> list[float]:
    worker = registry.worker(client, queue="echo", concurrency=8)
    samples = []
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1.0)
        for n in range(count):
            start = time.perf_counter()
            handle = await echo.enqueue(client, n=n)
            assert await handle.result(timeout=10) == n
            samples.append(time.perf_counter() - start)
        await worker.close()
    return samples


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as data:
        async with Ringo.local(Path(data) / "data") as client:
            raw: list[float] = []
            typed: list[float] = []
            for n in range(args.rounds):
                raw.append(await raw_round(client, f"raw-{n}", args.tasks))
                typed.append(await typed_round(client, f"typed-{n}", args.tasks))
            trips = await round_trips(client, args.round_trips)
    raw_rate = args.tasks / statistics.median(raw)
    typed_rate = args.tasks / statistics.median(typed)
    print(f"python {platform.python_version()}, {args.tasks:,} tasks x {args.rounds} rounds")
    print()
    print("| measurement | raw API | typed tasks | typed / raw |")
    print("|---|--:|--:|--:|")
    print(
        f"| {args.tasks:,} no-op tasks, worker at concurrency 64 (tasks/s, median)"
        f" | {raw_rate:,.0f} | {typed_rate:,.0f} | {typed_rate / raw_rate:.2f} |"
    )
    print(
        f"| enqueue + `result()` round trip, idle worker (ms), p50 / p99"
        f" | | {percentile(trips, 0.5) * 1000:.2f} / {percentile(trips, 0.99) * 1000:.2f} | |"
    )
    print()
    print("rounds (s): raw", [f"{t:.2f}" for t in raw], "typed", [f"{t:.2f}" for t in typed])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=200)
    trio.run(main, parser.parse_args())
