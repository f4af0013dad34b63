"""The Work stream's pushes, encoded straight from claimed task rows.

Theory of operation
-------------------
The reference path builds a `LeasedTask` from each claimed row (`_rows.leased`:
every time column µs -> `datetime`, a `Task`, `Lease` and `RetryBackoff`)
and encodes ``WorkResponse(task=leased)`` with the generic codec (`datetime`
-> Timestamp seconds/nanos again): ~20 µs of the daemon's CPU per pushed
task. `push_rows` writes the same bytes from the row itself: µs integers
straight to seconds/nanos, clamped as `_rows.from_us` and
`_rows.duration_from_us` clamp, every field in field-number order, left
out when the generic encoder leaves it out (an empty string or payload, a
zero number, an unset time). What repeats across a claim (queue and task
type; state, counters, priority and backoff; worker and lease deadline;
instants) is encoded once per call, keyed by its values. A push is kept as
its two parts (`Push`: the LeasedTask's task field and its Lease), which the
stream joins into the frame when it sends it, with the lease's ttl from
minor 11 on: the ttl counts from that moment, not from the claim.

A row with anything unusual — progress, a result, a time or counter that is
not an integer (SQLite may hold a REAL), a state not in `TaskState` — goes
the reference way (`Push.of(leased(row))`), so every frame is the one the
generic encoder writes, and a row the reference rejects is rejected alike.
Property tests hold the two byte-equal on random rows and on both engines
(tests/storage/test_push_rows.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from struct import Struct
from typing import Any

from ringo_trio._wire.primitives import SMALL as _SMALL
from ringo_trio._wire.primitives import seconds_nanos_body as _seconds_nanos_body
from ringo_trio._wire.primitives import varint as _varint

from ._base import Push
from ._rows import MAX_DURATION_US, MAX_US, MIN_US, STATES, from_us, leased

__all__ = ["push_rows"]

_DOUBLE = Struct("<d").pack
_STATE_FIELD = {
    number: b"\x30" + _varint(int(state)) if state else b"" for number, state in STATES.items()
}


def _length(size: int) -> bytes:
    return _SMALL[size] if size < 0x80 else _varint(size)


def _timestamp(us: int) -> bytes:
    """A Timestamp's length and body for `us` µs since the epoch (as
    ``from_us`` then the codec's `_w_timestamp`)."""
    if not MIN_US <= us <= MAX_US:
        us = MAX_US if us > 0 else MIN_US
    seconds, micros = divmod(us, 1_000_000)
    return _seconds_nanos_body(seconds, micros * 1000)


def _duration(us: int) -> bytes:
    """A Duration's length and body (as ``duration_from_us`` then `_w_duration`)."""
    if not 0 <= us <= MAX_DURATION_US:
        us = MAX_DURATION_US if us > 0 else 0
    seconds, micros = divmod(us, 1_000_000)
    return _seconds_nanos_body(seconds, micros * 1000)


def _text(tag: bytes, text: str | None) -> bytes:
    if not text:
        return b""
    data = text.encode()
    return tag + _length(len(data)) + data


def push_rows(rows: Sequence[Sequence[Any]]) -> list[Push]:
    """The push of each claimed row (in `_rows.COLS` order), in order."""
    heads: dict[tuple[Any, Any], bytes] = {}
    middles: dict[tuple[Any, ...], bytes] = {}
    instants: dict[int, bytes] = {}
    leases: dict[tuple[Any, Any], tuple[bytes, bytes, datetime]] = {}
    pushes: list[Push] = []
    append = pushes.append
    for r in rows:
        state = _STATE_FIELD.get(r[6])
        finished = r[16]
        if (
            state is None
            or r[21] is not None
            or r[25] is not None
            or not (
                type(r[7])
                is type(r[8])
                is type(r[9])
                is type(r[10])
                is type(r[11])
                is type(r[13])
                is type(r[14])
                is type(r[15])
                is type(r[23])
                is int
            )
            or (finished is not None and type(finished) is not int)
        ):
            append(Push.of(leased(r)))
            continue
        # Fields 2-3 of the Task.
        pair = (r[2], r[3])
        head = heads.get(pair)
        if head is None:
            head = heads[pair] = _text(b"\x12", pair[0]) + _text(b"\x1a", pair[1])
        # Fields 6-10: state, attempt, max_attempts, priority, retry_backoff.
        attempt = r[7]
        numbers = (r[6], attempt, r[8], r[9], r[10], r[11], r[12])
        middle = middles.get(numbers)
        if middle is None:
            backoff = b"\x0a" + _duration(r[10]) + b"\x12" + _duration(r[11])
            if r[12]:
                backoff += b"\x19" + _DOUBLE(r[12])
            middle = middles[numbers] = b"".join(
                (
                    state,
                    b"\x38" + _varint(attempt) if attempt else b"",
                    b"\x40" + _varint(r[8]) if r[8] else b"",
                    b"\x48" + _varint(r[9]) if r[9] else b"",
                    b"\x52" + _length(len(backoff)) + backoff,
                )
            )
        # Fields 11-14: the instants.
        stamps = []
        for tag, us in ((b"\x5a", r[13]), (b"\x62", r[14]), (b"\x6a", r[15]), (b"\x72", finished)):
            if us is not None:
                encoded = instants.get(us)
                if encoded is None:
                    encoded = instants[us] = _timestamp(us)
                stamps.append(tag)
                stamps.append(encoded)
        # Task fields 17-18 and Lease fields 4-5: worker and lease deadline.
        owner = (r[22], r[23])
        shared = leases.get(owner)
        if shared is None:
            until = _timestamp(owner[1])
            shared = leases[owner] = (
                _text(b"\x8a\x01", owner[0]) + b"\x92\x01" + until,
                _text(b"\x22", owner[0]) + b"\x2a" + until,
                from_us(owner[1]),
            )
        task_id = _text(b"\x0a", r[1])
        payload = r[4]
        task = b"".join(
            (
                task_id,
                head,
                b"\x22" + _length(len(payload)) + payload if payload else b"",
                _text(b"\x2a", r[5]),
                middle,
                *stamps,
                _text(b"\x7a", r[17]),
                shared[0],
            )
        )
        token = r[24]
        lease = b"".join(
            (
                task_id,
                b"\x10" + _varint(attempt) if attempt else b"",
                _text(b"\x1a", token),
                shared[1],
            )
        )
        append(Push(task, lease, r[1], attempt, token, shared[2], len(payload) if payload else 0))
    return pushes
