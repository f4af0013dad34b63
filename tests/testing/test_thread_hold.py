"""A plain (``def``) task function runs in a worker thread, in real time,
while the kit's clock is virtual: the clock must not jump past it."""

from __future__ import annotations

import math
import time

import anyio
import pytest
import trio
import trio.testing

from ringo_trio import TaskRegistry
from ringo_trio.testing import AutojumpEventLoop, RingoTestEnv
from ringo_trio.testing._autojump import THREAD_HOLD
from ringo_trio.testing._virtual import clock_held

tasks = TaskRegistry(queue="slow")


@tasks.task
def slow_double(n: int) -> int:
    # Real time the loop cannot see: the thread blocks, the loop looks idle.
    time.sleep(0.2)
    return 2 * n


async def _result_within_a_virtual_second() -> int:
    async with RingoTestEnv.start() as env:
        handle = await slow_double.enqueue(env.client, 21)
        async with anyio.create_task_group() as tg:
            worker = tasks.worker(env.client, concurrency=2)
            tg.start_soon(worker.run)
            value = await handle.result(timeout=1)
            await worker.close()
    return value


@pytest.mark.trio
async def test_under_trio_autojump_a_plain_functions_thread_takes_no_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a plain function that blocks its thread for 0.2 real
    seconds returns its result to a ``result(timeout=1)`` (virtual) under
    ``autojump_threshold=0``: the clock does not race past the thread. Red
    without the hold: the clock jumps while the thread sleeps and the wait
    times out. Afterwards the clock autojumps as the test set it."""
    assert await _result_within_a_virtual_second() == 42
    assert autojump_clock.autojump_threshold == 0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"loop_factory": AutojumpEventLoop})


@pytest.mark.anyio
async def test_under_asyncio_autojump_a_plain_functions_thread_takes_no_virtual_time() -> None:
    """Property: the same on `AutojumpEventLoop` (anyio's plugin on asyncio),
    and its sleeps jump again once the thread is done."""
    assert await _result_within_a_virtual_second() == 42
    begin = time.monotonic()
    await anyio.sleep(3600)
    assert time.monotonic() - begin < THREAD_HOLD


@pytest.mark.trio
async def test_the_hold_is_bounded_and_the_tests_threshold_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: while threads run, the clock jumps only after `THREAD_HOLD`
    real seconds of idleness -- a finite bound, so a thread that waits on
    the loop's own timers delays its test instead of hanging it. The
    threshold the test set comes back when the last of concurrent threads
    ends, also when its function raised; a threshold the test set while
    held is kept."""
    assert 0 < THREAD_HOLD < math.inf
    with clock_held():
        assert autojump_clock.autojump_threshold == THREAD_HOLD
        with clock_held():
            pass
        assert autojump_clock.autojump_threshold == THREAD_HOLD
    assert autojump_clock.autojump_threshold == 0

    with pytest.raises(ValueError, match="failed"), clock_held():
        raise ValueError("the task function failed")
    assert autojump_clock.autojump_threshold == 0

    with clock_held():
        autojump_clock.autojump_threshold = 0.5
    assert autojump_clock.autojump_threshold == 0.5

    autojump_clock.autojump_threshold = 2 * THREAD_HOLD
    with clock_held():
        assert autojump_clock.autojump_threshold == 2 * THREAD_HOLD
    assert autojump_clock.autojump_threshold == 2 * THREAD_HOLD


@pytest.mark.trio
async def test_a_real_clock_is_left_alone() -> None:
    """Property: outside a virtual clock the hold does nothing."""
    clock = trio.lowlevel.current_clock()
    with clock_held():
        assert trio.lowlevel.current_clock() is clock
