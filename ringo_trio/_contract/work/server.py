"""The daemon side of one Work stream, as a state machine with no I/O.

Theory of operation
-------------------
`ServerSession` is the daemon's half of the protocol whose other half is
`ringo_trio._contract.work.client.WorkSession`. The daemon's driver
(`ringo_trio.server.rpc.work`) reads frames, awaits storage and writes bytes;
every decision about the stream is taken here, from inputs the driver feeds
in, and comes back as a value the driver carries out: an `Answer` to write,
a number of tasks to claim, how many claimed pushes to write now, which
leases to return to storage, whether the stream may end. It reads no clock
(``now`` is passed in, in seconds of the daemon's own clock) and imports
nothing of the daemon, the SDK, the generated wire code or an I/O library
(``tests/test_contract.py``), so hypothesis drives it alone and together
with the client machine (``tests/contract/``).

What it owns:

*States.* ``AWAIT_REGISTER → OPEN → DRAINED``, ``STOPPING`` (the daemon shuts
down) from any live state, ``ENDED`` from any; one transition table
(`_TRANSITIONS`). An input the table does not list for the current state is
a `StreamProtocolError` that moves the session to ``ERROR`` for good (h11's
discipline): from then on only `end` is accepted, so a broken session never
pushes or answers again.

*Registration.* The first frame must be ``register`` (else the stream ends
``INVALID_ARGUMENT``); during shutdown it ends ``UNAVAILABLE``. The stream
runs at the registration's minor for its whole life (`features`), with
ordered request ids only when asked for and the minor has them.

*Commands.* Each command is admitted (`admit`) before it runs: an id not
above the previous one on an ordered stream, a frame with no command, a
second ``register``, a command the minor lacks — each is answered with an
error and changes nothing. Storage being found unavailable (`storage_down`)
ends the stream; commands still queued behind are answered ``UNAVAILABLE``
without running.

*The credit ledger.* ``credit`` (pushes still allowed), ``capacity`` (the
latest ``target_concurrency``, else ``max_concurrency``) and the
*outstanding* leases (pushed here, not yet settled here). An absolute update
replaces the credit, a grant (minor >= 10) adds to it; an update that adds
something and would leave ``credit + outstanding > capacity`` is refused
``credit_capacity`` and changes nothing. A push moves one unit from credit to
outstanding. So, whatever the worker sends, **pushed-and-unsettled never
exceeds what the worker granted** — the invariant `check` asserts.

*The lease table.* Every lease this stream claims is in one `LeaseState`:
``CLAIMED`` (leased in storage, not yet on the wire) → ``PUSHED`` (on the
wire: outstanding) → ``SETTLING`` (a settlement is being applied) — or it
ends, exactly once: ``RETURNED`` (never sent: handed back, attempt unspent),
``SETTLED`` (acked, nacked, rejected or released here), ``LOST`` (a command
about it answered ``LEASE_LOST``) or ``LEFT`` (the stream ended with it on
the wire: its handler may still run, so it is left to expire, never handed to
anyone else early). Ended leases leave the table. `end` returns every lease
still ``CLAIMED``: the driver hands those back, so a claim whose stream dies
before its pushes go out loses no attempt.

*Pushing.* `claim_size` says how many tasks to claim (credit, a batch, the
payload budget); `claimed` takes what storage leased and says which of it to
return at once (beyond the budget); `next_pushes` says how many of the
claimed leases the next message carries (credit, frame form, message size,
and no lease with less than the margin left); `pushed` moves them onto the
wire. Only ``OPEN`` claims; a drain, a shutdown or a smaller credit that
lands between the claim and the write leaves the rest to return.

*Drain and stop.* ``drain{begin}`` stops pushes for good (credit 0; later
credit is answered OK and grants nothing). `shutdown` stops pushes at once;
the stream then ends ``UNAVAILABLE`` as soon as it is `quiet`: no lease
outstanding, no command being run, no push being written.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import limits, reasons
from ..versions import Feature, FeatureMissing, Features

__all__ = [
    "LEASE_MARGIN",
    "MAX_CONCURRENCY",
    "PUSH_BATCH",
    "PUSH_BUDGET_BYTES",
    "PUSH_MESSAGE_BYTES",
    "STALL_TIMEOUT",
    "Answer",
    "Input",
    "LeaseState",
    "Refusal",
    "ServerSession",
    "State",
    "StreamEnd",
    "StreamProtocolError",
]

#: Tasks claimed per storage call (and per fair-share round).
PUSH_BATCH = 64
#: Payload bytes one stream may hold claimed but not yet written.
PUSH_BUDGET_BYTES = 4 * 1024 * 1024
#: Encoded bytes of the pushes one batch frame carries (at least one push):
#: a small message reaches the worker's handlers sooner than one big one.
PUSH_MESSAGE_BYTES = 1024 * 1024
#: Seconds of lease a push must have left (at most half the lease).
LEASE_MARGIN = 5.0
#: Seconds a claim's pushes may take to be written, whatever their leases.
STALL_TIMEOUT = 30.0
MAX_CONCURRENCY = 2**31 - 1

_SHUTTING_DOWN = "the daemon is shutting down"
# Characters of a storage error an answer repeats (≤ 4 bytes each in UTF-8).
_DOWN_TEXT = 400


class StreamProtocolError(Exception):
    """An input the session does not allow now (the driver's bug)."""


class State(enum.Enum):
    __hash__ = object.__hash__  # identity hash: looked up per input

    AWAIT_REGISTER = "awaiting register"
    OPEN = "open"
    DRAINED = "drained"
    STOPPING = "stopping"
    ENDED = "ended"
    ERROR = "error"


class Input(enum.Enum):
    __hash__ = object.__hash__

    REGISTER = "register"
    COMMAND = "command"
    DRAIN = "drain"
    CLAIM = "claim"
    PUSH = "push"
    SHUTDOWN = "shutdown"
    END = "end"


_S, _I = State, Input
_LIVE = (_S.OPEN, _S.DRAINED, _S.STOPPING)
_TRANSITIONS: dict[tuple[State, Input], State] = {
    (_S.AWAIT_REGISTER, _I.REGISTER): _S.OPEN,
    (_S.AWAIT_REGISTER, _I.SHUTDOWN): _S.STOPPING,
    **{(s, _I.COMMAND): s for s in _LIVE},
    (_S.OPEN, _I.DRAIN): _S.DRAINED,
    (_S.DRAINED, _I.DRAIN): _S.DRAINED,
    (_S.STOPPING, _I.DRAIN): _S.STOPPING,
    # Only an open stream claims; a claim in flight when the stream drains
    # or stops is returned by `claimed`/`next_pushes`, not pushed.
    (_S.OPEN, _I.CLAIM): _S.OPEN,
    **{(s, _I.PUSH): s for s in _LIVE},
    **{(s, _I.SHUTDOWN): _S.STOPPING for s in _LIVE},
    **{(s, _I.END): _S.ENDED for s in State},
}


class LeaseState(enum.Enum):
    __hash__ = object.__hash__

    CLAIMED = "claimed"
    PUSHED = "pushed"
    SETTLING = "settling"


class _LeaseInput(enum.Enum):
    __hash__ = object.__hash__

    SEND = "send"
    SETTLE = "settle"
    SETTLE_FAILED = "settle failed"


_L = LeaseState
_LEASE_TRANSITIONS: dict[tuple[LeaseState, _LeaseInput], LeaseState] = {
    (_L.CLAIMED, _LeaseInput.SEND): _L.PUSHED,
    (_L.PUSHED, _LeaseInput.SETTLE): _L.SETTLING,
    # A settlement whose outcome is not known (storage failed) leaves the
    # lease outstanding: the worker still holds it.
    (_L.SETTLING, _LeaseInput.SETTLE_FAILED): _L.PUSHED,
}


class Ending(enum.Enum):
    """How a lease of this stream left the table (each exactly once)."""

    RETURNED = "returned"
    SETTLED = "settled"
    LOST = "lost"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class Refusal:
    """An ``ErrorDetail``: ``code`` is the ErrorCode name (``"LEASE_LOST"``)."""

    code: str
    message: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Answer:
    """The ``result`` of one command; ``error`` None is success."""

    request_id: int
    error: Refusal | None = None


class StreamEnd(Exception):
    """The stream ends with this gRPC status name and message."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Registered:
    lease_duration: float
    max_concurrency: int
    ordered_request_ids: bool


@dataclass(slots=True)
class _Lease:
    state: LeaseState
    expires_at: float  # the daemon's clock, seconds
    size: int  # payload bytes


class ServerSession:
    """One Work stream's protocol state (daemon side). See the module docstring."""

    def __init__(self) -> None:
        self.state = State.AWAIT_REGISTER
        self.error: BaseException | None = None
        self.features = Features(0)  # until `register` says the stream's minor
        self.ordered = False
        self.lease_duration = limits.DEFAULT_LEASE.total_seconds()
        self.capacity = 0
        self.credit = 0
        # Every lease of this stream not yet ended, in claim order.
        self.leases: dict[str, _Lease] = {}
        self._outstanding = 0
        self._claimed: list[str] = []  # CLAIMED tokens, in push order
        self._last_request_id: int | None = None
        self._busy = 0  # frames being run (admitted, not yet answered)
        self._pushing = False
        self._down: str | None = None  # why storage was found unavailable
        #: Set when the session decides the stream ends (the driver ends it).
        self.ending: StreamEnd | None = None
        # The largest payload of the last claim: how many tasks fit the
        # budget. Until one has been seen, assume the worst, so the first
        # claims of many streams at once cannot load a full budget each.
        self._payload_hint = limits.MAX_PAYLOAD_BYTES
        self.ended: dict[Ending, int] = dict.fromkeys(Ending, 0)

    # -- observation -------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Leases on the wire and not yet settled on this stream."""
        return self._outstanding

    @property
    def quiet(self) -> bool:
        """Stopping, and nothing the worker could still settle here or be
        answered: the stream may end now."""
        return (
            self.state is State.STOPPING
            and not self._outstanding
            and not self._busy
            and not self._pushing
        )

    @property
    def down(self) -> str | None:
        return self._down

    def check(self) -> None:
        """The session's invariants (the tests call it after every input)."""
        if self.state is State.ERROR:
            return
        on_wire = sum(1 for lease in self.leases.values() if lease.state is not _L.CLAIMED)
        assert on_wire == self._outstanding, (on_wire, self._outstanding)
        assert self._claimed == [t for t, le in self.leases.items() if le.state is _L.CLAIMED]
        # Every push spends a unit the worker granted, and credit that was
        # added always fit the capacity with what was outstanding then.
        assert self.credit >= 0
        assert self.credit == 0 or self.credit + self._outstanding <= self.capacity
        assert self.credit == 0 or self.state is State.OPEN

    # -- the transition table ------------------------------------------------

    def _step(self, what: Input) -> None:
        new = _TRANSITIONS.get((self.state, what))
        if new is None:
            exc = StreamProtocolError(f"{what.value} is not allowed in state {self.state.value}")
            if self.state is not State.ERROR:
                self.state, self.error = State.ERROR, exc
            raise exc
        self.state = new

    def _lease_step(self, token: str, lease: _Lease, what: _LeaseInput) -> None:
        new = _LEASE_TRANSITIONS.get((lease.state, what))
        if new is None:
            exc = StreamProtocolError(
                f"lease {token!r}: cannot {what.value} a {lease.state.value} lease"
            )
            self.state, self.error = State.ERROR, exc
            raise exc
        lease.state = new

    def _end_lease(self, token: str, how: Ending) -> None:
        lease = self.leases.pop(token)
        if lease.state is not _L.CLAIMED:
            self._outstanding -= 1
        self.ended[how] += 1

    # -- registration --------------------------------------------------------

    def register(
        self,
        *,
        minor: int,
        ordered_request_ids: bool,
        max_concurrency: int,
        lease_duration: float | None,
    ) -> Registered:
        """The first frame. Raises `StreamEnd` (UNAVAILABLE while stopping,
        INVALID_ARGUMENT for a field out of range) to end the stream."""
        if self.state is State.STOPPING:
            raise StreamEnd("UNAVAILABLE", _SHUTTING_DOWN)
        if not 1 <= max_concurrency <= MAX_CONCURRENCY:
            raise StreamEnd(
                "INVALID_ARGUMENT",
                f"register.max_concurrency: {max_concurrency} is outside 1..{MAX_CONCURRENCY}",
            )
        self._step(Input.REGISTER)
        self.features = Features(minor)
        self.ordered = ordered_request_ids and self.features.has(Feature.ORDERED_REQUEST_IDS)
        # proto3 cannot tell an unset Duration from zero in every client; both
        # mean the daemon default.
        if lease_duration:
            self.lease_duration = lease_duration
        self.capacity = max_concurrency
        return Registered(self.lease_duration, max_concurrency, self.ordered)

    # -- commands ------------------------------------------------------------

    def begin_frame(self) -> None:
        """A frame was read: the stream is not quiet until it is answered."""
        self._busy += 1

    def end_frame(self) -> None:
        """Its answer is written (or the stream ends)."""
        self._busy -= 1

    def admit(self, request_id: int, name: str, *, has_result: bool = False) -> Answer | None:
        """Whether the command ``name`` (the WorkRequest body's name, ``""``
        for none) may run: None, or the `Answer` that refuses it."""
        self._step(Input.COMMAND)
        if self._down is not None:
            return Answer(
                request_id,
                Refusal("UNAVAILABLE", f"storage unavailable (not executed): {self._down}"),
            )
        if self.ordered:
            last = self._last_request_id
            if last is not None and request_id <= last:
                return Answer(
                    request_id,
                    Refusal(
                        "INVALID_ARGUMENT",
                        f"request_id: {request_id} is not above the previous id {last};"
                        " this stream registered ordered_request_ids",
                        {"field": "request_id"},
                    ),
                )
            self._last_request_id = request_id
        if name in _KNOWN:
            gate = _GATES.get(name)
            if gate is not None and (name != "ack" or has_result):
                refused = self._gate(request_id, *gate)
                if refused is not None:
                    return refused
            return None
        if name == "register":
            return Answer(
                request_id,
                Refusal(
                    "FAILED_PRECONDITION",
                    "this stream is already registered; open a new stream",
                ),
            )
        # No body, or one this minor does not know (a batch below minor 10).
        return Answer(
            request_id,
            Refusal("INVALID_ARGUMENT", "body: the request names no command", {"field": "body"}),
        )

    def _gate(self, request_id: int, feature: Feature, what: str) -> Answer | None:
        try:
            self.features.require(feature, what)
        except FeatureMissing as exc:
            return Answer(request_id, Refusal("INCOMPATIBLE_VERSION", str(exc)))
        return None

    def credit_update(
        self, request_id: int, *, available: int, target: int | None, grant: int | None
    ) -> Answer:
        """A ``credit`` command (admitted): the credit rule, applied at once.
        The driver writes the answer in the same step, under its send lock,
        so every push after it on the wire spends the credit it set."""
        if target is not None:
            refused = self._gate(request_id, Feature.TARGET_CONCURRENCY, "target_concurrency")
            if refused is not None:
                return refused
            if target > MAX_CONCURRENCY:
                return _field(
                    request_id, "credit.target_concurrency", f"{target} exceeds {MAX_CONCURRENCY}"
                )
        if grant is not None:
            refused = self._gate(request_id, Feature.CREDIT_GRANT, "credit grant")
            if refused is not None:
                return refused
            if available:
                return _field(request_id, "credit.available", "must be 0 when a grant is given")
        if self.state is not State.OPEN:
            return Answer(request_id)  # drained or stopping: grants nothing
        capacity = self.capacity if target is None else target
        credit = available if grant is None else self.credit + grant
        # The credit held after the update, not only credit added: a grant of
        # 0 whose target lowers the capacity would leave the credit left
        # standing over it, and the pushes it covers over the capacity.
        if credit and credit + self._outstanding > capacity:
            # Not clamped: the worker's view is stale (a push crossed this
            # update), so it resamples and sends a fresh one.
            return Answer(
                request_id,
                Refusal(
                    "RESOURCE_EXHAUSTED",
                    f"credit {credit} with {self._outstanding} task(s) outstanding exceeds the"
                    f" stream's capacity of {capacity}; resample and retry",
                    {"reason": reasons.CREDIT_CAPACITY},
                ),
            )
        self.capacity = capacity
        self.credit = credit
        return Answer(request_id)

    def drain(self, request_id: int, *, begin: bool) -> Answer:
        if not begin:
            return _field(request_id, "drain.begin", "must be true; a drain cannot be undone")
        self._step(Input.DRAIN)
        self.credit = 0
        return Answer(request_id)

    def settling(self, token: str) -> None:
        """A settlement (ack, nack, reject, release) of ``token`` goes to
        storage. A token this stream did not push is the worker's business:
        it may settle a lease of an earlier stream here."""
        lease = self.leases.get(token)
        if lease is not None and lease.state is _L.PUSHED:
            self._lease_step(token, lease, _LeaseInput.SETTLE)

    def settled(self, token: str, outcome: Ending | None) -> None:
        """Storage answered a command about ``token``: SETTLED (done), LOST
        (``LEASE_LOST``), or None (it failed; the worker still holds it)."""
        lease = self.leases.get(token)
        if lease is None or lease.state is _L.CLAIMED:
            return
        if outcome is None:
            if lease.state is _L.SETTLING:
                self._lease_step(token, lease, _LeaseInput.SETTLE_FAILED)
            return
        self._end_lease(token, outcome)

    def lost(self, request_id: int, token: str | None, *, cancelled: bool, message: str) -> Answer:
        """Storage says the lease a command named is not the task's current
        one: answered ``LEASE_LOST`` (``reason=cancelled`` when an operator
        cancelled the task), and it no longer takes a slot of this stream."""
        if token is not None:
            self.settled(token, Ending.LOST)
        if cancelled:
            return Answer(
                request_id,
                Refusal(
                    "LEASE_LOST",
                    message or "the task was cancelled",
                    {"reason": reasons.CANCELLED},
                ),
            )
        return Answer(
            request_id,
            Refusal("LEASE_LOST", message or "the lease is not the task's current lease"),
        )

    def storage_down(self, request_id: int, why: str) -> Answer:
        """Storage cannot be reached: this command is answered ``UNAVAILABLE``
        and the stream ends (`ending`) so the worker reconnects, here once the
        database is back or to another daemon; commands queued behind it are
        answered without running (`admit`)."""
        # The driver's error text is not ours to bound, yet every command left
        # in a batch repeats it: cut, so a batch of answers stays far within
        # the 4 MiB reply bound (1,000 answers of at most 2 KiB).
        why = why if len(why) <= _DOWN_TEXT else why[: _DOWN_TEXT - 1] + "…"
        if self._down is None:
            self._down = why
            self.ending = StreamEnd("UNAVAILABLE", f"storage unavailable: {why}")
        return Answer(request_id, Refusal("UNAVAILABLE", f"storage unavailable: {why}"))

    # -- pushing -------------------------------------------------------------

    def claim_size(self) -> int:
        """How many tasks to claim now (0: wait for credit or stop)."""
        if self.state is not State.OPEN or self.credit <= 0 or self._claimed:
            return 0
        self._step(Input.CLAIM)
        fits = PUSH_BUDGET_BYTES // max(self._payload_hint, 1)
        return min(self.credit, PUSH_BATCH, max(fits, 1))

    def claimed(self, leases: Iterable[tuple[str, float, int]]) -> list[str]:
        """Storage leased these (token, expires_at, payload size), in push
        order: they are this stream's to push or return. Returns the tokens
        to return at once: those beyond the payload budget (at least one is
        kept), all of them when the stream is no longer open."""
        total = largest = 0
        kept: list[str] = []
        back: list[str] = []
        for token, expires_at, size in leases:
            self.leases[token] = _Lease(_L.CLAIMED, expires_at, size)
            largest = max(largest, size)
            total += size
            if self.state is State.OPEN and (not kept or total <= PUSH_BUDGET_BYTES) and not back:
                kept.append(token)
                self._claimed.append(token)
            else:
                back.append(token)
        if largest:
            self._payload_hint = largest
        for token in back:
            self._end_lease(token, Ending.RETURNED)
        return back

    def lease_margin(self) -> float:
        return min(LEASE_MARGIN, self.lease_duration / 2)

    def fresh_for(self, now: float) -> float:
        """Seconds until the first claimed lease has only the margin left
        (infinite when none is claimed): the latest its push may be written."""
        expiring = min((self.leases[token].expires_at for token in self._claimed), default=math.inf)
        return expiring - self.lease_margin() - now

    def next_pushes(self, now: float, sizes: Sequence[int]) -> tuple[int, bool]:
        """How many of the claimed leases the next message carries, given
        their encoded ``sizes`` in order: within the credit, one per message
        without batch frames, within `PUSH_MESSAGE_BYTES` (at least one), and
        ending before the first lease with less than the margin left (then
        True: it and the rest are to be returned). The driver writes them,
        then calls `pushed`."""
        self._step(Input.PUSH)
        most = min(self.credit, len(self._claimed))
        if not self.features.has(Feature.BATCH_FRAMES):
            most = min(most, 1)
        margin = self.lease_margin()
        count = size = 0
        for token, frame_size in zip(self._claimed[:most], sizes, strict=False):
            if self.leases[token].expires_at - margin <= now:
                return count, True
            size += frame_size
            if count and size > PUSH_MESSAGE_BYTES:
                break
            count += 1
        if count:
            self._pushing = True
        return count, False

    def pushed(self, count: int) -> None:
        """The first ``count`` claimed leases are on the wire."""
        self._pushing = False
        sent, self._claimed = self._claimed[:count], self._claimed[count:]
        self.credit -= count
        for token in sent:
            self._lease_step(token, self.leases[token], _LeaseInput.SEND)
        self._outstanding += len(sent)

    def push_failed(self) -> None:
        """The write of the message `next_pushes` sized did not complete."""
        self._pushing = False

    def unsent(self) -> list[str]:
        """Return every claimed lease not on the wire (attempt unspent):
        the driver hands these back to storage."""
        back, self._claimed = self._claimed, []
        for token in back:
            self._end_lease(token, Ending.RETURNED)
        return back

    # -- stopping ------------------------------------------------------------

    def shutdown(self) -> None:
        """The daemon stops: no more pushes; end once `quiet`."""
        if self.state in (State.ENDED, State.ERROR, State.STOPPING):
            return
        self._step(Input.SHUTDOWN)
        self.credit = 0

    def end(self) -> list[str]:
        """The stream is gone. Returns the claimed leases never sent, which
        the driver hands back; leases on the wire are left to expire (their
        handlers may still run: the same attempt is never handed to anyone
        else early)."""
        self._step(Input.END)
        self.credit = 0
        back = [t for t, le in self.leases.items() if le.state is _L.CLAIMED]
        for token in list(self.leases):
            self._end_lease(token, Ending.RETURNED if token in back else Ending.LEFT)
        self._claimed = []
        return back


_KNOWN = frozenset(
    {"credit", "ack", "nack", "reject", "extend_lease", "progress", "drain", "release"}
)
# Commands that need a feature (an ack only when it carries a result).
_GATES: dict[str, tuple[Feature, str]] = {
    "release": (Feature.RELEASE, "release"),
    "ack": (Feature.RESULT_VALUES, "ack result"),
}


def _field(request_id: int, path: str, reason: str) -> Answer:
    return Answer(request_id, Refusal("INVALID_ARGUMENT", f"{path}: {reason}", {"field": path}))
