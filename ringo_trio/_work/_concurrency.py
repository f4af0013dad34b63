"""Shared concurrency controllers: one capacity split by weight across workers.

Theory of operation
-------------------
A controller (`AdaptiveConcurrency`, `ResourceConcurrency`) is a pool of
*permits* shared by every worker it is passed to — workers of different
queues and different clients, in one process and one event loop (it is not
shared across processes: each process has its own pool). A permit is the
right to have one task on its way to the worker or running in it.

*The sans-IO core* (`ringo_trio._work._permits`) is `PermitPool` plus a control law (`AimdLaw`,
`ResourceLaw`): plain classes, no clock, no I/O, driven by hypothesis in
``tests/work/test_concurrency.py``.

*Shares.* The pool's capacity ``C`` is split by weight with the largest
remainder method: member ``i`` gets ``floor(C * w_i / W)`` and the
``C - sum(floors)`` permits left over go one each to the largest remainders,
ties broken by attach order; the shares always sum to ``C``. When ``C`` is
smaller than the number of members (more precisely: when a member's quota
``C * w_i / W`` is below one and its remainder loses), that member's share
is 0 and it runs nothing until the capacity grows or another member
detaches — keep ``min`` at least the number of workers sharing a controller.

*Admission.* A member takes a permit only while it holds fewer than its
target (its share; see probes below) *and* the pool's total held is below
``C`` — so no grant ever makes the total exceed ``C``. A member holds
permits for three things it has *committed*: tasks running (or pushed and
not yet settled), credit the daemon may still use to push, and a credit
update in flight. It never gives back a committed permit — a handler is never
revoked and credit already granted cannot be recalled before the daemon has
answered the update that withdraws it. When ``C`` or its share shrinks, a
member gives permits back as they become uncommitted: its holding falls to
``max(target, committed)``. Hence: a task runs only under a permit of its
member; the total held rises only while it is below ``C``; after a shrink
the excess drains monotonically as committed work ends. (The total of
*running* handlers can exceed a freshly *lowered* ``C`` by exactly the work
admitted under the old one — credit in flight cannot be recalled; it never
exceeds the capacity that was in force when its permit was granted.)

*The worker's side* (``ringo_trio._work.worker``, through its `Membership`) keeps its Work session's
concurrency equal to its permits (the session itself leaves out the slots
that handlers of an ended stream still hold: its outside slots), reports
``committed`` from the session — its exact credit mirror plus every slot,
outside ones included — after every session event, and marks itself
inactive while it has no stream or is draining: then its target is 0 and
every uncommitted permit returns at once (stream loss returns the unused
credit; handlers still running keep theirs until they exit). Detaching (the
end of ``run()``, when no handler is left) returns everything and the other
members' shares grow. Changes reach other workers through one broadcast
event that each worker's rebalance task waits on — no callbacks.

*Probes.* After a congestion cut (adaptive only) the pool is *probing*: a
member's target is at most ``running + 1`` — it asks the daemon for one task
at a time — until a task admitted after the cut succeeds.

Control laws
------------
**AdaptiveConcurrency** (AIMD with slow start, like TCP): the limit ``L``
starts at ``min``. A success of a task admitted after the last cut grows it
— by 1 per success before the first congestion (slow start: doubling per
round of tasks), by ``1/L`` per success afterwards (about +1 per round) —
but only while at least half of it is in use (an idle or trickling worker
does not inflate it). A handler raising ``RetryTaskError(congestion=True)``
cuts it: ``L ← max(min, L x decrease)`` (``decrease`` = 0.5), counting only
congestion of tasks admitted *after* the previous cut — one cut per window
of tasks, since the tasks already in flight when the limit was cut say
nothing about the new limit. Capacity is ``floor(L)`` clamped to
``[min, max]``. Against a downstream that congests above ``K`` concurrent
tasks the capacity settles into a sawtooth between about ``K/2`` and ``K+1``
(``tests/work/test_concurrency.py`` states the measured band).

**ResourceConcurrency** (damped multiplicative tracking): every
``interval`` the sampler reports CPU (fraction of one core this process used
over the interval) and memory (resident bytes); the pressure ``p`` is the
largest ``usage / target`` over the resources that have a target. Then
``L ← clamp(L x p^(-gamma), L/2, 2L)`` with ``gamma = 0.5``, clamped to
``[min, max]``; capacity is ``round(L)``. In log space the error to the
fixed point ``L*`` (where ``p = 1``) shrinks by the factor ``1 - gamma`` each
interval, and by at least ``ln 2`` while it is larger than ``2 ln 2``; for a
resource proportional to the limit (``usage = a x L``) ``L* = t / a``. As for
the adaptive law, the limit grows only while at least half of it is in use.
The sampling loop runs inside the attached workers: each running worker
offers to drive it, one drives at a time (a lock), and when that worker stops
another takes over — no extra ``async with`` for the user.
"""

from __future__ import annotations

import functools
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import anyio
import anyio.lowlevel

from .._errors import InvalidArgumentError, RingoError
from .._interrupts import protected
from ._permits import (
    AimdLaw,
    Member,
    PermitPool,
    ResourceLaw,
    Signal,
    Sync,
)

__all__ = ["AdaptiveConcurrency", "Membership", "ResourceConcurrency", "ResourceSample", "attach"]

# -- resource sampling ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """One reading of the resources `ResourceConcurrency` follows.

    ``cpu``: fraction of one core used since the previous reading (None: not
    measured); ``memory``: resident bytes (None: not measured).
    """

    cpu: float | None = None
    memory: int | None = None


class _ProcessSampler:
    """This process's CPU (`time.process_time` deltas over wall time) and
    resident memory (/proc/self/statm, else the peak from getrusage). The
    clocks and the statm file are its arguments so that a test can give
    its own."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.process_time,
        statm: str = "/proc/self/statm",
    ) -> None:
        self._wall = wall
        self._cpu = cpu
        self._statm = statm
        self._last: tuple[float, float] | None = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __call__(self) -> ResourceSample:
        now = (self._wall(), self._cpu())
        cpu = None
        if self._last is not None and now[0] > self._last[0]:
            cpu = (now[1] - self._last[1]) / (now[0] - self._last[0])
        self._last = now
        return ResourceSample(cpu=cpu, memory=self._rss())

    def _rss(self) -> int:
        try:
            with open(self._statm, "rb") as statm:
                return int(statm.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            # ru_maxrss is the peak (KiB on Linux): an upper bound, which errs
            # on the side of fewer tasks.
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- the controllers ------------------------------------------------------------

_LOOP = anyio.lowlevel.RunVar[object]("ringo_trio._concurrency.loop")


def _current_loop() -> object:
    try:
        return _LOOP.get()
    except LookupError:
        mark = object()
        _LOOP.set(mark)
        return mark


class _Controller:
    """A shared controller; a worker uses it through its `Membership` (`attach`)."""

    def __init__(self, law: AimdLaw | ResourceLaw) -> None:
        self._pool = PermitPool(law.capacity)
        self._bounds = (law.minimum, law.maximum)
        self._loop: object | None = None
        self._changed: anyio.Event | None = None
        self._driver_lock: anyio.Lock | None = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} capacity={self.capacity} held={self.held}"
            f" workers={len(self._pool.members)}>"
        )

    @property
    def capacity(self) -> int:
        """The current total capacity shared by the attached workers."""
        return self._pool.capacity

    @property
    def min(self) -> int:
        return self._bounds[0]

    @property
    def max(self) -> int:
        return self._bounds[1]

    @property
    def held(self) -> int:
        """Permits held by the attached workers: tasks running or on their way,
        plus credit granted to the daemon."""
        return self._pool.held

    @property
    def running(self) -> int:
        """Tasks running in the attached workers (as last reported)."""
        return self._pool.running

    # -- worker side: through `Membership` ----------------------------------

    def _attach(self, weight: int) -> Member:
        loop = _current_loop()
        if self._loop is None:
            self._loop = loop
            self._changed = anyio.Event()
            self._driver_lock = anyio.Lock()
        elif self._loop is not loop:
            raise RingoError(
                f"{type(self).__name__} is already used by workers in another event loop;"
                " a controller is shared by workers of one event loop (one process)"
            )
        member = self._pool.attach(weight)
        self._notify()
        return member

    def _detach(self, member: Member) -> None:
        self._pool.detach(member)
        self._notify()
        if not self._pool.members:
            # Unbound: a later event loop (a new trio.run) may use it again.
            self._loop = self._changed = self._driver_lock = None

    def _changed_event(self) -> anyio.Event:
        assert self._changed is not None
        return self._changed

    def _notify(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = anyio.Event()
            changed.set()

    def _sync(self, member: Member, *, running: int, committed: int, active: bool) -> int:
        if self._pool.sync(member, running=running, committed=committed, active=active):
            self._notify()
        return self._pool.usable(member)

    def _admit(self) -> int:
        return 0

    def _finished(self, ticket: int, signal: Signal) -> None:
        del ticket, signal

    def _configure(self, capacity: int, probing: bool) -> None:
        if self._pool.configure(capacity, probing):
            self._notify()

    @protected
    async def _drive(self) -> None:
        """Run the controller's periodic work while this worker runs (if any)."""


class Membership:
    """One worker's place in a controller's pool, from `attach` to `detach`:
    everything a worker calls on the controller.

    ``admit`` (a task was pushed: its ticket), ``finished`` (that task's
    ticket and `Signal`) and ``sync`` (`ringo_trio._work._permits.balance`'s
    report, bound to this member) are the controller's own methods, bound
    once: they run per task, so no frame of ours is in between."""

    __slots__ = ("_controller", "admit", "finished", "member", "sync")

    def __init__(self, controller: _Controller, member: Member) -> None:
        self._controller = controller
        self.member = member
        self.admit: Callable[[], int] = controller._admit
        self.finished: Callable[[int, Signal], None] = controller._finished
        self.sync: Sync = functools.partial(controller._sync, member)

    @property
    def share(self) -> int:
        """This worker's current share of the capacity."""
        return self.member.share

    def changed(self) -> anyio.Event:
        """Set at the pool's next change (another worker attached, detached or
        gave permits back; the capacity moved): time to rebalance."""
        return self._controller._changed_event()

    @protected
    async def drive(self) -> None:
        """Run the controller's periodic work while this worker runs (if any)."""
        await self._controller._drive()

    def detach(self) -> None:
        """Every permit goes back (no handler of the worker is left)."""
        self._controller._detach(self.member)


def attach(controller: _Controller, weight: int) -> Membership:
    """Attach a starting worker of ``weight`` to ``controller``'s pool."""
    return Membership(controller, controller._attach(weight))


class AdaptiveConcurrency(_Controller):
    """A congestion-controlled capacity shared by workers (AIMD with slow start).

    ::

        limit = AdaptiveConcurrency(min=2, max=64)
        a = client.queue("fetch").worker(fetch, concurrency=limit, weight=3)
        b = client.queue("thumbs").worker(thumbs, concurrency=limit, weight=1)

    A success grows the capacity, a handler raising
    ``RetryTaskError(congestion=True)`` halves it; after a cut new work is
    admitted one task at a time per worker until one succeeds. ``min == max``
    gives a fixed capacity shared by weight. Shared within one process.
    """

    def __init__(self, min: int = 1, max: int = 256, *, decrease: float = 0.5) -> None:
        self._law = AimdLaw(min, max, decrease=decrease)
        super().__init__(self._law)

    @property
    def limit(self) -> float:
        """The law's real-valued limit (capacity is its floor, within min..max)."""
        return self._law.limit

    @property
    def probing(self) -> bool:
        """True after a congestion cut, until a task admitted after it succeeds."""
        return self._pool.probing

    def _admit(self) -> int:
        return self._law.admit()

    def _finished(self, ticket: int, signal: Signal) -> None:
        law = self._law
        if law.finished(ticket, signal, self._pool.running):
            self._configure(law.capacity, law.probing)


Sampler = Callable[[], ResourceSample]


class ResourceConcurrency(_Controller):
    """A capacity that follows this process's CPU and memory use, shared by workers.

    ::

        limit = ResourceConcurrency(min=1, max=32, cpu_target=0.8,
                                    memory_target=2 * 2**30)
        worker = client.queue("render").worker(render, concurrency=limit)

    Every ``interval`` it samples (by default: the CPU fraction of one core
    this process used, and its resident memory in bytes) and moves the
    capacity toward the targets: ``L ← clamp(L x p^-0.5, L/2, 2L)`` with
    ``p`` the largest usage/target. ``sampler`` (a callable returning a
    `ResourceSample`) replaces the default measurement. Shared within one
    process.
    """

    def __init__(
        self,
        min: int = 1,
        max: int = 256,
        *,
        cpu_target: float | None = 0.8,
        memory_target: int | None = None,
        interval: timedelta = timedelta(seconds=1),
        sampler: Sampler | None = None,
    ) -> None:
        self._law = ResourceLaw(min, max)
        if cpu_target is not None and (
            isinstance(cpu_target, bool)
            or not isinstance(cpu_target, int | float)
            or not 0 < cpu_target <= 1024
        ):
            raise InvalidArgumentError("cpu_target must be a positive number of cores (or None)")
        if memory_target is not None and (
            isinstance(memory_target, bool)
            or not isinstance(memory_target, int)
            or memory_target <= 0
        ):
            raise InvalidArgumentError("memory_target must be a positive number of bytes (or None)")
        if cpu_target is None and memory_target is None:
            raise InvalidArgumentError("give cpu_target, memory_target or both")
        if not isinstance(interval, timedelta) or interval <= timedelta(0):
            raise InvalidArgumentError("interval must be a positive timedelta")
        if sampler is not None and not callable(sampler):
            raise InvalidArgumentError("sampler must be callable")
        self.cpu_target = None if cpu_target is None else float(cpu_target)
        self.memory_target = memory_target
        self.interval = interval
        self._sampler: Sampler = _ProcessSampler() if sampler is None else sampler
        super().__init__(self._law)

    def _pressure(self, sample: ResourceSample) -> float | None:
        """The largest usage/target of ``sample`` (None: nothing measured)."""
        ratios = []
        if self.cpu_target is not None and sample.cpu is not None:
            ratios.append(sample.cpu / self.cpu_target)
        if self.memory_target is not None and sample.memory is not None:
            ratios.append(sample.memory / self.memory_target)
        return max(ratios) if ratios else None

    def _step(self, sample: ResourceSample) -> None:
        if self._law.update(self._pressure(sample), self._pool.running):
            self._configure(self._law.capacity, False)

    @protected
    async def _drive(self) -> None:
        lock = self._driver_lock
        assert lock is not None
        interval = self.interval.total_seconds()
        async with lock:
            while True:
                await anyio.sleep(interval)
                self._step(self._sampler())
