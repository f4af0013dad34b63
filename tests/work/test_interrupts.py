"""Where trio may raise a Ctrl-C's KeyboardInterrupt (ringo_trio._interrupts).

The random-moment proof is tests/work/test_ctrl_c.py (slow set); these pin the
two rules it rests on, deterministically.
"""

from __future__ import annotations

import asyncio

import pytest
import trio
import trio_asyncio

from ringo_trio import Ringo, Task, TaskContext, TaskSpec
from ringo_trio.testing import DaemonProcess

pytestmark = pytest.mark.trio


async def _protected_on_asyncio_side() -> bool:
    await asyncio.sleep(0)  # a later step of the task: run by the loop's queue
    return trio.lowlevel.currently_ki_protected()


async def test_asyncio_code_on_the_island_runs_ki_protected(daemon: DaemonProcess) -> None:
    """Asyncio code on a trio-asyncio loop (grpclib's callbacks, our pumps)
    runs KI-protected once a client exists: a Ctrl-C arriving there is
    delivered to the main task at a checkpoint, never raised inside an
    asyncio callback, where it hung the program or lost leases."""
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint), trio_asyncio.open_loop() as loop:
            assert await loop.run_aio_coroutine(_protected_on_asyncio_side())


async def test_handlers_are_not_ki_protected_but_the_sdk_task_running_them_is(
    daemon: DaemonProcess,
) -> None:
    """A handler is user code: a Ctrl-C may land in it (a loop without
    checkpoints stays interruptible). The handler's await is the one
    unprotected frame: the SDK code that settles after it is protected."""
    seen: list[bool] = []
    done = trio.Event()

    async def handle(task: Task, ctx: TaskContext) -> None:
        seen.append(trio.lowlevel.currently_ki_protected())
        done.set()

    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("interrupts")
            await queue.enqueue(TaskSpec("t", payload=b"x"))
            worker = queue.worker(handle)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await done.wait()
                await worker.close()
    assert seen == [False]
