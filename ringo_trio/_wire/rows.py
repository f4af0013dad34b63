"""A Work stream's pushes, encoded straight from claimed task rows.

Theory of operation
-------------------
The reference path builds a `LeasedTask` from each claimed row (storage's
`rows.leased`: every time column µs -> `datetime`, a `Task`, `Lease` and
`RetryBackoff`) and encodes ``WorkResponse(task=leased)`` with the generic
codec (`datetime` -> Timestamp seconds/nanos again): ~20 µs of the daemon's
CPU per pushed task. `push_rows` writes the same bytes from the row itself,
a `TaskRow`: µs integers straight to
seconds/nanos, clamped as storage's `rows.from_us` and
`rows.duration_from_us` clamp (`MIN_US`, `MAX_US`, `MAX_DURATION_US` are
defined here, for both), every field in field-number order, left out when
the generic encoder leaves it out (an empty string or payload, a zero
number, an unset time). What repeats across a claim (queue and task type;
state, counters, priority and backoff; worker and lease deadline; instants)
is encoded once per call, keyed by its values. A push is kept as its two
parts (`Push`: the LeasedTask's task field and its Lease), which the stream
joins into the frame when it sends it, with the lease's ttl from minor 11
on: the ttl counts from that moment, not from the claim.

A row with anything unusual — progress, a result, a time or counter that is
not an integer (SQLite may hold a REAL), a state not in `TaskState` — goes
the reference way (the caller's `reference`, storage's ``Push.of(leased(row))``),
so every frame is the one the generic encoder writes, and a row the
reference rejects is rejected alike. Property tests hold the two byte-equal
on random rows and on both engines (tests/server/storage/test_push_rows.py).

Storage calls `push_rows` inside the claim's transaction (SQLite) or its
hand-back guard (PostgreSQL), so a push that cannot be encoded leaves no
lease behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from struct import Struct
from typing import Any, NamedTuple

from .._proto.ringo.v1 import LeasedTask, TaskState
from .codec import encode
from .primitives import SMALL, seconds_nanos_body, varint

__all__ = [
    "EPOCH",
    "MAX_DURATION_US",
    "MAX_US",
    "MICRO",
    "MIN_US",
    "Push",
    "TaskRow",
    "from_us",
    "push_rows",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICRO = timedelta(microseconds=1)
# The range a protobuf Timestamp (and `datetime`) can express, in µs since
# the epoch.
MIN_US = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH) // MICRO
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC) - EPOCH) // MICRO
# A protobuf Duration's range is +-10,000 years; stored durations are >= 0.
MAX_DURATION_US = 315_576_000_000 * 1_000_000


class TaskRow(NamedTuple):
    """A task row as both storage engines select it (their ``COLS`` is these
    names, in this order): what a push is encoded from."""

    seq: int
    id: str
    queue: str
    task_type: str
    payload: bytes
    unique_key: str
    state: int
    attempt: int
    max_attempts: int
    priority: int
    backoff_initial_us: int
    backoff_max_us: int
    backoff_multiplier: float
    created_at: int
    updated_at: int
    available_at: int
    finished_at: int | None
    last_error: str
    progress_current: float | None
    progress_total: float | None
    progress_message: str | None
    progress_at: int | None
    worker_id: str
    lease_until: int | None
    lease_token: str
    result: bytes | None
    limit_key: str


class Push:
    """One claimed task as the Work stream pushes it: ``task`` is the encoded
    Task and ``lease`` the encoded Lease without its ``ttl``, kept apart so
    that the ttl, which counts from the moment of sending, is joined in only
    then (`frame_with`); the rest is what the stream keeps of it (the lease
    to count, return or note for the reaper, and the payload size its budget
    counts). ``lease`` and ``lease_token`` are None only for a LeasedTask
    without a lease (then nothing is counted or returned), ``task`` only for
    one without a task."""

    __slots__ = ("attempt", "lease", "lease_token", "size", "task", "task_id", "until")

    def __init__(
        self,
        task: bytes | None,
        lease: bytes | None,
        task_id: str,
        attempt: int,
        lease_token: str | None,
        until: datetime | None,
        size: int,
    ) -> None:
        self.task = task
        self.lease = lease
        self.task_id = task_id
        self.attempt = attempt
        self.lease_token = lease_token
        self.until = until
        self.size = size

    @property
    def frame(self) -> bytes:
        """The encoded ``WorkResponse(task=LeasedTask)`` without a ttl (what
        a stream below minor 11 sends)."""
        return self.frame_with(b"")

    def frame_with(self, ttl: bytes) -> bytes:
        """The encoded ``WorkResponse(task=LeasedTask)`` whose lease ends with
        `ttl`, an encoded ``Lease.ttl`` field (`ttl_field`), or b"" for none.

        One join per frame, at send time: what the claim used to join (the
        LeasedTask, then the WorkResponse around it) is joined here instead,
        so the payload is copied as often as before."""
        task = self.task
        lease = self.lease
        if task is None or lease is None:
            return self._partial(ttl)
        size = len(task)
        task_head = SMALL[size] if size < 0x80 else varint(size)
        lease_size = len(lease) + len(ttl)
        lease_head = SMALL[lease_size] if lease_size < 0x80 else varint(lease_size)
        size += 2 + len(task_head) + len(lease_head) + lease_size
        return b"".join(
            (
                b"\x12",
                SMALL[size] if size < 0x80 else varint(size),
                b"\x0a",
                task_head,
                task,
                b"\x12",
                lease_head,
                lease,
                ttl,
            )
        )

    def _partial(self, ttl: bytes) -> bytes:
        body = b""
        if self.task is not None:
            body = b"\x0a" + varint(len(self.task)) + self.task
        if self.lease is not None:
            lease = self.lease + ttl
            body += b"\x12" + varint(len(lease)) + lease
        return b"\x12" + varint(len(body)) + body

    @classmethod
    def of(cls, leased: LeasedTask) -> Push:
        """The push of `leased` (a lease without a ttl), each part encoded by
        the generic codec."""
        lease = leased.lease
        task = leased.task
        size = 0
        body = None
        if task is not None:
            size = len(task.payload)
            body = encode(task)
        if lease is None:
            return cls(body, None, "", 0, None, None, size)
        return cls(
            body,
            encode(lease),
            lease.task_id,
            lease.attempt,
            lease.lease_token,
            lease.until,
            size,
        )


_DOUBLE = Struct("<d").pack
_STATE_FIELD = {int(state): b"\x30" + varint(int(state)) if state else b"" for state in TaskState}


def _length(size: int) -> bytes:
    return SMALL[size] if size < 0x80 else varint(size)


def _timestamp(us: int) -> bytes:
    """A Timestamp's length and body for `us` µs since the epoch (as
    ``from_us`` then the codec's `_w_timestamp`)."""
    if not MIN_US <= us <= MAX_US:
        us = MAX_US if us > 0 else MIN_US
    seconds, micros = divmod(us, 1_000_000)
    return seconds_nanos_body(seconds, micros * 1000)


def from_us(us: int) -> datetime:
    """`us` µs since the epoch as a datetime, clamped as `_timestamp` clamps
    (`not a <= us <= b` also catches a NaN: a REAL that SQLite stored)."""
    if not MIN_US <= us <= MAX_US:
        us = MAX_US if us > 0 else MIN_US
    return EPOCH + timedelta(microseconds=us)


def _duration(us: int) -> bytes:
    """A Duration's length and body (as ``duration_from_us`` then `_w_duration`)."""
    if not 0 <= us <= MAX_DURATION_US:
        us = MAX_DURATION_US if us > 0 else 0
    seconds, micros = divmod(us, 1_000_000)
    return seconds_nanos_body(seconds, micros * 1000)


def _text(tag: bytes, text: str | None) -> bytes:
    if not text:
        return b""
    data = text.encode()
    return tag + _length(len(data)) + data


def push_rows(rows: Sequence[TaskRow], reference: Callable[[TaskRow], Push]) -> list[Push]:
    """The push of each claimed row, in order; `reference` pushes a row
    this encoder leaves to the generic codec."""
    heads: dict[tuple[Any, Any], bytes] = {}
    middles: dict[tuple[Any, ...], bytes] = {}
    instants: dict[int, bytes] = {}
    leases: dict[tuple[Any, Any], tuple[bytes, bytes, datetime]] = {}
    pushes: list[Push] = []
    append = pushes.append
    for r in rows:
        (
            _,
            task_id,
            queue,
            task_type,
            payload,
            unique_key,
            state_number,
            attempt,
            max_attempts,
            priority,
            initial_us,
            max_us,
            multiplier,
            created_at,
            updated_at,
            available_at,
            finished_at,
            last_error,
            _,
            _,
            _,
            progress_at,
            worker_id,
            lease_until,
            lease_token,
            result,
            limit_key,
        ) = r
        state = _STATE_FIELD.get(state_number)
        if (
            state is None
            or progress_at is not None
            or result is not None
            or not (
                type(attempt)
                is type(max_attempts)
                is type(priority)
                is type(initial_us)
                is type(max_us)
                is type(created_at)
                is type(updated_at)
                is type(available_at)
                is type(lease_until)
                is int
            )
            or (finished_at is not None and type(finished_at) is not int)
        ):
            append(reference(r))
            continue
        # Fields 2-3 of the Task.
        pair = (queue, task_type)
        head = heads.get(pair)
        if head is None:
            head = heads[pair] = _text(b"\x12", queue) + _text(b"\x1a", task_type)
        # Fields 6-10: state, attempt, max_attempts, priority, retry_backoff.
        numbers = (state_number, attempt, max_attempts, priority, initial_us, max_us, multiplier)
        middle = middles.get(numbers)
        if middle is None:
            backoff = b"\x0a" + _duration(initial_us) + b"\x12" + _duration(max_us)
            if multiplier:
                backoff += b"\x19" + _DOUBLE(multiplier)
            middle = middles[numbers] = b"".join(
                (
                    state,
                    b"\x38" + varint(attempt) if attempt else b"",
                    b"\x40" + varint(max_attempts) if max_attempts else b"",
                    b"\x48" + varint(priority) if priority else b"",
                    b"\x52" + _length(len(backoff)) + backoff,
                )
            )
        # Fields 11-14: the instants.
        stamps = []
        for tag, us in (
            (b"\x5a", created_at),
            (b"\x62", updated_at),
            (b"\x6a", available_at),
            (b"\x72", finished_at),
        ):
            if us is not None:
                encoded = instants.get(us)
                if encoded is None:
                    encoded = instants[us] = _timestamp(us)
                stamps.append(tag)
                stamps.append(encoded)
        # Task fields 17-18 and Lease fields 4-5: worker and lease deadline
        # (Task field 20, limit_key, follows them).
        owner = (worker_id, lease_until)
        shared = leases.get(owner)
        if shared is None:
            until = _timestamp(lease_until)
            shared = leases[owner] = (
                _text(b"\x8a\x01", worker_id) + b"\x92\x01" + until,
                _text(b"\x22", worker_id) + b"\x2a" + until,
                from_us(lease_until),
            )
        id_field = _text(b"\x0a", task_id)
        task = b"".join(
            (
                id_field,
                head,
                b"\x22" + _length(len(payload)) + payload if payload else b"",
                _text(b"\x2a", unique_key),
                middle,
                *stamps,
                _text(b"\x7a", last_error),
                shared[0],
                _text(b"\xa2\x01", limit_key),
            )
        )
        lease = b"".join(
            (
                id_field,
                b"\x10" + varint(attempt) if attempt else b"",
                _text(b"\x1a", lease_token),
                shared[1],
            )
        )
        size = len(payload) if payload else 0
        append(Push(task, lease, task_id, attempt, lease_token, shared[2], size))
    return pushes
