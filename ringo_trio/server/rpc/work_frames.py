"""The daemon's Work-stream frames in wire form.

betterproto2 spends ~150 µs encoding one task frame, which alone would cap
the daemon near 2,500 tasks/s per core. The hot frames — pushes (encoded by
storage from its rows, `ringo_trio._wire.rows`), plain OK results and batch
frames — are handed to the codec already encoded: a `WireFrame` is a
complete `WorkResponse` whose ``bytes()`` is that encoding
(`ringo_trio.server.rpc.codec.StrictCodec` sends it as is). Everything else
is a generated message the codec encodes. `work` (the stream's driver) only
asks for frames by name here; it never builds bytes itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._contract import limits
from ringo_trio._contract.work.server import Answer
from ringo_trio._proto.ringo.v1 import (
    ErrorCode,
    ErrorDetail,
    WorkRequest,
    WorkRequestBatch,
    WorkResponse,
    WorkResult,
)
from ringo_trio._wire.codec import decode, encode
from ringo_trio._wire.primitives import tag_len, varint
from ringo_trio._wire.work import encode_work_response_batch

from ..storage.base import Push, ttl_field
from .codec import Preencoded

__all__ = [
    "EncodedFrame",
    "WireFrame",
    "answer_frame",
    "batch_frame",
    "batch_requests",
    "encoded",
    "error_frame",
    "ok_frame",
    "push_frames",
]


# betterproto2 spends ~150 µs encoding one task frame, which alone would cap
# the daemon near 2,500 tasks/s per core. Task frames and plain OK results,
# the two frames of the hot path, are encoded by `ringo_trio._wire.work`
# and handed to the codec already encoded: `WireFrame` is a complete `WorkResponse` whose
# `bytes()` is that encoding.


class WireFrame(Preencoded, WorkResponse):
    """A `WorkResponse` that carries its own encoding."""


_new = object.__new__


class EncodedFrame(WireFrame):
    """A `WorkResponse` known by its encoding alone (the pushes, encoded by
    storage): its fields are decoded when first read, which only tests do."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        decoded = decode(self._wire, WorkResponse)
        self.__dict__.update(decoded.__dict__)
        return getattr(decoded, name)


def encoded(data: bytes) -> EncodedFrame:
    frame: EncodedFrame = _new(EncodedFrame)
    frame._wire = data
    return frame


def batch_frame(frames: Sequence[WorkResponse]) -> WorkResponse:
    """`WorkResponse(batch=WorkResponseBatch(responses=frames))`, encoded from
    the frames' own encodings."""
    return encoded(
        encode_work_response_batch(
            [item._wire if isinstance(item, Preencoded) else encode(item) for item in frames]
        )
    )


# WorkResponse.result, and WorkResult.request_id (a varint: its body is at
# most 11 bytes, so its length is one byte).
_RESULT = tag_len(3)
_REQUEST_ID = b"\x08"
_OK_ZERO = _RESULT + b"\x00"


def ok_frame(request_id: int) -> WorkResponse:
    """`WorkResponse(result=WorkResult(request_id=request_id))`, written
    inline: one per settled task (`encode_work_result` is the reference,
    byte-equal by test)."""
    if not request_id:
        return encoded(_OK_ZERO)
    body = _REQUEST_ID + varint(request_id)
    return encoded(_RESULT + bytes((len(body),)) + body)


def answer_frame(answer: Answer) -> WorkResponse:
    """The ``result`` frame of the session's `Answer`."""
    error = answer.error
    if error is None:
        return ok_frame(answer.request_id)
    return error_frame(answer.request_id, ErrorCode[error.code], error.message, **error.metadata)


def push_frames(pushes: Sequence[Push], now: datetime | None) -> list[bytes]:
    """The encoded task frames of `pushes`; with `now` (minor >= 11), each
    lease says how long it runs from now, the moment of sending (the worker
    arms its deadline at receipt on its own clock). A claim's leases share
    one until, so the ttl is encoded once per until."""
    if now is None:
        return [item.frame for item in pushes]
    frames = []
    until: datetime | None = None
    ttl = b""
    for item in pushes:
        if item.until != until:
            until = item.until
            ttl = b"" if until is None else ttl_field(until, now)
        frames.append(item.frame_with(ttl))
    return frames


def error_frame(request_id: int, code: ErrorCode, message: str, **metadata: str) -> WorkResponse:
    detail = ErrorDetail(code=code, message=message, metadata=metadata)
    return WorkResponse(result=WorkResult(request_id=request_id, error=detail))


def batch_requests(batch: WorkRequestBatch) -> list[WorkRequest]:
    """The commands of a batch, or the INVALID_ARGUMENT that ends the stream."""
    requests = batch.requests
    if not requests:
        raise GRPCError(
            Status.INVALID_ARGUMENT, "batch.requests: a batch holds at least one command"
        )
    if len(requests) > limits.MAX_WORK_BATCH:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"batch.requests: {len(requests)} commands exceed MAX_WORK_BATCH"
            f" ({limits.MAX_WORK_BATCH})",
        )
    for index, request in enumerate(requests):
        for name in ("batch", "register"):
            if getattr(request, name) is not None:
                raise GRPCError(
                    Status.INVALID_ARGUMENT,
                    f"batch.requests[{index}].{name}: a batch cannot hold `{name}`",
                )
    return requests
