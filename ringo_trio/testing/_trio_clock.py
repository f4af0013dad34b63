"""Driving trio's hand-driven MockClock through a stretch of time, timer by timer."""

from __future__ import annotations

import math

import trio
import trio.lowlevel
import trio.testing

__all__ = ["hand_driven", "jump_through"]


def hand_driven() -> trio.testing.MockClock | None:
    """The run's clock if it is a MockClock that moves only when jumped."""
    clock = trio.lowlevel.current_clock()
    if (
        isinstance(clock, trio.testing.MockClock)
        and clock.rate == 0
        and math.isinf(clock.autojump_threshold)
    ):
        return clock
    return None


async def jump_through(clock: trio.testing.MockClock, seconds: float) -> None:
    """Move ``clock`` ``seconds`` ahead, stopping at every deadline on the way
    until the tasks it wakes are blocked again, so what is due in between
    happens at its own time and in order (one jump would fire it all late)."""
    target = trio.current_time() + seconds
    while True:
        await trio.testing.wait_all_tasks_blocked()
        now = trio.current_time()
        step = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if now + step > target:
            if target > now:
                clock.jump(target - now)
            await trio.testing.wait_all_tasks_blocked()
            return
        if step > 0:
            clock.jump(step)
        else:
            await trio.lowlevel.checkpoint()
