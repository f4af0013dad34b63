"""Real time the testing kit spends on virtual time.

    python bench/testing_kit.py [--repeat 5]

Runs, under trio (MockClock autojump) and under asyncio (AutojumpEventLoop):

* ``retry``: one task with a one-hour retry delay failing until its third
  attempt succeeds (two virtual hours), worked with ``run_worker(until="settled")``;
* ``idle-day``: a worker left running across one idle virtual day;

and prints the median real seconds of each, start and stop of the
in-process daemon included.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import anyio
import trio
import trio.testing

from ringo_trio import RetryBackoff, RetryTaskError, Task, TaskContext, TaskState
from ringo_trio.testing import AutojumpEventLoop, RingoTestEnv

HOUR = timedelta(hours=1)


async def retry() -> None:
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("bench")
        result = await queue.enqueue(
            task_type="t", max_attempts=3, retry_backoff=RetryBackoff(initial=HOUR, maximum=HOUR)
        )

        async def handler(task: Task, ctx: TaskContext) -> None:
            if task.attempt < 3:
                raise RetryTaskError("not yet")

        await env.run_worker(queue, handler)
        task = await queue.get_by_id(result.task.id)
        assert (task.state, task.attempt) == (TaskState.SUCCEEDED, 3)


async def idle_day() -> None:
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("bench")
        await queue.enqueue(task_type="t", delay=timedelta(days=1))

        async def handler(task: Task, ctx: TaskContext) -> None:
            pass

        await env.run_worker(queue, handler)


def run(backend: str, scenario: Callable[[], Awaitable[None]]) -> float:
    begin = time.perf_counter()
    if backend == "trio":
        trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    else:
        anyio.run(scenario, backend="asyncio", backend_options={"loop_factory": AutojumpEventLoop})
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name, scenario in (("retry (2 virtual h)", retry), ("idle-day (24 virtual h)", idle_day)):
        for backend in ("trio", "asyncio"):
            times = [run(backend, scenario) for _ in range(args.repeat)]
            print(
                f"{name:26} {backend:8} median {statistics.median(times):.3f} s"
                f"  (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})"
            )


if __name__ == "__main__":
    main()
