"""The client side of one Work stream, as a state machine with no I/O.

Theory of operation
-------------------
`WorkSession` is to the worker what h11's ``Connection`` is to an HTTP
client: the trio driver (`ringo_trio._worker`) feeds it what arrived from the
daemon and what the application did, and it answers with *outputs* — frames to
write (`Register`, `Credit`, `Settle`, `Extend`, `Progress`, `Drain`) and
events to act on (`StartHandler`, `CancelHandler`, `CommandDone`). It never
reads a clock: every call that depends on time takes ``now`` (a monotonic
reading in seconds). It imports nothing from trio, anyio, asyncio, grpclib or
the generated wire code, so hypothesis can drive it through millions of
interleavings without a socket (``tests/contract/test_client_session.py``).

What it owns:

*Request ids and correlation.* Every command gets the next id (1, 2, …; ids
never repeat on a stream, so they are also increasing when the daemon checks
``ordered_request_ids``). A result must answer a pending id; a result for an
unknown or already-answered id is a `RemoteProtocolError`, so a result can
never be correlated to the wrong command. A command left unanswered for
``command_timeout`` breaks the session (`poll` raises `SessionBroken`).

*The credit ledger.* Credit is absolute ("you may push me N more from now
on") or, from minor 10, additive (a *grant*: "push me N more"). The session
mirrors the daemon's remaining credit exactly: the daemon writes the result
of a credit command before any push that consumes it, so the mirror becomes
N (a grant: grows by N) when the result arrives and drops by one per push. A
push the mirror does not cover is a protocol error.

From minor 10 the session grants freed slots as they free up, so the daemon
claims and pushes while handlers run instead of waiting for the worker to
run dry (the two processes then overlap instead of taking turns): a grant of
every free slot goes out once ``free = capacity - slots - mirror -
granted`` reaches ``capacity // GRANT_FRACTION``, at most the session's
``grant_cap`` (``GRANT_CAP``; a prefetching worker's ``PREFETCH_GRANT_CAP``)
(at least one; any free slot when nothing is out, so no slot idles
unasked-for; *capacity* is below). Counting the mirror
and every grant in flight as taken is what makes a grant impossible to
refuse: whatever the daemon holds as credit plus outstanding is at most what
the session counts, so ``credit + grant + outstanding <= concurrency`` (a
lease lost locally while its renewal was in flight is still counted after its
handler exits, until the renewal is answered: the daemon counts it until then
— at every minor, absolute credit included).
Several grants may be in flight; their results arrive in order. A resize
still goes absolute (it carries the new target), and no grant is sent while
it is in flight, so grants are always computed against the capacity the
daemon holds.

Below minor 10 the session asks for more only when the mirror is zero:
then no push can be in transit, so ``free slots`` is exactly what the worker
can take and the daemon's capacity check (``available + unsettled <=
concurrency``) cannot refuse it. A resize, which cannot wait for the mirror
to drain, may race up to ``mirror`` pushes (and every grant in flight), so
it counts the credit still out as taken slots (the daemon's check alone
would not do: it no longer counts a lost lease whose handler still holds a
slot). Should the daemon refuse with ``credit_capacity`` anyway, the session
resamples at once — any racing push arrived before the refusal, the stream
is ordered. One absolute credit command is in flight at a time; a later one
supersedes it anyway. The drain's result voids the mirror (the daemon pushes nothing after
answering it). ``committed`` — slots, outside slots, the mirror and the credit
of every credit command in flight — bounds every slot the worker can ever
hold without sending new credit; a shared concurrency controller keeps at
least that many permits for the worker.

*Slots.* A slot is taken by every push and given back when the driver settles
the task (`settle`) or, after a lost lease, when the cancelled handler has
really exited (`handler_exited`): a handler that ignores cancellation keeps
its slot, so it can never be replaced by new work.

*Outside slots.* Such a handler outlives its stream too: when a stream ends,
its handlers still running keep their slots of the worker's concurrency, and
the next session is built knowing how many (``outside``). They are taken
like its own slots in everything it sends, so the invariant is one sum:
``slots + outside + mirror + grants and credit in flight <= concurrency``
(``committed``; before a cut, the concurrency the credit was sent under).
The stream's *capacity* — what credit may fill — is ``concurrency -
outside``, and without a target no more than the daemon holds as the
stream's capacity: the registration's echo, then the last target accepted.
Registration asks for ``max(1, concurrency - outside)``, the wire's minimum
even while every slot is outside; the echo may lower the concurrency
(``min(concurrency, echo + outside)``), never raise it, so the 1 asked for a
worker with no free slot grants nothing. `outside_slot_freed` (the handler
finally exited) makes its slot this stream's: granted at once, and from
minor 2 a stream whose capacity outgrew the daemon's asks for it with a
target (below, the slot waits for the next stream). The input is refused in
``ENDED``: the next session counts what is still outside.

*The lease table.* Each held lease has a local deadline: receipt time plus
the remaining lease (never more than the registered lease duration). A
renewal (`Extend`) goes out a third of the lease duration before the
deadline; a successful result moves the deadline to *send time* plus the
extension — never receipt time, which would grant time the daemon did not.
If the deadline passes with the renewal unanswered, or the daemon answers
``LEASE_LOST``, the handler is cancelled (`CancelHandler`). A ``LEASE_LOST``
with ``metadata.reason = "cancelled"`` means an operator cancelled the task
(CancelTask, minor >= 9): the session says so once per lease
(`TaskCancelled`, before the `CancelHandler` when the handler still runs,
alone when its settlement was the command refused). Every lease the
daemon pushed ends in exactly one of: a settlement, a command answered
``LEASE_LOST``, or — when a renewal succeeds after the lease was given up
locally — a nack, so the daemon never counts a lease nobody works on.

*Leases.* Each held lease is in one `LeaseState` — ``HELD`` (its handler
runs on a live lease), ``LOST`` (given up locally: expired, refused, or the
stream ended; its handler is being cancelled and keeps its slot until it
exits) or ``SETTLING`` (its outcome is on the wire) — moved only through
`_LEASE_TRANSITIONS`. A renewal in flight is correlation data (its request
id), not a state: it can be out in ``HELD`` and in ``LOST``.

*Giving back.* A worker that stops (close past the grace period,
cancellation, a fence) settles its unfinished leases with
``Outcome.RELEASE``: at minor >= 7 a ``release`` command, which returns the
task at once without spending its attempt; below, today's nack. A handler
that *fails* spends its attempt (``NACK``); only the worker's own stopping
does not. A lease given up at its local deadline goes back with a nack, as
its expiry would spend the attempt (a handler that blocks the loop past its
lease must not run forever) — unless our stop had already ended its handler
and a freeze hid that exit until after the deadline (``_Lease.give_back``).

*Version gating.* The session is built for the negotiated minor and owns
what it implies: ordered request ids (minor >= 6), a target concurrency
(minor >= 2; `FeatureMissing` otherwise), ``release`` (minor >= 7), an
ack's result value (minor >= 9; dropped below, `can_store_result`) and batch
frames (minor >= 10).

*Batches.* A batch frame (`batch`) is exactly its pushes and results in
order: the session takes them as `task_pushed` and `result` would one by
one, appending their outputs as it goes, so an element that breaks the
protocol leaves in ``out`` what the elements before it asked for. A batch
below minor 10, or an empty one, is a `RemoteProtocolError`. How the driver
groups the frames it sends is not the session's business.

*States.* ``IDLE → REGISTERING → ACTIVE → DRAINING → ENDED`` with one
transition table (`_TRANSITIONS`); an input the table does not list for the
current state raises `LocalProtocolError` (our bug: a send, or an outside
slot freed) or `RemoteProtocolError` (the daemon's), never silently passes.
Any error — those two and `SessionBroken` — moves the session to ``ERROR``
for good (h11's discipline): from then on every input is refused with
`LocalProtocolError` and only `end` is accepted, so a broken stream can never
emit another frame.
"""

from __future__ import annotations

import copy
import enum
import functools
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar, cast

from .. import reasons
from ..versions import Feature, FeatureMissing, Features
from .client_events import (
    Answered,
    CancelHandler,
    CommandDone,
    CommandError,
    CommandKind,
    Credit,
    Drain,
    Extend,
    Frame,
    LeaseKey,
    Outcome,
    Output,
    Progress,
    Pushed,
    Register,
    Settle,
    StartHandler,
    TaskCancelled,
)

__all__ = [
    "GRANT_CAP",
    "PREFETCH_GRANT_CAP",
    "Answered",
    "CancelHandler",
    "CommandDone",
    "CommandError",
    "CommandKind",
    "Credit",
    "Drain",
    "Extend",
    "FeatureMissing",
    "Frame",
    "Input",
    "LeaseKey",
    "LeaseState",
    "LocalProtocolError",
    "Outcome",
    "Output",
    "Progress",
    "Pushed",
    "Register",
    "RemoteProtocolError",
    "SessionBroken",
    "Settle",
    "StartHandler",
    "State",
    "TaskCancelled",
    "VersionMismatch",
    "WorkSession",
]

MAX_REQUEST_ID = 2**64 - 1
#: `CancelHandler.reason` when the daemon says an operator cancelled the task.
CANCELLED_BY_OPERATOR = "the task was cancelled by an operator"
# Consecutive credit_capacity refusals after which the daemon is considered
# to disagree with us for good (each retry is resampled, so a correct daemon
# refuses at most as often as pushes race a resize).
MAX_CREDIT_REFUSALS = 20
# Minor >= 10: a grant goes out once 1/GRANT_FRACTION of the concurrency, at
# most GRANT_CAP slots (at least one), is free and not yet granted. Measured
# with bench/run.py: at no-op c=64, halves (32) beat eighths and quarters,
# whose many small claims cost the daemon more CPU per task than the overlap
# saves; at 10 ms c=256, grants of 32 beat halves (128) by 9-17 % (a freed
# slot waited for 127 others before it was asked for).
GRANT_FRACTION = 2
GRANT_CAP = 32
# The cap of a worker that prefetches (its credit limit above its
# concurrency): its waiting tasks keep the slots busy while a grant makes its
# round trip, so a grant may wait for more free slots and the daemon claims
# in fewer, larger batches (one storage statement each). Measured
# (bench/results.md, "Levers"): PostgreSQL no-op c=64 prefetch 64, 32 → 64:
# +4-12 % tasks/s, database CPU per task -14 %, daemon -11 %; SQLite no-op
# daemon CPU -17 %; 10 ms c=256 prefetch 256 unchanged. Without a prefetch
# the 10 ms run lost 10 % at 64, hence two caps.
PREFETCH_GRANT_CAP = 64


class LocalProtocolError(Exception):
    """The driver asked for something the protocol does not allow now (a bug)."""


class RemoteProtocolError(Exception):
    """The daemon broke the protocol; the stream cannot be trusted any more."""


class VersionMismatch(RemoteProtocolError):
    """The daemon registered the stream other than the negotiated minor asked."""


class SessionBroken(Exception):
    """The session cannot go on (a command unanswered in time, a settlement
    with an unknown outcome); the driver ends the stream and reconnects."""


class State(enum.Enum):
    __hash__ = object.__hash__  # see `_TRANSITIONS`

    IDLE = "idle"
    REGISTERING = "registering"
    ACTIVE = "active"
    DRAINING = "draining"
    ENDED = "ended"
    ERROR = "error"


class Input(enum.Enum):
    __hash__ = object.__hash__  # see `_TRANSITIONS`

    SEND_REGISTER = "send register"
    RECV_REGISTERED = "receive registered"
    SEND_CREDIT = "send credit"
    SEND_SETTLE = "send settle"
    SEND_EXTEND = "send extend"
    SEND_PROGRESS = "send progress"
    SEND_DRAIN = "send drain"
    RECV_TASK = "receive task"
    RECV_RESULT = "receive result"
    RECV_HEARTBEAT = "receive heartbeat"
    RECV_BATCH = "receive batch"
    FREE_OUTSIDE = "free an outside slot"
    END = "end"


_S, _I = State, Input
_LIVE = (
    _I.SEND_SETTLE,
    _I.SEND_EXTEND,
    _I.SEND_PROGRESS,
    _I.RECV_TASK,
    _I.RECV_RESULT,
    _I.RECV_BATCH,
)
# Looked up on every input: the enums of both tables hash by identity (their
# members are singletons, equal only to themselves), in C, instead of
# through Enum.__hash__, a Python call per member per lookup.
_TRANSITIONS: dict[tuple[State, Input], State] = {
    (_S.IDLE, _I.SEND_REGISTER): _S.REGISTERING,
    (_S.REGISTERING, _I.RECV_REGISTERED): _S.ACTIVE,
    (_S.REGISTERING, _I.RECV_HEARTBEAT): _S.REGISTERING,
    (_S.ACTIVE, _I.SEND_CREDIT): _S.ACTIVE,
    (_S.ACTIVE, _I.SEND_DRAIN): _S.DRAINING,
    (_S.ACTIVE, _I.RECV_HEARTBEAT): _S.ACTIVE,
    **{(_S.ACTIVE, i): _S.ACTIVE for i in _LIVE},
    # Pushes granted before the daemon saw the drain may still arrive; the
    # credit mirror keeps checking them.
    **{(_S.DRAINING, i): _S.DRAINING for i in _LIVE},
    (_S.DRAINING, _I.RECV_HEARTBEAT): _S.DRAINING,
    # A handler of an earlier stream exits whenever it does; once the session
    # has ended the next one counts what is left, so telling it is our bug.
    **{(s, _I.FREE_OUTSIDE): s for s in (_S.IDLE, _S.REGISTERING, _S.ACTIVE, _S.DRAINING)},
    **{(s, _I.END): _S.ENDED for s in State},
}
# Inputs that come from our side: refusing one is our bug, not the daemon's.
_LOCAL = frozenset(i for i in Input if i.name.startswith("SEND_")) | {_I.FREE_OUTSIDE}


class LeaseState(enum.Enum):
    __hash__ = object.__hash__  # see `_TRANSITIONS`

    HELD = "held"
    LOST = "lost"
    SETTLING = "settling"


class _LeaseInput(enum.Enum):
    __hash__ = object.__hash__  # see `_TRANSITIONS`

    SETTLE = "settle"
    GIVE_UP = "give up"


_L = LeaseState
_LEASE_TRANSITIONS: dict[tuple[LeaseState, _LeaseInput], LeaseState] = {
    (_L.HELD, _LeaseInput.SETTLE): _L.SETTLING,
    (_L.HELD, _LeaseInput.GIVE_UP): _L.LOST,
    # A lease given up locally that a late renewal kept alive is handed back.
    (_L.LOST, _LeaseInput.SETTLE): _L.SETTLING,
    (_L.LOST, _LeaseInput.GIVE_UP): _L.LOST,
    # Its settlement in flight ends it, whatever else happens meanwhile.
    (_L.SETTLING, _LeaseInput.GIVE_UP): _L.SETTLING,
}


@dataclass(slots=True)
class _Pending:
    kind: CommandKind
    sent_at: float
    key: LeaseKey | None = None
    credit: int = 0
    target: int | None = None
    grant: bool = False  # credit is added to what is left, not replacing it
    extension: float = 0.0


@dataclass(slots=True)
class _Lease:
    token: str
    deadline: float
    timer_at: float = 0.0  # the one timer entry of this lease that is current
    renewing: int = 0  # request id of the renewal in flight, 0 if none
    state: LeaseState = LeaseState.HELD
    told_cancelled: bool = False  # TaskCancelled was output for it
    # What handing it back after a give-up says: NACK, as its expiry would
    # spend the attempt; RELEASE once its handler exited by our own stop (at
    # once, or when the renewal in flight is answered).
    give_back: Outcome = Outcome.NACK

    def step(self, what: _LeaseInput, key: LeaseKey) -> None:
        new = _LEASE_TRANSITIONS.get((self.state, what))
        if new is None:
            raise LocalProtocolError(
                f"task {key.task_id} attempt {key.attempt}: cannot {what.value}"
                f" a lease that is {self.state.value}"
            )
        self.state = new


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _input(
    method: Callable[Concatenate[WorkSession, _P], _R],
) -> Callable[Concatenate[WorkSession, _P], _R]:
    """An input of the session: refused in ERROR, and any error it raises
    leaves the session in ERROR for good."""

    @functools.wraps(method)
    def guarded(self: WorkSession, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if self.state is State.ERROR:
            raise LocalProtocolError(
                f"{method.__name__}: the session failed earlier ({self.error!r}); only end() is"
                " accepted"
            )
        try:
            return method(self, *args, **kwargs)
        except (LocalProtocolError, RemoteProtocolError, SessionBroken) as exc:
            self.state = State.ERROR
            self.error = exc
            raise

    return guarded


class WorkSession:
    """One Work stream's protocol state (client side). See the module docstring."""

    def __init__(
        self,
        *,
        concurrency: int,
        minor: int,
        dynamic_target: bool = False,
        command_timeout: float = 30.0,
        outside: int = 0,
        grant_cap: int = GRANT_CAP,
    ) -> None:
        if concurrency < 0:
            raise LocalProtocolError("concurrency must not be negative")
        if grant_cap < 1:
            raise LocalProtocolError("grant_cap must be at least 1")
        if outside < 0:
            raise LocalProtocolError("outside slots must not be negative")
        features = Features(minor)
        if dynamic_target:
            features.require(
                Feature.TARGET_CONCURRENCY,
                "dynamic concurrency (set_concurrency, or a shared concurrency controller)",
            )
        self.state = State.IDLE
        self.error: BaseException | None = None  # what moved the session to ERROR
        self.minor = minor
        self.features = features
        self.concurrency = concurrency
        self.ordered_request_ids = features.has(Feature.ORDERED_REQUEST_IDS)
        self.can_release = features.has(Feature.RELEASE)
        self.can_store_result = features.has(Feature.RESULT_VALUES)
        self.can_grant = features.has(Feature.CREDIT_GRANT)
        self.grant_fraction = GRANT_FRACTION
        self.grant_cap = grant_cap
        self.dynamic_target = dynamic_target
        self.command_timeout = command_timeout
        self.lease_duration = 0.0
        self._next_id = 1
        self._pending: dict[int, _Pending] = {}
        self._credit_pending = 0  # request id of the absolute credit command in flight
        self._granted = 0  # sum of the grants in flight (minor >= 10)
        self._credit_mirror = 0  # pushes the daemon may still make
        self._target_sent: int | None = None  # last target the daemon accepted
        # Slots of this worker held by handlers of earlier streams (they
        # ignore their cancellation); taken for every credit this one sends.
        self._outside = outside
        # The stream's capacity on the daemon until a target replaces it: the
        # registration's echo (None before it arrives).
        self._registered_capacity: int | None = None
        self._refusals = 0
        self._leases: dict[LeaseKey, _Lease] = {}
        self._slots: set[LeaseKey] = set()
        # Leases whose handler exited after they were lost locally while their
        # renewal was in flight: the daemon still counts them as outstanding.
        self._renewals_out: set[LeaseKey] = set()
        # (when, tiebreak, key): renewal or expiry checks; stale entries are
        # skipped when popped (cheaper than removing them).
        self._timers: list[tuple[float, int, LeaseKey]] = []
        self._tiebreak = itertools.count()

    def __deepcopy__(self, memo: dict[int, object]) -> WorkSession:
        """A copy of the whole state (the tests feed one a batch, the original
        its elements). Spelled out for a mypyc-compiled build, where making an
        instance runs ``__init__`` and there is no ``__dict__``:
        ``__getstate__`` is every attribute in both builds."""
        new = WorkSession(concurrency=0, minor=self.minor)
        memo[id(self)] = new
        for name, value in cast("dict[str, object]", self.__getstate__()).items():
            setattr(new, name, copy.deepcopy(value, memo))
        return new

    # -- observation ------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Slots taken: pushed tasks whose handler has not finished."""
        return len(self._slots)

    @property
    def credit_mirror(self) -> int:
        return self._credit_mirror

    @property
    def outside(self) -> int:
        """Slots held by handlers of earlier streams that have not exited."""
        return self._outside

    @property
    def capacity(self) -> int:
        """Slots this stream may fill: the concurrency less the outside
        slots, and — when no target goes with its credit — no more than the
        daemon holds as the stream's capacity."""
        return self._limit()[0]

    @property
    def committed(self) -> int:
        """Slots the worker is bound to: tasks pushed and not finished, the
        outside slots, plus every push the daemon may still make — the
        mirror, every grant in flight and, while an absolute credit command
        is in flight, all of its credit (pushes against the old credit may
        arrive before the daemon applies it, and the new credit after). Never
        more than the concurrency (before a cut: the one the credit was sent
        under). A shared concurrency controller never takes these permits back."""
        pending = self._pending.get(self._credit_pending) if self._credit_pending else None
        return (
            len(self._slots)
            + self._outside
            + self._credit_mirror
            + self._granted
            + (pending.credit if pending else 0)
        )

    @property
    def pending_commands(self) -> int:
        return len(self._pending)

    def holds(self, key: LeaseKey) -> bool:
        """True while the lease is live locally (pushed, not settled or lost)."""
        lease = self._leases.get(key)
        return lease is not None and lease.state is LeaseState.HELD

    def lease_state(self, key: LeaseKey) -> LeaseState | None:
        lease = self._leases.get(key)
        return None if lease is None else lease.state

    def next_deadline(self) -> float | None:
        """When `poll` next has something to do (None: nothing scheduled)."""
        while self._timers:
            when, _, key = self._timers[0]
            if self._timer_current(when, key) is None:
                heapq.heappop(self._timers)
                continue
            break
        candidates = [self._timers[0][0]] if self._timers else []
        if self._pending:
            oldest = next(iter(self._pending.values()))
            candidates.append(oldest.sent_at + self.command_timeout)
        return min(candidates) if candidates else None

    # -- the transition table ---------------------------------------------

    def _step(self, what: Input) -> None:
        new = _TRANSITIONS.get((self.state, what))
        if new is None:
            remote = what not in _LOCAL and self.state is not State.ERROR
            error = RemoteProtocolError if remote else LocalProtocolError
            exc = error(f"{what.value} is not allowed in state {self.state.value}")
            if self.state is not State.ERROR:
                self.state, self.error = State.ERROR, exc
            raise exc
        self.state = new

    def _take_id(self) -> int:
        request_id = self._next_id
        if request_id > MAX_REQUEST_ID:
            raise SessionBroken("request id space exhausted; the stream must be reopened")
        self._next_id = request_id + 1
        return request_id

    # -- driver → session -------------------------------------------------

    @_input
    def register(self) -> Register:
        self._step(Input.SEND_REGISTER)
        return Register(self.ordered_request_ids, max(1, self._own()))

    @_input
    def registered(
        self,
        *,
        lease_duration: float,
        max_concurrency: int,
        ordered_request_ids: bool,
        now: float,
    ) -> list[Output]:
        # Validated before the transition: a bad registration never enters ACTIVE.
        if (self.state, Input.RECV_REGISTERED) in _TRANSITIONS:
            if ordered_request_ids != self.ordered_request_ids:
                raise VersionMismatch(
                    "the daemon did not confirm the requested request-id mode"
                    f" (asked {self.ordered_request_ids}, got {ordered_request_ids})"
                )
            if lease_duration <= 0:
                raise RemoteProtocolError("the daemon registered a non-positive lease duration")
        self._step(Input.RECV_REGISTERED)
        self.lease_duration = lease_duration
        if not self.dynamic_target and max_concurrency:
            # The daemon's word on the stream can lower the concurrency, never
            # raise it: an echo above what was asked (at least the 1 the wire
            # demands while every slot is outside) is no free slot.
            self._registered_capacity = max_concurrency
            self.concurrency = min(self.concurrency, max_concurrency + self._outside)
        return self._maybe_credit(now)

    @_input
    def task_pushed(
        self, key: LeaseKey, lease_token: str, lease_remaining: float, now: float
    ) -> list[Output]:
        """A ``task`` frame arrived; ``lease_remaining`` is how long the lease
        runs from ``now``: its ttl, or the lease duration from a daemon below
        minor 11 — never worked out from ``until`` and a wall clock."""
        return self._task_pushed(key, lease_token, lease_remaining, now)

    # `batch` takes its elements through these two directly: it is an input
    # itself, so the guard of each element's own input would be redundant.

    def _task_pushed(
        self, key: LeaseKey, lease_token: str, lease_remaining: float, now: float
    ) -> list[Output]:
        self._step(Input.RECV_TASK)
        if self._credit_mirror <= 0:
            raise RemoteProtocolError(f"task {key.task_id} was pushed without credit")
        if key in self._leases or key in self._slots:
            raise RemoteProtocolError(f"task {key.task_id} attempt {key.attempt} was pushed twice")
        self._credit_mirror -= 1
        deadline = now + min(max(lease_remaining, 0.0), self.lease_duration)
        self._leases[key] = lease = _Lease(lease_token, deadline)
        self._slots.add(key)
        # `_arm`, inline: once per push.
        lease.timer_at = when = deadline - self.lease_duration / 3
        heapq.heappush(self._timers, (when, next(self._tiebreak), key))
        if self._credit_mirror:
            return [StartHandler(key)]
        # The last covered push: slots freed while the previous grant was out
        # are asked for now, or they would idle until some handler settles.
        return [StartHandler(key), *self._maybe_credit(now)]

    @_input
    def batch(self, items: list[Pushed | Answered], now: float, out: list[Output]) -> None:
        """A batch frame (minor >= 10): exactly its elements, in order, as
        `task_pushed` and `result` would take them one by one. The outputs
        are appended to `out` as each element is taken, so that when an
        element breaks the session, `out` holds what the ones before it
        asked for, as it would have been carried out one by one."""
        self._step(Input.RECV_BATCH)
        if not self.features.has(Feature.BATCH_FRAMES):
            raise RemoteProtocolError(f"a batch frame on a stream of minor {self.minor}")
        if not items:
            raise RemoteProtocolError("an empty batch frame")
        task_pushed, result = self._task_pushed, self._result
        for item in items:
            if type(item) is Pushed:
                out += task_pushed(item.key, item.lease_token, item.lease_remaining, now)
            else:
                assert type(item) is Answered
                out += result(item.request_id, item.error, now)

    @_input
    def heartbeat(self) -> None:
        self._step(Input.RECV_HEARTBEAT)

    @_input
    def result(self, request_id: int, error: CommandError | None, now: float) -> list[Output]:
        return self._result(request_id, error, now)

    def _result(self, request_id: int, error: CommandError | None, now: float) -> list[Output]:
        self._step(Input.RECV_RESULT)
        pending = self._pending.pop(request_id, None)
        if pending is None:
            raise RemoteProtocolError(f"result for request {request_id}, which is not awaiting one")
        kind = pending.kind
        if kind is CommandKind.CREDIT:
            return self._credit_result(pending, error, now)
        if kind is CommandKind.EXTEND:
            return self._extend_result(request_id, pending, error, now)
        out: list[Output] = [CommandDone(request_id, kind, error)]
        if kind is CommandKind.DRAIN and error is None:
            # The daemon answered the drain before any later push: it will
            # not push again, so the remaining credit is void.
            self._credit_mirror = 0
        key = pending.key
        if kind is CommandKind.SETTLE and key is not None:
            lease = self._leases.pop(key, None)
            if error is not None and error.code != "LEASE_LOST":
                # The settlement may or may not have committed; the only safe
                # continuation is a new stream (leases left to expire).
                raise SessionBroken(f"settling task {key.task_id} failed: {error.message}")
            if error is not None:
                out += self._told_cancelled(key, lease, error)
        elif (
            kind is CommandKind.PROGRESS
            and key is not None
            and error is not None
            and error.code == "LEASE_LOST"
        ):
            told = self._told_cancelled(key, self._leases.get(key), error)
            why = CANCELLED_BY_OPERATOR if told else "lease lost (progress report refused)"
            out += told + self._lose(key, why)
        return out

    @_input
    def settle(
        self,
        key: LeaseKey,
        outcome: Outcome,
        now: float,
        *,
        error: str = "",
        retry_delay: float | None = None,
        result: bytes | None = None,
    ) -> list[Output]:
        """The handler finished (or the worker stops it: ``Outcome.RELEASE``):
        send its outcome and free its slot. ``result`` goes with an ACK on a
        stream of minor >= 9 (`can_store_result`) and is dropped otherwise."""
        lease = self._leases.get(key)
        if lease is None or lease.state is not LeaseState.HELD:
            raise LocalProtocolError(f"task {key.task_id} attempt {key.attempt} is not held")
        if now >= lease.deadline:
            # The deadline passed and no `poll` has seen it yet (a freeze that
            # ended in this very step): the outcome is not sent — an ack would
            # outlive the lease — the lease is given up as `poll` gives it up,
            # and the handler, finished, frees its slot.
            if outcome is Outcome.RELEASE:
                lease.give_back = Outcome.RELEASE
            out = [o for o in self._expire(key, lease, now) if not isinstance(o, CancelHandler)]
            return out + self._free_exited(key, now)
        settle = self._send_settle(key, lease, outcome, now, error, retry_delay, result)
        self._slots.discard(key)
        credit = self._maybe_credit(now)
        return [settle, *credit] if credit else [settle]

    def _send_settle(
        self,
        key: LeaseKey,
        lease: _Lease,
        outcome: Outcome,
        now: float,
        error: str,
        retry_delay: float | None = None,
        result: bytes | None = None,
    ) -> Settle:
        self._step(Input.SEND_SETTLE)
        lease.step(_LeaseInput.SETTLE, key)
        if outcome is Outcome.RELEASE and not self.can_release:
            # An older daemon has no release: today's nack (the attempt is spent).
            outcome = Outcome.NACK
        if outcome is not Outcome.ACK or not self.can_store_result:
            result = None
        request_id = self._take_id()
        self._pending[request_id] = _Pending(CommandKind.SETTLE, now, key)
        return Settle(request_id, key, lease.token, outcome, error, retry_delay, result)

    @_input
    def handler_exited(self, key: LeaseKey, now: float) -> list[Output]:
        """A handler whose lease was lost has really finished: free its slot."""
        if key not in self._slots:
            return []
        lease = self._leases.get(key)
        if lease is not None and lease.state is LeaseState.HELD:
            raise LocalProtocolError(
                f"task {key.task_id}: a handler with a live lease must settle, not exit"
            )
        return self._free_exited(key, now)

    def _free_exited(self, key: LeaseKey, now: float) -> list[Output]:
        lease = self._leases.get(key)
        self._slots.discard(key)
        if lease is not None and lease.renewing:
            # Lost here, but the daemon counts it until its renewal is answered.
            self._renewals_out.add(key)
        if lease is not None and not lease.renewing and lease.state is LeaseState.LOST:
            del self._leases[key]
        return self._maybe_credit(now)

    @_input
    def outside_slot_freed(self, now: float) -> list[Output]:
        """A handler of an earlier stream has really exited: its slot is this
        stream's to grant."""
        self._step(Input.FREE_OUTSIDE)
        if not self._outside:
            raise LocalProtocolError("no outside slot is held")
        self._outside -= 1
        return self._maybe_credit(now)

    @_input
    def report_progress(
        self, key: LeaseKey, current: float, total: float, message: str, now: float
    ) -> Progress:
        lease = self._leases.get(key)
        if lease is None or lease.state is not LeaseState.HELD:
            raise LocalProtocolError(f"task {key.task_id} attempt {key.attempt} is not held")
        self._step(Input.SEND_PROGRESS)
        request_id = self._take_id()
        self._pending[request_id] = _Pending(CommandKind.PROGRESS, now, key=key)
        return Progress(request_id, key, lease.token, current, total, message)

    @_input
    def set_concurrency(self, concurrency: int, now: float) -> list[Output]:
        if concurrency < 0:
            raise LocalProtocolError("concurrency must not be negative")
        self.features.require(Feature.TARGET_CONCURRENCY, "changing concurrency at runtime")
        self.concurrency = concurrency
        self.dynamic_target = True
        if self.state is not State.ACTIVE:
            return []
        return self._maybe_credit(now)

    @_input
    def drain(self, now: float) -> Drain:
        self._step(Input.SEND_DRAIN)
        request_id = self._take_id()
        self._pending[request_id] = _Pending(CommandKind.DRAIN, now)
        return Drain(request_id)

    @_input
    def poll(self, now: float) -> list[Output]:
        """Renewals that are due and leases whose deadline has passed.

        Raises `SessionBroken` when a command has waited longer than
        ``command_timeout`` for its result.
        """
        if self._pending:
            oldest_id, oldest = next(iter(self._pending.items()))
            if now >= oldest.sent_at + self.command_timeout:
                raise SessionBroken(
                    f"request {oldest_id} ({oldest.kind.value}) got no result"
                    f" within {self.command_timeout:g}s"
                )
        out: list[Output] = []
        while self._timers and self._timers[0][0] <= now:
            when, _, key = heapq.heappop(self._timers)
            lease = self._timer_current(when, key)
            if lease is None:
                continue
            if now >= lease.deadline:
                out += self._expire(key, lease, now)
            elif not lease.renewing and self.state in (State.ACTIVE, State.DRAINING):
                self._step(Input.SEND_EXTEND)
                request_id = self._take_id()
                lease.renewing = request_id
                self._pending[request_id] = _Pending(
                    CommandKind.EXTEND, now, key=key, extension=self.lease_duration
                )
                out.append(Extend(request_id, key, lease.token, self.lease_duration))
                self._arm(key, lease.deadline)
            else:
                self._arm(key, lease.deadline)
        return out

    def end(self) -> list[Output]:
        """The stream is gone: every pending command fails, every lease is lost."""
        self._step(Input.END)
        out: list[Output] = []
        gone = CommandError("UNAVAILABLE", "the Work stream ended")
        for request_id, pending in self._pending.items():
            if pending.kind in (CommandKind.SETTLE, CommandKind.PROGRESS, CommandKind.DRAIN):
                out.append(CommandDone(request_id, pending.kind, gone))
        self._pending.clear()
        self._credit_pending = self._granted = 0
        self._renewals_out.clear()
        for key, lease in self._leases.items():
            if lease.state is LeaseState.HELD and key in self._slots:
                out.append(CancelHandler(key, "the Work stream ended"))
            lease.step(_LeaseInput.GIVE_UP, key)
        self._credit_mirror = 0
        return out

    # -- internals ----------------------------------------------------------

    def _arm(self, key: LeaseKey, when: float) -> None:
        self._leases[key].timer_at = when
        heapq.heappush(self._timers, (when, next(self._tiebreak), key))

    def _timer_current(self, when: float, key: LeaseKey) -> _Lease | None:
        lease = self._leases.get(key)
        if lease is None or lease.state is not LeaseState.HELD or lease.timer_at != when:
            return None
        return lease

    def _expire(self, key: LeaseKey, lease: _Lease, now: float) -> list[Output]:
        """The local deadline passed: the lease is given up and, when no
        command is in flight that would tell the daemon it is gone from here,
        handed back explicitly (a stale ref is answered LEASE_LOST, a live one
        released)."""
        out = self._lose(key, "lease expired before it could be renewed")
        if not lease.renewing:
            out += self._release_renewed(
                key, lease, now, "the worker's local lease deadline passed"
            )
        return out

    def _lose(self, key: LeaseKey, reason: str) -> list[Output]:
        lease = self._leases.get(key)
        if lease is None:
            return []
        was = lease.state
        lease.step(_LeaseInput.GIVE_UP, key)
        if was is not LeaseState.HELD:
            # A settling lease has no handler left to cancel: the settlement
            # in flight ends it (its result, LEASE_LOST or not, removes it).
            return []
        # A held lease's handler holds its slot: the lease stays, LOST, until
        # the handler exits (`_free_exited` forgets it then).
        return [CancelHandler(key, reason)]

    def _extend_result(
        self, request_id: int, pending: _Pending, error: CommandError | None, now: float
    ) -> list[Output]:
        key = pending.key
        assert key is not None
        lease = self._leases.get(key)
        if lease is None or lease.renewing != request_id:
            raise RemoteProtocolError(f"renewal result {request_id} matches no renewal")
        lease.renewing = 0
        # Answered LEASE_LOST (the daemon dropped it) or renewed, and then the
        # nack handing it back goes out before the grant of its slot.
        freed = key in self._renewals_out
        self._renewals_out.discard(key)
        if error is None:
            if lease.state is LeaseState.LOST:
                # Renewed after we gave up on it: hand it back at once so the
                # daemon does not count (and keep) a lease nobody works on.
                out = self._release_renewed(key, lease, now)
                return out + self._maybe_credit(now) if freed else out
            # Send time, not receipt time: the daemon extended from when it
            # received the command, which is no earlier than this.
            lease.deadline = pending.sent_at + pending.extension
            self._arm(key, lease.deadline - self.lease_duration / 3)
            return []
        if error.code == "LEASE_LOST":
            told = self._told_cancelled(key, lease, error)
            why = CANCELLED_BY_OPERATOR if told else "lease lost (renewal refused)"
            out = told + self._lose(key, why)
            if key not in self._slots:
                self._leases.pop(key, None)
            return out + self._maybe_credit(now) if freed else out
        raise SessionBroken(f"renewing task {key.task_id} failed: {error.code} {error.message}")

    @staticmethod
    def _told_cancelled(
        key: LeaseKey, lease: _Lease | None, error: CommandError | None
    ) -> list[Output]:
        """`TaskCancelled` when `error` says an operator cancelled the task and
        this lease has not been told so yet."""
        if (
            lease is None
            or lease.told_cancelled
            or error is None
            or error.code != "LEASE_LOST"
            or error.reason != reasons.CANCELLED
        ):
            return []
        lease.told_cancelled = True
        return [TaskCancelled(key)]

    def _release_renewed(
        self,
        key: LeaseKey,
        lease: _Lease,
        now: float,
        why: str = "the worker gave the lease up before its renewal was confirmed",
    ) -> list[Output]:
        if self.state not in (State.ACTIVE, State.DRAINING):
            return []
        return [self._send_settle(key, lease, lease.give_back, now, why)]

    def _credit_result(
        self, pending: _Pending, error: CommandError | None, now: float
    ) -> list[Output]:
        if pending.grant:
            self._granted -= pending.credit
        else:
            self._credit_pending = 0
        if error is None:
            self._refusals = 0
            if pending.grant:
                # Additive: pushes consuming it follow this result on the
                # wire, as for an absolute update.
                self._credit_mirror += pending.credit
                return self._maybe_credit(now)
            # Absolute: replaces whatever was left. Pushes consuming it follow
            # this result on the wire, so they are counted from here — even
            # after we sent a drain: the daemon may have pushed against this
            # credit before it saw the drain (results only arrive in ACTIVE or
            # DRAINING, so the grant is never stale).
            self._credit_mirror = pending.credit
            if pending.target is not None:
                self._target_sent = pending.target
            return self._maybe_credit(now)
        if error.reason == reasons.CREDIT_CAPACITY:
            # The push that raced this update has already arrived (the stream
            # is ordered): resampling now gives the daemon a value it can hold.
            self._refusals += 1
            if self._refusals >= MAX_CREDIT_REFUSALS:
                raise SessionBroken(
                    f"the daemon refused {self._refusals} credit updates in a row: {error.message}"
                )
            return self._maybe_credit(now)
        raise SessionBroken(f"credit update refused: {error.code} {error.message}")

    def _own(self) -> int:
        return max(0, self.concurrency - self._outside)

    def _limit(self) -> tuple[int, int | None]:
        """The slots this stream may fill, and the target its credit carries
        (None: none, the daemon's capacity stands)."""
        own = self._own()
        if self.dynamic_target:
            return own, own
        held = self._target_sent
        if held is None:
            held = own if self._registered_capacity is None else self._registered_capacity
        if own > held and self.features.has(Feature.TARGET_CONCURRENCY):
            # Outside slots freed since registering: reclaimed with a target,
            # which the daemon's capacity check then uses.
            return own, own
        return min(own, held), None

    def _maybe_credit(self, now: float) -> list[Output]:
        """The credit frame to send now, if any (see the module docstring)."""
        if self.state is not State.ACTIVE or self._credit_pending:
            return []
        limit, target = self._limit()
        # Credit still out counts as taken: on a resize that many pushes may be
        # on their way, and the daemon's capacity check cannot be relied on to
        # refuse the excess — it no longer counts a lease whose cancelled
        # handler still holds a slot. Grants in flight are credit out too.
        # A lease lost while its renewal is out stays outstanding on the
        # daemon after its handler exits: its slot is offered once the renewal
        # is answered. Below minor 10 the daemon's capacity check alone would
        # not refuse it: it no longer counts a stubborn handler whose lease it
        # dropped (the simulation found it).
        free = max(
            0,
            limit
            - len(self._slots)
            - self._credit_mirror
            - self._granted
            - len(self._renewals_out),
        )
        resize = target is not None and target != self._target_sent
        if not resize and self.can_grant:
            # Batched so that each grant is worth a round trip; but with
            # nothing out (no credit, no grant) a free slot is asked for at
            # once, as below minor 10, or it would idle.
            idle = self._credit_mirror == 0 and not self._granted
            batch = min(limit // self.grant_fraction, self.grant_cap)
            if free < max(1, batch) and not (idle and free):
                return []
            self._step(Input.SEND_CREDIT)
            request_id = self._take_id()
            self._granted += free
            self._pending[request_id] = _Pending(
                CommandKind.CREDIT, now, credit=free, target=target, grant=True
            )
            return [Credit(request_id, 0, target, grant=free)]
        if not (resize or (self._credit_mirror == 0 and free > 0)):
            return []
        self._step(Input.SEND_CREDIT)
        request_id = self._take_id()
        self._credit_pending = request_id
        self._pending[request_id] = _Pending(CommandKind.CREDIT, now, credit=free, target=target)
        return [Credit(request_id, free, target)]
