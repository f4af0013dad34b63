"""Wrong-token throttling: how long to make a failed authentication wait.

Theory of operation
-------------------
A daemon answering wrong tokens as fast as it can lets a guesser try about a
thousand per second per connection. `AuthThrottle` turns each failure into a
verdict for the gate (`gate.Gate`), keyed by the peer's address:

* **Delay, serialised per address.** The n-th recent failure from an address
  waits ``min(base * 2**(n-1), cap)`` seconds (``base`` is ``cap / 20``),
  and only after every earlier failure of that address was answered: the
  gate holds the address's `Verdict.turn` lock (first come, first served)
  through the wait and the answer. So parallel streams or connections buy a
  guesser nothing: an address gets at most one answer per ``cap`` seconds
  once warmed up, and a waiter whose connection is gone leaves the line
  (its slot is not kept). The dashboard (`http.ui.app`) takes the delay but
  not the turn: its wrong logins wait side by side, so parallel ones are
  all answered within ``cap``, bounded instead by its per-address HTTP
  connection cap (each waits holding its own connection); a ``drop``
  verdict there waits ``cap`` and closes after its answer rather than
  answering nothing at once. Only failures are counted or delayed: a caller
  holding the right token is never slowed, even from an address a guesser
  shares.
* **Bounded waiting.** A failure arriving while ``max_waiting`` failures of
  its address are still waiting for their answer gets none: its connection
  is closed at once (``drop``). Otherwise the queue of pending answers, and
  the streams and tasks behind it, would grow as fast as the guesser sends.
* **One connection, few guesses.** The connection that has had
  ``per_connection`` failures is closed after its last answer (``close``).
* **Forgetting.** An address with no failure for ``forget_after`` seconds
  starts again from the first delay; at most ``max_addresses`` addresses
  are remembered (the least recently failing is forgotten first).

Bookkeeping on a monotonic clock passed in (``now``), so the rules are
tested without sleeping; the gate does the waiting and the closing.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["DEFAULT_CAP", "AuthThrottle", "Verdict"]

#: Seconds, the longest one failure waits (``ringod --auth-failure-delay``).
DEFAULT_CAP = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the gate does with one failed authentication."""

    #: Seconds to wait, holding `turn`, before answering UNAUTHENTICATED.
    delay: float
    #: The address's line: one failure waits and is answered at a time.
    turn: asyncio.Lock | None = None
    #: Close the connection after the answer.
    close: bool = False
    #: Close the connection at once, without an answer (not counted).
    drop: bool = False
    # The entry `AuthThrottle.answered` gives the waiting slot back to (the
    # address may have been forgotten and counted afresh meanwhile).
    address: _Address | None = field(default=None, repr=False)


@dataclass(slots=True)
class _Address:
    failures: int = 0
    last_failure: float = 0.0
    waiting: int = 0
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Failures per connection, keyed by the peer's port.
    connections: OrderedDict[int, int] = field(default_factory=OrderedDict)


class AuthThrottle:
    def __init__(
        self,
        *,
        cap: float = DEFAULT_CAP,
        per_connection: int = 5,
        max_waiting: int = 16,
        forget_after: float = 60.0,
        max_addresses: int = 10_000,
    ) -> None:
        if not cap >= 0:
            raise ValueError("cap must be a number of seconds >= 0")
        self.base = cap / 20
        self.cap = cap
        self.per_connection = per_connection
        self.max_waiting = max_waiting
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self._addresses: OrderedDict[str, _Address] = OrderedDict()

    def failed(self, host: str, port: int, now: float) -> Verdict:
        """A failed authentication from ``host:port`` at monotonic time `now`.

        Unless the verdict is ``drop``, the caller must call `answered` with
        it once the answer is out (or abandoned).
        """
        entry = self._addresses.pop(host, None)
        if entry is None:
            entry = _Address()
        elif now - entry.last_failure > self.forget_after:
            entry.failures = 0
            entry.connections.clear()
        self._addresses[host] = entry  # the most recently failing, last
        while len(self._addresses) > self.max_addresses:
            self._addresses.popitem(last=False)
        if entry.waiting >= self.max_waiting:
            return Verdict(delay=0.0, drop=True)
        entry.failures += 1
        entry.last_failure = now
        delay = min(self.base * 2 ** min(entry.failures - 1, 64), self.cap)
        entry.waiting += 1
        on_connection = entry.connections.pop(port, 0) + 1
        entry.connections[port] = on_connection
        if len(entry.connections) > self.per_connection * 16:
            entry.connections.popitem(last=False)
        return Verdict(
            delay=delay,
            turn=entry.turn,
            close=on_connection >= self.per_connection,
            address=entry,
        )

    def answered(self, verdict: Verdict) -> None:
        if verdict.address is not None and verdict.address.waiting > 0:
            verdict.address.waiting -= 1

    def waiting(self, host: str) -> int:
        """Failures from `host` whose answer is still due."""
        entry = self._addresses.get(host)
        return entry.waiting if entry is not None else 0
