"""Blocking access to a running daemon for the browser tests.

The browser tests are plain sync tests (Playwright's sync API), so they reach
the daemon through `Ops`: each call is one ``trio.run`` with a fresh client
(a loopback connection costs little), on the test's own thread.

`Ops.live_worker` keeps a real `Worker` attached (a Work stream the
``/workers`` page must show) for the length of a ``with`` block, which is
why it needs a thread of its own: there, a ``trio.run`` owns the worker in a
nursery and waits for the block to end.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import trio

from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskQueue

T = TypeVar("T")

# Generous: the machine is shared, and a hung daemon must still end the test.
CALL_TIMEOUT = 30.0


@dataclass
class LiveWorker:
    worker_id: str
    queue: str
    concurrency: int
    handling: threading.Event
    """Set once a handler runs (holds a lease)."""


class Ops:
    def __init__(self, endpoint: str, token: str | None) -> None:
        self.endpoint = endpoint
        self.token = token

    def run(self, fn: Callable[[RingoClient], Awaitable[T]]) -> T:
        """``await fn(client)`` on a fresh client; its result."""

        async def main() -> T:
            with trio.fail_after(CALL_TIMEOUT):
                async with Ringo.connect(self.endpoint, token=self.token) as client:
                    return await fn(client)

        return trio.run(main)

    def on_queue(self, queue: str, fn: Callable[[TaskQueue], Awaitable[T]]) -> T:
        async def call(client: RingoClient) -> T:
            return await fn(client.queue(queue))

        return self.run(call)

    def enqueue(self, queue: str, **spec: Any) -> str:
        """Enqueue one task (TaskSpec keywords); its id."""

        async def call(q: TaskQueue) -> str:
            return (await q.enqueue(**spec)).task.id

        return self.on_queue(queue, call)

    def get(self, queue: str, task_id: str) -> Task:
        return self.on_queue(queue, lambda q: q.get_by_id(task_id))

    def settle(self, queue: str, how: str, *, error: str = "", result: str = "") -> str:
        """Claim the queue's next task and settle it (``ack``, ``reject``, or
        ``nack``); its id. A rejected task is DEAD."""

        async def call(q: TaskQueue) -> str:
            (leased,) = await q.claim(1, wait_timeout=timedelta(seconds=5))
            if how == "ack":
                await leased.ack(result)
            elif how == "reject":
                await leased.reject(error)
            else:
                await leased.nack(error)
            return leased.task.id

        return self.on_queue(queue, call)

    @contextlib.contextmanager
    def live_worker(self, queue: str, *, concurrency: int) -> Iterator[LiveWorker]:
        """A Worker of `queue` registered with the daemon while the block runs.

        Its handler holds each task's lease until the block ends, except a
        task of type "quick-ok" (acked at once) or "quick-fail" (fails)."""
        ready: concurrent.futures.Future[tuple[trio.lowlevel.TrioToken, trio.Event, str]]
        ready = concurrent.futures.Future()
        handling = threading.Event()

        async def handler(task: Task, ctx: TaskContext) -> None:
            if task.task_type == "quick-ok":
                return
            if task.task_type == "quick-fail":
                raise RuntimeError("quick failure")
            handling.set()
            await trio.sleep_forever()

        async def main() -> None:
            async with Ringo.connect(self.endpoint, token=self.token) as client:
                worker = client.queue(queue).worker(
                    handler, concurrency=concurrency, grace_period=timedelta(0)
                )
                stop = trio.Event()
                async with trio.open_nursery() as nursery:
                    with trio.fail_after(CALL_TIMEOUT):
                        await nursery.start(worker.run)
                    ready.set_result((trio.lowlevel.current_trio_token(), stop, worker.worker_id))
                    await stop.wait()
                    with trio.fail_after(CALL_TIMEOUT):
                        await worker.close()

        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="live-worker") as pool:
            running: concurrent.futures.Future[None] = pool.submit(trio.run, main)
            either: list[concurrent.futures.Future[Any]] = [ready, running]
            done, _ = concurrent.futures.wait(
                either, timeout=CALL_TIMEOUT, return_when=concurrent.futures.FIRST_COMPLETED
            )
            if running in done:
                running.result()  # raises: the worker never started
            if ready not in done:
                raise TimeoutError(f"the worker of {queue!r} did not start in {CALL_TIMEOUT:g}s")
            token, stop, worker_id = ready.result()
            try:
                yield LiveWorker(worker_id, queue, concurrency, handling)
            finally:
                trio.from_thread.run_sync(stop.set, trio_token=token)
                running.result(timeout=CALL_TIMEOUT)
