"""One protobuf codec for the SDK and the daemon, built from betterproto2's metadata.

This module does one thing: encode and decode any generated message by a
table compiled from its class. The wire format's primitives (varints,
lengths, Timestamps, Durations, `WireError`) are `.primitives`; frames by
name, some hand-unrolled, are `.work`.

Theory of operation
-------------------
betterproto2 generates the dataclasses (the contract is the ``.proto``), but
its own ``bytes()``/``parse`` are slow (~150 µs for a pushed task: a
``BytesIO`` per varint, a defaults check under ``warnings.catch_warnings``
per field) and lenient (a truncated varint or a length past the end is
silently dropped, a numeric field sent length-delimited becomes a list). So
this module compiles, once per message class, a table from the class's
``FieldMetadata`` — field number, proto type, repeated/optional/oneof/map,
the nested class, the Timestamp/Duration/wrapper ``unwrap`` — and walks it:

* `decode` is strict: every malformed input — a truncated varint or field,
  a varint over 10 bytes, field number 0 or past 2**29 - 1, a group or
  reserved wire type, a known field with the wrong wire type, invalid
  UTF-8, a packed run of the wrong size, a Timestamp or Duration outside
  ``datetime``'s range — raises one `WireError` (a `ValueError`) naming the
  field path (``tasks[0].retry_backoff.initial: truncated varint``).
  Unknown fields are checked structurally, skipped and kept in
  ``_unknown_fields`` (that is how a newer peer stays compatible).
  Everything else gives the dataclass betterproto2's ``parse`` gives for
  the same bytes, and the message Google's ``protobuf`` reads from them
  (tests/wire/test_against_protobuf.py), except where a guess would be
  acted on: two members of one oneof (protobuf keeps the last, betterproto2
  both) and a message field sent twice (protobuf merges the two,
  betterproto2 keeps the last) are refused.
* `encode` gives a canonical proto3 encoding betterproto2 parses back to an
  equal message: implicit-presence fields at their zero value are left out,
  ``optional``/oneof/message fields are written whenever set, repeated
  scalars are packed, map entries carry key and value, a message's
  ``_unknown_fields`` follow its known fields; an integer past 64 bits
  either way is a ``ValueError``, not a varint no decoder reads. Unlike
  betterproto2 it encodes a negative fractional ``Duration`` with the right
  sign.

Values are built without the dataclass ``__init__`` (a fresh ``__dict__``
from the class's defaults), which is most of the gain on decode. The module
is pure: no I/O; its only state is the per-class tables, built on first use
under a lock (the bounded memos of Timestamps and Durations are `.primitives`').
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Final, TypeVar, cast, get_type_hints

import betterproto2

from .primitives import (
    FIXED32,
    FIXED64,
    LEN,
    SMALL,
    VARINT,
    WireError,
    field_key,
    put_len,
    read_duration,
    read_len,
    read_timestamp,
    read_varint,
    skip,
    varint,
    varint_tail,
    write_duration,
    write_timestamp,
)

__all__ = ["WireError", "build", "decode", "encode", "message_classes"]

M = TypeVar("M", bound=betterproto2.Message)

_M32: Final = (1 << 32) - 1
_M64: Final = (1 << 64) - 1
_new = object.__new__
_setattr = object.__setattr__


# -- value readers and writers -------------------------------------------------------
# The codec's table entries: a reader takes (buf, pos, end, arg) and returns
# (value, next position); a writer appends (value, arg) to a bytearray.


def _r_uint64(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    return value & _M64, pos


def _r_uint32(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    return value & _M32, pos


def _r_int64(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    value &= _M64
    return (value - (1 << 64) if value >> 63 else value), pos


def _r_int32(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    value &= _M32
    return (value - (1 << 32) if value >> 31 else value), pos


def _r_sint64(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    value &= _M64
    return (value >> 1) ^ -(value & 1), pos


def _r_sint32(buf: bytes, pos: int, end: int, arg: Any) -> tuple[int, int]:
    value, pos = read_varint(buf, pos, end)
    value &= _M32
    return (value >> 1) ^ -(value & 1), pos


def _r_bool(buf: bytes, pos: int, end: int, arg: Any) -> tuple[bool, int]:
    value, pos = read_varint(buf, pos, end)
    return value != 0, pos


def _r_enum(buf: bytes, pos: int, end: int, arg: Any) -> tuple[Any, int]:
    """``arg``: (members by value, enum class). Unknown values become the
    class's nameless pseudo-members, as betterproto2 makes them."""
    value, pos = _r_int32(buf, pos, end, None)
    member = arg[0].get(value)
    return (arg[1](value) if member is None else member), pos


def _fixed_reader(fmt: str) -> Callable[[bytes, int, int, Any], tuple[Any, int]]:
    codec = struct.Struct(fmt)
    size = codec.size
    unpack = codec.unpack_from

    def read(buf: bytes, pos: int, end: int, arg: Any) -> tuple[Any, int]:
        stop = pos + size
        if stop > end:
            raise WireError("truncated field")
        return unpack(buf, pos)[0], stop

    return read


def _r_string(buf: bytes, pos: int, end: int, arg: Any) -> tuple[str, int]:
    if pos < end and buf[pos] < 0x80:  # `read_len`, inline for short strings
        start = pos + 1
        stop = start + buf[pos]
        if stop > end:
            raise WireError("truncated field")
    else:
        start, stop = read_len(buf, pos, end)
    try:
        return buf[start:stop].decode(), stop
    except UnicodeDecodeError:
        raise WireError("string is not valid UTF-8") from None


def _r_bytes(buf: bytes, pos: int, end: int, arg: Any) -> tuple[bytes, int]:
    start, stop = read_len(buf, pos, end)
    return buf[start:stop], stop


def _r_message(buf: bytes, pos: int, end: int, arg: Any) -> tuple[Any, int]:
    start, stop = read_len(buf, pos, end)
    return _decode_fields(arg, buf, start, stop), stop


def _r_wrapped(buf: bytes, pos: int, end: int, arg: Any) -> tuple[Any, int]:
    """A wrapper type other than Timestamp/Duration: the message's ``to_wrapped``."""
    start, stop = read_len(buf, pos, end)
    return _decode_fields(arg, buf, start, stop).to_wrapped(), stop


# -- primitive writers ---------------------------------------------------------------


def _w_varint(out: bytearray, value: int, arg: Any) -> None:
    out += SMALL[value] if 0 <= value < 0x80 else varint(value)


def _w_bool(out: bytearray, value: bool, arg: Any) -> None:
    out += b"\x01" if value else b"\x00"


def _w_sint(out: bytearray, value: int, arg: Any) -> None:
    out += varint((value << 1) ^ (value >> 63) if value < 0 else value << 1)


def _fixed_writer(fmt: str) -> Callable[[bytearray, Any, Any], None]:
    pack = struct.Struct(fmt).pack

    def write(out: bytearray, value: Any, arg: Any) -> None:
        out += pack(value)

    return write


# The three writers below inline `put_len`: they run for most fields of a task.


def _w_string(out: bytearray, value: str, arg: Any) -> None:
    data = value.encode()
    size = len(data)
    out += SMALL[size] if size < 0x80 else varint(size)
    out += data


def _w_bytes(out: bytearray, value: bytes, arg: Any) -> None:
    size = len(value)
    out += SMALL[size] if size < 0x80 else varint(size)
    out += value


def _w_message(out: bytearray, value: Any, arg: Any) -> None:
    body = _encode_fields(arg, value)
    size = len(body)
    out += SMALL[size] if size < 0x80 else varint(size)
    out += body


def _w_wrapped(out: bytearray, value: Any, arg: Any) -> None:
    plan, wrapper = arg
    put_len(out, _encode_fields(plan, wrapper.from_wrapped(value)))


# -- the tables ----------------------------------------------------------------------

_FIXED_FORMATS: Final = {
    "double": "<d",
    "float": "<f",
    "fixed32": "<I",
    "fixed64": "<Q",
    "sfixed32": "<i",
    "sfixed64": "<q",
}
_SCALAR_READERS: Final[dict[str, Callable[[bytes, int, int, Any], tuple[Any, int]]]] = {
    "int32": _r_int32,
    "int64": _r_int64,
    "uint32": _r_uint32,
    "uint64": _r_uint64,
    "sint32": _r_sint32,
    "sint64": _r_sint64,
    "bool": _r_bool,
    "enum": _r_enum,
    "string": _r_string,
    "bytes": _r_bytes,
    **{name: _fixed_reader(fmt) for name, fmt in _FIXED_FORMATS.items()},
}
_SCALAR_WRITERS: Final[dict[str, Callable[[bytearray, Any, Any], None]]] = {
    "int32": _w_varint,
    "int64": _w_varint,
    "uint32": _w_varint,
    "uint64": _w_varint,
    "enum": _w_varint,
    "sint32": _w_sint,
    "sint64": _w_sint,
    "bool": _w_bool,
    "string": _w_string,
    "bytes": _w_bytes,
    **{name: _fixed_writer(fmt) for name, fmt in _FIXED_FORMATS.items()},
}
_WIRE_TYPES: Final = {
    **dict.fromkeys(("int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool"), VARINT),
    "enum": VARINT,
    **dict.fromkeys(("fixed64", "sfixed64", "double"), FIXED64),
    **dict.fromkeys(("fixed32", "sfixed32", "float"), FIXED32),
    **dict.fromkeys(("string", "bytes", "message", "map"), LEN),
}
_DEFAULTS: Final[dict[str, Any]] = {
    **dict.fromkeys(
        ("int32", "int64", "uint32", "uint64", "sint32", "sint64"),
        0,
    ),
    **dict.fromkeys(("fixed32", "fixed64", "sfixed32", "sfixed64"), 0),
    "bool": False,
    "double": 0.0,
    "float": 0.0,
    "string": "",
    "bytes": b"",
    "message": None,
}

# How a decoded value lands in the message.
_SET, _APPEND, _EXTEND, _MAP, _ONEOF, _MESSAGE = range(6)


class _Plan:
    """A message class's decode and encode tables."""

    __slots__ = ("cls", "containers", "defaults", "encoders", "fields", "known", "oneofs")

    cls: type[betterproto2.Message]
    #: wire key (number << 3 | wire type) -> (name, mode, reader, arg)
    fields: dict[int, tuple[str, int, Callable[[bytes, int, int, Any], tuple[Any, int]], Any]]
    #: field number -> (name, proto type), for wrong-wire-type refusals
    known: dict[int, tuple[str, str]]
    #: the immutable defaults of a fresh instance
    defaults: dict[str, Any]
    #: repeated and map fields: each decoded instance gets its own
    containers: tuple[tuple[str, type], ...]
    #: oneof member -> (its group, the other members, whether it is a message)
    oneofs: dict[str, tuple[str, tuple[str, ...], bool]]
    #: in field-number order: (name, tag, writer, arg, mode); mode is
    #: 0 = implicit presence (skip falsy), 1 = explicit (skip None),
    #: 2 = repeated one by one, 3 = packed, 4 = map (arg: entry writers)
    encoders: tuple[tuple[str, bytes, Callable[[bytearray, Any, Any], None], Any, int], ...]


_plans: dict[type[betterproto2.Message], _Plan] = {}
# Plans being built (a message may nest itself, so a plan is referenced before
# it is complete); published to `_plans` together once the outermost is done,
# under the lock, so another thread never sees half a table.
_building: dict[type[betterproto2.Message], _Plan] = {}
_lock = threading.RLock()


def _plan(cls: type[betterproto2.Message]) -> _Plan:
    plan = _plans.get(cls)
    if plan is not None:
        return plan
    with _lock:
        plan = _plans.get(cls) or _building.get(cls)
        if plan is not None:
            return plan
        outermost = not _building
        plan = _building[cls] = _Plan()
        try:
            _build(plan, cls)
            if outermost:
                _plans.update(_building)
        finally:
            if outermost:
                _building.clear()
    return plan


def _is_well_known(cls: type, name: str) -> bool:
    return cls.__name__ == name and cls.__module__.endswith("google.protobuf")


def _value_codec(
    proto_type: str, unwrap: Callable[[], type] | None, cls: Any
) -> tuple[Callable[..., Any], Callable[..., Any], Any]:
    """(reader, writer, arg) of one value of a field."""
    if proto_type == "message":
        if unwrap is not None:
            wrapper = unwrap()
            if _is_well_known(wrapper, "Timestamp"):
                return read_timestamp, write_timestamp, None
            if _is_well_known(wrapper, "Duration"):
                return read_duration, write_duration, None
            sub = _plan(wrapper)
            return _r_wrapped, _w_wrapped, (sub, wrapper)
        sub = _plan(cls)
        return _r_message, _w_message, sub
    if proto_type == "enum":
        return _r_enum, _w_varint, ({int(member): member for member in cls}, cls)
    return _SCALAR_READERS[proto_type], _SCALAR_WRITERS[proto_type], None


def _inner(hint: Any) -> Any:
    """The class a field's annotation names: ``X`` of ``X``, ``X | None``, ``list[X]``."""
    args = getattr(hint, "__args__", None)
    return args[0] if args else hint


def _build(plan: _Plan, cls: type[betterproto2.Message]) -> None:
    # The dataclass fields and one get_type_hints per class: betterproto2's own
    # metadata (`cls._betterproto`) resolves the hints once per field, which
    # made building the Work stream's tables cost ~20 ms at a worker's start.
    hints = get_type_hints(cls, vars(sys.modules[cls.__module__]))
    metas: dict[str, betterproto2.FieldMetadata] = {
        field.name: field.metadata["betterproto"] for field in dataclasses.fields(cast(Any, cls))
    }
    groups: dict[str, list[str]] = {}
    for name, meta in metas.items():
        if meta.group:
            groups.setdefault(meta.group, []).append(name)
    plan.cls = cls
    plan.fields = {}
    plan.known = {}
    plan.defaults = {"_unknown_fields": b""}
    plan.oneofs = {}
    containers: list[tuple[str, type]] = []
    encoders = []
    for name, meta in sorted(metas.items(), key=lambda item: item[1].number):
        number, proto_type = meta.number, meta.proto_type
        wire_type = _WIRE_TYPES[proto_type]
        plan.known[number] = (name, proto_type)
        if proto_type == "map":
            assert meta.map_meta is not None
            key_meta, value_meta = meta.map_meta
            key_hint, value_hint = hints[name].__args__
            value_type = value_meta.proto_type
            key_codec = _value_codec(key_meta.proto_type, None, key_hint)
            value_codec = _value_codec(value_type, value_meta.unwrap, value_hint)
            value_default: Callable[[], Any]
            if value_type == "enum":
                value_default = partial(value_hint, 0)
            elif value_type == "message":
                # An entry without its value holds the empty message.
                value_default = partial(_empty_value, value_codec[0], value_codec[2])
            else:
                value_default = partial(_same, _DEFAULTS[value_type])
            entry = _Entry(
                (*key_codec, _WIRE_TYPES[key_meta.proto_type]),
                (*value_codec, _WIRE_TYPES[value_type]),
                _DEFAULTS[key_meta.proto_type],
                value_default,
                value_type == "message",
            )
            plan.fields[number << 3 | LEN] = (name, _MAP, _r_map_entry, entry)
            containers.append((name, dict))
            encoders.append((name, field_key(number, LEN), _w_varint, entry, 4))
            continue
        field_cls = _inner(hints[name])
        reader, writer, arg = _value_codec(proto_type, meta.unwrap, field_cls)
        if meta.repeated:
            containers.append((name, list))
            plan.fields[number << 3 | wire_type] = (name, _APPEND, reader, arg)
            if wire_type != LEN:
                plan.fields[number << 3 | LEN] = (name, _EXTEND, _packed(reader), arg)
                encoders.append((name, field_key(number, LEN), writer, arg, 3))
            else:
                encoders.append((name, field_key(number, wire_type), writer, arg, 2))
            continue
        mode = _MESSAGE if proto_type == "message" else _SET
        if meta.group:
            mode = _ONEOF
            plan.oneofs[name] = (
                meta.group,
                tuple(sorted(other for other in groups[meta.group] if other != name)),
                proto_type == "message",
            )
        plan.fields[number << 3 | wire_type] = (name, mode, reader, arg)
        explicit = bool(meta.optional or meta.group) or proto_type == "message"
        if explicit:
            default = None
        elif proto_type == "enum":
            default = field_cls(0)
        else:
            default = _DEFAULTS[proto_type]
        plan.defaults[name] = default
        encoders.append((name, field_key(number, wire_type), writer, arg, 1 if explicit else 0))
    plan.containers = tuple(containers)
    plan.encoders = tuple(encoders)


def _same(value: Any) -> Any:
    return value


def _empty_value(read: Callable[..., tuple[Any, int]], arg: Any) -> Any:
    """What ``read`` makes of a zero-length message."""
    return read(b"\x00", 0, 1, arg)[0]


def _packed(
    reader: Callable[[bytes, int, int, Any], tuple[Any, int]],
) -> Callable[[bytes, int, int, Any], tuple[list[Any], int]]:
    def read(buf: bytes, pos: int, end: int, arg: Any) -> tuple[list[Any], int]:
        start, stop = read_len(buf, pos, end)
        values = []
        while start < stop:
            value, start = reader(buf, start, stop, arg)
            values.append(value)
        return values, stop

    return read


class _Entry:
    """How a map field's entries are read and written."""

    __slots__ = (
        "key",
        "key_default",
        "key_tag",
        "value",
        "value_default",
        "value_is_message",
        "value_tag",
    )

    def __init__(
        self,
        key: tuple[Callable[..., Any], Callable[..., Any], Any, int],
        value: tuple[Callable[..., Any], Callable[..., Any], Any, int],
        key_default: Any,
        value_default: Callable[[], Any],
        value_is_message: bool,
    ) -> None:
        self.key = key
        self.value = value
        self.key_default = key_default
        self.value_default = value_default
        self.value_is_message = value_is_message
        self.key_tag = field_key(1, key[3])
        self.value_tag = field_key(2, value[3])


def _r_map_entry(buf: bytes, pos: int, end: int, entry: _Entry) -> tuple[tuple[Any, Any], int]:
    key_read, _, key_arg, key_wire = entry.key
    value_read, _, value_arg, value_wire = entry.value
    key = entry.key_default
    value = entry.value_default()
    value_seen = False
    start, stop = read_len(buf, pos, end)
    pos = start
    while pos < stop:
        tag = buf[pos]
        pos += 1
        if tag > 0x7F:
            tag, pos = varint_tail(buf, pos, stop, tag)
        try:
            if tag == 8 | key_wire:
                key, pos = key_read(buf, pos, stop, key_arg)
            elif tag == 16 | value_wire:
                if value_seen and entry.value_is_message:
                    raise _sent_twice()
                value, pos = value_read(buf, pos, stop, value_arg)
                value_seen = True
            else:
                pos = skip(buf, pos, stop, tag, _ENTRY_FIELDS)
        except WireError as error:
            if tag in (8 | key_wire, 16 | value_wire):
                error.parts.append("key" if tag >> 3 == 1 else "value")
            raise
    return (key, value), stop


_ENTRY_FIELDS: Final = {1: ("key", "map key"), 2: ("value", "map value")}


def _sent_twice(*path: str) -> WireError:
    # Protobuf merges a singular message field that comes twice; betterproto2
    # keeps the last. No encoder sends one twice, and a merged Timestamp or
    # Duration (seconds from one, nanos from the other) is not a value worth
    # guessing at, so the frame is refused naming the field.
    error = WireError("message field sent twice")
    error.parts.extend(path)
    return error


# -- decoding ------------------------------------------------------------------------


def _decode_fields(plan: _Plan, buf: bytes, pos: int, end: int) -> Any:
    values = plan.defaults.copy()
    for name, factory in plan.containers:
        values[name] = factory()
    fields = plan.fields
    unknown: bytearray | None = None
    while pos < end:
        start = pos
        key = buf[pos]
        pos += 1
        if key > 0x7F:
            key, pos = varint_tail(buf, pos, end, key)
        field = fields.get(key)
        if field is None:
            pos = skip(buf, pos, end, key, plan.known)
            if unknown is None:
                unknown = bytearray()
            unknown += buf[start:pos]
            continue
        name, mode, reader, arg = field
        try:
            value, pos = reader(buf, pos, end, arg)
        except WireError as error:
            if mode in (_APPEND, _EXTEND, _MAP):
                error.parts.append(f"{name}[{len(values[name])}]")
            else:
                error.parts.append(name)
            raise
        if mode == _SET:
            values[name] = value
        elif mode == _APPEND:
            values[name].append(value)
        elif mode == _MESSAGE:
            if values[name] is not None:
                raise _sent_twice(name)
            values[name] = value
        elif mode == _ONEOF:
            group, others, is_message = plan.oneofs[name]
            if is_message and values[name] is not None:
                raise _sent_twice(name)
            for other in others:
                if values[other] is not None:
                    # Protobuf would keep the last member; a request naming two
                    # commands (or two lookups) is refused instead of guessed at.
                    twice = WireError(f"more than one of {', '.join(sorted((name, *others)))}")
                    twice.parts.append(group)
                    raise twice
            values[name] = value
        elif mode == _EXTEND:
            values[name].extend(value)
        else:
            values[name][value[0]] = value[1]
    if unknown is not None:
        values["_unknown_fields"] = bytes(unknown)
    message = _new(plan.cls)
    _setattr(message, "__dict__", values)
    return message


def decode(data: bytes | bytearray | memoryview, cls: type[M]) -> M:
    """The ``cls`` message encoded in ``data``; `WireError` if it is not one."""
    buf = data if type(data) is bytes else bytes(data)
    result: M = _decode_fields(_plan(cls), buf, 0, len(buf))
    return result


# -- encoding ------------------------------------------------------------------------


def _encode_fields(plan: _Plan, message: Any) -> bytearray:
    out = bytearray()
    values = message.__dict__
    for name, tag, write, arg, mode in plan.encoders:
        value = values[name]
        if mode == 0:
            if not value:
                continue
        elif mode == 1:
            if value is None:
                continue
        elif not value:
            continue
        elif mode == 2:
            for item in value:
                out += tag
                write(out, item, arg)
            continue
        elif mode == 3:
            body = bytearray()
            for item in value:
                write(body, item, arg)
            out += tag
            put_len(out, body)
            continue
        else:
            _, key_write, key_arg, _ = arg.key
            _, value_write, value_arg, _ = arg.value
            key_tag = arg.key_tag
            value_tag = arg.value_tag
            for key, item in value.items():
                entry = bytearray(key_tag)
                key_write(entry, key, key_arg)
                entry += value_tag
                value_write(entry, item, value_arg)
                out += tag
                put_len(out, entry)
            continue
        out += tag
        write(out, value, arg)
    out += message._unknown_fields
    return out


def encode(message: betterproto2.Message) -> bytes:
    """The protobuf encoding of ``message`` (see the module docstring)."""
    return bytes(_encode_fields(_plan(type(message)), message))


def build(cls: type[M], /, **fields: Any) -> M:
    """``cls(**fields)`` without the dataclass ``__init__`` (a default factory
    call per field): the hot frames are built per task. Unknown names raise
    TypeError, as ``cls(...)`` would."""
    plan = _plan(cls)
    values = plan.defaults.copy()
    for name, factory in plan.containers:
        values[name] = factory()
    for name, value in fields.items():
        if name not in values or name == "_unknown_fields":
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        values[name] = value
    message: M = _new(cls)
    _setattr(message, "__dict__", values)
    return message


def message_classes(module: Any) -> Iterable[type[betterproto2.Message]]:
    """Every message class a generated module defines, in name order."""
    for name in sorted(vars(module)):
        value = getattr(module, name)
        if (
            isinstance(value, type)
            and issubclass(value, betterproto2.Message)
            and value.__module__ == module.__name__
        ):
            yield value
