"""The hot frames, by name: what the SDK's worker and the daemon encode per task.

Each function is the encoding of one betterproto2 message built from its
arguments (the docstring names it; `.codec.build` makes it without the
dataclass ``__init__``), by the generic codec (`.codec`). The
callers keep their flat arguments so that a frame can be hand-unrolled where
the end-to-end benchmark says the generic path costs 5 % or more; these
functions are then the unrolled twin's reference, held byte-equal by property
tests: the worker's ack, nack, reject and extend (`ringo_trio._work_wire`),
the EnqueueMany request (`ringo_trio._batch_wire`). docs/architecture.md,
"Codec", has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from .._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueResult,
    ErrorDetail,
    ExtendLeaseRequest,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    RejectRequest,
    RequestContext,
    Task,
    TaskSpec,
    WorkRequest,
    WorkResponse,
    WorkResult,
)
from .codec import build, encode, tag_len, varint

__all__ = [
    "encode_ack",
    "encode_credit",
    "encode_enqueue_many_request",
    "encode_enqueue_many_response",
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


def encode_enqueue_many_response(
    results: Sequence[tuple[Task, bool]], created: int, duplicates: int
) -> bytes:
    """``EnqueueManyResponse(results=[build(EnqueueResult, task, created), ...],
    created_count=created, duplicate_count=duplicates)``."""
    return encode(
        build(
            EnqueueManyResponse,
            results=[build(EnqueueResult, task=task, created=was) for task, was in results],
            created_count=created,
            duplicate_count=duplicates,
        )
    )


# -- the SDK's commands --------------------------------------------------------------


def encode_work_request_batch(elements: Sequence[bytes]) -> bytes:
    """``WorkRequest(batch=WorkRequestBatch(requests=[...]))`` from the
    elements' encodings (each an encoded ``WorkRequest``)."""
    return _batch(_REQUEST_BATCH, elements)


def encode_credit(
    request_id: int, available: int, target: int | None, grant: int | None = None
) -> bytes:
    """``WorkRequest(request_id, credit=build(CreditUpdate, available, target, grant))``."""
    credit = build(CreditUpdate, available=available, target_concurrency=target, grant=grant)
    return encode(build(WorkRequest, request_id=request_id, credit=credit))


def encode_ack(
    request_id: int, task_id: str, attempt: int, token: str, result: bytes | None = None
) -> bytes:
    """``WorkRequest(request_id, ack=build(AckRequest, lease=LeaseRef(...), result))``
    (a result only at minor >= 9)."""
    ref = build(LeaseRef, task_id=task_id, attempt=attempt, lease_token=token)
    ack = build(AckRequest, lease=ref, result=result)
    return encode(build(WorkRequest, request_id=request_id, ack=ack))


def encode_nack(
    request_id: int,
    task_id: str,
    attempt: int,
    token: str,
    error: str,
    retry_delay: timedelta | None,
) -> bytes:
    """``WorkRequest(request_id, nack=build(NackRequest, lease=LeaseRef(...), error,
    retry_delay_override=retry_delay))``."""
    ref = build(LeaseRef, task_id=task_id, attempt=attempt, lease_token=token)
    nack = build(NackRequest, lease=ref, error=error, retry_delay_override=retry_delay)
    return encode(build(WorkRequest, request_id=request_id, nack=nack))


def encode_reject(request_id: int, task_id: str, attempt: int, token: str, error: str) -> bytes:
    """``WorkRequest(request_id, reject=build(RejectRequest, lease=LeaseRef(...), error))``."""
    ref = build(LeaseRef, task_id=task_id, attempt=attempt, lease_token=token)
    return encode(
        build(
            WorkRequest, request_id=request_id, reject=build(RejectRequest, lease=ref, error=error)
        )
    )


def encode_extend(
    request_id: int, task_id: str, attempt: int, token: str, extension: timedelta
) -> bytes:
    """``WorkRequest(request_id, extend_lease=build(ExtendLeaseRequest, lease=LeaseRef(...),
    extension))``."""
    ref = build(LeaseRef, task_id=task_id, attempt=attempt, lease_token=token)
    extend = build(ExtendLeaseRequest, lease=ref, extension=extension)
    return encode(build(WorkRequest, request_id=request_id, extend_lease=extend))


def encode_enqueue_many_request(
    context: RequestContext | None, queue: str, specs: Sequence[TaskSpec]
) -> bytes:
    """``EnqueueManyRequest(context, queue, tasks=specs)``."""
    return encode(build(EnqueueManyRequest, context=context, queue=queue, tasks=list(specs)))
