"""Helpers of the worker tests: run a worker in a nursery, enqueue, wait for task states;
the daemons at an old minor and behind a cuttable proxy (fixtures, re-exported by
tests/work/conftest.py)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
import trio

from ringo_trio import (
    Task,
    TaskQueue,
    TaskSpec,
    TaskState,
    UnavailableError,
    Worker,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import free_port
from tests._kit.proxy import CuttableProxy


class Concurrent:
    """Handlers running at once, as the handlers count themselves: each wraps
    its body in `one`; ``now`` is how many are inside, ``peak`` the most."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    @contextmanager
    def one(self) -> Iterator[None]:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            self.now -= 1


async def wait_states(
    queue: TaskQueue, ids: list[str], states: set[TaskState], within: float = 20.0
) -> list[Task]:
    """Poll the daemon until every task is in one of ``states``."""
    with trio.fail_after(within):
        while True:
            tasks = [await queue.get_by_id(task_id) for task_id in ids]
            if all(task.state in states for task in tasks):
                return tasks
            await trio.sleep(0.05)


async def enqueue(queue: TaskQueue, n: int, **spec: object) -> list[str]:
    result = await queue.enqueue_many([TaskSpec("t", **spec) for _ in range(n)])  # type: ignore[arg-type]
    return [r.task.id for r in result.results]


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[trio.Nursery]:
    """Run ``worker`` in a nursery; close it when the block ends."""
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        try:
            yield nursery
        finally:
            with trio.CancelScope(shield=True), trio.fail_after(30):
                await worker.close()


@pytest.fixture
def old_daemon(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[DaemonProcess]:
    minor: int = request.param
    with spawn_daemon(tmp_path / f"minor{minor}", protocol_minor=minor) as daemon:
        yield daemon


@pytest.fixture
async def proxied_daemon(
    tmp_path: pathlib.Path,
) -> AsyncIterator[tuple[DaemonProcess, CuttableProxy]]:
    port = free_port()
    daemon = spawn_daemon(tmp_path / "proxied", extra_args=["--listen", f"127.0.0.1:{port}"])
    try:
        proxy = CuttableProxy(port)
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            yield daemon, proxy
            nursery.cancel_scope.cancel()
    finally:
        daemon.stop()


async def enqueue_retrying(queue: TaskQueue, n: int) -> list[str]:
    # The cut also dropped the unary channel; an enqueue racing it may fail
    # (never replayed, by design), so the test retries it itself.
    with trio.fail_after(20):
        while True:
            try:
                return await enqueue(queue, n)
            except UnavailableError:
                await trio.sleep(0.1)
