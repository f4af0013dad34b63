"""Hypothesis strategies of wire messages: any generated message class filled field by
field (unknown fields included), the durations each codec accepts, and the tasks of
the Work stream's hot path."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import betterproto2
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import (
    Task,
)

UTC_DATETIMES = st.datetimes(timezones=st.just(UTC))


# Offsets away from the ends of datetime's range (astimezone would overflow).
OFFSET_DATETIMES = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
        lambda minutes: timezone(timedelta(minutes=minutes))
    ),
)


DATETIMES = st.one_of(
    UTC_DATETIMES,
    OFFSET_DATETIMES,
    st.sampled_from(
        [
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime(1, 1, 1, tzinfo=UTC),
            datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        ]
    ),
)


#: Every timedelta: what our encoder must get right.
DURATIONS = st.one_of(
    st.timedeltas(),
    st.sampled_from([timedelta(microseconds=-1), timedelta(seconds=-1, microseconds=1)]),
    st.just(timedelta.max),
    st.just(timedelta.min),
)


#: Where betterproto2's own ``bytes()`` is right: it encodes a negative
#: fractional Duration with the wrong sign and rounds past 2**53 µs. Not pinned.
BETTERPROTO_DURATIONS = st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=100_000))


_INTS: dict[str, tuple[int, int]] = {
    "int32": (-(2**31), 2**31 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "sint64": (-(2**63), 2**63 - 1),
    "sfixed64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "fixed32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
    "fixed64": (0, 2**64 - 1),
}


def _scalar(proto_type: str, cls: Any, *, nan: bool = True) -> st.SearchStrategy[Any]:
    if proto_type in _INTS:
        low, high = _INTS[proto_type]
        return st.integers(low, high)
    if proto_type == "enum":
        # Unknown values too: a newer peer's members.
        return st.one_of(st.sampled_from(list(cls)), st.integers(-(2**31), 2**31 - 1).map(cls))
    if proto_type == "bool":
        return st.booleans()
    if proto_type == "double":
        return st.floats(allow_nan=nan)
    if proto_type == "float":
        return st.floats(width=32, allow_nan=nan)
    if proto_type == "string":
        return st.text(st.characters(codec="utf-8"), max_size=20)
    if proto_type == "bytes":
        return st.binary(max_size=40)
    raise AssertionError(f"no strategy for {proto_type}")  # pragma: no cover


@st.composite
def unknown_fields(draw: st.DrawFn, numbers: frozenset[int]) -> bytes:
    """Well-formed fields of numbers the message does not use."""
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        number = draw(st.integers(1, 2**29 - 1).filter(lambda n: n not in numbers))
        wire_type = draw(st.sampled_from([0, 1, 2, 5]))
        out += betterproto2.encode_varint(number << 3 | wire_type)
        if wire_type == 0:
            out += betterproto2.encode_varint(draw(st.integers(0, 2**64 - 1)))
        elif wire_type == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire_type == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            data = draw(st.binary(max_size=10))
            out += betterproto2.encode_varint(len(data)) + data
    return out


def message_fields(
    cls: type[betterproto2.Message],
) -> Iterator[tuple[str, betterproto2.FieldMetadata]]:
    meta = cast(Any, cls)._betterproto
    yield from meta.meta_by_field_name.items()


def _value(
    cls: type[betterproto2.Message],
    name: str,
    meta: betterproto2.FieldMetadata,
    durations: st.SearchStrategy[timedelta],
    depth: int,
    nan: bool,
) -> st.SearchStrategy[Any]:
    field_cls = cast(Any, cls)._betterproto.cls_by_field[name]
    if meta.proto_type == "map":
        assert meta.map_meta is not None
        key_meta, value_meta = meta.map_meta
        key_cls, value_cls = cls._type_hints()[name].__args__
        keys = _scalar(key_meta.proto_type, key_cls, nan=False)
        if value_meta.proto_type == "message":
            values = messages(value_cls, durations, depth + 1, nan=nan)
        else:
            values = _scalar(value_meta.proto_type, value_cls, nan=False)
        return st.dictionaries(keys, values, max_size=3)
    if meta.proto_type == "message":
        if meta.unwrap is not None:
            wrapper = meta.unwrap()
            if wrapper.__name__ == "Timestamp":
                one: st.SearchStrategy[Any] = DATETIMES
            elif wrapper.__name__ == "Duration":
                one = durations
            else:  # pragma: no cover - no other wrapper in the contract yet
                one = messages(wrapper, durations, depth + 1, nan=nan).map(lambda m: m.to_wrapped())
        else:
            one = messages(field_cls, durations, depth + 1, nan=nan)
    else:
        one = _scalar(meta.proto_type, field_cls, nan=nan and not meta.repeated)
    if meta.repeated:
        return st.lists(one, max_size=3)
    return one


_MAX_DEPTH = 4


def messages(
    cls: type[betterproto2.Message],
    durations: st.SearchStrategy[timedelta] = DURATIONS,
    depth: int = 0,
    *,
    nan: bool = True,
) -> st.SearchStrategy[Any]:
    """Any message of ``cls``: every field drawn from its proto type, at most one
    member per oneof, unknown fields at every level (NaN where ``nan``: the
    generated messages count NaN equal to itself, the SDK's models do not)."""
    plain: dict[str, st.SearchStrategy[Any]] = {}
    groups: dict[str, list[tuple[str, st.SearchStrategy[Any]]]] = {}
    for name, meta in message_fields(cls):
        if depth >= _MAX_DEPTH and meta.proto_type == "message" and not meta.repeated:
            continue  # recursion guard (optional fields stay None)
        value = _value(cls, name, meta, durations, depth, nan)
        if meta.group:
            groups.setdefault(meta.group, []).append((name, value))
        elif meta.optional or (meta.proto_type == "message" and not meta.repeated):
            plain[name] = st.none() | value
        else:
            plain[name] = value
    members = [
        st.one_of(st.just({}), *(value.map(lambda v, n=name: {n: v}) for name, value in choices))
        for choices in groups.values()
    ]
    numbers = frozenset(meta.number for _, meta in message_fields(cls))

    def build(parts: tuple[dict[str, Any], list[dict[str, Any]], bytes]) -> Any:
        kwargs, chosen, unknown = parts
        for member in chosen:
            kwargs.update(member)
        message = cls(**kwargs)
        message._unknown_fields = unknown
        return message

    return st.tuples(
        st.fixed_dictionaries(plain), st.tuples(*members).map(list), unknown_fields(numbers)
    ).map(build)


def hot_task(task: Task) -> Task:
    """What a push carries: no progress, no result, no history, no unknown
    fields."""
    task.progress = None
    task.result = None
    task.history = []
    task._unknown_fields = b""
    if task.retry_backoff is not None:
        task.retry_backoff._unknown_fields = b""
    return task


def outcome(decoder: Any, data: bytes) -> Any:
    """What ``decoder`` makes of ``data``: its result, or the type and text of
    what it raised (so a hand-unrolled decoder and the generic one compare
    equal on bad input too)."""
    try:
        return decoder(data)
    except Exception as exc:
        return (type(exc), str(exc))


# What matters to the wire format: zero, each wire type's key for fields 1-3,
# a varint's continuation bit, the largest byte.
_EDIT_BYTES = (0x00, 0x01, 0x02, 0x05, 0x08, 0x0A, 0x10, 0x12, 0x1A, 0x7F, 0x80, 0xFF)


def edits(data: bytes) -> list[bytes]:
    """A fault at every point of an encoding, not where a random draw lands:
    every cut, every byte dropped, every byte replaced by or preceded by each
    byte that matters to the wire format."""
    out = [data[:i] for i in range(len(data))]
    for i in range(len(data)):
        out.append(data[:i] + data[i + 1 :])
        for byte in _EDIT_BYTES:
            out.append(data[:i] + bytes((byte,)) + data[i + 1 :])
            out.append(data[:i] + bytes((byte,)) + data[i:])
    return out
