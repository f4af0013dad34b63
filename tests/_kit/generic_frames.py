"""The generic encoding of every frame that has a hand-unrolled encoder or
decoder in the package: the references the property tests hold those to.

Each is the shared codec (`ringo_trio._wire.codec`) over the betterproto2
message its docstring names, plus, for the SDK's decoders, the conversion of
the decoded message into the SDK's models that the unrolled decoder makes
straight from the bytes (and falls back to on anything it does not read).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from ringo_trio._models import BatchResult
from ringo_trio._models import TaskSpec as SdkTaskSpec
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueResult,
    ExtendLeaseRequest,
    LeaseRef,
    NackRequest,
    RejectRequest,
    RequestContext,
    Task,
    TaskSpec,
    WorkRequest,
    WorkResponse,
)
from ringo_trio._queue._batch import batch_result
from ringo_trio._wire.codec import build, decode, encode
from ringo_trio._work._frames import PushedTask, WorkResultFrame, as_frames

# -- the worker's commands (`ringo_trio._wire.work`) ---------------------------------


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


# -- the SDK's decoding of the daemon's Work frames (`ringo_trio._work._frames`) ---------


def decode_work_response(
    buffer: bytes | bytearray | memoryview,
) -> PushedTask | WorkResultFrame | WorkResponse | list[PushedTask | WorkResultFrame]:
    """The generic decode of a WorkResponse, as the SDK's frames (`as_frames`)."""
    return as_frames(decode(buffer, WorkResponse))


# -- EnqueueMany (`ringo_trio._queue._batch`, `ringo_trio.server.rpc.enqueue_reply`) -------


def encode_enqueue_many_request(
    context: RequestContext | None, queue: str, specs: Sequence[TaskSpec]
) -> bytes:
    """``EnqueueManyRequest(context, queue, tasks=specs)``."""
    return encode(build(EnqueueManyRequest, context=context, queue=queue, tasks=list(specs)))


def encode_enqueue_many_request_from_specs(
    context: RequestContext | None, queue: str, specs: Sequence[SdkTaskSpec]
) -> bytes:
    """``EnqueueManyRequest(context, queue, tasks=[spec.to_wire() ...])``."""
    tasks = [spec.to_wire() for spec in specs]
    return encode(EnqueueManyRequest(context=context, queue=queue, tasks=tasks))


def decode_enqueue_many_response(buffer: bytes | bytearray | memoryview) -> BatchResult:
    """The generic decode of an EnqueueMany reply, as the SDK's `BatchResult`."""
    return batch_result(decode(buffer, EnqueueManyResponse))


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
