"""The sans-IO core of the shared concurrency controllers (`ringo_trio._work._concurrency`).

`PermitPool` (shares by weight, permits held, admissions), the control laws
`AimdLaw` and `ResourceLaw`, and `balance` — what a worker does with its
session after every event. Plain classes: no clock, no I/O, no event loop
(a contract test checks the imports), so hypothesis drives them directly
(``tests/work/test_concurrency.py``). The theory of operation is at the top of
`ringo_trio._work._concurrency`.
"""

from __future__ import annotations

import enum
import itertools
from typing import Protocol

from .._contract.work.client import Output, State, WorkSession
from .._errors import InvalidArgumentError

__all__ = [
    "AimdLaw",
    "Member",
    "PermitPool",
    "PoolError",
    "ResourceLaw",
    "Signal",
    "Sync",
    "balance",
]

_MAX = 2**31 - 1


class PoolError(Exception):
    """The pool was asked for something that breaks its accounting (a bug)."""


class Signal(enum.Enum):
    """What a finished task tells a control law."""

    SUCCESS = "success"
    CONGESTION = "congestion"
    FAILURE = "failure"  # any other outcome: tells the law nothing


# -- the sans-IO core ---------------------------------------------------------


class Member:
    """One attached worker's account in a `PermitPool`."""

    __slots__ = ("active", "attached", "committed", "held", "order", "running", "share", "weight")

    def __init__(self, weight: int, order: int) -> None:
        self.weight = weight
        self.order = order
        self.share = 0
        self.held = 0
        self.running = 0
        self.committed = 0
        self.active = False
        self.attached = True

    def __repr__(self) -> str:
        return (
            f"<Member w={self.weight} share={self.share} held={self.held}"
            f" committed={self.committed} running={self.running}>"
        )


class PermitPool:
    """Permits of one capacity, split by weight (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise PoolError("capacity must not be negative")
        self.capacity = capacity
        self.probing = False
        self.held = 0
        self._members: list[Member] = []
        self._order = itertools.count()

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(self._members)

    @property
    def running(self) -> int:
        """Tasks running in all members, as last reported by `sync`."""
        return sum(m.running for m in self._members)

    def attach(self, weight: int) -> Member:
        if weight < 1:
            raise PoolError("weight must be positive")
        member = Member(weight, next(self._order))
        self._members.append(member)
        self._reshare()
        return member

    def detach(self, member: Member) -> None:
        """Every permit of ``member`` returns; the caller guarantees none of
        its work runs any more (the worker's handler group has exited)."""
        self._check(member)
        self.held -= member.held
        member.held = member.running = member.committed = member.share = 0
        member.attached = member.active = False
        self._members.remove(member)
        self._reshare()

    def configure(self, capacity: int, probing: bool) -> bool:
        """Apply a control law's output; True when anything changed."""
        if capacity < 0:
            raise PoolError("capacity must not be negative")
        changed = capacity != self.capacity or probing != self.probing
        self.probing = probing
        if capacity != self.capacity:
            self.capacity = capacity
            self._reshare()
        return changed

    def usable(self, member: Member) -> int:
        """Permits ``member`` may base its credit on: what it holds, but no
        more than its target (the rest are committed and on their way back)
        and, while the pool holds more than its capacity (after a shrink), no
        more than it has committed already — no new work is promised until
        the excess has drained."""
        usable = min(member.held, self.target(member))
        if self.held > self.capacity:
            usable = min(usable, member.committed)
        return usable

    def target(self, member: Member) -> int:
        """How many permits ``member`` may hold now (before its commitments)."""
        target = member.share if member.active else 0
        if self.probing:
            target = min(target, member.running + 1)
        return target

    def sync(self, member: Member, *, running: int, committed: int, active: bool) -> bool:
        """Settle ``member``'s permits against its target and commitments.

        ``running``: tasks pushed to it and not finished; ``committed``:
        ``running`` plus the pushes the daemon may still make. Takes permits
        up to the target while the pool has room; gives back what is neither
        targeted nor committed. Returns True when permits went back to the
        pool (other members may take them now).
        """
        self._check(member)
        if not 0 <= running <= committed:
            raise PoolError(f"bad report: running={running} committed={committed}")
        if committed > member.held:
            raise PoolError(f"a member committed {committed} tasks with only {member.held} permits")
        member.running, member.committed, member.active = running, committed, active
        target = self.target(member)
        if member.held > target:
            keep = max(target, committed)
            freed = member.held - keep
            member.held = keep
            self.held -= freed
            return freed > 0
        grant = min(target - member.held, self.capacity - self.held)
        if grant > 0:
            member.held += grant
            self.held += grant
        return False

    def _check(self, member: Member) -> None:
        if not member.attached:
            raise PoolError("the member is detached")

    def _reshare(self) -> None:
        members = self._members
        if not members:
            return
        total = sum(m.weight for m in members)
        capacity = self.capacity
        shares = [capacity * m.weight // total for m in members]
        left = capacity - sum(shares)
        # Largest remainder first; attach order breaks ties (members is in
        # attach order, and sorted() is stable).
        ranked = sorted(range(len(members)), key=lambda i: -(capacity * members[i].weight % total))
        for i in ranked[:left]:
            shares[i] += 1
        for member, share in zip(members, shares, strict=True):
            member.share = share


class Sync(Protocol):
    def __call__(self, *, running: int, committed: int, active: bool) -> int: ...


def balance(
    sync: Sync,
    session: WorkSession | None,
    *,
    handlers: int,
    closing: bool,
    now: float,
) -> list[Output]:
    """One worker's side of the pool: report its commitments, take or give
    back permits (``sync``, bound to its member, returns the permits it may
    use: held, but no more than its target), and size its session to them.

    ``handlers`` counts the worker's running handlers, each holding a permit;
    it is read only when there is no live session: a live one counts its own
    slots and, as its outside slots, the handlers of ended streams. Sizing
    the session below what it has committed makes it withdraw unused credit
    (a resize); the permits follow once the daemon has answered. Returns the
    session's outputs.
    """
    if session is None or session.state is State.ENDED:
        sync(running=handlers, committed=handlers, active=False)
        return []
    state = session.state
    usable = sync(
        running=session.in_flight + session.outside,
        committed=session.committed,
        active=not closing and state in (State.REGISTERING, State.ACTIVE),
    )
    if state is State.ERROR:
        return []  # it takes no input but its end; its handlers keep their permits until then
    # The session's concurrency is all of the worker's permits: it leaves out
    # the outside slots itself.
    if usable == session.concurrency:
        return []
    return session.set_concurrency(usable, now)


def _check_bounds(minimum: object, maximum: object) -> tuple[int, int]:
    for name, value in (("min", minimum), ("max", maximum)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name} must be an integer")
    assert isinstance(minimum, int)
    assert isinstance(maximum, int)
    if not 1 <= minimum <= maximum <= _MAX:
        raise InvalidArgumentError("need 1 <= min <= max <= 2**31-1")
    return minimum, maximum


class AimdLaw:
    """Additive increase, multiplicative decrease, with slow start and one cut
    per window (see the module docstring)."""

    def __init__(self, minimum: int, maximum: int, *, decrease: float = 0.5) -> None:
        self.minimum, self.maximum = _check_bounds(minimum, maximum)
        if isinstance(decrease, bool) or not isinstance(decrease, int | float):
            raise InvalidArgumentError("decrease must be a number")
        if not 0 < decrease < 1:
            raise InvalidArgumentError("decrease must be between 0 and 1 (exclusive)")
        self.decrease = float(decrease)
        self.limit = float(minimum)
        self.slow_start = True
        self.probing = False
        self._issued = 0
        # Tickets up to this one were admitted before the last cut.
        self._recover = 0

    @property
    def capacity(self) -> int:
        return max(self.minimum, min(self.maximum, int(self.limit)))

    def admit(self) -> int:
        """A task was admitted; its ticket goes back with `finished`."""
        self._issued += 1
        return self._issued

    def finished(self, ticket: int, signal: Signal, in_use: int) -> bool:
        """A task admitted with ``ticket`` ended; ``in_use`` is how many tasks
        run (this one included). True when capacity or probing changed."""
        if ticket <= self._recover or signal is Signal.FAILURE:
            return False
        before = (self.capacity, self.probing)
        if signal is Signal.CONGESTION:
            self.slow_start = False
            self.limit = max(float(self.minimum), self.limit * self.decrease)
            self._recover = self._issued
            self.probing = True
        else:
            self.probing = False
            if 2 * in_use >= self.limit:
                step = 1.0 if self.slow_start else 1.0 / self.limit
                self.limit = min(float(self.maximum), self.limit + step)
        return (self.capacity, self.probing) != before


class ResourceLaw:
    """Damped multiplicative tracking of a resource target (module docstring)."""

    GAMMA = 0.5

    def __init__(self, minimum: int, maximum: int) -> None:
        self.minimum, self.maximum = _check_bounds(minimum, maximum)
        self.limit = float(minimum)

    @property
    def capacity(self) -> int:
        return max(self.minimum, min(self.maximum, round(self.limit)))

    def update(self, pressure: float | None, in_use: int) -> bool:
        """One sample: ``pressure`` is max(usage / target) (None: nothing
        measured). True when the capacity changed."""
        if pressure is None:
            return False
        factor = 2.0 if pressure <= 0 else min(2.0, max(0.5, pressure**-self.GAMMA))
        if factor > 1 and 2 * in_use < self.limit:
            factor = 1.0  # application-limited: low usage says nothing about more load
        before = self.capacity
        self.limit = min(float(self.maximum), max(float(self.minimum), self.limit * factor))
        return self.capacity != before
