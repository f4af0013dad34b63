"""The daemon's grpclib codec: the shared strict codec plus the size limit.

Every incoming frame is decoded by `ringo_trio._wire.codec`, which refuses
what is not a well-formed encoding of the method's message (betterproto2's
own parser would silently drop a truncated varint or turn a mis-typed field
into a list, and the daemon would act on a request nobody sent). A refusal
is ``INVALID_ARGUMENT`` naming the field path; unknown fields are checked
only structurally (they are how newer clients stay compatible).

Both directions enforce ``MAX_MESSAGE_BYTES`` with ``RESOURCE_EXHAUSTED``,
the status gRPC uses for an oversized message.
"""

from __future__ import annotations

from typing import Any

from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from ringo_trio._contract.limits import MAX_MESSAGE_BYTES
from ringo_trio._wire.codec import WireError, decode, encode

__all__ = ["Preencoded", "StrictCodec", "WireError"]


class Preencoded:
    """Mixin for a response message that carries its own encoding (a hot
    frame encoded once where it is made): `StrictCodec.encode` sends it."""

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
        data = message._wire if isinstance(message, Preencoded) else encode(message)
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
            return decode(data, message_type)
        except WireError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"malformed {name}: {exc}") from None
