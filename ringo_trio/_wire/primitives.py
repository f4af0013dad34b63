"""The low-level pieces of the protobuf wire format, shared by the generic
codec (`.codec`) and the hand-unrolled hot paths.

Readers take ``(buf, pos, end)`` (the value readers also the codec's table
argument, ignored here) and return ``(value, next position)``; every
malformed input raises `WireError`. Writers append to a ``bytearray`` or
return ``bytes``. Timestamps and Durations are memoised by their bytes
(decoding) and by their value (encoding): a task's moments coincide, and a
queue's retry policy is a handful of values.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

__all__ = [
    "LEN",
    "SMALL",
    "WireError",
    "read_duration",
    "read_len",
    "read_seconds_nanos",
    "read_timestamp",
    "read_varint",
    "seconds_nanos_body",
    "skip",
    "field_key",
    "tag_len",
    "varint",
    "varint_tail",
    "write_duration",
    "write_timestamp",
]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
"""The wire types this codec reads and writes."""
_M32: Final = (1 << 32) - 1
_M64: Final = (1 << 64) - 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)
SMALL: Final[tuple[bytes, ...]] = tuple(bytes((i,)) for i in range(128))
"""``varint(i)`` for i < 128, without a call."""


class WireError(ValueError):
    """The bytes are not a valid encoding of the expected message.

    ``str()`` is ``"<field path>: <reason>"`` (``message`` when the message's
    own framing is broken); the path is built while the
    error travels out of the nested decoders (``parts``, innermost first).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.parts: list[str] = []

    @property
    def path(self) -> str:
        return ".".join(reversed(self.parts))

    def __str__(self) -> str:
        return f"{self.path or 'message'}: {self.reason}"


# -- primitive readers ---------------------------------------------------------------
# Each reader takes (buf, pos, end, arg) and returns (value, next position).


def varint_tail(buf: bytes, pos: int, end: int, first: int) -> tuple[int, int]:
    """Finish a varint whose first byte ``first`` (>= 0x80) sat at ``pos - 1``."""
    result = first & 0x7F
    shift = 7
    while True:
        if pos >= end:
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos >= end:
        raise WireError("truncated varint")
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    return varint_tail(buf, pos + 1, end, byte)


def read_len(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, stop) of the length-delimited value whose length is at ``pos``."""
    if pos >= end:
        raise WireError("truncated field")
    size = buf[pos]
    pos += 1
    if size > 0x7F:
        size, pos = varint_tail(buf, pos, end, size)
    stop = pos + size
    if stop > end:
        raise WireError("truncated field")
    return pos, stop


def read_seconds_nanos(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(seconds as int64, nanos as int32) of the Timestamp/Duration body buf[pos:end]."""
    seconds = nanos = 0
    while pos < end:
        key = buf[pos]
        pos += 1
        if key == 0x08 or key == 0x10:
            # The varint, inline: this is the innermost loop of every task.
            if pos >= end:
                raise WireError("truncated varint")
            byte = buf[pos]
            pos += 1
            value = byte & 0x7F
            shift = 7
            while byte > 0x7F:
                if shift >= 70:  # before the cut: `varint_tail` says the same
                    raise WireError("varint longer than 10 bytes")
                if pos >= end:
                    raise WireError("truncated varint")
                byte = buf[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                shift += 7
            if key == 0x08:
                seconds = value
            else:
                nanos = value
        else:
            if key > 0x7F:
                key, pos = varint_tail(buf, pos, end, key)
            pos = skip(buf, pos, end, key, _SECONDS_NANOS)
    if seconds > 0x7FFFFFFFFFFFFFFF:
        seconds &= _M64
        seconds = seconds - (1 << 64) if seconds >> 63 else seconds
    if nanos > 0x7FFFFFFF:
        nanos &= _M32
        nanos = nanos - (1 << 32) if nanos >> 31 else nanos
    return seconds, nanos


# Decoded Timestamps by their exact bytes: a task's timestamps often coincide
# (created == available, lease_until == the lease's until) and datetimes are
# immutable, so sharing one never changes a result. Bounded by clearing.
_TIMESTAMPS: dict[bytes, datetime] = {}
_TIMESTAMP_MEMO_SIZE: Final = 1024


def read_timestamp(buf: bytes, pos: int, end: int, arg: Any) -> tuple[datetime, int]:
    start, stop = read_len(buf, pos, end)
    body = buf[start:stop]
    moment = _TIMESTAMPS.get(body)
    if moment is not None:
        return moment, stop
    seconds, nanos = read_seconds_nanos(buf, start, stop)
    try:
        # Timestamp.to_datetime: whole microseconds, rounded down.
        moment = _EPOCH + timedelta(0, seconds, nanos // 1000)
    except OverflowError:
        raise WireError(f"Timestamp {seconds}s {nanos}ns is outside datetime's range") from None
    if len(_TIMESTAMPS) >= _TIMESTAMP_MEMO_SIZE:
        _TIMESTAMPS.clear()
    _TIMESTAMPS[body] = moment
    return moment, stop


# Decoded Durations by their bytes: a queue's retry policy is a handful of values.
_DURATIONS: dict[bytes, timedelta] = {}


def read_duration(buf: bytes, pos: int, end: int, arg: Any) -> tuple[timedelta, int]:
    start, stop = read_len(buf, pos, end)
    body = buf[start:stop]
    delta = _DURATIONS.get(body)
    if delta is not None:
        return delta, stop
    seconds, nanos = read_seconds_nanos(buf, start, stop)
    try:
        if nanos % 1000:
            # Duration.to_timedelta: ``microseconds=nanos / 1e3``, rounded half-even.
            delta = timedelta(seconds=seconds, microseconds=nanos / 1e3)
        else:
            delta = timedelta(0, seconds, nanos // 1000)
    except OverflowError:
        raise WireError(f"Duration {seconds}s {nanos}ns is outside timedelta's range") from None
    if len(_DURATIONS) >= _TIMESTAMP_MEMO_SIZE:
        _DURATIONS.clear()
    _DURATIONS[body] = delta
    return delta, stop


def skip(buf: bytes, pos: int, end: int, key: int, known: Any) -> int:
    """Skip an unknown field's value; refuse a known field with a wrong wire type.

    ``known`` maps the message's field numbers to their labels (the
    ``WireError`` names the field).
    """
    number = key >> 3
    wire_type = key & 7
    if number == 0:
        raise WireError("field number 0 is invalid")
    if number > _MAX_FIELD_NUMBER:
        # Known fields never get here; an unknown one past protobuf's range
        # would be kept and re-encoded as a field no peer can parse.
        raise WireError(f"field number {number} is past 2**29 - 1")
    label = known.get(number)
    if label is not None:
        name, proto_type = label
        error = WireError(
            f"unsupported wire type {wire_type}"
            if wire_type in (3, 4, 6, 7)
            else f"wire type {wire_type} does not match a {proto_type} field"
        )
        error.parts.append(name)
        raise error
    try:
        if wire_type == VARINT:
            return read_varint(buf, pos, end)[1]
        if wire_type == LEN:
            return read_len(buf, pos, end)[1]
        if wire_type == FIXED64:
            pos += 8
        elif wire_type == FIXED32:
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire_type}")
        if pos > end:
            raise WireError("truncated field")
    except WireError as error:
        error.parts.append(f"#{number}")
        raise
    return pos


_SECONDS_NANOS: Final = {1: ("seconds", "int64"), 2: ("nanos", "int32")}
_MAX_FIELD_NUMBER: Final = (1 << 29) - 1


def varint(value: int) -> bytes:
    """The varint of ``value``; negatives as their 64-bit two's complement.
    Past 64 bits either way is a ValueError: a longer varint is refused by
    every decoder, ours included."""
    if 0 <= value < 0x80:
        return SMALL[value]
    if value < 0:
        if value < -(1 << 63):
            raise ValueError(f"{value} does not fit a 64-bit varint")
        value &= _M64
    elif value > _M64:
        raise ValueError(f"{value} does not fit a 64-bit varint")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def put_len(out: bytearray, data: bytes | bytearray) -> None:
    size = len(data)
    out += SMALL[size] if size < 0x80 else varint(size)
    out += data


def seconds_nanos_body(seconds: int, nanos: int) -> bytes:
    body = b""
    if seconds:
        body = b"\x08" + varint(seconds)
    if nanos:
        body += b"\x10" + varint(nanos)
    return SMALL[len(body)] + body  # at most 2 + 10 + 10 bytes


# Encoded Timestamps by moment (equal instants encode alike, whatever their
# timezone): a task's timestamps often coincide, a batch's share the clock.
_TIMESTAMP_BYTES: dict[datetime, bytes] = {}


def write_timestamp(out: bytearray, value: datetime, arg: Any) -> None:
    encoded = _TIMESTAMP_BYTES.get(value)
    if encoded is None:
        try:
            offset = value - _EPOCH
        except TypeError:
            raise ValueError("datetime must be timezone aware") from None
        encoded = seconds_nanos_body(
            offset.days * 86400 + offset.seconds, offset.microseconds * 1000
        )
        if len(_TIMESTAMP_BYTES) >= _TIMESTAMP_MEMO_SIZE:
            _TIMESTAMP_BYTES.clear()
        _TIMESTAMP_BYTES[value] = encoded
    out += encoded


_DURATION_BYTES: dict[timedelta, bytes] = {}


def write_duration(out: bytearray, value: timedelta, arg: Any) -> None:
    encoded = _DURATION_BYTES.get(value)
    if encoded is None:
        # Seconds and nanos share the duration's sign (protobuf's rule).
        total = value // _MICROSECOND
        seconds, micros = divmod(-total if total < 0 else total, 1_000_000)
        if total < 0:
            seconds, micros = -seconds, -micros
        encoded = seconds_nanos_body(seconds, micros * 1000)
        if len(_DURATION_BYTES) >= _TIMESTAMP_MEMO_SIZE:
            _DURATION_BYTES.clear()
        _DURATION_BYTES[value] = encoded
    out += encoded


def tag_len(number: int) -> bytes:
    """The key of length-delimited field `number` (a message, bytes or string)."""
    return field_key(number, LEN)


def field_key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)
