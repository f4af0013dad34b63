"""Shared concurrency controllers (`ringo_trio._work._concurrency`) without a daemon.

* **A state machine** plays several workers against one `PermitPool` and an
  `AimdLaw`, exactly as the worker drives them: each worker has a *real*
  `WorkSession` sized by `balance`, and a tiny model daemon (absolute credit,
  commands answered in order when a rule delivers them, pushes only against
  credit). Rules: attach, detach, push (a task is admitted), finish (success
  / congestion / failure), stream loss (handlers of the stream run on without
  a slot), reconnect, capacity change, a lagging worker's rebalance. The
  invariants are the ``@invariant`` methods, each named after its property.
* **Convergence** of the two control laws, under trio's MockClock, with the
  real controller objects and simulated saturated workers: Adaptive against a
  downstream that congests above K concurrent tasks; Resource against a fake
  resource whose usage is proportional to what runs.
* **Sharp edges**: argument checks, shares when capacity < members, one
  controller in two event loops.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import pathlib
import random
import resource
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from fractions import Fraction

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from ringo_trio import InvalidArgumentError, RingoError
from ringo_trio._contract.work.client import (
    CancelHandler,
    CommandError,
    Credit,
    LeaseKey,
    Outcome,
    Output,
    Settle,
    StartHandler,
    State,
    WorkSession,
)
from ringo_trio._work._concurrency import (
    AdaptiveConcurrency,
    ResourceConcurrency,
    ResourceSample,
    _ProcessSampler,
    attach,
)
from ringo_trio._work._permits import (
    AimdLaw,
    Member,
    PermitPool,
    PoolError,
    ResourceLaw,
    Signal,
    balance,
)

CAPACITY_REFUSAL = CommandError("RESOURCE_EXHAUSTED", "over capacity", "credit_capacity")


def largest_remainder(capacity: int, weights: list[int]) -> list[int]:
    """The apportionment computed independently, with exact fractions."""
    total = sum(weights)
    quotas = [Fraction(capacity * w, total) for w in weights]
    shares = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for i in order[: capacity - sum(shares)]:
        shares[i] += 1
    return shares


# -- the state machine ------------------------------------------------------------


@dataclass
class SimWorker:
    """One worker: its member, its current session and the model daemon of it."""

    member: Member
    session: WorkSession | None = None
    closing: bool = False
    daemon_credit: int = 0
    unsettled: set[LeaseKey] = field(default_factory=set)
    inbox: deque[Output] = field(default_factory=deque)  # commands not yet delivered
    running: dict[LeaseKey, int] = field(default_factory=dict)  # key -> ticket (this stream)
    orphans: dict[LeaseKey, int] = field(default_factory=dict)  # handlers of ended streams
    old_sessions: dict[LeaseKey, WorkSession] = field(default_factory=dict)
    synced_probing: bool = False  # the pool was probing at this worker's last sync
    synced_with: tuple[int, bool, tuple[tuple[int, int], ...]] | None = None  # the pool then

    @property
    def handlers(self) -> int:
        return len(self.running) + len(self.orphans)


class PoolMachine(RuleBasedStateMachine):
    """Workers sharing one adaptive pool, driven like ``ringo_trio._work.worker`` drives it."""

    def __init__(self) -> None:
        super().__init__()
        self.law = AimdLaw(1, 12)
        self.law.limit = 6.0
        self.pool = PermitPool(self.law.capacity)
        self.workers: list[SimWorker] = []
        self.now = 0.0
        self.tasks = itertools.count(1)
        # The largest capacity in force since the pool last held no more than
        # its capacity: credit granted under it cannot be recalled at once.
        self.ceiling = self.pool.capacity
        self.violations: list[str] = []
        self.retired: list[Member] = []

    # -- plumbing ---------------------------------------------------------------

    def sync(self, worker: SimWorker, *, running: int, committed: int, active: bool) -> int:
        member = worker.member
        before = member.held
        total_before = self.pool.held
        self.pool.sync(member, running=running, committed=committed, active=active)
        target = self.pool.target(member)
        if member.held > before and member.held > target:
            self.violations.append(f"granted beyond the target {target}: {member}")
        if self.pool.held > total_before and self.pool.held > self.pool.capacity:
            self.violations.append(f"a grant took the pool over {self.pool.capacity}")
        if self.pool.probing and member.held > max(running + 1, committed):
            self.violations.append(f"more than one uncommitted permit while probing: {member}")
        worker.synced_probing = self.pool.probing
        worker.synced_with = self.pool_state()
        return self.pool.usable(member)

    def pool_state(self) -> tuple[int, bool, tuple[tuple[int, int], ...]]:
        # Members by identity: after a detach and an attach the shares alone
        # can repeat while this worker's own share changed.
        return (
            self.pool.capacity,
            self.pool.probing,
            tuple((id(m), m.share) for m in self.pool.members),
        )

    def rebalance(self, worker: SimWorker) -> None:
        """What the worker does after every session event and on every pool change."""
        session = worker.session
        sync = functools.partial(self.sync, worker)
        self.act(
            worker,
            balance(sync, session, handlers=worker.handlers, closing=worker.closing, now=0),
        )

    def act(self, worker: SimWorker, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, Credit):
                if worker.synced_probing and self.pool.probing and out.available > 1:
                    self.violations.append(f"a probing worker asked for {out.available}")
                worker.inbox.append(out)
            elif isinstance(out, Settle):
                worker.inbox.append(out)
            elif isinstance(out, StartHandler):
                self.admitted(worker, out.key)
            elif isinstance(out, CancelHandler):
                pass  # the handler runs on as an orphan (it may ignore cancellation)
        if worker.session is not None and worker.session.state is not State.ENDED:
            # The worker's `_Live.act` ends with a rebalance.
            session = worker.session
            sync = functools.partial(self.sync, worker)
            more = balance(sync, session, handlers=worker.handlers, closing=worker.closing, now=0)
            if more:
                self.act(worker, more)

    def admitted(self, worker: SimWorker, key: LeaseKey) -> None:
        running = sum(w.handlers for w in self.workers) + 1
        if worker.handlers + 1 > worker.member.held:
            self.violations.append(f"admitted beyond its permits: {worker.member}")
        if running > self.ceiling:
            self.violations.append(f"{running} running, over the capacity {self.ceiling}")
        worker.running[key] = self.law.admit()

    def connect(self, worker: SimWorker) -> None:
        session = WorkSession(
            concurrency=0, minor=7, dynamic_target=True, outside=len(worker.orphans)
        )
        worker.session = session
        worker.daemon_credit = 0
        worker.unsettled = set()
        worker.inbox.clear()
        session.register()
        self.rebalance(worker)  # the worker sizes the session before `registered`
        self.act(
            worker,
            session.registered(
                lease_duration=60.0, max_concurrency=1, ordered_request_ids=True, now=0
            ),
        )

    def lose_stream(self, worker: SimWorker) -> None:
        session = worker.session
        assert session is not None
        worker.session = None
        session.end()
        worker.inbox.clear()  # commands of a dead stream reach nobody
        worker.daemon_credit = 0
        for key, ticket in worker.running.items():
            worker.orphans[key] = ticket
            worker.old_sessions[key] = session
        worker.running.clear()
        self.rebalance(worker)

    def apply_law(self, signal: Signal, ticket: int) -> None:
        if self.law.finished(ticket, signal, self.pool.running):
            self.pool.configure(self.law.capacity, self.law.probing)

    def pick(self, data: st.DataObject, workers: list[SimWorker]) -> SimWorker:
        return workers[data.draw(st.integers(0, len(workers) - 1), label="worker")]

    # -- rules --------------------------------------------------------------------

    @precondition(lambda self: len(self.workers) < 4)
    @rule(weight=st.integers(1, 4))
    def attach(self, weight: int) -> None:
        worker = SimWorker(self.pool.attach(weight))
        self.workers.append(worker)
        self.connect(worker)

    @precondition(lambda self: any(not w.closing for w in self.workers))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        """Close begins: the worker stops asking for work (drain)."""
        worker = self.pick(data, [w for w in self.workers if not w.closing])
        worker.closing = True
        session = worker.session
        if session is not None and session.state is State.ACTIVE:
            worker.inbox.append(session.drain(0))
        self.rebalance(worker)

    @precondition(lambda self: any(w.handlers == 0 for w in self.workers))
    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        """run() ends (closed, or failed) once no handler is left: the member
        detaches with whatever it holds — credit included."""
        worker = self.pick(data, [w for w in self.workers if w.handlers == 0])
        if worker.session is not None:
            worker.session.end()
        self.pool.detach(worker.member)
        self.workers.remove(worker)
        self.retired.append(worker.member)  # keeps its id() from being reused

    @precondition(lambda self: any(w.inbox for w in self.workers))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """The daemon handles a worker's oldest command and answers it."""
        worker = self.pick(data, [w for w in self.workers if w.inbox])
        command = worker.inbox.popleft()
        error = None
        if isinstance(command, Credit):
            capacity = command.target_concurrency
            assert capacity is not None
            if command.available and command.available + len(worker.unsettled) > capacity:
                error = CAPACITY_REFUSAL
            else:
                worker.daemon_credit = command.available
        elif isinstance(command, Settle):
            worker.unsettled.discard(command.key)
        else:
            worker.daemon_credit = 0  # a drain
        session = worker.session
        assert session is not None
        self.act(worker, session.result(command.request_id, error, 0))

    @precondition(lambda self: any(w.daemon_credit and w.session for w in self.workers))
    @rule(data=st.data())
    def push(self, data: st.DataObject) -> None:
        """The daemon pushes a task against its credit: one admission."""
        worker = self.pick(data, [w for w in self.workers if w.daemon_credit and w.session])
        session = worker.session
        assert session is not None
        worker.daemon_credit -= 1
        key = LeaseKey(f"t{next(self.tasks)}", 1)
        worker.unsettled.add(key)
        self.act(worker, session.task_pushed(key, "tok", 60.0, 0))

    @precondition(lambda self: any(w.handlers for w in self.workers))
    @rule(data=st.data(), signal=st.sampled_from(Signal))
    def finish(self, data: st.DataObject, signal: Signal) -> None:
        """A handler ends (its outcome feeds the law; an orphan just exits)."""
        worker = self.pick(data, [w for w in self.workers if w.handlers])
        keys = sorted([*worker.running, *worker.orphans], key=lambda k: k.task_id)
        key = keys[data.draw(st.integers(0, len(keys) - 1), label="handler")]
        if key in worker.orphans:
            ticket = worker.orphans.pop(key)
            self.apply_law(Signal.FAILURE, ticket)
            old = worker.old_sessions.pop(key)
            old.handler_exited(key, 0)
            session = worker.session
            if session is not None and session.state is not State.ENDED:
                # Its slot is the current stream's (the worker's `_orphan_exited`).
                self.act(worker, session.outside_slot_freed(0))
            self.rebalance(worker)
            return
        ticket = worker.running.pop(key)
        self.apply_law(signal, ticket)
        # `Handlers.finish` rebalances before it settles, so the credit the
        # settlement asks for already follows a cut this outcome caused.
        self.rebalance(worker)
        session = worker.session
        assert session is not None
        outcome = Outcome.ACK if signal is Signal.SUCCESS else Outcome.NACK
        self.act(worker, session.settle(key, outcome, 0))

    @precondition(lambda self: any(w.session for w in self.workers))
    @rule(data=st.data())
    def stream_lost(self, data: st.DataObject) -> None:
        """The stream drops: unused credit is void, handlers run on without a slot."""
        self.lose_stream(self.pick(data, [w for w in self.workers if w.session]))

    @precondition(lambda self: any(w.session is None and not w.closing for w in self.workers))
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        self.connect(self.pick(data, [w for w in self.workers if w.session is None]))

    @precondition(lambda self: bool(self.workers))
    @rule(data=st.data())
    def pool_changed(self, data: st.DataObject) -> None:
        """A worker's rebalance task wakes (it may lag behind other changes)."""
        self.rebalance(self.pick(data, self.workers))

    @rule(capacity=st.integers(0, 12))
    def capacity_changes(self, capacity: int) -> None:
        """The capacity moves on its own (what a resource controller does)."""
        self.pool.configure(capacity, self.pool.probing)

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def nothing_unexpected(self) -> None:
        """Grants never pass a member's target nor the pool's capacity; while
        probing a member holds at most one permit beyond what it runs (unless
        already committed) and asks for at most one task at a time; every
        admission is covered by its member's permits."""
        assert self.violations == []

    @invariant()
    def totals_are_never_exceeded(self) -> None:
        """Totals never exceeded: the handlers running in all workers never
        exceed the permits held, and the permits held never exceed the
        capacity — except, after the capacity was lowered, by credit granted
        before (it drains and is never topped up)."""
        if self.pool.held <= self.pool.capacity:
            self.ceiling = self.pool.capacity
        running = sum(w.handlers for w in self.workers)
        assert running <= self.pool.held <= self.ceiling

    @invariant()
    def no_permit_is_held_by_nobody(self) -> None:
        """No leak, no double count: the pool's total is the sum of its members'
        permits, and each member holds at least what it has committed."""
        assert self.pool.held == sum(w.member.held for w in self.workers)
        for worker in self.workers:
            session = worker.session
            # A live session counts the orphans as its outside slots.
            committed = session.committed if session is not None else worker.handlers
            assert worker.member.held >= committed, worker.member

    @invariant()
    def unused_permits_go_back(self) -> None:
        """Liveness: a worker over its target does not sit on unused permits.
        Once it has synced with the pool as it is now and the daemon has
        answered its commands, it holds no more than max(target, running) —
        credit beyond its target was withdrawn, not kept because the daemon
        might still use it (an idle queue never would)."""
        for worker in self.workers:
            if worker.inbox or worker.synced_with != self.pool_state():
                continue
            member = worker.member
            target = self.pool.target(member)
            assert member.held <= max(target, worker.handlers), member

    @invariant()
    def shares_follow_the_weights(self) -> None:
        """Shares are the largest-remainder split of the capacity by weight
        (ties by attach order) and sum to the capacity."""
        if not self.workers:
            return
        weights = [w.member.weight for w in self.workers]
        shares = [w.member.share for w in self.workers]
        assert shares == largest_remainder(self.pool.capacity, weights)
        assert sum(shares) == self.pool.capacity

    def teardown(self) -> None:
        """After everything settles — handlers done, commands answered, every
        worker closed and detached — no permit is held."""
        for worker in list(self.workers):
            worker.closing = True
            session = worker.session
            if session is not None and session.state is State.ACTIVE:
                worker.inbox.append(session.drain(0))
        while any(w.inbox or w.handlers for w in self.workers):
            for worker in self.workers:
                while worker.inbox:
                    command = worker.inbox.popleft()
                    if isinstance(command, Credit) and command.available:
                        worker.daemon_credit = command.available
                    elif not isinstance(command, Credit | Settle):
                        worker.daemon_credit = 0
                    assert worker.session is not None
                    self.act(worker, worker.session.result(command.request_id, None, 0))
                for key in list(worker.running):
                    ticket = worker.running.pop(key)
                    self.apply_law(Signal.SUCCESS, ticket)
                    assert worker.session is not None
                    self.act(worker, worker.session.settle(key, Outcome.ACK, 0))
                for key in list(worker.orphans):
                    del worker.orphans[key]
                    worker.old_sessions.pop(key).handler_exited(key, 0)
                    session = worker.session
                    if session is not None and session.state is not State.ENDED:
                        self.act(worker, session.outside_slot_freed(0))
                self.rebalance(worker)
        for worker in self.workers:
            # Drained and idle: a closing worker keeps nothing.
            assert worker.member.held == 0, worker.member
            self.pool.detach(worker.member)
        assert self.pool.held == 0
        assert self.violations == []


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=600,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- sharp edges of the core --------------------------------------------------------


def test_shares_when_capacity_is_below_the_number_of_members() -> None:
    """Capacity 2 over three equal members: the first two (attach order breaks
    the tie) get one each, the third none until someone detaches — and then
    it gets the freed share."""
    pool = PermitPool(2)
    a, b, c = (pool.attach(1) for _ in range(3))
    assert [a.share, b.share, c.share] == [1, 1, 0]
    for m in (a, b, c):
        pool.sync(m, running=0, committed=0, active=True)
    assert [a.held, b.held, c.held] == [1, 1, 0]
    pool.detach(a)
    pool.sync(c, running=0, committed=0, active=True)
    assert [b.share, c.share] == [1, 1]
    assert [b.held, c.held] == [1, 1]


def test_the_pool_refuses_impossible_reports() -> None:
    """A member that reports more committed work than permits is a bug, loudly."""
    pool = PermitPool(2)
    member = pool.attach(1)
    with pytest.raises(PoolError):
        pool.sync(member, running=1, committed=1, active=True)
    with pytest.raises(PoolError):
        pool.sync(member, running=2, committed=1, active=True)
    pool.detach(member)
    with pytest.raises(PoolError):
        pool.sync(member, running=0, committed=0, active=True)


def test_a_pool_may_have_no_permits_and_says_when_a_law_changed_it() -> None:
    """A pool of capacity 0 is valid (every member's share is 0) and a
    negative one is a bug; `configure` reports a change only when the
    capacity or probing moved (the worker re-balances its sessions on it);
    a member of weight 0 would hold no share ever, so it is refused."""
    pool = PermitPool(0)
    member = pool.attach(1)
    assert member.share == 0
    with pytest.raises(PoolError):
        PermitPool(-1)
    with pytest.raises(PoolError):
        pool.configure(-1, False)
    with pytest.raises(PoolError):
        pool.attach(0)
    assert pool.configure(0, False) is False
    assert pool.configure(3, False) is True
    assert member.share == 3
    assert pool.configure(3, False) is False
    assert pool.configure(3, True) is True
    assert pool.configure(3, True) is False
    # A sync that gives back even one permit says so: others may take it.
    pool.configure(3, False)
    assert pool.sync(member, running=0, committed=0, active=True) is False
    assert member.held == 3
    pool.configure(2, False)
    assert pool.sync(member, running=0, committed=0, active=True) is True
    assert (member.held, pool.held) == (2, 2)


def test_a_closing_worker_takes_no_new_permits() -> None:
    """Property: `balance` reports a worker active only while its session
    registers or runs and the worker is not closing; a closing worker keeps
    what it has committed but is given no new permits, which go to the
    members that stay."""
    reports: list[bool] = []

    def sync(*, running: int, committed: int, active: bool) -> int:
        reports.append(active)
        return 0

    session = WorkSession(concurrency=0, minor=7, dynamic_target=True)
    session.register()
    balance(sync, session, handlers=0, closing=False, now=0)
    balance(sync, session, handlers=0, closing=True, now=0)
    session.registered(lease_duration=60.0, max_concurrency=1, ordered_request_ids=True, now=0)
    balance(sync, session, handlers=0, closing=False, now=0)
    balance(sync, session, handlers=0, closing=True, now=0)
    balance(sync, None, handlers=0, closing=False, now=0)
    assert reports == [True, False, True, False, False]


def test_controller_arguments_are_checked() -> None:
    """Bad bounds or targets fail at once with InvalidArgumentError."""
    bad_adaptive: list[dict[str, object]] = [
        {"min": 0},
        {"min": 5, "max": 4},
        {"max": 2**31},
        {"min": True},
        {"min": 1.5},
        {"decrease": 1.0},
        {"decrease": 0},
    ]
    for kwargs in bad_adaptive:
        with pytest.raises(InvalidArgumentError):
            AdaptiveConcurrency(**kwargs)  # type: ignore[arg-type]
    bad_resource: list[dict[str, object]] = [
        {"min": 0},
        {"cpu_target": 0},
        {"cpu_target": -1.0},
        {"cpu_target": "high"},
        {"cpu_target": 1024.5},
        {"memory_target": 0},
        {"memory_target": 1.5},
        {"cpu_target": None, "memory_target": None},
        {"interval": timedelta(0)},
        {"interval": 1},
        {"sampler": 3},
    ]
    for kwargs in bad_resource:
        with pytest.raises(InvalidArgumentError):
            ResourceConcurrency(**kwargs)  # type: ignore[arg-type]


def test_a_controller_belongs_to_one_event_loop_at_a_time() -> None:
    """Workers in two event loops cannot share a controller (clear error); once
    the first loop's workers have detached, another loop may use it."""
    controller = AdaptiveConcurrency(min=2, max=2)

    async def hold_and_try_other_loop() -> None:
        member = controller._attach(1)
        try:
            other = trio.to_thread.run_sync

            def attach_elsewhere() -> str:
                try:
                    trio.run(_attach_once, controller)
                except RingoError as exc:
                    return str(exc)
                return "attached"

            message = await other(attach_elsewhere)
            assert "another event loop" in message
        finally:
            controller._detach(member)

    trio.run(hold_and_try_other_loop)
    trio.run(_attach_once, controller)  # unbound again: a new loop may use it


def test_the_documented_controller_defaults_and_edges_hold() -> None:
    """Property: the defaults docs/worker.md states, the bounds each
    controller reports, and the largest and smallest targets accepted: 1,024
    cores (anything above is refused: `test_controller_arguments_are_checked`)
    and one byte of memory."""
    adaptive = AdaptiveConcurrency()
    assert (adaptive.min, adaptive.max, adaptive._law.decrease) == (1, 256, 0.5)
    resources = ResourceConcurrency()
    assert (resources.min, resources.max) == (1, 256)
    assert (resources.cpu_target, resources.memory_target) == (0.8, None)
    assert resources.interval == timedelta(seconds=1)
    bounded = AdaptiveConcurrency(min=3, max=9)
    assert (bounded.min, bounded.max) == (3, 9)
    assert ResourceConcurrency(cpu_target=1024).cpu_target == 1024.0
    assert ResourceConcurrency(memory_target=1).memory_target == 1


def test_the_default_sampler_reads_cpu_over_wall_time_and_resident_pages(
    tmp_path: pathlib.Path,
) -> None:
    """Property: the default sampler's CPU is the process time used over the
    wall time since its previous reading (none at the first reading, none
    when no wall time passed), and its memory the resident pages (statm's
    second field) times the page size; without statm, the peak from
    getrusage (KiB) in bytes."""
    clock = {"wall": 10.0, "cpu": 3.0}
    statm = tmp_path / "statm"
    statm.write_text("1000 25 7 1 0 50 0\n")
    sampler = _ProcessSampler(
        wall=lambda: clock["wall"], cpu=lambda: clock["cpu"], statm=str(statm)
    )
    resident = 25 * os.sysconf("SC_PAGE_SIZE")
    assert sampler() == ResourceSample(cpu=None, memory=resident)
    clock.update(wall=14.0, cpu=4.0)
    assert sampler() == ResourceSample(cpu=0.25, memory=resident)
    clock.update(cpu=5.0)
    assert sampler().cpu is None
    clock.update(wall=16.0, cpu=7.0)
    assert sampler().cpu == 1.0
    without_statm = _ProcessSampler(statm=str(tmp_path / "absent"))
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    memory = without_statm().memory
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert memory is not None
    assert peak_before <= memory <= peak_after


def test_the_pressure_is_the_largest_ratio_over_the_resources_measured() -> None:
    """Property: a sample's pressure is its largest usage/target over the
    resources that have a target and were measured (a resource without a
    target, or not measured, does not count); nothing to compare is no
    pressure (None: the law then leaves the limit alone)."""
    both = ResourceConcurrency(cpu_target=0.5, memory_target=1000)
    assert both._pressure(ResourceSample(cpu=0.25, memory=2000)) == 2.0
    assert both._pressure(ResourceSample(cpu=1.0, memory=100)) == 2.0
    assert both._pressure(ResourceSample(cpu=None, memory=500)) == 0.5
    assert both._pressure(ResourceSample(cpu=0.25, memory=None)) == 0.5
    assert both._pressure(ResourceSample()) is None
    memory_only = ResourceConcurrency(cpu_target=None, memory_target=1000)
    assert memory_only._pressure(ResourceSample(cpu=4.0, memory=250)) == 0.25
    assert memory_only._pressure(ResourceSample(cpu=4.0)) is None


def test_a_resource_step_never_makes_the_workers_probe() -> None:
    """Property: only a congestion cut makes the pool probe (each worker
    asking for one task at a time); a resource step that moves the
    capacity leaves the workers' targets at their shares."""
    controller = ResourceConcurrency(min=1, max=64, cpu_target=1.0)

    async def main() -> None:
        membership = attach(controller, 1)
        try:
            assert membership.sync(running=0, committed=0, active=True) == 1
            membership.sync(running=1, committed=1, active=True)
            controller._step(ResourceSample(cpu=0.1))  # 1 of 1 in use: it grows
            assert controller.capacity == 2
            assert not controller._pool.probing
        finally:
            membership.detach()

    trio.run(main)


async def _attach_once(controller: AdaptiveConcurrency) -> None:
    controller._detach(controller._attach(1))


def test_an_adaptive_law_starts_at_its_minimum_in_slow_start() -> None:
    """A fresh law runs at its minimum and is not probing; until its first
    congestion each success of a busy worker (at least half of the limit in
    use; less is no reason to grow) adds a whole task (slow start),
    after it 1/limit per success. The bounds reach 2**31-1, the documented
    most (and so does a resource law's)."""
    law = AimdLaw(2, 10)
    assert (law.capacity, law.probing, law.slow_start) == (2, False, True)
    # Exactly half of the limit in use counts as busy.
    assert law.finished(law.admit(), Signal.SUCCESS, 1)
    assert law.finished(law.admit(), Signal.SUCCESS, 2)
    assert (law.limit, law.probing) == (4.0, False)
    assert law.finished(law.admit(), Signal.CONGESTION, 4)
    assert (law.limit, law.probing, law.slow_start) == (2.0, True, False)
    law.finished(law.admit(), Signal.SUCCESS, 1)
    assert (law.limit, law.probing) == (2.5, False)
    law.limit = 8.0
    assert not law.finished(law.admit(), Signal.SUCCESS, 3)
    assert law.limit == 8.0
    for make in (AimdLaw, ResourceLaw):
        assert make(1, 2**31 - 1).maximum == 2**31 - 1
        assert make(2**31 - 1, 2**31 - 1).capacity == 2**31 - 1
        with pytest.raises(InvalidArgumentError):
            make(1, 2**31)


def test_a_resource_law_reads_no_usage_as_room_and_half_use_as_busy() -> None:
    """A sample that measured nothing changes nothing (and says so); a
    pressure of 0 (nothing used) doubles the limit rather than dividing by
    zero; exactly half of the limit in use counts as busy, so it may grow,
    and less than half does not; pressure shrinks it whatever the use."""
    law = ResourceLaw(1, 100)
    law.limit = 4.0
    assert law.update(None, 4) is False
    assert law.limit == 4.0
    assert law.update(0.0, 2) is True
    assert law.limit == 8.0
    assert law.update(0.25, 3) is False
    assert law.limit == 8.0
    # Over its target it shrinks however little is in use.
    assert law.update(4.0, 1) is True
    assert law.limit == 4.0


def test_adaptive_law_ignores_signals_of_tasks_admitted_before_the_cut() -> None:
    """One cut per window: congestion of tasks admitted before the last cut
    does not cut again, nor do their successes end probing or grow the limit;
    a success of a task admitted after it does both."""
    law = AimdLaw(1, 100)
    law.limit = 20.0
    law.slow_start = False
    old = [law.admit() for _ in range(10)]
    assert law.finished(old[0], Signal.CONGESTION, 10)
    assert (law.limit, law.probing) == (10.0, True)
    assert not law.finished(old[1], Signal.CONGESTION, 10)
    assert not law.finished(old[2], Signal.SUCCESS, 10)
    assert (law.limit, law.probing) == (10.0, True)
    probe = law.admit()
    assert law.finished(probe, Signal.SUCCESS, 10)
    assert law.probing is False
    assert law.limit == pytest.approx(10.1)


def test_the_limit_does_not_grow_while_mostly_unused() -> None:
    """Application-limited: successes grow the limit only while at least half
    of it is in use; a trickle of work leaves it where it is."""
    law = AimdLaw(1, 100)
    law.limit = 10.0
    for _ in range(50):
        law.finished(law.admit(), Signal.SUCCESS, 2)
    assert law.limit == 10.0
    resource_law = ResourceLaw(1, 100)
    resource_law.limit = 10.0
    assert not resource_law.update(0.1, in_use=2)
    assert resource_law.limit == 10.0


# -- convergence -------------------------------------------------------------------


async def _saturate(
    controller: AdaptiveConcurrency | ResourceConcurrency,
    weights: list[int],
    duration: float,
    task_time: Callable[[], float],
    *,
    congested_above: int | None = None,
) -> list[tuple[float, int, int]]:
    """Workers with an endless backlog, driven like the worker drives a
    controller (credit is immediate here). Returns (time, capacity, running)
    after every task; fails on any admission not covered by a permit."""
    running_total = 0
    trace: list[tuple[float, int, int]] = []

    async def worker(member: Member, nursery: trio.Nursery) -> None:
        nonlocal running_total
        running = 0
        wake = trio.Event()

        def sync() -> int:
            return controller._sync(member, running=running, committed=running, active=True)

        async def task(ticket: int) -> None:
            nonlocal running, running_total, wake
            congested = congested_above is not None and running_total > congested_above
            await trio.sleep(task_time())
            signal = Signal.CONGESTION if congested else Signal.SUCCESS
            controller._finished(ticket, signal)
            running -= 1
            running_total -= 1
            trace.append((trio.current_time(), controller.capacity, running_total))
            wake.set()

        async def watch_pool() -> None:
            while True:
                await controller._changed_event().wait()
                wake.set()

        nursery.start_soon(watch_pool)
        while True:
            while running < sync():
                running += 1
                running_total += 1
                assert running <= member.held
                assert running_total <= controller.held
                nursery.start_soon(task, controller._admit())
            sync()  # what the worker's rebalance after a push reports
            await wake.wait()
            wake = trio.Event()

    members = [controller._attach(weight) for weight in weights]
    try:
        async with trio.open_nursery() as nursery:
            for member in members:
                nursery.start_soon(worker, member, nursery)
            nursery.start_soon(controller._drive)
            await trio.sleep(duration)
            nursery.cancel_scope.cancel()
    finally:
        for member in members:
            controller._detach(member)
    return trace


@pytest.mark.parametrize("capacity", [3, 10, 40])
def test_adaptive_settles_into_a_sawtooth_around_the_true_capacity(capacity: int) -> None:
    """AIMD convergence: against a downstream that congests whenever more than
    K tasks run at once (each task checks at its start), the capacity, after
    slow start, stays in the band [ceil(K/2), K+1] and visits both ends — it
    is cut at K+1 (a task saw K+1 running) to half, then climbs by about one
    per round of tasks; the one-cut-per-window rule means the tasks already
    running at a cut do not cut again, and no task admitted after a cut sees
    more than K running. Two workers with weights 1 and 2 share it."""
    rng = random.Random(capacity)
    controller = AdaptiveConcurrency(min=1, max=1000)

    async def main() -> list[tuple[float, int, int]]:
        return await _saturate(
            controller, [1, 2], 300.0, lambda: rng.uniform(0.5, 1.5), congested_above=capacity
        )

    trace = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    settled = [cap for when, cap, _ in trace if when > 60]
    low, high = math.ceil(capacity / 2), capacity + 1
    assert min(settled) == low
    assert max(settled) == high
    assert max(running for when, _, running in trace if when > 60) <= high


def test_resource_converges_to_the_target_with_a_fake_resource() -> None:
    """Resource convergence: with a fake CPU whose usage is a x (tasks
    running) and a target t, the capacity reaches t/a within +-1 within
    N = 14 intervals from min=1 (t/a = 80: 5 doubling steps while the log
    error exceeds 2 ln 2, then the error halves each interval; the bound of
    the next test) and stays there — checked from the 15th second on, with
    the real controller, its sampling loop and two saturated workers."""
    per_task, target = 0.01, 0.8

    controller = ResourceConcurrency(
        min=1,
        max=1000,
        cpu_target=target,
        interval=timedelta(seconds=1),
        sampler=lambda: ResourceSample(cpu=per_task * controller.running),
    )

    async def main() -> list[tuple[float, int, int]]:
        return await _saturate(controller, [1, 3], 40.0, lambda: 0.1)

    trace = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    goal = target / per_task
    settled = [cap for when, cap, _ in trace if when >= 15.0]
    assert all(abs(cap - goal) <= 1 for cap in settled), sorted(set(settled))


@settings(max_examples=300, deadline=None)
@given(
    goal=st.floats(1.0, 1000.0),
    start=st.integers(1, 1000),
    target=st.sampled_from([0.5, 0.8, 1.0, 2.0]),
)
def test_resource_law_converges_within_the_stated_number_of_intervals(
    goal: float, start: int, target: float
) -> None:
    """The law alone, for any fixed point L* = t/a in [1, 1000] and any start
    in [1, 1000]: with usage = a x L, after N = max(0, ceil(e0 - 2)) +
    ceil(log2(2 / eps)) + 1 intervals — e0 = |log2(start / L*)|, eps =
    log2(1 + 0.5 / L*) — the capacity is within +-1 of L* (in fact L is within
    0.5 of it), and it stays there."""
    per_task = target / goal
    law = ResourceLaw(1, 1000)
    law.limit = float(start)
    e0 = abs(math.log2(start / goal))
    eps = math.log2(1 + 0.5 / goal)
    steps = max(0, math.ceil(e0 - 2)) + math.ceil(math.log2(2 / eps)) + 1
    for _ in range(steps):
        law.update(per_task * law.limit / target, in_use=law.capacity)
    for _ in range(5):
        assert abs(law.capacity - goal) <= 1, (law.limit, goal)
        law.update(per_task * law.limit / target, in_use=law.capacity)
