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
its daemon through in-memory pipes, so it has neither. With no timer
scheduled at all the loop waits for real, as usual.

Use it with anyio's pytest plugin::

    @pytest.fixture
    def anyio_backend():
        return ("asyncio", {"loop_factory": AutojumpEventLoop})

This module is asyncio-only by nature; tests/test_contract.py allows it.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["AutojumpEventLoop", "running_on_autojump"]


class _JumpingSelector(selectors.BaseSelector):
    def __init__(self, loop_clock: list[float]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = loop_clock

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0:
            return self._inner.select(timeout)
        ready = self._inner.select(0)
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
        super().__init__(_JumpingSelector(self._virtual))

    def time(self) -> float:
        return self._virtual[0]


def running_on_autojump() -> bool:
    """True if the running asyncio loop is an `AutojumpEventLoop` (virtual time)."""
    return isinstance(asyncio.get_running_loop(), AutojumpEventLoop)
