"""An asyncio event loop with trio's ``autojump_clock`` semantics, for tests.

`AutojumpEventLoop` keeps its own virtual ``time()``, starting at 0. Whenever
the loop would block — no callback ready and no I/O event waiting — it moves
the clock straight to the next timer instead of sleeping: an
``asyncio.sleep(3600)`` returns at once, one virtual hour later, exactly as
under ``trio.testing.MockClock(autojump_threshold=0)``. It does so by
wrapping the loop's selector: a select that would wait polls first, and if
nothing is ready advances the clock by the timeout it was given.

Like trio's autojump, this is only sound when nothing outside the loop is
about to wake it: a socket whose reply is in flight, or a worker thread,
looks the same as idle, and the clock jumps past it. `RingoTestEnv` talks to
its daemon through in-memory pipes, so it has no socket; the worker thread
of a plain (``def``) task function holds the jumps (`holding_jumps`) while
it runs. With no timer scheduled at all the loop waits for real, as usual.

Use it with anyio's pytest plugin::

    @pytest.fixture
    def anyio_backend():
        return ("asyncio", {"loop_factory": AutojumpEventLoop})

This module is asyncio-only by nature; tests/test_contract.py allows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Iterator
from typing import Any

__all__ = ["THREAD_HOLD", "AutojumpEventLoop", "running_autojump_loop"]

THREAD_HOLD = 1.0
"""Real seconds of idleness a virtual clock waits before it jumps while a
plain task function runs in its worker thread (`_virtual.clock_held`): long
enough for a function that returns at once on a loaded machine, short
enough that a thread waiting on the loop's own timers (``from_thread`` a
sleep) costs a test a second, not a hang."""


class _JumpingSelector(selectors.BaseSelector):
    def __init__(self, loop_clock: list[float]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = loop_clock
        self.holds = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0:
            return self._inner.select(timeout)
        ready = self._inner.select(min(timeout, THREAD_HOLD) if self.holds else 0)
        if not ready:
            # Nothing can happen before the next timer: skip to it.
            self._clock[0] += timeout
        return ready

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class AutojumpEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock is virtual and jumps to the next timer when idle."""

    def __init__(self) -> None:
        self._virtual = [0.0]
        self._jumping = _JumpingSelector(self._virtual)
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._virtual[0]

    @contextlib.contextmanager
    def holding_jumps(self) -> Iterator[None]:
        """While inside, the clock jumps only after `THREAD_HOLD` real
        seconds of idleness (nested and concurrent holds count)."""
        self._jumping.holds += 1
        try:
            yield
        finally:
            self._jumping.holds -= 1


def running_autojump_loop() -> AutojumpEventLoop | None:
    """The running asyncio loop if it is an `AutojumpEventLoop` (virtual time)."""
    loop = asyncio.get_running_loop()
    return loop if isinstance(loop, AutojumpEventLoop) else None
