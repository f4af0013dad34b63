"""The daemon's Work session (`ringo_trio._contract.work.server`) alone.

A hypothesis state machine plays a worker and a storage engine against one
`ServerSession`: credit (absolute and additive, with resizes), claims and
pushes as the driver sizes them, settlements with every outcome, drains,
shutdown and the stream's end, in any order the protocol allows. After every
step the session's own invariants hold (`ServerSession.check`) and so do the
properties the daemon promises, checked against bookkeeping of the test's own.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ringo_trio._contract import reasons
from ringo_trio._contract.work.server import (
    MAX_CONCURRENCY,
    PUSH_BUDGET_BYTES,
    PUSH_MESSAGE_BYTES,
    Answer,
    Ending,
    ServerSession,
    State,
    StreamEnd,
    StreamProtocolError,
)

LEASE = 60.0


class DaemonStream(RuleBasedStateMachine):
    """Properties, each checked after every step:

    * **pushes never exceed the credit the worker granted**: a mirror of the
      credit, kept by the test from the answers alone (absolute replaces,
      a grant adds, a push spends one), never goes below zero and equals the
      session's credit;
    * **every lease ends exactly once**: each claimed lease is in the table
      or counted once among returned / settled / lost / left;
    * **a returned lease was never on the wire**, and every lease on the wire
      when the stream ends is left to expire, never returned;
    * **credit added always fits**: credit + outstanding ≤ capacity whenever
      credit is left;
    * **a refused command changes nothing**.
    """

    def __init__(self) -> None:
        super().__init__()
        self._reset()

    def _reset(self) -> None:
        self.session = ServerSession()
        self.now = 1000.0
        self.ids = itertools.count(1)
        self.tokens = (f"t{n}" for n in itertools.count())
        self.mirror = 0  # the credit as the answers say it is
        self.claimed_total = 0
        self.on_wire: set[str] = set()  # pushed, not yet ended
        self.ever_pushed: set[str] = set()
        self.returned: set[str] = set()
        self.left: set[str] = set()
        self.capacity = 0
        self.claim: list[tuple[str, int]] = []  # claimed, not yet pushed

    @initialize(
        minor=st.sampled_from([5, 6, 9, 10, 11]),
        concurrency=st.integers(1, 8),
        ordered=st.booleans(),
    )
    def register(self, minor: int, concurrency: int, ordered: bool) -> None:
        self._register(minor, concurrency, ordered)

    def _register(self, minor: int, concurrency: int, ordered: bool) -> None:
        registered = self.session.register(
            minor=minor,
            ordered_request_ids=ordered,
            max_concurrency=concurrency,
            lease_duration=LEASE,
        )
        assert registered.max_concurrency == concurrency
        assert registered.ordered_request_ids == (ordered and minor >= 6)
        self.capacity = concurrency

    def _live(self) -> bool:
        return self.session.state in (State.OPEN, State.DRAINED, State.STOPPING)

    # -- the worker's commands ------------------------------------------------

    @precondition(lambda self: self._live())
    @rule(
        available=st.integers(0, 10),
        resize=st.none() | st.integers(0, 10),
        grant=st.none() | st.integers(0, 10),
    )
    def credit(self, available: int, resize: int | None, grant: int | None) -> None:
        target = resize
        session = self.session
        before = (session.credit, session.capacity)
        request_id = next(self.ids)
        refused = session.admit(request_id, "credit")
        assert refused is None
        answer = session.credit_update(request_id, available=available, target=target, grant=grant)
        assert answer.request_id == request_id
        if answer.error is not None:
            assert (session.credit, session.capacity) == before, "a refusal changed the ledger"
            if answer.error.metadata.get("reason") == reasons.CREDIT_CAPACITY:
                would = available if grant is None else before[0] + grant
                cap = before[1] if target is None else target
                assert would + session.outstanding > cap
            return
        if session.state is not State.OPEN:
            assert session.credit == 0
            return
        self.mirror = available if grant is None else self.mirror + grant
        if target is not None:
            self.capacity = target

    @precondition(lambda self: self._live() and self.on_wire)
    @rule(data=st.data(), outcome=st.sampled_from([Ending.SETTLED, Ending.LOST, None]))
    def settle(self, data: st.DataObject, outcome: Ending | None) -> None:
        token = data.draw(st.sampled_from(sorted(self.on_wire)))
        session = self.session
        assert session.admit(next(self.ids), "nack") is None
        before = session.outstanding
        session.settling(token)
        if outcome is Ending.LOST:
            answer = session.lost(1, token, cancelled=False, message="")
            assert answer.error is not None
            assert answer.error.code == "LEASE_LOST"
        else:
            session.settled(token, outcome)
        if outcome is None:
            assert session.outstanding == before  # the worker still holds it
        else:
            self.on_wire.discard(token)
            assert session.outstanding == before - 1

    @precondition(lambda self: self._live())
    @rule()
    def settle_unknown_lease(self) -> None:
        """A lease of an earlier stream, settled here: none of this stream's business."""
        before = (self.session.outstanding, self.session.credit)
        self.session.settling("elsewhere")
        self.session.settled("elsewhere", Ending.SETTLED)
        assert (self.session.outstanding, self.session.credit) == before

    @precondition(lambda self: self._live())
    @rule()
    def drain(self) -> None:
        request_id = next(self.ids)
        assert self.session.admit(request_id, "drain") is None
        assert self.session.drain(request_id, begin=True) == Answer(request_id)
        self.mirror = 0

    @precondition(lambda self: self._live())
    @rule(name=st.sampled_from(["", "register", "batch", "release"]))
    def odd_command(self, name: str) -> None:
        before = (self.session.credit, self.session.outstanding, self.session.capacity)
        answer = self.session.admit(next(self.ids), name)
        if name == "release" and self.session.features.minor >= 7:
            assert answer is None
        else:
            assert answer is not None
            assert answer.error is not None
        assert (self.session.credit, self.session.outstanding, self.session.capacity) == before

    @precondition(lambda self: self._live() and self.session.ordered)
    @rule()
    def repeated_id(self) -> None:
        request_id = next(self.ids)
        assert self.session.admit(request_id, "progress") is None
        answer = self.session.admit(request_id, "progress")
        assert answer is not None
        assert answer.error is not None
        assert answer.error.metadata == {"field": "request_id"}

    # -- the driver's pushes ----------------------------------------------------

    @precondition(lambda self: self._live() and not self.claim)
    @rule(
        available=st.integers(0, 12),
        sizes=st.lists(st.integers(0, 2 * 1024 * 1024), min_size=1, max_size=3),
        age=st.floats(0, 2 * LEASE) | st.just(0.0),
    )
    def claim_tasks(self, available: int, sizes: list[int], age: float) -> None:
        """The dispatcher claims as the session says; storage has `available`."""
        session = self.session
        limit = session.claim_size()
        if session.state is not State.OPEN:
            assert limit == 0
        assert limit <= session.credit
        count = min(limit, available)
        if not count:
            return
        leases = [
            (next(self.tokens), self.now + LEASE - age, sizes[i % len(sizes)]) for i in range(count)
        ]
        self.claimed_total += count
        back = session.claimed(leases)
        self.returned.update(back)
        kept = [(token, size) for token, _, size in leases if token not in back]
        assert [t for t, _ in kept] == [t for t, _, _ in leases][: len(kept)], "not a prefix"
        held = sum(size for _, size in kept)
        assert held <= PUSH_BUDGET_BYTES or len(kept) == 1, "claimed beyond the payload budget"
        self.claim = kept

    @precondition(lambda self: self._live() and self.claim)
    @rule(all_of_it=st.booleans())
    def push(self, all_of_it: bool) -> None:
        """The dispatcher writes what the session sizes — one message, or
        until it says stop; a credit, drain or shutdown may have landed
        since the claim."""
        session = self.session
        while self.claim:
            sizes = [size + 100 for _, size in self.claim]
            n, stale = session.next_pushes(self.now, sizes)
            if not n:
                break
            assert sum(sizes[:n]) <= PUSH_MESSAGE_BYTES or n == 1
            session.pushed(n)
            self.mirror -= n
            for token, _ in self.claim[:n]:
                self.on_wire.add(token)
                self.ever_pushed.add(token)
            del self.claim[:n]
            if stale or not all_of_it:
                break
        if not self.claim or not all_of_it:
            self._return_unsent()

    def _return_unsent(self) -> None:
        back = self.session.unsent()
        assert back == [token for token, _ in self.claim]
        self.returned.update(back)
        self.claim = []

    @precondition(lambda self: self._live())
    @rule(seconds=st.floats(0, LEASE))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # -- the daemon stopping, the stream ending --------------------------------

    @precondition(lambda self: self._live())
    @rule()
    def shutdown(self) -> None:
        self.session.shutdown()
        self.mirror = 0
        assert self.session.quiet == (self.session.outstanding == 0)

    @precondition(lambda self: self._live())
    @rule()
    def storage_down(self) -> None:
        request_id = next(self.ids)
        answer = self.session.storage_down(request_id, "gone")
        assert answer.error is not None
        assert answer.error.code == "UNAVAILABLE"
        assert self.session.ending is not None
        later = self.session.admit(next(self.ids), "progress")
        assert later is not None
        assert later.error is not None
        assert "not executed" in later.error.message
        self.end()  # the driver ends the stream with the session's `ending`

    @precondition(lambda self: self._live())
    @rule()
    def end(self) -> None:
        self._return_unsent()  # the dispatcher's `finally`
        assert self.session.end() == []
        self.left |= self.on_wire
        self.on_wire.clear()
        assert self.session.outstanding == 0
        assert not self.session.leases

    @precondition(lambda self: self.session.state is State.ENDED)
    @rule(concurrency=st.integers(1, 8))
    def next_stream(self, concurrency: int) -> None:
        """The worker reconnects: a new session, the same properties."""
        self._reset()
        self._register(11, concurrency, True)

    # -- properties ---------------------------------------------------------------

    @invariant()
    def session_invariants(self) -> None:
        self.session.check()

    @invariant()
    def pushes_never_exceed_granted_credit(self) -> None:
        assert self.mirror >= 0
        if self.session.state is State.OPEN:
            assert self.mirror == self.session.credit

    @invariant()
    def every_lease_ends_exactly_once(self) -> None:
        ended = self.session.ended
        assert self.claimed_total == sum(ended.values()) + len(self.session.leases)
        assert ended[Ending.RETURNED] == len(self.returned)
        assert ended[Ending.LEFT] == len(self.left)

    @invariant()
    def a_returned_lease_was_never_on_the_wire(self) -> None:
        assert not self.returned & self.ever_pushed
        assert self.left <= self.ever_pushed

    @invariant()
    def outstanding_is_what_is_on_the_wire(self) -> None:
        if self._live():
            assert self.session.outstanding == len(self.on_wire)


DaemonStream.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_daemon_stream = DaemonStream.TestCase


def _registered(minor: int = 11, concurrency: int = 4) -> ServerSession:
    session = ServerSession()
    session.register(
        minor=minor, ordered_request_ids=True, max_concurrency=concurrency, lease_duration=LEASE
    )
    return session


def test_registration_during_shutdown_ends_the_stream_unavailable() -> None:
    session = ServerSession()
    session.shutdown()
    with pytest.raises(StreamEnd) as caught:
        session.register(
            minor=11, ordered_request_ids=False, max_concurrency=1, lease_duration=None
        )
    assert caught.value.status == "UNAVAILABLE"


@pytest.mark.parametrize("concurrency", [0, 2**31])
def test_registration_refuses_a_concurrency_out_of_range(concurrency: int) -> None:
    with pytest.raises(StreamEnd) as caught:
        ServerSession().register(
            minor=11, ordered_request_ids=False, max_concurrency=concurrency, lease_duration=None
        )
    assert caught.value.status == "INVALID_ARGUMENT"
    assert "register.max_concurrency" in caught.value.message


def test_an_input_the_table_does_not_list_is_a_loud_error_and_sticks() -> None:
    """Registering twice is the driver's bug (a second ``register`` frame is
    answered by `admit`, never fed here): the session refuses it and, from
    then on, everything but `end`."""
    session = _registered()
    with pytest.raises(StreamProtocolError):
        session.register(
            minor=11, ordered_request_ids=False, max_concurrency=1, lease_duration=None
        )
    assert session.state is State.ERROR
    with pytest.raises(StreamProtocolError):
        session.admit(2, "progress")
    session.end()
    assert session.state is State.ENDED


def test_a_claim_in_flight_when_the_stream_drains_is_returned_whole() -> None:
    """Claimed leases are this stream's to push or return: when a drain lands
    while the claim is in flight, none of it is pushed and all of it is
    returned (no attempt spent)."""
    session = _registered()
    session.credit_update(1, available=4, target=None, grant=None)
    assert session.claim_size() == 4
    session.drain(2, begin=True)
    back = session.claimed([("a", 100.0, 1), ("b", 100.0, 1)])
    assert back == ["a", "b"]
    assert session.ended[Ending.RETURNED] == 2
    assert not session.leases


def test_a_stale_lease_is_returned_not_pushed() -> None:
    """A lease with less than the margin left is never pushed."""
    session = _registered()
    session.credit_update(1, available=2, target=None, grant=None)
    session.claim_size()
    session.claimed([("fresh", 100.0, 1), ("stale", 1.0, 1)])
    count, stale = session.next_pushes(0.0, [10, 10])
    assert (count, stale) == (1, True)
    session.pushed(count)
    assert session.unsent() == ["stale"]


def test_shutdown_waits_for_outstanding_leases() -> None:
    session = _registered()
    session.credit_update(1, available=1, target=None, grant=None)
    session.claim_size()
    session.claimed([("a", 100.0, 1)])
    session.pushed(session.next_pushes(0.0, [10])[0])
    session.shutdown()
    assert not session.quiet
    session.settling("a")
    session.settled("a", Ending.SETTLED)
    assert session.quiet


def test_a_frame_being_answered_holds_a_stopping_stream_open() -> None:
    """Property: a stopping stream is not quiet while a frame it read is
    still being answered (its answer must reach the worker before the call
    ends), and is once the answer is written; frames nest."""
    session = _registered()
    session.begin_frame()
    session.begin_frame()
    session.shutdown()
    assert not session.quiet
    session.end_frame()
    assert not session.quiet
    session.end_frame()
    assert session.quiet


def test_a_second_register_and_an_empty_body_are_refused_apart() -> None:
    """Property: on a registered stream another ``register`` is refused
    FAILED_PRECONDITION (open a new stream), a body naming no command
    INVALID_ARGUMENT naming ``body``; the stream stays open."""
    session = _registered()
    again = session.admit(1, "register")
    assert again is not None
    assert again.error is not None
    assert again.error.code == "FAILED_PRECONDITION"
    empty = session.admit(2, "")
    assert empty is not None
    assert empty.error is not None
    assert (empty.error.code, empty.error.metadata) == ("INVALID_ARGUMENT", {"field": "body"})
    assert session.state is State.OPEN


def test_a_driver_error_repeated_in_every_answer_is_cut() -> None:
    """Property: the storage driver's error text, repeated in the answer of
    every command left in a batch, is cut to 400 characters (the last one
    an ellipsis) so a batch of answers stays within the reply bound; a
    shorter text, and one of exactly 400, goes whole. A lost lease's
    answer names why even when storage gave no message."""
    prefix = "storage unavailable: "
    for given, said in [
        ("x" * 399, "x" * 399),
        ("x" * 400, "x" * 400),
        ("x" * 401, "x" * 399 + "…"),
        ("y" * 50_000, "y" * 399 + "…"),
    ]:
        session = _registered()
        answer = session.storage_down(1, given)
        assert answer.error is not None
        assert answer.error.message == prefix + said
        assert session.ending is not None
    session = _registered()
    cancelled = session.lost(1, None, cancelled=True, message="").error
    gone = session.lost(2, None, cancelled=False, message="").error
    assert cancelled is not None
    assert gone is not None
    assert (cancelled.message, cancelled.metadata) == (
        "the task was cancelled",
        {"reason": reasons.CANCELLED},
    )
    assert gone.message == "the lease is not the task's current lease"


@pytest.mark.parametrize(
    ("lease", "margin"),
    [(60.0, 5.0), (4.0, 2.0)],
    ids=["the margin", "half a short lease"],
)
def test_a_push_needs_the_margin_left_on_its_lease(lease: float, margin: float) -> None:
    """Property: a claimed lease is pushed only while more than the margin
    is left on it — 5 s, or half the lease when that is shorter, so a short
    lease can still be pushed — else it and those after it go back; the
    driver's deadline for the push (`fresh_for`) is the first claimed
    lease's end less the margin, none when nothing is claimed."""
    for left, pushed in [(margin + 0.1, True), (margin - 0.1, False)]:
        session = ServerSession()
        session.register(
            minor=11, ordered_request_ids=True, max_concurrency=4, lease_duration=lease
        )
        assert session.fresh_for(0.0) == math.inf
        session.credit_update(1, available=2, target=None, grant=None)
        session.claim_size()
        session.claimed([("a", 100.0 + left, 1), ("b", 200.0, 1)])
        assert session.fresh_for(100.0) == pytest.approx(left - margin)
        assert session.next_pushes(100.0, [10, 10]) == ((2, False) if pushed else (0, True))


def test_the_concurrency_bound_is_inclusive() -> None:
    """`MAX_CONCURRENCY` itself is a valid registration and target; one
    more is refused."""
    session = _registered(concurrency=MAX_CONCURRENCY)
    assert session.capacity == MAX_CONCURRENCY
    with pytest.raises(StreamEnd, match="max_concurrency"):
        _registered(concurrency=MAX_CONCURRENCY + 1)
    ok = session.credit_update(1, available=0, target=MAX_CONCURRENCY, grant=0)
    assert ok.error is None
    refused = session.credit_update(2, available=0, target=MAX_CONCURRENCY + 1, grant=0)
    assert refused.error is not None
    assert refused.error.metadata.get("field") == "credit.target_concurrency"


def test_a_claim_holds_at_most_the_payload_budget() -> None:
    """A worker that stops reading cannot make the daemon hoard payload: what
    a claim keeps beyond `PUSH_BUDGET_BYTES` (at least one task) is returned
    at once."""
    session = _registered()
    session.credit_update(1, available=4, target=None, grant=None)
    assert session.claim_size() == 4  # the first claim assumes 1 MiB payloads
    mib = 1024 * 1024
    back = session.claimed([(t, 100.0, 2 * mib) for t in "abcd"])
    assert back == ["c", "d"]
    assert session.claim_size() == 0  # nothing more until these are pushed
    # Each push is over PUSH_MESSAGE_BYTES: a message of its own.
    assert session.next_pushes(0.0, [2 * mib, 2 * mib]) == (1, False)
    session.pushed(1)
    assert session.next_pushes(0.0, [2 * mib]) == (1, False)
    session.pushed(1)
    assert session.unsent() == []
    # The next claim is sized from the payloads it has seen.
    session.credit_update(2, available=2, target=8, grant=None)
    assert session.claim_size() == 2


def test_credit_withdrawn_after_the_claim_stops_the_pushes() -> None:
    """Pushes spend the credit current when they are written: credit the
    worker withdrew after the claim is not spent (the rest is returned)."""
    session = _registered()
    session.credit_update(1, available=3, target=None, grant=None)
    assert session.claim_size() == 3
    session.claimed([(t, 100.0, 1) for t in "abc"])
    session.credit_update(2, available=1, target=None, grant=None)
    count, stale = session.next_pushes(0.0, [10, 10, 10])
    assert (count, stale) == (1, False)
    session.pushed(count)
    assert session.next_pushes(0.0, [10, 10]) == (0, False)
    assert session.unsent() == ["b", "c"]
    assert session.credit == 0


def test_a_grant_whose_target_strands_the_credit_is_refused() -> None:
    """Property (credit held always fits): a grant of 0 whose target lowers
    the capacity under the credit still held plus what is outstanding is
    refused ``credit_capacity`` and changes nothing -- accepted, the daemon
    would push that credit over the worker's new capacity (hypothesis found
    it: grant 1 at capacity 1, then grant 0 with target 0). A target the
    credit still fits is accepted."""
    session = _registered(concurrency=2)
    assert session.credit_update(1, available=0, target=None, grant=2).error is None
    refused = session.credit_update(2, available=0, target=1, grant=0)
    assert refused.error is not None
    assert refused.error.metadata == {"reason": reasons.CREDIT_CAPACITY}
    assert (session.credit, session.capacity) == (2, 2)
    session.check()
    session.claim_size()
    session.claimed([("a", 100.0, 1)])
    session.pushed(session.next_pushes(0.0, [10])[0])
    # Credit 1 + outstanding 1 fit a target of 2, not of 1.
    assert session.credit_update(3, available=0, target=2, grant=0).error is None
    assert session.credit_update(4, available=0, target=1, grant=0).error is not None
    assert (session.credit, session.capacity, session.outstanding) == (1, 2, 1)
    session.check()


def test_a_lease_answered_lease_lost_frees_its_slot() -> None:
    """A command about a lease answered LEASE_LOST ends it: it no longer
    counts against the stream's capacity (cancelled: with the reason)."""
    session = _registered(concurrency=1)
    session.credit_update(1, available=1, target=None, grant=None)
    session.claim_size()
    session.claimed([("a", 100.0, 1)])
    session.pushed(session.next_pushes(0.0, [10])[0])
    refused = session.credit_update(2, available=1, target=None, grant=None)
    assert refused.error is not None
    assert refused.error.metadata == {"reason": reasons.CREDIT_CAPACITY}
    answer = session.lost(3, "a", cancelled=True, message="")
    assert answer.error is not None
    assert answer.error.metadata == {"reason": reasons.CANCELLED}
    assert session.outstanding == 0
    assert session.credit_update(4, available=1, target=None, grant=None).error is None


def test_a_storage_error_repeated_by_every_answer_is_cut() -> None:
    """Every command behind a storage outage repeats its error text: it is
    cut, so 1,000 answers stay far within the 4 MiB reply bound."""
    session = _registered()
    answer = session.storage_down(1, "x" * 1_000_000)
    later = session.admit(2, "progress")
    for refused in (answer, later):
        assert refused is not None
        assert refused.error is not None
        assert len(refused.error.message.encode()) <= 2048
