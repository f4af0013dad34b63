"""Keyed limits across two ``ringod`` processes on one PostgreSQL database
(real sockets): a key's concurrency is counted in the database, so it holds
over every daemon's workers together."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio

from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskState
from ringo_trio.testing import DaemonProcess
from tests._kit.postgres import postgres_daemons
from tests._kit.workers import enqueue, running, wait_states

pytestmark = pytest.mark.trio

GUARD = 90


@asynccontextmanager
async def clients_of(daemons: Sequence[DaemonProcess]) -> AsyncIterator[list[RingoClient]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Ringo.connect(d.endpoint)) for d in daemons]


async def test_a_keys_concurrency_is_global_across_daemons(postgres_dsn: str) -> None:
    """Property: concurrency 3 on a key, a worker of concurrency 6 on each
    of two daemons sharing the database: never more than 3 of the key's
    handlers run at once (counted across both workers), another key beside
    it is not held by it, and every task finishes."""
    running_now = peak = 0
    by_key: dict[str, int] = {}

    async def handle(task: Task, ctx: TaskContext) -> None:
        nonlocal running_now, peak
        if task.limit_key == "t:hot":
            running_now += 1
            peak = max(peak, running_now)
        by_key[task.limit_key or ""] = by_key.get(task.limit_key or "", 0) + 1
        try:
            await trio.sleep(0.02)
        finally:
            if task.limit_key == "t:hot":
                running_now -= 1

    with postgres_daemons(postgres_dsn, 2) as daemons, trio.fail_after(GUARD):
        async with clients_of(daemons) as (a, b):
            await a.queue("shared").set_limit("t:", concurrency=3)
            hot = await enqueue(a.queue("shared"), 40, limit_key="t:hot")
            cold = await enqueue(b.queue("shared"), 10, limit_key="t:cold")
            async with (
                running(a.queue("shared").worker(handle, concurrency=6)),
                running(b.queue("shared").worker(handle, concurrency=6)),
            ):
                done = await wait_states(
                    b.queue("shared"), hot + cold, {TaskState.SUCCEEDED}, within=GUARD
                )
    assert len(done) == 50
    assert by_key == {"t:hot": 40, "t:cold": 10}
    assert 1 <= peak <= 3, peak
