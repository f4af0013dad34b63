"""Is the running event loop's clock virtual? `RingoTestEnv` refuses to run
"virtual" time on a real clock. And `clock_held`: a virtual clock waits for
a plain task function's thread.

A test that expects virtual time but runs on a real clock does not fail: it
waits. A one-hour retry backoff under anyio's default asyncio loop (a wrong
marker, or ``anyio_backend`` left at its default), or under pytest-trio
without ``autojump_clock``, sat for the whole real hour before anyone
noticed. So ``time="loop"`` is refused at once on a clock the kit does not
know to be virtual, with the fix in the message; ``time="real"`` is how a
test says real time is what it means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator
from typing import Any

import sniffio

from ._autojump import THREAD_HOLD, running_autojump_loop

__all__ = ["RealClockError", "check_virtual_clock", "clock_held", "loop_clock_is_virtual"]

_FIX = (
    "RingoTestEnv.start() runs on the event loop's clock, and this test's loop has a real"
    " clock, so every retry delay, lease and backoff would take real time. Give the test"
    " a virtual clock: under pytest-trio, request the `autojump_clock` fixture (or"
    " `mock_clock`); under anyio's pytest plugin, define"
    ' `anyio_backend` returning ("asyncio", {"loop_factory": AutojumpEventLoop}) or'
    ' ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}); under trio.run,'
    " pass clock=trio.testing.MockClock(autojump_threshold=0). If real time is what the"
    ' test means, say so: RingoTestEnv.start(time="real").'
)


class RealClockError(RuntimeError):
    """`RingoTestEnv.start` (``time="loop"``, the default) found a real clock
    where it needs a virtual one; the message names the fix."""


def loop_clock_is_virtual() -> bool:
    """True if the running loop's clock is one the kit knows to be virtual:
    a trio ``MockClock`` (autojumping or hand-driven) or an
    `AutojumpEventLoop` under asyncio."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel
        import trio.testing

        return isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock)
    return running_autojump_loop() is not None


def check_virtual_clock() -> None:
    """Raise `RealClockError` unless the running loop's clock is virtual."""
    if not loop_clock_is_virtual():
        raise RealClockError(_FIX)


@dataclasses.dataclass
class _TrioHold:
    threads: int
    threshold: float  # the clock's own, put back when the last thread ends
    held: float  # what the holds set


@contextlib.contextmanager
def clock_held() -> Iterator[None]:
    """While a plain task function runs in its worker thread: a virtual
    clock jumps only after `THREAD_HOLD` real seconds of idleness.

    The thread's real time is invisible to the loop, which looks idle while
    it waits, so an autojumping clock raced past the timeouts armed around
    the task -- a ``result(timeout=30)`` failed while the function returned
    in a millisecond. Holding the jumps makes the thread's time count as
    none, as a test means it; the bound keeps a thread that waits on the
    loop's own timers from hanging its test. Outside a virtual clock it does
    nothing. The registry calls it only when the kit is loaded."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel
        import trio.testing

        clock = trio.lowlevel.current_clock()
        if isinstance(clock, trio.testing.MockClock):
            with _held_trio(clock):
                yield
            return
    elif (loop := running_autojump_loop()) is not None:
        with loop.holding_jumps():
            yield
        return
    yield


# The holds of each trio MockClock now held.
_trio_holds: weakref.WeakKeyDictionary[Any, _TrioHold] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _held_trio(clock: Any) -> Iterator[None]:
    hold = _trio_holds.get(clock)
    if hold is None:
        threshold = clock.autojump_threshold
        hold = _trio_holds[clock] = _TrioHold(0, threshold, max(threshold, THREAD_HOLD))
        clock.autojump_threshold = hold.held
    hold.threads += 1
    try:
        yield
    finally:
        hold.threads -= 1
        if not hold.threads:
            del _trio_holds[clock]
            # A threshold the test set meanwhile is the test's to keep.
            if clock.autojump_threshold == hold.held:
                clock.autojump_threshold = hold.threshold
