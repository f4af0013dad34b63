"""The daemon's message codec: strict protobuf decoding and the size limit.

betterproto2's parser is lenient by design: truncated varints, lengths that
run past the end of the buffer and wire types that do not match the field
are silently dropped or coerced (a uint32 field sent as a length-delimited
run even becomes a *list*). A daemon that accepted that would act on a
request nobody sent, or crash later with a confusing INTERNAL. So every
incoming frame is first walked against the method's message schema
(`check_message`) and refused with ``INVALID_ARGUMENT`` naming the field
path when it is not a well-formed encoding of that message. Unknown fields
are checked only structurally (they are how newer clients stay compatible).

Both directions enforce ``MAX_MESSAGE_BYTES`` with ``RESOURCE_EXHAUSTED``,
the status gRPC uses for an oversized message.
"""

from __future__ import annotations

from typing import Any, cast

import betterproto2
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from ringo_trio._limits import MAX_MESSAGE_BYTES

__all__ = ["StrictCodec", "WireError", "check_message"]

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5

_VARINT_TYPES = frozenset(
    {"int32", "int64", "uint32", "uint64", "sint32", "sint64", "bool", "enum"}
)
_FIXED64_TYPES = frozenset({"fixed64", "sfixed64", "double"})
_FIXED32_TYPES = frozenset({"fixed32", "sfixed32", "float"})
_NATIVE_WIRE = {
    **dict.fromkeys(_VARINT_TYPES, _VARINT),
    **dict.fromkeys(_FIXED64_TYPES, _FIXED64),
    **dict.fromkeys(_FIXED32_TYPES, _FIXED32),
    **dict.fromkeys(("string", "bytes", "message", "map"), _LEN),
}


class WireError(ValueError):
    """The bytes are not a valid encoding of the expected message."""


def _varint(buf: bytes, pos: int, end: int, path: str) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise WireError(f"{path}: truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"{path}: varint longer than 10 bytes")


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def _check_packed(buf: bytes, start: int, end: int, proto_type: str, path: str) -> None:
    if proto_type in _VARINT_TYPES:
        pos = start
        while pos < end:
            _, pos = _varint(buf, pos, end, path)
    else:
        size = 8 if proto_type in _FIXED64_TYPES else 4
        if (end - start) % size:
            raise WireError(f"{path}: packed run is not a multiple of {size} bytes")


def _check_value(
    buf: bytes,
    start: int,
    end: int,
    meta: Any,
    message_cls: type[betterproto2.Message] | None,
    path: str,
) -> None:
    proto_type: str = meta.proto_type
    if proto_type == "string":
        try:
            buf[start:end].decode("utf-8")
        except UnicodeDecodeError:
            raise WireError(f"{path}: string is not valid UTF-8") from None
    elif proto_type == "message":
        assert message_cls is not None
        _check_message_at(buf, start, end, message_cls, path)
    elif proto_type != "bytes":
        # A length-delimited run of a numeric field: only valid packed.
        _check_packed(buf, start, end, proto_type, path)


_Schema = dict[int, tuple[str, Any, "type[betterproto2.Message] | None"]]
_schemas: dict[type[betterproto2.Message], _Schema] = {}


def _message_schema(cls: type[betterproto2.Message]) -> _Schema:
    """field number -> (name, FieldMetadata, message class of a message field)."""
    cached = _schemas.get(cls)
    if cached is not None:
        return cached
    proto_meta = cast(Any, cls)._betterproto
    schema: _Schema = {}
    for field_name, meta in proto_meta.meta_by_field_name.items():
        sub: type[betterproto2.Message] | None = None
        if meta.proto_type == "message":
            sub = meta.unwrap() if meta.unwrap else proto_meta.cls_by_field[field_name]
        elif meta.proto_type == "map":
            # Map entries are messages {1: key, 2: value}; keep the pieces in
            # a pseudo-schema keyed by the map field itself.
            key_meta, value_meta = meta.map_meta
            value_cls = (
                proto_meta.cls_by_field[f"{field_name}.value"]
                if value_meta.proto_type == "message"
                else None
            )
            _map_entries[(cls, field_name)] = {
                1: ("key", key_meta, None),
                2: ("value", value_meta, value_cls),
            }
        schema[meta.number] = (field_name, meta, sub)
    _schemas[cls] = schema
    return schema


_map_entries: dict[tuple[type[betterproto2.Message], str], _Schema] = {}


def _check_fields(
    buf: bytes,
    pos: int,
    end: int,
    schema: _Schema,
    path: str,
    owner: type[betterproto2.Message] | None = None,
) -> None:
    counts: dict[int, int] = {}
    while pos < end:
        key, pos = _varint(buf, pos, end, path or "message")
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise WireError(f"{path or 'message'}: field number 0 is invalid")
        entry = schema.get(number)
        if entry is None:
            field_path = _join(path, f"#{number}")
        else:
            field_name, meta, _ = entry
            if meta.repeated or meta.proto_type == "map":
                index = counts.get(number, 0)
                counts[number] = index + 1
                field_path = _join(path, f"{field_name}[{index}]")
            else:
                field_path = _join(path, field_name)
        start = pos
        if wire_type == _VARINT:
            _, pos = _varint(buf, pos, end, field_path)
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        elif wire_type == _LEN:
            length, pos = _varint(buf, pos, end, field_path)
            start = pos
            pos += length
        else:
            raise WireError(f"{field_path}: unsupported wire type {wire_type}")
        if pos > end:
            raise WireError(f"{field_path}: truncated field")
        if entry is None:
            continue
        field_name, meta, sub = entry
        native = _NATIVE_WIRE.get(meta.proto_type)
        packed = wire_type == _LEN and meta.repeated and native != _LEN
        if wire_type != native and not packed:
            raise WireError(
                f"{field_path}: wire type {wire_type} does not match a {meta.proto_type} field"
            )
        if wire_type != _LEN:
            continue
        if meta.proto_type == "map":
            assert owner is not None
            _check_fields(buf, start, pos, _map_entries[(owner, field_name)], field_path)
        else:
            _check_value(buf, start, pos, meta, sub, field_path)


def check_message(data: bytes, cls: type[betterproto2.Message]) -> None:
    """Raise `WireError` unless `data` is a well-formed encoding of `cls`."""
    _check_message_at(data, 0, len(data), cls, "")


def _check_message_at(
    buf: bytes, start: int, end: int, cls: type[betterproto2.Message], path: str
) -> None:
    _check_fields(buf, start, end, _message_schema(cls), path, owner=cls)


class Preencoded:
    """Mixin for a response message that carries its own encoding (made by
    `ringo_trio._fastwire`): `StrictCodec.encode` sends ``bytes(message)``."""

    _wire: bytes

    def __bytes__(self) -> bytes:
        return self._wire


class StrictCodec(CodecBase):
    """grpclib codec for betterproto2 messages that refuses malformed input."""

    __content_subtype__ = "proto"

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._max = max_message_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, message_type):
            raise TypeError(f"message must be {message_type!r}, not {type(message)!r}")
        data = bytes(message)
        if len(data) > self._max:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"response of {len(data)} bytes exceeds the {self._max}-byte message limit",
            )
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        name = getattr(message_type, "__name__", "message")
        if len(data) > self._max:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"{name} of {len(data)} bytes exceeds the {self._max}-byte message limit",
            )
        try:
            check_message(data, message_type)
            return message_type.parse(data)
        except WireError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"malformed {name}: {exc}") from None
        except Exception as exc:
            # Well-formed wire bytes can still be unrepresentable (a Duration
            # beyond timedelta's range): the request is bad, not the daemon.
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"malformed {name}: {type(exc).__name__}: {exc}"
            ) from None
