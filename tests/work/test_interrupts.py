"""Where trio may raise a Ctrl-C's KeyboardInterrupt (ringo_trio._interrupts).

The random-moment proof is tests/work/test_ctrl_c.py (slow set); these pin the
two rules it rests on, deterministically.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator

import anyio
import pytest
import trio
import trio.testing
import trio_asyncio

from ringo_trio import Ringo, Task, TaskContext, TaskSpec
from ringo_trio import _interrupts as interrupts
from ringo_trio.testing import DaemonProcess, RingoTestEnv


async def _protected_on_asyncio_side() -> bool:
    await asyncio.sleep(0)  # a later step of the task: run by the loop's queue
    return trio.lowlevel.currently_ki_protected()


@pytest.mark.trio
async def test_asyncio_code_on_the_island_runs_ki_protected(daemon: DaemonProcess) -> None:
    """Asyncio code on a trio-asyncio loop (grpclib's callbacks, our pumps)
    runs KI-protected once a client exists: a Ctrl-C arriving there is
    delivered to the main task at a checkpoint, never raised inside an
    asyncio callback, where it hung the program or lost leases."""
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint), trio_asyncio.open_loop() as loop:
            assert await loop.run_aio_coroutine(_protected_on_asyncio_side())


@pytest.mark.trio
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


# -- a Ctrl-C during a stop (`abandon_on_interrupt`) ------------------------------


class _Handler:
    """A Python SIGINT handler standing in for trio's (trio leaves a handler
    that is not Python's default in place), counting the signals it got."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, _signum: int, _frame: object) -> None:
        self.calls += 1


@pytest.fixture
def sigint() -> Iterator[_Handler]:
    handler = _Handler()
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield handler
    finally:
        # A test that failed midway leaves no stop behind for the next one.
        for scope in list(interrupts._stops):
            interrupts.forget(scope)
        signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_during_a_stop_cancels_it_and_is_handled_as_before(sigint: _Handler) -> None:
    """Property: while a stop is in progress, a SIGINT cancels the stop's
    scope and then reaches the handler that was in place, unchanged; the
    handler goes back once the last stop in progress is forgotten (not
    before), and a stop forgotten twice changes nothing."""

    async def main() -> None:
        first, second = anyio.CancelScope(), anyio.CancelScope()
        interrupts.abandon_on_interrupt(first)
        interrupts.abandon_on_interrupt(second)
        ours = signal.getsignal(signal.SIGINT)
        assert ours is not sigint
        signal.raise_signal(signal.SIGINT)
        # The cancellation comes through the trio token, the signal-safe way
        # in: a scheduler pass or more later, and ends what the stop awaits.
        with trio.fail_after(5), first:
            await trio.sleep_forever()
        assert first.cancel_called
        assert second.cancel_called
        assert sigint.calls == 1
        interrupts.forget(first)
        interrupts.forget(first)
        assert signal.getsignal(signal.SIGINT) is ours
        interrupts.forget(second)
        assert signal.getsignal(signal.SIGINT) is sigint

    trio.run(main)


def test_a_workers_stop_puts_the_sigint_handler_back_when_run_ends(sigint: _Handler) -> None:
    """Property: a stopping worker's Ctrl-C rule lasts as long as its stop.
    While its cancelled handler exits, a SIGINT would cancel the stop; once
    `run` has returned, the handler in place before is back and no stop is
    left registered (a later Ctrl-C is the program's again)."""
    during: list[bool] = []

    async def main() -> None:
        with trio.fail_after(600):
            async with RingoTestEnv.start() as env:
                queue = env.client.queue("stop-sigint")
                await queue.enqueue(TaskSpec("t"))
                started = trio.Event()

                async def handle(task: Task, ctx: TaskContext) -> None:
                    started.set()
                    try:
                        await trio.sleep_forever()
                    except trio.Cancelled:
                        during.append(signal.getsignal(signal.SIGINT) is not sigint)
                        raise

                worker = queue.worker(handle)
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    await started.wait()
                    await worker.stop()
                assert signal.getsignal(signal.SIGINT) is sigint
                assert not interrupts._stops

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert during == [True]
    assert sigint.calls == 0


def test_a_handler_put_in_place_of_ours_meanwhile_is_left_alone(sigint: _Handler) -> None:
    """Property: a program that replaced the SIGINT handler during a stop
    keeps its own when the stop ends."""
    theirs = _Handler()

    async def main() -> None:
        scope = anyio.CancelScope()
        interrupts.abandon_on_interrupt(scope)
        signal.signal(signal.SIGINT, theirs)
        interrupts.forget(scope)
        assert signal.getsignal(signal.SIGINT) is theirs
        # Forgotten: the next stop installs ours again, in front of theirs.
        again = anyio.CancelScope()
        interrupts.abandon_on_interrupt(again)
        assert signal.getsignal(signal.SIGINT) not in (sigint, theirs)
        interrupts.forget(again)
        assert signal.getsignal(signal.SIGINT) is theirs

    trio.run(main)


def test_where_the_rule_does_not_apply_nothing_is_installed(sigint: _Handler) -> None:
    """Property: the SIGINT handler is touched only under trio, in the main
    thread, and when the handler in place is a Python callable (a program
    that ignores SIGINT keeps ignoring it; asyncio turns SIGINT into a
    cancellation by itself)."""

    async def on_trio() -> None:
        interrupts.abandon_on_interrupt(anyio.CancelScope())

    async def on_asyncio() -> None:
        await on_trio()

    asyncio.run(on_asyncio())
    assert signal.getsignal(signal.SIGINT) is sigint
    worker = threading.Thread(target=trio.run, args=(on_trio,))
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGINT) is sigint
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    trio.run(on_trio)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
