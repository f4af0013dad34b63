"""The daemon's grpclib codec: the shared strict codec plus the size limit.

Every incoming frame is decoded by `ringo_trio._wire.codec`, which refuses
what is not a well-formed encoding of the method's message (betterproto2's
own parser would silently drop a truncated varint or turn a mis-typed field
into a list, and the daemon would act on a request nobody sent). A refusal
is ``INVALID_ARGUMENT`` naming the field path; unknown fields are checked
only structurally (they are how newer clients stay compatible).

A request over ``MAX_MESSAGE_BYTES`` is refused with ``RESOURCE_EXHAUSTED``,
the status gRPC uses for an oversized message. A reply over
``MAX_REPLY_BYTES`` (gRPC's default receive limit) is never sent: every
reply is cut to fit before it is built (`reply_bounds`), so one that does
not is a daemon bug, logged and answered ``RESOURCE_EXHAUSTED`` here, alike
for every client, instead of failing only in clients with default limits.
"""

from __future__ import annotations

import logging
from typing import Any

from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from ringo_trio._contract.limits import MAX_MESSAGE_BYTES, MAX_REPLY_BYTES
from ringo_trio._wire.codec import WireError, decode, encode

__all__ = ["Preencoded", "StrictCodec", "WireError"]

log = logging.getLogger("ringo_trio.server")


class Preencoded:
    """Mixin for a response message that carries its own encoding (a hot
    frame encoded once where it is made): `StrictCodec.encode` sends it."""

    _wire: bytes

    def __bytes__(self) -> bytes:
        return self._wire


class StrictCodec(CodecBase):
    """grpclib codec for betterproto2 messages that refuses malformed input."""

    __content_subtype__ = "proto"

    def __init__(
        self, max_message_bytes: int = MAX_MESSAGE_BYTES, max_reply_bytes: int = MAX_REPLY_BYTES
    ) -> None:
        self._max = max_message_bytes
        self._max_reply = max_reply_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, message_type):
            raise TypeError(f"message must be {message_type!r}, not {type(message)!r}")
        data = message._wire if isinstance(message, Preencoded) else encode(message)
        if len(data) > self._max_reply:
            name = getattr(message_type, "__name__", "reply")
            log.error("a %s of %d bytes was not sent: a reply bound is missing", name, len(data))
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"{name} of {len(data)} bytes exceeds the {self._max_reply}-byte reply limit",
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
