"""The Work stream's frames, both directions, each encoded by one function.

The daemon's frames (a push, a command's result, a batch of them) are the
generic codec's encoding of the message the docstring names (`.codec.build`
makes it without the dataclass ``__init__``). The worker's commands (credit,
ack, nack, reject, extend) run once per task, so they are written inline:
byte for byte the generic encoding of the same message, which property tests
hold them to (tests/wire/test_work_wire.py, against the generic references in
tests/_kit/generic_frames.py); docs/architecture.md, "Codec", has the figures.
A batch of either direction (minor >= 10) is a join of its elements' bytes.

Decoding is the codec's (`.codec.decode`) on the daemon's side; the SDK reads
pushes and results straight into its models (`ringo_trio._work._frames`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from .._proto.ringo.v1 import ErrorDetail, Lease, LeasedTask, WorkResponse, WorkResult
from .codec import build, encode
from .primitives import SMALL, tag_len, varint, write_duration

__all__ = [
    "encode_ack",
    "encode_credit",
    "encode_extend",
    "encode_nack",
    "encode_reject",
    "encode_work_push",
    "encode_work_request_batch",
    "encode_work_response_batch",
    "encode_work_result",
]

# A batch's encoding is its elements' encodings, each framed as one element of
# the repeated field, framed as the oneof member: so a batch of frames that
# are already encoded costs a join, not a walk of the schema.
_RESPONSE_BATCH = tag_len(5)  # WorkResponse.batch
_REQUEST_BATCH = tag_len(11)  # WorkRequest.batch
_ELEMENT = tag_len(1)  # WorkResponseBatch.responses, WorkRequestBatch.requests


def _batch(member: bytes, elements: Sequence[bytes]) -> bytes:
    body = b"".join([part for data in elements for part in (_ELEMENT, varint(len(data)), data)])
    return b"".join((member, varint(len(body)), body))


# -- the daemon's frames -------------------------------------------------------------


def encode_work_push(leased: LeasedTask) -> bytes:
    """``WorkResponse(task=leased)``: one pushed task."""
    return encode(build(WorkResponse, task=leased))


def encode_work_response_batch(elements: Sequence[bytes]) -> bytes:
    """``WorkResponse(batch=WorkResponseBatch(responses=[...]))`` from the
    elements' encodings (each an encoded ``WorkResponse``)."""
    return _batch(_RESPONSE_BATCH, elements)


def encode_work_result(request_id: int, error: ErrorDetail | None, lease: Lease | None) -> bytes:
    """``WorkResponse(result=build(WorkResult, request_id, error, lease))``."""
    return encode(
        build(
            WorkResponse, result=build(WorkResult, request_id=request_id, error=error, lease=lease)
        )
    )


# -- the worker's commands ------------------------------------------------------------


def encode_work_request_batch(elements: Sequence[bytes]) -> bytes:
    """``WorkRequest(batch=WorkRequestBatch(requests=[...]))`` from the
    elements' encodings (each an encoded ``WorkRequest``)."""
    return _batch(_REQUEST_BATCH, elements)


def _len(data: bytes) -> bytes:
    size = len(data)
    return SMALL[size] if size < 0x80 else varint(size)


def _command(request_id: int, tag: bytes, body: bytes) -> bytes:
    """``WorkRequest(request_id, <tag>=body)``."""
    head = b"\x08" + varint(request_id) if request_id else b""
    return head + tag + _len(body) + body


def _ref(task_id: str, attempt: int, token: str) -> bytes:
    """The command's ``lease`` field (2): ``LeaseRef(task_id, attempt, token)``."""
    body = b""
    if task_id:
        data = task_id.encode()
        body = b"\x0a" + _len(data) + data
    if attempt:
        body += b"\x10" + varint(attempt)
    if token:
        data = token.encode()
        body += b"\x1a" + _len(data) + data
    return b"\x12" + _len(body) + body


def _error(error: str) -> bytes:
    if not error:
        return b""
    data = error.encode()
    return b"\x1a" + _len(data) + data


def _duration(tag: bytes, delta: timedelta | None) -> bytes:
    if delta is None:
        return b""
    out = bytearray(tag)
    write_duration(out, delta, None)
    return bytes(out)


def encode_ack(
    request_id: int, task_id: str, attempt: int, token: str, result: bytes | None = None
) -> bytes:
    """``WorkRequest(request_id, ack=AckRequest(lease=LeaseRef(task_id, attempt,
    token), result))`` (a result only at minor >= 9)."""
    tid = task_id.encode()
    tok = token.encode()
    size = len(tid) + len(tok)
    if result is None and request_id and tid and tok and 0 < attempt < 0x80 and size < 0x78:
        # Every ack of a no-op handler: each length fits one byte, so the
        # frame is one formatting instead of a dozen concatenations (~0.4 µs).
        return b"\x08%b\x22%c\x12%c\x0a%c%b\x10%c\x1a%c%b" % (
            varint(request_id),
            size + 8,
            size + 6,
            len(tid),
            tid,
            attempt,
            len(tok),
            tok,
        )
    body = _ref(task_id, attempt, token)
    if result is not None:
        body += b"\x1a" + _len(result) + result
    return _command(request_id, b"\x22", body)


def encode_nack(
    request_id: int,
    task_id: str,
    attempt: int,
    token: str,
    error: str,
    retry_delay: timedelta | None,
) -> bytes:
    """``WorkRequest(request_id, nack=NackRequest(lease=LeaseRef(...), error,
    retry_delay_override=retry_delay))``."""
    body = _ref(task_id, attempt, token) + _error(error) + _duration(b"\x22", retry_delay)
    return _command(request_id, b"\x2a", body)


def encode_reject(request_id: int, task_id: str, attempt: int, token: str, error: str) -> bytes:
    """``WorkRequest(request_id, reject=RejectRequest(lease=LeaseRef(...), error))``."""
    return _command(request_id, b"\x32", _ref(task_id, attempt, token) + _error(error))


def encode_credit(
    request_id: int, available: int, target: int | None, grant: int | None = None
) -> bytes:
    """``WorkRequest(request_id, credit=CreditUpdate(available,
    target_concurrency=target, grant))``."""
    body = b"\x08" + varint(available) if available else b""
    if target is not None:
        body += b"\x10" + varint(target)
    if grant is not None:
        body += b"\x18" + varint(grant)
    return _command(request_id, b"\x1a", body)


def encode_extend(
    request_id: int, task_id: str, attempt: int, token: str, extension: timedelta
) -> bytes:
    """``WorkRequest(request_id, extend_lease=ExtendLeaseRequest(lease=LeaseRef(...),
    extension))``."""
    body = _ref(task_id, attempt, token) + _duration(b"\x1a", extension)
    return _command(request_id, b"\x3a", body)
