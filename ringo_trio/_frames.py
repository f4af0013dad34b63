"""The SDK's side of the hot messages: the shared codec's messages as SDK models.

The bytes are decoded and encoded by `ringo_trio._wire.codec` (strict: a
malformed frame is a `ValueError` naming the field); this module only turns
a pushed task or a command result into what the worker's reader consumes,
and an EnqueueMany reply into a `BatchResult`. Both are the references (and
the fallbacks) of their unrolled twins, `_work_wire` and `_batch_wire`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ._models import BatchResult, EnqueueResult, Task, TaskSpec
from ._proto.ringo.v1 import (
    EnqueueManyRequest,
    EnqueueManyResponse,
    RequestContext,
    WorkResponse,
)
from ._wire.codec import decode, encode

__all__ = [
    "PushedTask",
    "WorkResultFrame",
    "decode_enqueue_many_response",
    "decode_work_response",
    "encode_enqueue_many_request_from_specs",
]


# The worker builds one of these per push or result: plain slotted dataclasses,
# since a frozen one's __init__ costs three times as much (`_work._session`).
@dataclass(slots=True)
class PushedTask:
    """A ``WorkResponse.task`` frame: the SDK task and the lease it came with.

    ``until`` is the daemon's wall clock, for display only; ``ttl`` (minor >=
    11) is the lease's time: seconds it runs from the moment the daemon sent
    the frame (``Lease.ttl.total_seconds()``), None when the daemon sent none.
    """

    task: Task
    task_id: str
    attempt: int
    lease_token: str
    worker_id: str
    until: datetime | None
    ttl: float | None


@dataclass(slots=True)
class WorkResultFrame:
    """A ``WorkResponse.result`` frame.

    The command failed iff ``error_value`` is non-zero; ``error_code`` is then
    the ErrorCode name (``"LEASE_LOST"``), or ``""`` for a code this SDK does
    not know.
    """

    request_id: int
    error_code: str
    """``""`` when there is no error (no detail, or ERROR_CODE_UNSPECIFIED)."""
    error_message: str
    reason: str
    """``detail.metadata.get("reason", "")``."""
    lease_until: datetime | None
    error_value: int = 0
    """The raw ErrorCode number (0 when unset)."""


def decode_work_response(
    buffer: bytes | bytearray | memoryview,
) -> PushedTask | WorkResultFrame | WorkResponse | list[PushedTask | WorkResultFrame]:
    """A task push as `PushedTask`, a command result as `WorkResultFrame`,
    a batch (minor >= 10) as the list of its elements, each one of those
    two; any other frame (registered, heartbeat, a push without its task or
    lease) as the decoded `WorkResponse`. Raises `ValueError` on malformed
    input, and on a batch holding anything but pushes and results."""
    response = decode(buffer, WorkResponse)
    batch = response.batch
    if batch is None:
        return _work_frame(response)
    frames: list[PushedTask | WorkResultFrame] = []
    for index, element in enumerate(batch.responses):
        frame = _work_frame(element)
        if isinstance(frame, WorkResponse):
            raise ValueError(f"batch.responses[{index}]: a batch holds pushes and results only")
        frames.append(frame)
    return frames


def _work_frame(response: WorkResponse) -> PushedTask | WorkResultFrame | WorkResponse:
    result = response.result
    if result is not None:
        detail = result.error
        lease = result.lease
        until = None if lease is None else lease.until
        if detail is None or not detail.code:
            return WorkResultFrame(result.request_id, "", "", "", until)
        return WorkResultFrame(
            result.request_id,
            detail.code.name or "",
            detail.message,
            detail.metadata.get("reason", ""),
            until,
            int(detail.code),
        )
    pushed = response.task
    if pushed is not None and pushed.task is not None and pushed.lease is not None:
        lease = pushed.lease
        return PushedTask(
            Task.from_wire(pushed.task),
            lease.task_id,
            lease.attempt,
            lease.lease_token,
            lease.worker_id,
            lease.until,
            None if lease.ttl is None else lease.ttl.total_seconds(),
        )
    return response


def decode_enqueue_many_response(buffer: bytes | bytearray | memoryview) -> BatchResult:
    """The `BatchResult` of an EnqueueMany reply. Raises `ValueError` on
    malformed input, `InvalidArgumentError` for a result without its task."""
    reply = decode(buffer, EnqueueManyResponse)
    return BatchResult(
        results=tuple(EnqueueResult.from_wire(result) for result in reply.results),
        created_count=reply.created_count,
        duplicate_count=reply.duplicate_count,
    )


def encode_enqueue_many_request_from_specs(
    context: RequestContext | None, queue: str, specs: Sequence[TaskSpec]
) -> bytes:
    """``EnqueueManyRequest(context, queue, tasks=[spec.to_wire() ...])``."""
    tasks = [spec.to_wire() for spec in specs]
    return encode(EnqueueManyRequest(context=context, queue=queue, tasks=tasks))
