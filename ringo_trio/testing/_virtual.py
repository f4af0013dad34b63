"""Is the running event loop's clock virtual? `RingoTestEnv` refuses to run
"virtual" time on a real clock.

A test that expects virtual time but runs on a real clock does not fail: it
waits. A one-hour retry backoff under anyio's default asyncio loop (a wrong
marker, or ``anyio_backend`` left at its default), or under pytest-trio
without ``autojump_clock``, sat for the whole real hour before anyone
noticed. So ``time="loop"`` is refused at once on a clock the kit does not
know to be virtual, with the fix in the message; ``time="real"`` is how a
test says real time is what it means.
"""

from __future__ import annotations

import sniffio

__all__ = ["RealClockError", "check_virtual_clock", "loop_clock_is_virtual"]

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
    from ._autojump import running_on_autojump

    return running_on_autojump()


def check_virtual_clock() -> None:
    """Raise `RealClockError` unless the running loop's clock is virtual."""
    if not loop_clock_is_virtual():
        raise RealClockError(_FIX)
