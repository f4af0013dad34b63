"""The Work stream's heartbeat on a virtual clock (the testing kit's AutojumpEventLoop)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from ringo_trio.server.clock import ManualClock
from ringo_trio.server.rpc.work import _WorkStream
from ringo_trio.testing import AutojumpEventLoop

# Found by search: resuming after sleep(10 - (NOW - SENT)) the clock reads an
# ulp short of SENT + 10, and the remainder (3.6e-15 s) is below what the
# clock can add to NOW.
SENT = 25.4458609934608
NOW = 30.859985721395766


class _Sent(Exception):
    pass


class _SpinGuard(AutojumpEventLoop):
    """Fails a loop that iterates without end (time does not move in a spin,
    so no timeout could catch it)."""

    iterations = 0

    def _run_once(self) -> None:
        self.iterations += 1
        if self.iterations > 100_000:
            raise RuntimeError("the event loop is spinning")
        super()._run_once()  # type: ignore[misc]


class _Probe(_WorkStream):
    """A Work stream with nothing but a clock: what it sends is recorded."""

    sent_at: list[float]

    async def _send(self, message: Any) -> None:
        self.sent_at.append(self._loop.time())
        raise _Sent


def test_a_heartbeat_due_within_an_ulp_is_sent_instead_of_spinning() -> None:
    """Property: once a quiet stream has slept out the heartbeat interval it
    sends the heartbeat, even when float rounding leaves the clock a hair
    short of due; re-checking would sleep ~0 s forever on a virtual clock,
    and the loop would spin at 100% CPU without time ever moving."""
    loop = _SpinGuard()
    loop._virtual[0] = NOW
    stream: Any = object.__new__(_Probe)
    stream._owner = SimpleNamespace(heartbeat_interval=10.0, clock=ManualClock())
    stream._loop = loop
    stream._last_sent = SENT
    stream.sent_at = sent_at = []

    async def main() -> None:
        with contextlib.suppress(_Sent):
            await stream._heartbeat()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    assert len(sent_at) == 1
    assert abs(sent_at[0] - (SENT + 10.0)) < 1e-9
