"""Property tests of the sans-IO Work-stream session (`ringo_trio._contract.work.client`).

No trio, no sockets, no clock: time is a number the tests pass in.

* **Totality** — every `State` x `Input` pair, reached through the public
  methods, either follows `_TRANSITIONS` or is refused with
  `LocalProtocolError` (a ``SEND_*`` input) / `RemoteProtocolError` (a
  ``RECV_*`` input), leaving the session exactly as it was.
* **A state machine** plays the session against `FakeDaemon`, a small model of
  a *correct* daemon (absolute credit, the ``credit_capacity`` rule, pushes
  while it has credit, ``LEASE_LOST`` for stale leases, leases expiring by
  time or on demand, leases an operator cancels — answered ``LEASE_LOST``
  with reason ``cancelled``). Commands reach the model at once; everything the model
  says (results, pushes, heartbeats) waits in one ordered queue that a rule
  delivers, so results and pushes interleave in the daemon's order while the
  application settles, reports progress, resizes, drains and lets time pass.
  Streams end and reconnect; handlers of an ended stream may ignore their
  cancellation and run on as *orphans*, holding their slots, and exit at any
  later step. The daemon echoes at registration what the session asked for
  (as ``ringod`` does) or any other value.
  The invariants are the `@invariant` methods of `SessionMachine`, each named
  after the property it witnesses.
* **Sharp edges** — unit tests for the protocol errors, the credit
  resampling, the renewal arithmetic, command timeouts and `end()`.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ringo_trio._contract.reasons import CANCELLED as CANCELLED_REASON
from ringo_trio._contract.reasons import CREDIT_CAPACITY as CREDIT_CAPACITY_REASON
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._contract.work.client import (
    _TRANSITIONS,
    CANCELLED_BY_OPERATOR,
    GRANT_CAP,
    GRANT_FRACTION,
    MAX_CREDIT_REFUSALS,
    MAX_REQUEST_ID,
    PREFETCH_GRANT_CAP,
    Answered,
    CancelHandler,
    CommandDone,
    CommandError,
    CommandKind,
    Credit,
    Drain,
    Extend,
    Input,
    LeaseKey,
    LeaseState,
    LocalProtocolError,
    Outcome,
    Output,
    Progress,
    Pushed,
    Register,
    RemoteProtocolError,
    SessionBroken,
    Settle,
    StartHandler,
    State,
    TaskCancelled,
    WorkSession,
)

BATCH_MINOR = FEATURES[Feature.BATCH_FRAMES]
TARGET_MINOR = FEATURES[Feature.TARGET_CONCURRENCY]
OPERATE_MINOR = FEATURES[Feature.OPERATE]


def frames(outputs: list[Output]) -> list[Output]:
    """The frames among a session's outputs (what it asks the driver to send)."""
    return [
        o for o in outputs if isinstance(o, Register | Credit | Settle | Extend | Progress | Drain)
    ]


LEASE_LOST = CommandError("LEASE_LOST", "the lease is gone")
CANCELLED = CommandError("LEASE_LOST", "the task was cancelled", CANCELLED_REASON)
CAPACITY = CommandError("RESOURCE_EXHAUSTED", "over capacity", CREDIT_CAPACITY_REASON)

Command = Credit | Settle | Extend | Progress | Drain
_T = TypeVar("_T")


def kind_of(frame: Command) -> CommandKind:
    if isinstance(frame, Credit):
        return CommandKind.CREDIT
    if isinstance(frame, Settle):
        return CommandKind.SETTLE
    if isinstance(frame, Extend):
        return CommandKind.EXTEND
    if isinstance(frame, Progress):
        return CommandKind.PROGRESS
    return CommandKind.DRAIN


def of_type(outputs: Iterable[object], cls: type[_T]) -> list[_T]:
    return [o for o in outputs if isinstance(o, cls)]


def sort_keys(keys: Iterable[LeaseKey]) -> list[LeaseKey]:
    return sorted(keys, key=lambda k: (k.task_id, k.attempt))


# -- a correct daemon, in memory ----------------------------------------------


@dataclass(frozen=True)
class Registered:
    lease_duration: float
    max_concurrency: int
    ordered_request_ids: bool


@dataclass(frozen=True)
class Result:
    request_id: int
    error: CommandError | None


@dataclass(frozen=True)
class Push:
    key: LeaseKey
    token: str
    until: float


@dataclass(frozen=True)
class Heartbeat:
    pass


Message = Registered | Result | Push | Heartbeat


@dataclass
class ServerLease:
    token: str
    until: float


class FakeDaemon:
    """The daemon side of one Work stream, as the session assumes it behaves.

    * Every command is answered by exactly one `Result`, in order, queued in
      `outbox` the moment the command arrives.
    * Credit is absolute (``available`` replaces it) or, from minor 10, a
      ``grant`` added to it. An update that adds something and leaves
      ``credit + len(unsettled) > capacity`` is refused with
      ``credit_capacity`` and changes nothing; capacity is the command's
      target, else the last accepted target, else the registered
      ``max_concurrency`` (what it echoed). The result of an accepted credit is queued before
      any push that consumes it. A refused grant is recorded as a violation:
      a correct session never sends one the daemon cannot hold.
    * It pushes while it has credit and tasks and has not seen a drain; a
      drain voids its credit.
    * A lease is live until its ``until`` passes or `expire` ends it early;
      a command on a lease that is not live is answered ``LEASE_LOST``. The
      lease stays in ``unsettled`` (the daemon cannot know the worker stopped
      working on it) until it is settled — whatever the outcome — or a
      command on it is answered ``LEASE_LOST``.
    * An operator may cancel a task while it is leased: the lease ends at
      once (the task is not handed out again) and every command on it is
      answered ``LEASE_LOST`` with reason ``cancelled``.
    * From minor 9 an ACK may carry a result; no other settlement does.
    """

    def __init__(
        self,
        *,
        lease_duration: float,
        max_concurrency: int | None,
        ordered: bool,
        minor: int = 7,
    ) -> None:
        self.now = 0.0
        self.minor = minor
        self.lease_duration = lease_duration
        # What `registered` echoes: None echoes what was asked, as ringod does.
        self.max_concurrency = max_concurrency
        self.ordered = ordered
        self.registered = False
        self.capacity = max_concurrency or 0
        self.credit = 0
        self.draining = False
        self.available: deque[str] = deque()
        self.attempts: dict[str, int] = {}
        self.leases: dict[LeaseKey, ServerLease] = {}  # live leases only
        self.cancelled: set[LeaseKey] = set()  # leases an operator cancelled
        self.unsettled: set[LeaseKey] = set()
        self.outbox: deque[Message] = deque()
        self.kinds: dict[int, CommandKind] = {}  # every command received
        self.answered: set[int] = set()
        self.last_id = 0
        self.violations: list[str] = []
        self._tasks = itertools.count(1)
        self._tokens = itertools.count(1)

    # -- the world around the stream ------------------------------------

    def enqueue(self, n: int) -> None:
        for _ in range(n):
            self.available.append(f"t{next(self._tasks)}")
        self._pump()

    def tick(self, now: float) -> None:
        """Time passes on the daemon: leases whose ``until`` passed expire."""
        assert now >= self.now
        self.now = now
        for key in [k for k, lease in self.leases.items() if lease.until <= now]:
            self.expire(key)

    def expire(self, key: LeaseKey) -> None:
        """The lease ends on the daemon (its reaper, another clock...); the
        task becomes available again for a new attempt."""
        del self.leases[key]
        self.available.append(key.task_id)
        self._pump()

    def heartbeat(self) -> None:
        self.outbox.append(Heartbeat())

    def operator_cancels(self, key: LeaseKey) -> None:
        """CancelTask on a leased task: the lease ends, the task is done with."""
        del self.leases[key]
        self.cancelled.add(key)

    def _lost(self, key: LeaseKey) -> CommandError:
        return CANCELLED if key in self.cancelled else LEASE_LOST

    # -- the stream -------------------------------------------------------

    def receive(self, frame: Register | Command) -> None:
        if isinstance(frame, Register):
            if self.registered:
                self.violations.append("register sent twice")
            if frame.max_concurrency < 1:
                self.violations.append(f"the wire refuses {frame}")
            self.registered = True
            self.capacity = self.max_concurrency or frame.max_concurrency
            self.outbox.append(
                Registered(self.lease_duration, self.capacity, frame.ordered_request_ids)
            )
            return
        if not self.registered:
            self.violations.append(f"{frame} before registration")
        rid = frame.request_id
        if rid in self.kinds:
            self.violations.append(f"request id {rid} reused")
        if self.ordered and rid <= self.last_id:
            self.violations.append(f"request id {rid} not increasing")
        self.last_id = max(self.last_id, rid)
        self.kinds[rid] = kind_of(frame)
        error: CommandError | None
        if isinstance(frame, Credit):
            error = self._credit(frame)
        elif isinstance(frame, Settle):
            error = self._settle(frame)
        elif isinstance(frame, Extend | Progress):
            error = self._on_lease(frame)
        else:
            self.draining = True
            self.credit = 0
            error = None
        if rid in self.answered:
            self.violations.append(f"request {rid} answered twice")
        self.answered.add(rid)
        self.outbox.append(Result(rid, error))
        self._pump()

    def _credit(self, frame: Credit) -> CommandError | None:
        if self.draining:
            self.violations.append("credit after drain")
        if frame.available < 0:
            self.violations.append(f"negative credit {frame}")
        capacity = frame.target_concurrency
        if capacity is None:
            capacity = self.capacity
        credit, adds = frame.available, frame.available
        if frame.grant is not None:
            if self.minor < BATCH_MINOR or frame.available:
                self.violations.append(f"a grant on a minor {self.minor} stream: {frame}")
            credit, adds = self.credit + frame.grant, frame.grant
        if adds > 0 and credit + len(self.unsettled) > capacity:
            if frame.grant is not None:
                self.violations.append(
                    f"grant refused: {frame} with credit {self.credit} and"
                    f" {len(self.unsettled)} unsettled, capacity {capacity}"
                )
            return CAPACITY
        self.credit = credit
        if frame.target_concurrency is not None:
            self.capacity = frame.target_concurrency
        return None

    def _live(self, key: LeaseKey, token: str) -> bool:
        lease = self.leases.get(key)
        return lease is not None and lease.token == token and self.now < lease.until

    def _settle(self, frame: Settle) -> CommandError | None:
        if frame.outcome is Outcome.RELEASE and self.minor < 7:
            self.violations.append(f"release sent on a minor {self.minor} stream: {frame}")
        if frame.result is not None and (frame.outcome is not Outcome.ACK or self.minor < 9):
            self.violations.append(f"a result on a minor {self.minor} {frame.outcome}: {frame}")
        self.unsettled.discard(frame.key)
        if not self._live(frame.key, frame.lease_token):
            return self._lost(frame.key)
        del self.leases[frame.key]
        if frame.outcome is Outcome.NACK:
            self.available.append(frame.key.task_id)
        elif frame.outcome is Outcome.RELEASE:
            # Claimable at once, and the attempt is not spent: the next lease
            # carries the same attempt number again.
            self.available.appendleft(frame.key.task_id)
            self.attempts[frame.key.task_id] -= 1
        return None

    def _on_lease(self, frame: Extend | Progress) -> CommandError | None:
        if not self._live(frame.key, frame.lease_token):
            self.unsettled.discard(frame.key)
            return self._lost(frame.key)
        if isinstance(frame, Extend):
            self.leases[frame.key].until = self.now + frame.extension
        return None

    def _pump(self) -> None:
        while self.registered and not self.draining and self.credit > 0 and self.available:
            task = self.available.popleft()
            attempt = self.attempts[task] = self.attempts.get(task, 0) + 1
            key = LeaseKey(task, attempt)
            token = f"lease-{next(self._tokens)}"
            until = self.now + self.lease_duration
            self.leases[key] = ServerLease(token, until)
            self.unsettled.add(key)
            self.credit -= 1
            self.outbox.append(Push(key, token, until))

    # -- observation ----------------------------------------------------------

    def in_transit(self, cls: type[_T]) -> list[_T]:
        return of_type(self.outbox, cls)


# -- the session against the daemon ---------------------------------------------


@dataclass
class Tracked:
    """What the test knows about one pushed lease, computed independently of
    the session: its local deadline and renewal bookkeeping."""

    token: str
    deadline: float  # the current local deadline
    epoch_start: float  # when that deadline was set
    extend_at: float | None = None  # when this epoch's renewal went out
    extend_id: int = 0
    due_since: float | None = None  # first poll at or after the renewal point
    stalled: bool = False  # the driver slept through the renewal point
    held: bool = True
    cancelled: bool = False
    told_cancelled: bool = False  # the session said TaskCancelled for it
    settled: bool = False
    released: bool = False  # given back with a NACK after a late renewal


@dataclass
class Sent:
    kind: CommandKind
    at: float
    key: LeaseKey | None = None
    credit: int = 0  # a credit command's grant, or its absolute credit


RARELY = st.integers(0, 5)


class SessionMachine(RuleBasedStateMachine):
    """The session, driven like the trio driver drives it, against `FakeDaemon`."""

    @initialize(
        concurrency=st.integers(0, 4),
        max_concurrency=st.one_of(st.none(), st.integers(1, 4)),
        dynamic=st.booleans(),
        minor=st.sampled_from([2, 5, 6, 7, OPERATE_MINOR, BATCH_MINOR]),
        lease=st.sampled_from([3.0, 6.0, 9.0]),
        timeout_leases=st.sampled_from([2.0, 5.0, 1000.0]),
        backlog=st.integers(0, 8),
        grant_fraction=st.sampled_from([1, 3, GRANT_FRACTION]),
        grant_cap=st.sampled_from([1, 2, GRANT_CAP, PREFETCH_GRANT_CAP]),
    )
    def start(
        self,
        concurrency: int,
        max_concurrency: int | None,
        dynamic: bool,
        minor: int,
        lease: float,
        timeout_leases: float,
        backlog: int,
        grant_fraction: int,
        grant_cap: int,
    ) -> None:
        self.now = 0.0
        # The worker's concurrency (a resize changes it, and makes it dynamic).
        self.limit = concurrency
        self.dynamic = dynamic
        # The largest concurrency credit still out, or handlers still running,
        # may have been admitted under (it only exceeds `limit` after a cut).
        self.ceiling = 0
        # Handlers of ended streams still running (they ignored their
        # cancellation), with the session each ran under.
        self.orphans: list[tuple[WorkSession, LeaseKey]] = []
        self.handlers: set[LeaseKey] = set()
        # Concurrency here is at most 5: small fractions give grant thresholds
        # above one slot.
        self.grant_fraction = grant_fraction
        self.grant_cap = grant_cap
        self.lease = lease
        self.backlog = backlog
        self.params = (max_concurrency, minor, lease * timeout_leases)
        self._connect()

    def _connect(self) -> None:
        """A new Work stream: a fresh session against a fresh daemon. The
        handlers of the previous stream still running are its orphans now."""
        max_concurrency, minor, timeout = self.params
        if hasattr(self, "session"):
            self.orphans += [(self.session, key) for key in sort_keys(self.handlers)]
        self.session = WorkSession(
            concurrency=self.limit,
            minor=minor,
            dynamic_target=self.dynamic,
            command_timeout=timeout,
            outside=len(self.orphans),
        )
        self.session.grant_fraction = self.grant_fraction
        self.session.grant_cap = self.grant_cap
        self.daemon = FakeDaemon(
            lease_duration=self.lease,
            max_concurrency=max_concurrency,
            ordered=minor >= 6,
            minor=minor,
        )
        self.daemon.now = self.now
        self.daemon.enqueue(self.backlog)
        self.ended = False
        self.leases: dict[LeaseKey, Tracked] = {}
        self.handlers: set[LeaseKey] = set()  # handlers that have not returned
        self.sent: dict[int, Sent] = {}
        self.unanswered: dict[int, Sent] = {}
        self.violations: list[str] = []
        # Every output the machine carried out, in order (see `deliver_batch`).
        self.applied: list[Output] = []
        self._send(self.session.register(), source="register")

    # -- plumbing ----------------------------------------------------------

    def _send(self, frame: Register | Command, *, source: str) -> None:
        if not isinstance(frame, Register):
            rid = frame.request_id
            if rid in self.sent:
                self.violations.append(f"request id {rid} used twice")
            sent = Sent(kind_of(frame), self.now, getattr(frame, "key", None))
            if isinstance(frame, Credit):
                sent.credit = frame.available if frame.grant is None else frame.grant
            self.sent[rid] = self.unanswered[rid] = sent
        if isinstance(frame, Extend):
            tracked = self.leases[frame.key]
            if not tracked.held:
                self.violations.append(f"renewal of a lease not held: {frame}")
            if tracked.extend_at is not None:
                self.violations.append(f"second renewal in one lease period: {frame}")
            if frame.extension != self.lease or frame.lease_token != tracked.token:
                self.violations.append(f"renewal with wrong extension or token: {frame}")
            tracked.extend_at = self.now
            tracked.extend_id = frame.request_id
        if isinstance(frame, Settle) and source != "settle":
            tracked = self.leases[frame.key]
            # The only settlements the session makes on its own: NACKs handing
            # back a lease it gave up locally (its renewal was granted too late,
            # or its deadline passed with no command on it in flight).
            if (
                frame.outcome is not Outcome.NACK
                or tracked.held
                or tracked.released
                or tracked.settled
            ):
                self.violations.append(f"unexpected settlement {frame} ({source})")
            tracked.released = True
        self.daemon.receive(frame)

    def _apply(self, outputs: list[Output], *, source: str) -> None:
        self.applied += outputs
        for out in outputs:
            if isinstance(out, Register | Credit | Settle | Extend | Progress | Drain):
                self._send(out, source=source)
            elif isinstance(out, CancelHandler):
                tracked = self.leases.get(out.key)
                if tracked is None or out.key not in self.handlers or not tracked.held:
                    self.violations.append(f"cancel of a handler that is not running: {out}")
                else:
                    tracked.held = False
                    tracked.cancelled = True
            elif isinstance(out, StartHandler):
                if source != "push":
                    self.violations.append(f"{out} without a push")
            elif isinstance(out, TaskCancelled):
                tracked = self.leases.get(out.key)
                if out.key not in self.daemon.cancelled or source != "result":
                    self.violations.append(f"{out} for a task nobody cancelled ({source})")
                elif tracked is None or tracked.told_cancelled:
                    self.violations.append(f"{out} told twice")
                else:
                    tracked.told_cancelled = True
            elif isinstance(out, CommandDone) and source != "result":
                self.violations.append(f"{out} outside a result")

    def _advance(self, now: float) -> None:
        self.now = now
        self.daemon.tick(now)

    def _poll(self) -> None:
        try:
            outputs = self.session.poll(self.now)
        except SessionBroken:
            oldest = min(s.at for s in self.unanswered.values()) if self.unanswered else None
            if oldest is None or self.now < oldest + self.session.command_timeout:
                raise
            self._end()
            return
        for tracked in self.leases.values():
            due = tracked.deadline - self.lease / 3
            if tracked.held and self.now >= due and tracked.due_since is None:
                tracked.due_since = self.now
        self._apply(outputs, source="poll")

    def _drive(self) -> None:
        """What the driver does between messages: poll once it is due."""
        if self.ended:
            return
        nxt = self.session.next_deadline()
        if nxt is not None and nxt <= self.now:
            self._poll()

    def _deliver(self, message: Message) -> None:
        session = self.session
        if isinstance(message, Registered):
            outputs = session.registered(
                lease_duration=message.lease_duration,
                max_concurrency=message.max_concurrency,
                ordered_request_ids=message.ordered_request_ids,
                now=self.now,
            )
            self._apply(outputs, source="registered")
        elif isinstance(message, Heartbeat):
            session.heartbeat()
        elif isinstance(message, Push):
            before = session.credit_mirror
            if before <= 0:
                self.violations.append(f"push {message.key} not covered by the credit mirror")
            remaining = message.until - self.now
            outputs = session.task_pushed(message.key, message.token, remaining, self.now)
            # The push starts its handler; the push that uses the credit up
            # may also ask for the slots freed meanwhile (nothing else may).
            extra = outputs[1:]
            asks = session.credit_mirror == 0 and all(isinstance(o, Credit) for o in extra)
            if (
                outputs[:1] != [StartHandler(message.key)]
                or session.credit_mirror != before - 1
                or (extra and not asks)
            ):
                self.violations.append(f"push {message.key} handled as {outputs}")
            deadline = self.now + min(max(remaining, 0.0), self.lease)
            self.leases[message.key] = Tracked(message.token, deadline, self.now)
            self.handlers.add(message.key)
            self._apply(outputs, source="push")
        else:
            self._result(message)

    def _result(self, message: Result) -> None:
        rid, error = message.request_id, message.error
        sent = self.unanswered.pop(rid)
        outputs = self.session.result(rid, error, self.now)
        done = of_type(outputs, CommandDone)
        if sent.kind in (CommandKind.SETTLE, CommandKind.PROGRESS, CommandKind.DRAIN):
            expected = [CommandDone(rid, sent.kind, error)]
        else:
            expected = []
        if done != expected:
            self.violations.append(f"result {rid} ({sent.kind}) reported as {done}")
        if error == CANCELLED:
            # An operator's cancel is told as such: before the handler it
            # cancels, which is cancelled for that reason.
            for index, out in enumerate(outputs):
                if isinstance(out, CancelHandler) and (
                    out.reason != CANCELLED_BY_OPERATOR
                    or TaskCancelled(out.key) not in outputs[:index]
                ):
                    self.violations.append(f"cancel by an operator reported as {outputs}")
        elif of_type(outputs, TaskCancelled):
            self.violations.append(f"{outputs} after a result that was no cancel ({error})")
        if sent.kind is CommandKind.EXTEND and sent.key is not None:
            tracked = self.leases[sent.key]
            if tracked.extend_id != rid:
                self.violations.append(f"renewal result {rid} for an older renewal")
            tracked.extend_id = 0
            if error is None and tracked.held:
                tracked.deadline = sent.at + self.lease
                tracked.epoch_start = self.now
                tracked.extend_at = tracked.due_since = None
                tracked.stalled = False
            elif error is None and not tracked.released:
                released = [
                    o
                    for o in of_type(outputs, Settle)
                    if o.key == sent.key and o.outcome is Outcome.NACK
                ]
                if not (tracked.settled or released):
                    self.violations.append(f"lease {sent.key} renewed after loss, not given back")
        self._apply(outputs, source="result")

    def _end(self) -> None:
        pending = {
            rid: s.kind
            for rid, s in self.unanswered.items()
            if s.kind in (CommandKind.SETTLE, CommandKind.PROGRESS, CommandKind.DRAIN)
        }
        held = {k for k, t in self.leases.items() if t.held}
        outputs = self.session.end()
        failed = {o.request_id: o.kind for o in outputs if isinstance(o, CommandDone)}
        if failed != pending or any(
            isinstance(o, CommandDone) and o.error is None for o in outputs
        ):
            self.violations.append(f"end() failed {failed}, pending were {pending}")
        cancelled = {o.key for o in outputs if isinstance(o, CancelHandler)}
        if cancelled != held:
            self.violations.append(f"end() cancelled {cancelled}, held were {held}")
        for out in outputs:
            if isinstance(out, CancelHandler) and out.key in self.leases:
                self.leases[out.key].held = False
                self.leases[out.key].cancelled = True
        if frames(outputs):
            self.violations.append(f"end() sent {frames(outputs)}")
        self.ended = True
        self.unanswered.clear()
        self.daemon.outbox.clear()
        if self.session.poll(self.now + 1000 * self.lease) != []:
            self.violations.append("an ended session still has work to do")

    def _settled_down(self) -> bool:
        return (
            not self.ended
            and self.session.credit_mirror == 0
            and self.session.in_flight + len(self.orphans) <= self.limit
            and not self.daemon.in_transit(Push)
            and not any(s.kind is CommandKind.CREDIT for s in self.unanswered.values())
        )

    def _held(self) -> list[LeaseKey]:
        return sort_keys(k for k, t in self.leases.items() if t.held)

    def _let_go(self) -> list[LeaseKey]:
        return sort_keys(k for k in self.handlers if not self.leases[k].held)

    # -- rules ---------------------------------------------------------------

    @precondition(lambda self: not self.ended)
    @rule(n=st.integers(1, 5))
    def enqueue(self, n: int) -> None:
        self.daemon.enqueue(n)

    @precondition(lambda self: not self.ended and bool(self.daemon.outbox))
    @rule(count=st.integers(1, 4))
    def deliver(self, count: int) -> None:
        for _ in range(count):
            if self.ended or not self.daemon.outbox:
                break
            self._deliver(self.daemon.outbox.popleft())
            self._drive()

    @precondition(
        lambda self: (
            not self.ended
            and self.session.minor >= BATCH_MINOR
            and self.session.state in (State.ACTIVE, State.DRAINING)
            and isinstance(self.daemon.outbox[0] if self.daemon.outbox else None, Push | Result)
        )
    )
    @rule(count=st.integers(1, 6))
    def deliver_batch(self, count: int) -> None:
        """Property: a batch is the same as its elements in order. The next
        pushes and results in transit (up to `count`) arrive as one batch
        frame: a copy of the session takes the batch, the session itself takes
        the elements one by one (with every check of `_deliver`); both must
        give the same outputs in the same order and end in the same state.
        The copy then carries on, so later steps run on a batch-fed session."""
        outbox = self.daemon.outbox
        messages: list[Push | Result] = []
        while outbox and len(messages) < count and isinstance(outbox[0], Push | Result):
            message = outbox.popleft()
            assert isinstance(message, Push | Result)
            messages.append(message)
        items: list[Pushed | Answered] = [
            Pushed(m.key, m.token, m.until - self.now)
            if isinstance(m, Push)
            else Answered(m.request_id, m.error)
            for m in messages
        ]
        batched = copy.deepcopy(self.session)
        batch_outputs: list[Output] = []
        batched.batch(items, self.now, batch_outputs)
        applied = len(self.applied)
        for message in messages:
            self._deliver(message)
        assert batch_outputs == self.applied[applied:]
        assert session_state(batched) == session_state(self.session)
        self.session = batched
        self._drive()

    @precondition(lambda self: not self.ended)
    @rule(chance=RARELY)
    def heartbeat(self, chance: int) -> None:
        if chance == 0:
            self.daemon.heartbeat()

    @precondition(lambda self: not self.ended and bool(self._held()))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(Outcome),
        result=st.sampled_from([None, b"", b"value"]),
    )
    def handler_returns(self, data: st.DataObject, outcome: Outcome, result: bytes | None) -> None:
        key = data.draw(st.sampled_from(self._held()), label="key")
        outputs = self.session.settle(key, outcome, self.now, error="boom", result=result)
        tracked = self.leases[key]
        settles = of_type(outputs, Settle)
        if outcome is Outcome.RELEASE and not self.session.can_release:
            outcome = Outcome.NACK  # an older daemon: today's nack
        if outcome is not Outcome.ACK or self.session.minor < OPERATE_MINOR:
            result = None  # only an ACK of minor >= 9 carries one
        expected = Settle(settles[0].request_id, key, tracked.token, outcome, "boom", result=result)
        if settles != [expected]:
            self.violations.append(f"settle {key} {outcome} sent {settles}")
        tracked.held = False
        tracked.settled = True
        self.handlers.discard(key)
        self._apply(outputs, source="settle")

    @precondition(lambda self: bool(self._let_go()))
    @rule(data=st.data())
    def cancelled_handler_exits(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self._let_go()), label="key")
        outputs = self.session.handler_exited(key, self.now)
        self.handlers.discard(key)
        self._apply(outputs, source="exit")

    @precondition(lambda self: bool(self.orphans))
    @rule(data=st.data())
    def orphan_exits(self, data: st.DataObject) -> None:
        """A handler of an ended stream exits at last (the worker's
        `_orphan_exited`): its own session has nothing left to send, and the
        current one, unless it has ended too, gets its slot."""
        index = data.draw(st.integers(0, len(self.orphans) - 1), label="orphan")
        old, key = self.orphans.pop(index)
        if old.handler_exited(key, self.now) != []:
            self.violations.append(f"an ended session acted on the exit of {key}")
        if not self.ended:
            self._apply(self.session.outside_slot_freed(self.now), source="orphan")

    @precondition(lambda self: not self.ended and bool(self._held()))
    @rule(data=st.data(), current=st.integers(0, 10))
    def handler_reports_progress(self, data: st.DataObject, current: int) -> None:
        key = data.draw(st.sampled_from(self._held()), label="key")
        frame = self.session.report_progress(key, current, 10, "working", self.now)
        if frame.key != key or frame.lease_token != self.leases[key].token:
            self.violations.append(f"progress for {key} sent as {frame}")
        self._send(frame, source="progress")

    @precondition(lambda self: not self.ended)
    @rule(
        dt=st.sampled_from([0.25, 0.5, 1.0, 2.0, 2.5, 4.0, 7.0]),
        stall=st.sampled_from([False, False, True]),
    )
    def time_passes(self, dt: float, stall: bool) -> None:
        """The driver wakes at every `next_deadline` — unless it stalls
        (a blocked event loop) and wakes only at the end."""
        until = self.now + dt
        if stall:
            for tracked in self.leases.values():
                if tracked.held and self.now < tracked.deadline - self.lease / 3 <= until:
                    tracked.stalled = True
        else:
            for _ in range(10_000):
                nxt = self.session.next_deadline()
                if self.ended or nxt is None or nxt > until:
                    break
                self._advance(max(self.now, nxt))
                self._poll()
            else:
                raise AssertionError("poll never moves next_deadline past now")
        if not self.ended:
            self._advance(until)
            self._poll()

    @precondition(lambda self: not self.ended and bool(self.daemon.leases))
    @rule(data=st.data())
    def lease_expires_on_daemon(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sort_keys(self.daemon.leases)), label="key")
        self.daemon.expire(key)

    @precondition(lambda self: not self.ended and bool(self.daemon.leases))
    @rule(data=st.data())
    def operator_cancels_a_task(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sort_keys(self.daemon.leases)), label="key")
        self.daemon.operator_cancels(key)

    @precondition(lambda self: not self.ended)
    @rule(concurrency=st.integers(0, 5))
    def resize(self, concurrency: int) -> None:
        self.ceiling = max(self.ceiling, self.limit, concurrency)
        self.limit, self.dynamic = concurrency, True
        self._apply(self.session.set_concurrency(concurrency, self.now), source="resize")

    # Draining and ending close most doors, so they fire on one draw in
    # RARELY: long sessions explore more interleavings.

    @precondition(lambda self: not self.ended and self.session.state is State.ACTIVE)
    @rule(chance=RARELY)
    def drain(self, chance: int) -> None:
        if chance == 0:
            self._send(self.session.drain(self.now), source="drain")

    @precondition(lambda self: not self.ended)
    @rule(chance=RARELY)
    def stream_ends(self, chance: int) -> None:
        if chance == 0:
            self._end()

    @precondition(lambda self: self.ended)
    @rule()
    def reconnect(self) -> None:
        self._connect()

    @precondition(lambda self: not self.ended and self.session.state is not State.IDLE)
    @rule(chance=RARELY, data=st.data())
    def daemon_breaks_the_protocol(self, chance: int, data: st.DataObject) -> None:
        """A result for a request nobody sent: the session refuses it and is in
        ERROR for good — every later input is refused and no frame goes out —
        until the driver ends it (which still cancels every held handler)."""
        if chance != 0:
            return
        with pytest.raises(RemoteProtocolError):
            self.session.result(2**63, None, self.now)
        assert self.session.state is State.ERROR
        later: list[Callable[[], object]] = [
            lambda: self.session.poll(self.now + 1000 * self.lease),
            lambda: self.session.set_concurrency(self.session.concurrency + 1, self.now),
            lambda: self.session.drain(self.now),
            lambda: self.session.heartbeat(),
        ]
        if self._held():
            key = data.draw(st.sampled_from(self._held()), label="key")
            later += [
                lambda: self.session.settle(key, Outcome.ACK, self.now),
                lambda: self.session.report_progress(key, 1, 2, "", self.now),
            ]
        for attempt in later:
            with pytest.raises(LocalProtocolError):
                attempt()
            assert self.session.state is State.ERROR
        self._end()

    # -- invariants ------------------------------------------------------------

    @invariant()
    def nothing_unexpected(self) -> None:
        """The session's outputs and the daemon's view never contradicted the protocol."""
        assert self.violations == []
        assert self.daemon.violations == []
        for key, tracked in self.leases.items():
            assert self.session.holds(key) == tracked.held, key

    @invariant()
    def in_flight_never_exceeds_granted_credit(self) -> None:
        """In-flight never exceeds granted credit: every push was covered by the
        credit mirror (checked as it arrives), a slot is held exactly while a
        handler runs, and the slots in use plus the credit still out stay within
        the concurrency — within the concurrency before a cut while grants made
        before it are still out."""
        assert self.session.in_flight == len(self.handlers)
        assert self.session.credit_mirror >= 0
        if self._settled_down():
            # Every grant made before a cut is used up or superseded: from
            # here on, credit is computed against the current concurrency.
            self.ceiling = self.limit
        # Slots in use (outside ones too) plus the pushes the daemon may
        # still make, and every credit command in flight: what the worker
        # has committed to (a push only moves one from credit to slot).
        bound = max(self.ceiling, self.limit)
        assert self.session.committed <= bound, (
            self.session.in_flight,
            self.session.credit_mirror,
            self.session.committed,
        )

    @invariant()
    def credit_never_exceeds_free_local_slots(self) -> None:
        """Credit never exceeds free local slots: the credit mirror + the credit
        of every credit command in flight (grants and absolute) + the slots of
        running handlers + the slots orphans of ended streams still hold <=
        the worker's concurrency (before a cut: the one the credit was sent
        under), whatever the daemon echoed at registration. Counted from what
        the machine sent and runs, not from the session's own sums; and the
        session's concurrency never rises above the worker's, and it takes
        exactly the running orphans as its outside slots."""
        assert self.session.concurrency <= self.limit, (self.session.concurrency, self.limit)
        if not self.ended:
            assert self.session.outside == len(self.orphans)
        in_flight = sum(s.credit for s in self.unanswered.values() if s.kind is CommandKind.CREDIT)
        taken = self.session.credit_mirror + in_flight + len(self.handlers) + len(self.orphans)
        assert taken <= max(self.ceiling, self.limit), (
            self.session.credit_mirror,
            in_flight,
            len(self.handlers),
            len(self.orphans),
            self.limit,
            self.ceiling,
        )

    @invariant()
    def every_command_gets_exactly_one_result(self) -> None:
        """Every command gets exactly one result: the session waits for exactly the
        results still in transit, the daemon answered every command once, and once
        they are delivered nothing is pending."""
        if self.ended:
            assert self.session.pending_commands == 0
            return
        in_transit = {m.request_id for m in self.daemon.in_transit(Result)}
        assert set(self.unanswered) == in_transit
        assert self.session.pending_commands == len(in_transit)
        assert self.daemon.answered == set(self.daemon.kinds) == set(self.sent)

    @invariant()
    def no_result_is_correlated_to_the_wrong_command(self) -> None:
        """No result is correlated to the wrong command: the daemon saw every id with
        the kind of frame the session sent under it (the session's reaction to each
        result — a CommandDone of that kind, or none — is checked on delivery)."""
        assert {rid: s.kind for rid, s in self.sent.items()} == self.daemon.kinds

    @invariant()
    def a_lease_is_renewed_before_it_expires_or_the_handler_is_cancelled(self) -> None:
        """A lease is renewed before it expires or the handler is cancelled: every
        lease still held has a local deadline in the future, and once past its
        renewal point (deadline - lease/3) its renewal went out — at the renewal
        point itself when the driver woke on time, as `next_deadline` asked."""
        for key, tracked in self.leases.items():
            if not tracked.held:
                continue
            assert self.session.holds(key)
            assert tracked.deadline > self.now, (key, tracked)
            renew_at = tracked.deadline - self.lease / 3
            if self.now >= renew_at:
                assert tracked.extend_at is not None, (key, tracked)
                if tracked.due_since is not None:
                    assert tracked.extend_at <= tracked.due_since, (key, tracked)
                if not tracked.stalled:
                    assert tracked.extend_at <= max(renew_at, tracked.epoch_start), (key, tracked)
        # The session wakes the driver exactly when this bookkeeping says: the
        # next renewal point, the deadline of a lease being renewed, or the
        # timeout of the oldest command.
        wakeups = [
            t.deadline if t.extend_id else t.deadline - self.lease / 3
            for t in self.leases.values()
            if t.held
        ]
        if self.unanswered:
            oldest = min(s.at for s in self.unanswered.values())
            wakeups.append(oldest + self.session.command_timeout)
        if not self.ended:
            assert self.session.next_deadline() == min(wakeups, default=None)

    @invariant()
    def no_lease_is_leaked_on_the_daemon(self) -> None:
        """No lease is leaked on the daemon: once everything the daemon said has
        arrived, it counts a lease as unsettled only while its handler still runs
        (or its push is still in transit)."""
        if self.ended or self.daemon.in_transit(Result):
            return
        in_transit = {m.key for m in self.daemon.in_transit(Push)}
        leaked = self.daemon.unsettled - self.handlers - in_transit
        assert not leaked, sort_keys(leaked)

    @invariant()
    def no_slot_idles_without_a_request_for_work(self) -> None:
        """Liveness: a free slot never idles unasked-for. Whenever the session
        is active, its credit is used up and no credit command is in flight,
        every slot no orphan holds is taken — otherwise the worker would wait
        for work it never asked for (until some unrelated handler happened to
        settle); a slot an orphan gives back included."""
        if self.ended or self.session.state is not State.ACTIVE:
            return
        if any(s.kind is CommandKind.CREDIT for s in self.unanswered.values()):
            return
        # A lease lost while its renewal was out keeps its slot reserved
        # after its handler exits, until the daemon answers (every minor).
        reserved = {
            s.key
            for s in self.unanswered.values()
            if s.kind is CommandKind.EXTEND
            and s.key not in self.handlers
            and not self.leases[s.key].settled
        }
        # Every slot no orphan holds; a freed one included (at minor >= 2 a
        # stream registered without it asks for it with a target).
        free_locally = max(0, self.session.concurrency - len(self.orphans))
        if self.session.credit_mirror == 0:
            assert self.session.in_flight + len(reserved) >= free_locally, (
                self.session.in_flight,
                free_locally,
                reserved,
            )

    @invariant()
    def credit_mirror_equals_the_daemons_credit(self) -> None:
        """The credit mirror equals the daemon's credit (plus the pushes on their
        way) whenever no credit command or drain is in transit."""
        if self.ended:
            return
        unanswered = {s.kind for s in self.unanswered.values()}
        if CommandKind.CREDIT in unanswered or CommandKind.DRAIN in unanswered:
            return
        pushes = len(self.daemon.in_transit(Push))
        assert self.session.credit_mirror == self.daemon.credit + pushes

    @invariant()
    def committed_bounds_every_slot_to_come(self) -> None:
        """``committed`` — what a shared concurrency controller must keep as
        permits for the worker — is never less than the slots taken, the
        orphans' included, plus every push the daemon can still make (its
        credit and the pushes on their way), whatever credit or drain is in
        flight."""
        if self.ended:
            return
        pushes = len(self.daemon.in_transit(Push))
        can_arrive = self.daemon.credit + pushes
        taken = len(self.handlers) + len(self.orphans)
        assert self.session.committed >= taken + can_arrive, (
            self.session.committed,
            taken,
            can_arrive,
        )


TestSessionAgainstDaemon = SessionMachine.TestCase
TestSessionAgainstDaemon.settings = settings(
    max_examples=800,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- totality of the transition table ------------------------------------------

NOW = 100.0
LEASE = 9.0
A = LeaseKey("a", 1)
B = LeaseKey("b", 1)


def session_in(state: State) -> WorkSession:
    """A fresh session brought into ``state`` through the public methods, with
    one of its four slots held outside it; from ACTIVE on it holds lease A,
    has credit left and a progress report pending."""
    session = WorkSession(concurrency=4, minor=BATCH_MINOR, outside=1)
    if state is State.IDLE:
        return session
    session.register()
    if state is State.REGISTERING:
        return session
    (credit,) = session.registered(
        lease_duration=LEASE, max_concurrency=3, ordered_request_ids=True, now=NOW
    )
    assert isinstance(credit, Credit)
    assert session.result(credit.request_id, None, NOW) == []
    assert session.task_pushed(A, "tok-a", LEASE, NOW) == [StartHandler(A)]
    session.report_progress(A, 1, 2, "half", NOW)
    if state is State.DRAINING:
        session.drain(NOW)
    elif state is State.ENDED:
        session.end()
    elif state is State.ERROR:
        with pytest.raises(RemoteProtocolError):
            session.result(2**63, None, NOW)
    assert session.state is state
    return session


def session_state(session: WorkSession) -> dict[str, object]:
    """Everything a session holds, comparable across copies (``__getstate__``:
    a mypyc-compiled session has no ``__dict__``)."""
    state = session.__getstate__()
    assert isinstance(state, dict)
    return {**state, "_tiebreak": repr(session._tiebreak)}


def _pending_id(session: WorkSession) -> int:
    return next(iter(session._pending), 1)


APPLY: dict[Input, Callable[[WorkSession], object]] = {
    Input.SEND_REGISTER: lambda s: s.register(),
    Input.RECV_REGISTERED: lambda s: s.registered(
        lease_duration=LEASE, max_concurrency=3, ordered_request_ids=True, now=NOW
    ),
    # Credit and renewals have no method of their own (the session decides when
    # to send them, see test_gated_sends); the table is the gate.
    Input.SEND_CREDIT: lambda s: s._step(Input.SEND_CREDIT),
    Input.SEND_EXTEND: lambda s: s._step(Input.SEND_EXTEND),
    Input.SEND_SETTLE: lambda s: s.settle(A, Outcome.ACK, NOW),
    Input.SEND_PROGRESS: lambda s: s.report_progress(A, 2, 2, "done", NOW),
    Input.SEND_DRAIN: lambda s: s.drain(NOW),
    Input.RECV_TASK: lambda s: s.task_pushed(B, "tok-b", LEASE, NOW),
    Input.RECV_RESULT: lambda s: s.result(_pending_id(s), None, NOW),
    Input.RECV_HEARTBEAT: lambda s: s.heartbeat(),
    Input.RECV_BATCH: lambda s: s.batch([Answered(_pending_id(s), None)], NOW, []),
    Input.FREE_OUTSIDE: lambda s: s.outside_slot_freed(NOW),
    Input.END: lambda s: s.end(),
}
# Inputs from our own side: refusing one is our bug (LocalProtocolError).
LOCAL_INPUTS = {i for i in Input if i.name.startswith("SEND_")} | {Input.FREE_OUTSIDE}


def snapshot(session: WorkSession) -> tuple[object, ...]:
    return (
        session.state,
        session.pending_commands,
        session.credit_mirror,
        session.in_flight,
        session.concurrency,
        session.outside,
        session._next_id,
        session.holds(A),
        session.holds(B),
    )


def test_every_input_has_a_way_in() -> None:
    assert set(APPLY) == set(Input)
    assert all(isinstance(s, State) and isinstance(i, Input) for s, i in _TRANSITIONS)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("what", list(Input), ids=lambda i: i.name)
def test_totality(state: State, what: Input) -> None:
    """Each State x Input either follows `_TRANSITIONS` or is refused with the
    error of whoever broke the protocol, changing nothing but the state: a
    refusal leaves the session in ERROR for good, where every input but END is
    refused as our own mistake (h11's sticky error state). Our own inputs are
    the sends and an outside slot freed."""
    session = session_in(state)
    before = snapshot(session)
    after = _TRANSITIONS.get((state, what))
    if after is not None:
        APPLY[what](session)
        assert session.state is after
        return
    expected: type[Exception] = RemoteProtocolError
    if what in LOCAL_INPUTS or state is State.ERROR:
        expected = LocalProtocolError
    with pytest.raises(Exception) as caught:  # noqa: PT011 - the exact type is checked below
        APPLY[what](session)
    assert type(caught.value) is expected, caught.value
    assert session.state is State.ERROR
    assert snapshot(session)[1:] == before[1:]
    with pytest.raises(LocalProtocolError):
        session.heartbeat()
    assert session.end() is not None
    assert session.state is State.ENDED


def test_only_end_leaves_the_error_state() -> None:
    """ERROR is sticky: END is its one transition in the table."""
    assert {i for (s, i) in _TRANSITIONS if s is State.ERROR} == {Input.END}


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
def test_gated_sends(state: State) -> None:
    """Credit and renewals go out only in the states the table allows them in."""
    session = session_in(state)
    if state is State.ERROR:
        with pytest.raises(LocalProtocolError):
            session.set_concurrency(session.concurrency + 1, NOW)
        with pytest.raises(LocalProtocolError):
            session.poll(NOW + LEASE - LEASE / 3)
        return
    credits = frames(session.set_concurrency(session.concurrency + 1, NOW))
    renewals = frames(session.poll(NOW + LEASE - LEASE / 3))
    may_credit = (state, Input.SEND_CREDIT) in _TRANSITIONS
    may_extend = (state, Input.SEND_EXTEND) in _TRANSITIONS
    assert bool(of_type(credits, Credit)) == may_credit
    assert bool(of_type(renewals, Extend)) == may_extend
    assert session.state is state


# -- sharp edges -------------------------------------------------------------------


def active(
    concurrency: int = 2, *, lease: float = LEASE, timeout: float = 30.0, credit: bool = True
) -> tuple[WorkSession, Credit]:
    """A registered session; its first credit answered unless ``credit`` is False."""
    session = WorkSession(concurrency=concurrency, minor=7, command_timeout=timeout)
    session.register()
    (frame,) = session.registered(
        lease_duration=lease, max_concurrency=concurrency, ordered_request_ids=True, now=0.0
    )
    assert isinstance(frame, Credit)
    assert frame.available == concurrency
    if credit:
        assert session.result(frame.request_id, None, 0.0) == []
        assert session.credit_mirror == concurrency
    return session, frame


def test_a_refused_registration_never_enters_active() -> None:
    """A registration the session refuses (the daemon did not confirm the
    request-id mode) leaves it in ERROR — never ACTIVE — with no credit sent."""
    session = WorkSession(concurrency=2, minor=7)
    session.register()
    with pytest.raises(RemoteProtocolError):
        session.registered(
            lease_duration=LEASE, max_concurrency=2, ordered_request_ids=False, now=0.0
        )
    assert session.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        session.set_concurrency(3, 0.0)


def test_result_for_unknown_or_answered_id_is_a_remote_error() -> None:
    session, credit = active()
    with pytest.raises(RemoteProtocolError):
        session.result(credit.request_id, None, 0.0)  # already answered
    session, credit = active()
    with pytest.raises(RemoteProtocolError):
        session.result(99, None, 0.0)  # never sent


def test_results_are_correlated_by_id_not_by_order() -> None:
    session, _ = active()
    session.task_pushed(A, "tok", LEASE, 0.0)
    first = session.report_progress(A, 1, 3, "", 0.0)
    second = session.drain(0.0)
    assert session.result(second.request_id, None, 1.0) == [
        CommandDone(second.request_id, CommandKind.DRAIN, None)
    ]
    assert session.result(first.request_id, LEASE_LOST, 1.0) == [
        CommandDone(first.request_id, CommandKind.PROGRESS, LEASE_LOST),
        CancelHandler(A, "lease lost (progress report refused)"),
    ]


def test_push_without_credit_is_a_remote_error() -> None:
    session, credit = active(1, credit=False)
    with pytest.raises(RemoteProtocolError):
        session.task_pushed(A, "tok", LEASE, 0.0)  # credit result not yet in
    session, credit = active(1, credit=False)
    session.result(credit.request_id, None, 0.0)
    session.task_pushed(A, "tok", LEASE, 0.0)
    with pytest.raises(RemoteProtocolError):
        session.task_pushed(B, "tok", LEASE, 0.0)  # the one credit is used up


def test_duplicate_push_is_a_remote_error() -> None:
    session, _ = active(2)
    session.task_pushed(A, "tok", LEASE, 0.0)
    with pytest.raises(RemoteProtocolError):
        session.task_pushed(A, "tok", LEASE, 0.0)


@given(
    st.tuples(st.sampled_from(["a", "b", "a\x00"]), st.integers(1, 3)),
    st.tuples(st.sampled_from(["a", "b", "a\x00"]), st.integers(1, 3)),
)
def test_a_lease_key_names_one_attempt_and_cannot_change(
    first: tuple[str, int], second: tuple[str, int]
) -> None:
    """Lease keys are lease-table keys: keys of different tasks or attempts
    never collide (two table entries, not one answering for the other),
    equal keys find each other's entry, and a key cannot be changed once it
    keys a table."""
    a, b = LeaseKey(*first), LeaseKey(*second)
    table = {a: "first", b: "second"}
    if first == second:
        assert a == b
        assert hash(a) == hash(b)
        assert table == {a: "second"}
    else:
        assert a != b
        assert table[a] == "first"
        assert table[b] == "second"
    with pytest.raises(AttributeError):
        a.attempt = 9  # type: ignore[misc]
    assert a == LeaseKey(*first)


def test_capacity_refusal_is_resampled_at_once_and_twenty_break_the_session() -> None:
    session, _ = active(2)
    session.task_pushed(A, "tok", LEASE, 0.0)
    (resize,) = frames(session.set_concurrency(4, 0.0))
    # One slot taken, and the one credit left may be a push on its way.
    assert resize == Credit(resize.request_id, 2, 4)
    session.task_pushed(B, "tok", LEASE, 0.0)  # it was; the daemon refuses the resize
    (frame,) = session.result(resize.request_id, CAPACITY, 0.0)
    assert frame == Credit(resize.request_id + 1, 2, 4)  # resampled at once
    (settle,) = session.settle(A, Outcome.ACK, 0.0)  # no second credit in flight
    assert isinstance(settle, Settle)
    for refusal in range(2, MAX_CREDIT_REFUSALS):
        assert isinstance(frame, Credit)
        (frame,) = session.result(frame.request_id, CAPACITY, 0.0)
        # Each resample reads the current slots: A's is free now.
        assert frame == Credit(session._next_id - 1, 3, 4), refusal
    assert isinstance(frame, Credit)
    with pytest.raises(SessionBroken):
        session.result(frame.request_id, CAPACITY, 0.0)


def test_accepted_credit_resets_the_refusal_count() -> None:
    session, _ = active(2)
    (frame,) = frames(session.set_concurrency(3, 0.0))
    for _ in range(MAX_CREDIT_REFUSALS - 1):
        (frame,) = session.result(frame.request_id, CAPACITY, 0.0)
    assert session.result(frame.request_id, None, 0.0) == []
    (frame,) = frames(session.set_concurrency(4, 0.0))
    (frame,) = session.result(frame.request_id, CAPACITY, 0.0)
    assert isinstance(frame, Credit)


def test_other_credit_refusals_break_the_session() -> None:
    session, credit = active(2, credit=False)
    with pytest.raises(SessionBroken):
        session.result(credit.request_id, CommandError("INVALID_ARGUMENT", "no"), 0.0)


def test_renewal_granted_after_the_lease_was_given_up_is_nacked() -> None:
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    (extend,) = session.poll(6.0)
    assert extend == Extend(extend.request_id, A, "tok", 9.0)
    assert session.poll(9.0) == [CancelHandler(A, "lease expired before it could be renewed")]
    assert not session.holds(A)
    (nack,) = session.result(extend.request_id, None, 9.5)
    assert isinstance(nack, Settle)
    assert (nack.key, nack.lease_token, nack.outcome) == (A, "tok", Outcome.NACK)
    # The slot is still the (cancelled) handler's until it really exits.
    assert session.in_flight == 1
    assert session.result(nack.request_id, None, 9.5) == [
        CommandDone(nack.request_id, CommandKind.SETTLE, None)
    ]
    (credit,) = session.handler_exited(A, 10.0)
    assert credit == Credit(credit.request_id, 1, None)
    assert session.in_flight == 0


@pytest.mark.parametrize("renewing", [True, False], ids=["renewal-out", "no-renewal"])
def test_a_stop_seen_after_the_deadline_hands_the_lease_back_released(renewing: bool) -> None:
    """Property (no attempt spent by our own stopping): a handler the worker's
    stop ended in time but whose exit is seen only after the local deadline
    (a freeze at the same instant) hands its lease back with a release — at
    once, or once the renewal in flight is answered — never with the nack a
    lease lost while its handler ran is handed back with (the test above).
    Found by tests/contract/test_simulation.py's soak (``[no attempt spent by
    our own stopping] the stop gave back <lease ... ended nacked>``)."""
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    if renewing:
        (extend,) = session.poll(6.0)
        assert session.settle(A, Outcome.RELEASE, 9.5) == []
        outputs = session.result(extend.request_id, None, 9.6)
    else:
        outputs = session.settle(A, Outcome.RELEASE, 9.5)
    [back] = [o for o in outputs if isinstance(o, Settle)]
    assert (back.key, back.lease_token, back.outcome) == (A, "tok", Outcome.RELEASE)
    assert not session.holds(A)


@pytest.mark.parametrize("answer", [None, LEASE_LOST], ids=["renewed", "lost"])
def test_a_grant_waits_for_the_renewal_of_a_lease_lost_meanwhile(
    answer: CommandError | None,
) -> None:
    """Property: the daemon never refuses a grant the session sends (minor 10).
    A lease lost locally while its renewal is out is still outstanding on the
    daemon after its handler exits, so its slot is granted only once the
    renewal is answered — after the nack handing it back, if it was renewed."""
    session = WorkSession(concurrency=1, minor=BATCH_MINOR)
    session.register()
    (grant,) = session.registered(
        lease_duration=9.0, max_concurrency=1, ordered_request_ids=True, now=0.0
    )
    assert grant == Credit(grant.request_id, 0, None, grant=1)
    assert session.result(grant.request_id, None, 0.0) == []
    session.task_pushed(A, "tok", 9.0, 0.0)
    (extend,) = session.poll(6.0)
    assert session.poll(9.0) == [CancelHandler(A, "lease expired before it could be renewed")]
    assert session.handler_exited(A, 9.5) == []  # the daemon still counts A
    assert session.committed == 0
    outputs = session.result(extend.request_id, answer, 10.0)
    if answer is None:
        nack, grant = outputs
        assert isinstance(nack, Settle)
        assert nack.outcome is Outcome.NACK
    else:
        (grant,) = outputs
    assert grant == Credit(grant.request_id, 0, None, grant=1)


@pytest.mark.parametrize("answer", [None, LEASE_LOST], ids=["renewed", "lost"])
def test_absolute_credit_waits_for_the_renewal_of_a_lease_lost_meanwhile(
    answer: CommandError | None,
) -> None:
    """Property: credit never exceeds free slots as the daemon counts them
    (minor 9, absolute credit). Found by tests/contract/test_simulation.py
    (``[credit never exceeds free slots] stream 0: the daemon has 2
    outstanding and 1 credit, <worker 0> runs 1 other handler(s),
    concurrency 3``): a lease lost locally while its renewal is out is still
    outstanding on the daemon after its handler exits, so its slot must not
    be offered until the renewal is answered; before, the session sent
    ``Credit(1)`` at once and the daemon, counting that lease and not the
    stubborn handler of a lease it had dropped, accepted one push too many."""
    session = WorkSession(concurrency=1, minor=OPERATE_MINOR)
    session.register()
    (credit,) = session.registered(
        lease_duration=9.0, max_concurrency=1, ordered_request_ids=True, now=0.0
    )
    assert credit == Credit(credit.request_id, 1, None)
    assert session.result(credit.request_id, None, 0.0) == []
    session.task_pushed(A, "tok", 9.0, 0.0)
    (extend,) = session.poll(6.0)
    assert session.poll(9.0) == [CancelHandler(A, "lease expired before it could be renewed")]
    assert session.handler_exited(A, 9.5) == []  # the daemon still counts A
    outputs = session.result(extend.request_id, answer, 10.0)
    if answer is None:
        nack, credit = outputs
        assert isinstance(nack, Settle)
        assert nack.outcome is Outcome.NACK
    else:
        (credit,) = outputs
    assert credit == Credit(credit.request_id, 1, None)


@pytest.mark.parametrize("cap", [GRANT_CAP, PREFETCH_GRANT_CAP])
def test_freed_slots_are_granted_in_batches_of_at_most_the_cap(cap: int) -> None:
    """Property (minor 10): at a large concurrency, with a grant already out,
    freed slots are asked for once the session's cap of them are free (the
    Worker's: GRANT_CAP, PREFETCH_GRANT_CAP when it prefetches), not once
    half the concurrency is, so a freed slot does not idle while a hundred
    others finish; below the cap nothing more goes out."""
    concurrency = 8 * cap
    session = WorkSession(concurrency=concurrency, minor=BATCH_MINOR, grant_cap=cap)
    session.register()
    (first,) = session.registered(
        lease_duration=60.0, max_concurrency=concurrency, ordered_request_ids=True, now=0.0
    )
    assert first.grant == concurrency
    assert session.result(first.request_id, None, 0.0) == []
    keys = [LeaseKey(f"t{n}", 1) for n in range(concurrency)]
    for key in keys:
        session.task_pushed(key, "tok", 60.0, 0.0)
    # Nothing out at all: the first freed slot is asked for at once.
    (grant,) = of_type(session.settle(keys[0], Outcome.ACK, 1.0), Credit)
    assert grant.grant == 1
    for key in keys[1:cap]:
        assert of_type(session.settle(key, Outcome.ACK, 1.0), Credit) == []
    (grant,) = of_type(session.settle(keys[cap], Outcome.ACK, 1.0), Credit)
    assert grant == Credit(grant.request_id, 0, None, grant=cap)


def test_a_grant_cap_below_one_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match="grant_cap"):
        WorkSession(concurrency=4, minor=BATCH_MINOR, grant_cap=0)


def test_renewal_moves_the_deadline_to_send_time_plus_extension() -> None:
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    assert session.next_deadline() == 6.0
    (extend,) = session.poll(6.0)  # sent at 6
    assert session.next_deadline() == 9.0  # the old deadline, until the result comes
    assert session.result(extend.request_id, None, 8.0) == []
    # 6 + 9 = 15 (not 8 + 9 = 17); renew a third before: 12.
    assert session.next_deadline() == 12.0
    (again,) = session.poll(12.0)
    assert isinstance(again, Extend)
    assert session.poll(14.99) == []
    assert of_type(session.poll(15.0), CancelHandler) == [
        CancelHandler(A, "lease expired before it could be renewed")
    ]


def test_a_short_remaining_lease_is_renewed_at_once() -> None:
    session, _ = active(2, lease=9.0)
    session.task_pushed(A, "tok", 2.0, 0.0)  # the daemon's clock says 2 s are left
    assert session.next_deadline() == 2.0 - 3.0
    assert of_type(session.poll(0.0), Extend)
    # ...and a remaining lease longer than the registered one is capped.
    session, _ = active(1, lease=9.0)
    session.task_pushed(B, "tok", 60.0, 0.0)
    assert session.poll(5.99) == []
    assert of_type(session.poll(6.0), Extend)


def test_unanswered_command_breaks_the_session_at_the_timeout() -> None:
    session, credit = active(1, timeout=5.0, credit=False)
    assert session.next_deadline() == 5.0
    assert session.poll(4.99) == []
    with pytest.raises(SessionBroken):
        session.poll(5.0)
    # Broken for good: even the late answer is refused; only end() remains.
    assert session.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        session.result(credit.request_id, None, 5.0)
    session.end()
    assert session.state is State.ENDED


def test_end_fails_every_pending_command_and_cancels_every_held_lease() -> None:
    session, _ = active(4)
    a, b, c, d = (LeaseKey(name, 1) for name in "abcd")
    for key in (a, b, c):
        session.task_pushed(key, "tok", LEASE, 0.0)
    session.task_pushed(d, "tok", 1.0, 0.0)
    (extend,) = session.poll(0.0)  # d: renewed at once, 1 s left
    assert isinstance(extend, Extend)
    assert session.poll(1.0) == [CancelHandler(d, "lease expired before it could be renewed")]
    progress = session.report_progress(a, 1, 2, "", 1.0)
    (settle,) = of_type(session.settle(b, Outcome.ACK, 1.0), Settle)  # (and a credit)
    assert isinstance(settle, Settle)
    drain = session.drain(1.0)
    outputs = session.end()
    gone = CommandError("UNAVAILABLE", "the Work stream ended")
    assert sorted(of_type(outputs, CommandDone), key=lambda o: o.request_id) == [
        CommandDone(progress.request_id, CommandKind.PROGRESS, gone),
        CommandDone(settle.request_id, CommandKind.SETTLE, gone),
        CommandDone(drain.request_id, CommandKind.DRAIN, gone),
    ]
    # a and c were held; b was settled and d already cancelled.
    assert of_type(outputs, CancelHandler) == [
        CancelHandler(a, "the Work stream ended"),
        CancelHandler(c, "the Work stream ended"),
    ]
    assert frames(outputs) == []
    assert session.pending_commands == 0
    assert session.credit_mirror == 0
    assert not any(session.holds(k) for k in (a, b, c, d))
    assert session.state is State.ENDED
    assert session.next_deadline() is None


def test_pushes_granted_before_the_drain_are_accepted() -> None:
    """The daemon answers the credit, pushes against it, then sees the drain:
    the credit result arrives after the drain was sent, and the push after it."""
    session, credit = active(2, credit=False)
    session.drain(0.0)
    assert session.result(credit.request_id, None, 0.0) == []
    assert session.credit_mirror == 2
    assert session.task_pushed(A, "tok", LEASE, 0.0) == [StartHandler(A)]
    assert session.credit_mirror == 1


def test_local_deadline_without_a_renewal_in_flight_hands_the_lease_back() -> None:
    """The driver slept through the renewal point: no command on the lease is in
    flight, so the session tells the daemon it let the lease go."""
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    cancel, nack = session.poll(9.5)
    assert cancel == CancelHandler(A, "lease expired before it could be renewed")
    assert isinstance(nack, Settle)
    assert (nack.key, nack.lease_token, nack.outcome) == (A, "tok", Outcome.NACK)
    assert session.result(nack.request_id, LEASE_LOST, 9.5) == [
        CommandDone(nack.request_id, CommandKind.SETTLE, LEASE_LOST)
    ]
    assert session.in_flight == 1  # until the handler really exits
    (credit,) = session.handler_exited(A, 10.0)
    assert isinstance(credit, Credit)
    assert credit.available == 1


@pytest.mark.parametrize("renewing", [False, True], ids=["no-renewal", "renewal-out"])
def test_a_handler_finishing_past_the_local_deadline_does_not_ack(renewing: bool) -> None:
    """Property: a lease that expired is never acked, even when the handler
    finishes in the step that ends a freeze, before any `poll` saw the
    deadline (before, `settle` trusted the last `poll` and the ack went out
    past the local deadline). The lease is given up as `poll` gives it up —
    handed back when no renewal is out — and the finished handler's slot is
    free at once."""
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    if renewing:
        (extend,) = session.poll(6.0)
        assert isinstance(extend, Extend)
    outputs = session.settle(A, Outcome.ACK, 9.5)
    settles = of_type(outputs, Settle)
    assert all(settle.outcome is not Outcome.ACK for settle in settles)
    assert of_type(outputs, CancelHandler) == []  # nothing left to cancel
    if renewing:
        assert settles == []  # the renewal's answer ends it (nacked if renewed)
    else:
        (nack,) = settles
        assert (nack.key, nack.lease_token, nack.outcome) == (A, "tok", Outcome.NACK)
    assert session.in_flight == 0
    assert not session.holds(A)


def test_a_settled_lease_is_not_cancelled_when_its_progress_report_is_refused() -> None:
    """Found by the state machine: progress on A, then A settled, then the
    progress result LEASE_LOST used to cancel a handler that had returned."""
    session, _ = active(1)
    session.task_pushed(A, "tok", LEASE, 0.0)
    progress = session.report_progress(A, 1, 2, "", 0.0)
    (settle, *_) = session.settle(A, Outcome.ACK, 0.0)
    assert isinstance(settle, Settle)
    assert session.result(progress.request_id, LEASE_LOST, 0.0) == [
        CommandDone(progress.request_id, CommandKind.PROGRESS, LEASE_LOST)
    ]
    assert session.result(settle.request_id, LEASE_LOST, 0.0) == [
        CommandDone(settle.request_id, CommandKind.SETTLE, LEASE_LOST)
    ]


def test_a_resize_never_lets_new_work_replace_a_cancelled_handler() -> None:
    """Found by the state machine: two handlers whose leases expired ignore
    their cancellation; a push is on its way when the worker resizes. The
    daemon no longer counts the two lost leases, so its capacity check accepts
    any grant up to the free slots — counting the push on its way is the
    session's job."""
    session, credit = active(3, lease=3.0, credit=False)
    assert credit.available == 3
    session.result(credit.request_id, None, 0.0)
    old = [LeaseKey("t1", 1), LeaseKey("t2", 1)]
    for key in old:
        # Pushed at 0, delivered at 3: the lease is already over.
        session.task_pushed(key, "tok", 0.0, 3.0)
    released = session.poll(3.0)
    assert of_type(released, CancelHandler) == [
        CancelHandler(key, "lease expired before it could be renewed") for key in old
    ]
    assert session.in_flight == 2
    assert session.credit_mirror == 1
    # The daemon already pushed t1 again (attempt 2) against the last credit.
    (resize,) = frames(session.set_concurrency(3, 3.0))
    assert isinstance(resize, Credit)
    assert resize.available == 0  # 3 slots - 2 cancelled handlers - 1 push on its way
    session.task_pushed(LeaseKey("t1", 2), "tok", 3.0, 3.0)
    session.result(resize.request_id, None, 3.0)
    assert session.in_flight == 3 == session.concurrency
    assert session.credit_mirror == 0


# -- batch frames (minor >= 10) ------------------------------------------------


def _active(minor: int) -> tuple[WorkSession, Credit]:
    session = WorkSession(concurrency=3, minor=minor)
    session.register()
    (credit,) = session.registered(
        lease_duration=LEASE, max_concurrency=3, ordered_request_ids=True, now=NOW
    )
    assert isinstance(credit, Credit)
    return session, credit


@pytest.mark.parametrize("minor", [OPERATE_MINOR, BATCH_MINOR])
def test_a_batch_is_refused_below_its_minor_and_when_empty(minor: int) -> None:
    """A batch frame on a stream older than minor 10 breaks the protocol
    (the daemon must never send one there), and so does an empty batch."""
    session, credit = _active(minor)
    items: list[Pushed | Answered] = [Answered(credit.request_id, None)]
    out: list[Output] = []
    with pytest.raises(RemoteProtocolError):
        session.batch(items if minor < BATCH_MINOR else [], NOW, out)
    assert session.state is State.ERROR
    assert out == []


def test_a_batch_broken_part_way_keeps_what_its_first_elements_asked_for() -> None:
    """Property: a batch is the same as its elements in order, also when one
    of them breaks the protocol: what the elements before it asked for is in
    `out` (to be carried out, as it would have been one by one), the session
    is in ERROR, and nothing after the bad element was taken."""
    session, credit = _active(BATCH_MINOR)
    out: list[Output] = []
    items: list[Pushed | Answered] = [
        Answered(credit.request_id, None),
        Pushed(A, "tok-a", LEASE),
        Answered(2**63, None),
        Pushed(B, "tok-b", LEASE),
    ]
    with pytest.raises(RemoteProtocolError):
        session.batch(items, NOW, out)
    assert out == [StartHandler(A)]
    assert session.state is State.ERROR
    assert session.in_flight == 1


# -- the per-task events' fast __init__ ------------------------------------------------

_KEYS = st.builds(LeaseKey, st.text(max_size=8), st.integers(0, 2**32 - 1))
_ERRORS = st.none() | st.builds(CommandError, st.text(max_size=8), st.text(max_size=8))
_FAST_EVENTS = {
    Settle: st.tuples(
        st.integers(1, 2**64 - 1),
        _KEYS,
        st.text(max_size=8),
        st.sampled_from(Outcome),
        st.text(max_size=8),
        st.none() | st.floats(allow_nan=False),
        st.none() | st.binary(max_size=8),
    ),
    Pushed: st.tuples(_KEYS, st.text(max_size=8), st.floats(allow_nan=False)),
    Answered: st.tuples(st.integers(1, 2**64 - 1), _ERRORS),
    StartHandler: st.tuples(_KEYS),
    CommandDone: st.tuples(st.integers(1, 2**64 - 1), st.sampled_from(CommandKind), _ERRORS),
}


@pytest.mark.parametrize("cls", list(_FAST_EVENTS), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_fast_init_builds_what_the_generated_init_builds(cls: type, data: st.DataObject) -> None:
    """Property (same events): the per-task events' descriptor-filling
    ``__init__`` (`_fast_init`) builds, from any arguments, positional or by
    keyword, with or without the defaults, the event the dataclass's own
    ``__init__`` builds: equal, same hash, every field the same, still frozen;
    and it takes the same parameters."""
    generated = cls.__init__.generated  # type: ignore[misc]
    fast = inspect.signature(cls.__init__).parameters
    reference = inspect.signature(generated).parameters
    assert [(p.name, p.kind, p.default) for p in fast.values()] == [
        (p.name, p.kind, p.default) for p in reference.values()
    ]
    args = data.draw(_FAST_EVENTS[cls])
    names = [field.name for field in dataclasses.fields(cls)]
    given_count = data.draw(st.integers(1, len(args)))
    required = sum(p.default is inspect.Parameter.empty for p in reference.values()) - 1
    given_count = max(given_count, required)
    positional = data.draw(st.integers(0, given_count))
    call_args = args[:positional]
    by_name = zip(names[positional:given_count], args[positional:given_count], strict=True)
    call_kwargs = dict(by_name)
    built = cls(*call_args, **call_kwargs)
    expected = object.__new__(cls)
    generated(expected, *call_args, **call_kwargs)
    assert built == expected
    assert hash(built) == hash(expected)
    for name in names:
        assert getattr(built, name) is getattr(expected, name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, names[0], args[0])


# -- outside slots (handlers of ended streams) -----------------------------------


def test_a_worker_with_every_slot_outside_registers_one_and_asks_for_nothing() -> None:
    """Property: no credit for a slot held outside, whatever the echo. One slot,
    held by a handler of an ended stream: the stream registers 1 (the wire's
    minimum), and neither that echo nor a larger one buys credit; the slot is
    granted once the handler exits."""
    for echo in (1, 5):
        session = WorkSession(concurrency=1, minor=7, outside=1)
        assert session.register() == Register(ordered_request_ids=True, max_concurrency=1)
        assert (
            session.registered(
                lease_duration=LEASE, max_concurrency=echo, ordered_request_ids=True, now=NOW
            )
            == []
        )
        assert (session.concurrency, session.capacity, session.committed) == (1, 0, 1)
        (credit,) = session.outside_slot_freed(NOW)
        assert isinstance(credit, Credit)
        assert (credit.available, credit.target_concurrency) == (1, None)
        assert session.committed == 1  # the credit in flight now


def test_an_echo_below_the_request_lowers_the_concurrency() -> None:
    """The daemon may hold the stream to less than it asked for: that much, and
    the outside slots, are the worker's concurrency on this stream."""
    session = WorkSession(concurrency=4, minor=7, outside=1)
    assert session.register().max_concurrency == 3
    (credit,) = session.registered(
        lease_duration=LEASE, max_concurrency=2, ordered_request_ids=True, now=NOW
    )
    assert isinstance(credit, Credit)
    assert (session.concurrency, credit.available) == (3, 2)


@pytest.mark.parametrize(("minor", "reclaimed"), [(1, False), (2, True), (BATCH_MINOR, True)])
def test_a_slot_freed_outside_beyond_the_registration_needs_a_target(
    minor: int, reclaimed: bool
) -> None:
    """Three slots, one outside: the stream registers two. When the outside
    handler exits, its slot goes beyond what the daemon holds: from minor 2 a
    target asks for it (and the daemon's capacity check then uses it); below,
    it waits for the next stream (a credit beyond the registration would be
    refused)."""
    session = WorkSession(concurrency=3, minor=minor, outside=1)
    assert session.register().max_concurrency == 2
    (credit,) = session.registered(
        lease_duration=LEASE, max_concurrency=2, ordered_request_ids=minor >= 6, now=NOW
    )
    assert isinstance(credit, Credit)
    assert credit.target_concurrency is None
    session.result(credit.request_id, None, NOW)
    for n in range(2):
        session.task_pushed(LeaseKey(f"t{n}", 1), "tok", LEASE, NOW)
    out = session.outside_slot_freed(NOW)
    assert session.capacity == (3 if reclaimed else 2)
    if not reclaimed:
        assert out == []
        return
    (resize,) = out
    assert isinstance(resize, Credit)
    assert (resize.available, resize.target_concurrency, resize.grant) == (1, 3, None)
    assert session.result(resize.request_id, None, NOW) == []
    # The target stands: later credit, with no target of its own, is checked against it.
    session.task_pushed(LeaseKey("t2", 1), "tok", LEASE, NOW)
    (again,) = session.settle(LeaseKey("t0", 1), Outcome.ACK, NOW)[1:]
    assert isinstance(again, Credit)
    assert again.target_concurrency is None
    assert session.capacity == 3


def test_freeing_an_outside_slot_that_is_not_held_is_our_bug() -> None:
    """More exits than outside slots, or one reported to an ended session (the
    next session counts what is left), is refused as ours."""
    session = WorkSession(concurrency=2, minor=7, outside=1)
    session.outside_slot_freed(NOW)
    with pytest.raises(LocalProtocolError):
        session.outside_slot_freed(NOW)
    ended = WorkSession(concurrency=2, minor=7, outside=1)
    ended.end()
    with pytest.raises(LocalProtocolError):
        ended.outside_slot_freed(NOW)


# The edges a mutation run of this module found untested (docs/testing.md,
# "Tests that can go red"): each case below went red with its comparison
# moved by one, or its `and` read as `or`.


def test_a_grant_cap_of_one_and_a_concurrency_of_zero_are_accepted() -> None:
    """The bounds are inclusive: a session may grant one slot at a time,
    and a worker may start with no slot of its own (every one outside)."""
    assert WorkSession(concurrency=4, minor=BATCH_MINOR, grant_cap=1).grant_cap == 1
    assert WorkSession(concurrency=0, minor=7).concurrency == 0


def test_refusals_of_the_first_credit_break_the_session_at_the_twentieth() -> None:
    """Twenty refusals in a row break the session, counted from the first
    credit too (not from one short of it)."""
    session, frame = active(2, credit=False)
    for refusal in range(1, MAX_CREDIT_REFUSALS):
        (frame,) = session.result(frame.request_id, CAPACITY, 0.0)
        assert isinstance(frame, Credit), refusal
    with pytest.raises(SessionBroken, match=f"refused {MAX_CREDIT_REFUSALS} credit"):
        session.result(frame.request_id, CAPACITY, 0.0)


def test_the_last_request_id_is_usable_and_the_next_breaks_the_session() -> None:
    """Request ids run up to 2**64 - 1, the wire's bound, inclusive; the
    next command breaks the session (a new stream starts ids over)."""
    session, _ = active(1)
    session.task_pushed(A, "tok", LEASE, 0.0)
    session._next_id = MAX_REQUEST_ID  # 2**64 commands, skipped
    assert session.report_progress(A, 1, 2, "", 0.0).request_id == MAX_REQUEST_ID
    with pytest.raises(SessionBroken, match="request id space exhausted"):
        session.report_progress(A, 2, 2, "", 0.0)


def test_a_daemon_without_an_echo_leaves_the_concurrency_as_asked() -> None:
    """A registration whose ``max_concurrency`` is 0 (a daemon that echoes
    nothing) says nothing of the stream's capacity: the session keeps its
    concurrency and asks for all of it. With a target (``dynamic_target``)
    an echo does not lower it either: the target is the session's."""
    session = WorkSession(concurrency=3, minor=7)
    session.register()
    (credit,) = session.registered(
        lease_duration=LEASE, max_concurrency=0, ordered_request_ids=True, now=0.0
    )
    assert isinstance(credit, Credit)
    assert (session.concurrency, credit.available) == (3, 3)
    target = WorkSession(concurrency=3, minor=TARGET_MINOR, dynamic_target=True)
    target.register()
    target.registered(
        lease_duration=LEASE,
        max_concurrency=1,
        ordered_request_ids=target.ordered_request_ids,
        now=0.0,
    )
    assert target.concurrency == 3


def test_a_push_of_a_lease_still_settling_is_a_remote_error() -> None:
    """A task's attempt is pushed once: pushed again while its settlement
    is in flight (its slot already free), the session refuses it rather
    than run the attempt twice."""
    session, _ = active(2)
    session.task_pushed(A, "tok", LEASE, 0.0)
    settle = frames(session.settle(A, Outcome.ACK, 1.0))[0]
    assert isinstance(settle, Settle)
    with pytest.raises(RemoteProtocolError, match="pushed twice"):
        session.task_pushed(A, "tok", LEASE, 1.0)


def test_a_settlement_refused_because_the_task_was_cancelled_says_so() -> None:
    """An ack the daemon refuses because an operator cancelled the task
    tells the worker (`TaskCancelled`), once; a plain lost lease does not."""
    session, _ = active(2)
    session.task_pushed(A, "tok", LEASE, 0.0)
    session.task_pushed(B, "tok", LEASE, 0.0)
    ack_a = frames(session.settle(A, Outcome.ACK, 1.0))[0]
    ack_b = frames(session.settle(B, Outcome.ACK, 1.0))[0]
    assert session.result(ack_a.request_id, CANCELLED, 1.0) == [
        CommandDone(ack_a.request_id, CommandKind.SETTLE, CANCELLED),
        TaskCancelled(A),
    ]
    assert session.result(ack_b.request_id, LEASE_LOST, 1.0) == [
        CommandDone(ack_b.request_id, CommandKind.SETTLE, LEASE_LOST)
    ]


def test_an_outcome_at_the_very_deadline_is_not_sent() -> None:
    """The lease ends at its deadline: a handler finishing at that instant,
    before `poll` saw it, does not ack (the daemon may have expired it and
    leased the task again); the lease is handed back as a give-up."""
    session, _ = active(1, lease=9.0)
    session.task_pushed(A, "tok", 9.0, 0.0)
    out = session.settle(A, Outcome.ACK, 9.0)
    (nack,) = [o for o in out if isinstance(o, Settle)]
    assert nack.outcome is Outcome.NACK
    assert not [o for o in out if isinstance(o, CancelHandler)]
    assert session.in_flight == 0  # the finished handler's slot is free


@pytest.mark.parametrize("refused", ["progress", "renewal"])
def test_a_lost_lease_is_still_known_while_its_handler_runs(refused: str) -> None:
    """A lease lost while its handler still runs (a progress report or a
    renewal refused) stays known as LOST, its slot held, until the handler
    exits; then the session forgets it."""
    session, _ = active(1)
    session.task_pushed(A, "tok", LEASE, 0.0)
    if refused == "progress":
        command = session.report_progress(A, 1, 2, "", 1.0)
        why = "lease lost (progress report refused)"
    else:
        (command,) = session.poll(6.0)
        assert isinstance(command, Extend)
        why = "lease lost (renewal refused)"
    (cancel,) = of_type(session.result(command.request_id, LEASE_LOST, 6.0), CancelHandler)
    assert cancel == CancelHandler(A, why)
    assert session.lease_state(A) is LeaseState.LOST
    assert not session.holds(A)
    assert session.in_flight == 1
    session.handler_exited(A, 7.0)
    assert session.lease_state(A) is None


@pytest.mark.parametrize("lease_duration", [0.0, -1.0])
def test_a_registration_without_a_positive_lease_is_refused(lease_duration: float) -> None:
    """A lease of no length could never be renewed in time: the session
    refuses the registration and never enters ACTIVE."""
    session = WorkSession(concurrency=2, minor=7)
    session.register()
    with pytest.raises(RemoteProtocolError, match="non-positive lease duration"):
        session.registered(
            lease_duration=lease_duration,
            max_concurrency=2,
            ordered_request_ids=True,
            now=0.0,
        )
    assert session.state is State.ERROR


@pytest.mark.parametrize("concurrency", [2, 3, 8])
def test_freed_slots_are_granted_once_half_the_capacity_is_free(concurrency: int) -> None:
    """Property (minor 10): below the cap, with credit still out, freed
    slots are asked for once ``capacity // GRANT_FRACTION`` of them (at
    least one) are free, not before — each grant is worth its round trip —
    and not later, or slots idle."""
    session = WorkSession(concurrency=concurrency, minor=BATCH_MINOR)
    session.register()
    (first,) = session.registered(
        lease_duration=60.0, max_concurrency=concurrency, ordered_request_ids=True, now=0.0
    )
    assert session.result(first.request_id, None, 0.0) == []
    batch = max(1, concurrency // GRANT_FRACTION)
    keys = [LeaseKey(f"t{n}", 1) for n in range(concurrency - 1)]
    for key in keys:  # one credit left unpushed: the session is not idle
        session.task_pushed(key, "tok", 60.0, 0.0)
    for settled, key in enumerate(keys[: batch - 1], start=1):
        assert of_type(session.settle(key, Outcome.ACK, 1.0), Credit) == [], settled
    (grant,) = of_type(session.settle(keys[batch - 1], Outcome.ACK, 1.0), Credit)
    assert grant.grant == batch
