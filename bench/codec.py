"""Codec micro-benchmark: betterproto2 vs ``ringo_trio._fastwire``, µs per operation.

    python bench/codec.py [--repeat 5] [--batch 1000]

Each row times what the hot path does today against its fastwire
replacement, best of ``--repeat`` samples (each sample runs long enough to
take >= 0.1 s):

* daemon encoders: ``bytes(message)`` of an already built message;
* SDK decoders: ``Message.parse`` plus the ``_models`` conversion the SDK
  applies (``Task.from_wire`` / ``BatchResult``);
* SDK request encoders: building the betterproto2 request and ``bytes()``
  (the SDK builds one per command), against one fastwire call.

The task is realistic: a 26-character ULID, 16-byte payload, queue, type,
retry backoff, ``created_at == available_at`` (an immediate task),
``updated_at`` at the lease, ``lease_until == lease.until`` (as the daemon's
storage writes them), a 32-hex lease token. The "distinct timestamps" row
gives every timestamp its own value (no reuse within the frame).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import timeit
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from ringo_trio import _fastwire as fw
from ringo_trio import _models as models
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueManyResponse,
    EnqueueResult,
    ErrorCode,
    ErrorDetail,
    ExtendLeaseRequest,
    Lease,
    LeasedTask,
    LeaseRef,
    NackRequest,
    RejectRequest,
    RequestContext,
    RetryBackoff,
    Task,
    TaskState,
    WorkRequest,
    WorkResponse,
    WorkResult,
)

T0 = datetime(2026, 12, 2, 15, 30, 12, 345678, tzinfo=UTC)
TOKEN = "9f86d081884c7d659a2feaa0c55ad015"
CONTEXT = RequestContext(protocol_major=1, protocol_minor=6, session_token="s" * 32)


def _task(index: int, *, leased: bool, distinct: bool = False) -> Task:
    created = T0 + timedelta(microseconds=index)
    leased_at = created + timedelta(seconds=1, microseconds=234_567)
    return Task(
        id=f"01JE{index:022d}",
        queue="emails",
        task_type="send_welcome_email",
        payload=bytes(range(16)),
        state=TaskState.LEASED if leased else TaskState.PENDING,
        attempt=1 if leased else 0,
        max_attempts=5,
        retry_backoff=RetryBackoff(
            initial=timedelta(seconds=1), maximum=timedelta(minutes=5), multiplier=2.0
        ),
        created_at=created,
        updated_at=leased_at if leased else created,
        available_at=created + timedelta(microseconds=7) if distinct else created,
        worker_id="host-4242-7f3a" if leased else "",
        lease_until=leased_at + timedelta(seconds=60) if leased else None,
    )


def _leased(*, distinct: bool = False) -> LeasedTask:
    task = _task(1, leased=True, distinct=distinct)
    assert task.lease_until is not None
    until = task.lease_until + timedelta(microseconds=3) if distinct else task.lease_until
    return LeasedTask(
        task=task,
        lease=Lease(
            task_id=task.id, attempt=1, lease_token=TOKEN, worker_id=task.worker_id, until=until
        ),
    )


def best_us(func: Callable[[], object], repeat: int) -> float:
    timer = timeit.Timer(func)
    number = 1
    while timer.timeit(number) < 0.1:
        number *= 2
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    repeat, batch = args.repeat, args.batch

    leased = _leased()
    distinct = _leased(distinct=True)
    task, lease = leased.task, leased.lease
    assert task is not None
    assert lease is not None
    task_id = task.id
    error = ErrorDetail(
        code=ErrorCode.RESOURCE_EXHAUSTED,
        message="credit above capacity",
        metadata={"reason": "credit_capacity", "field": "available"},
    )
    pending = [(_task(i, leased=False), True) for i in range(batch)]
    # One daemon call stamps a whole batch with one clock reading.
    for task, _ in pending:
        task.created_at = task.updated_at = task.available_at = T0
    push = bytes(WorkResponse(task=leased))
    push_distinct = bytes(WorkResponse(task=distinct))
    result = bytes(WorkResponse(result=WorkResult(request_id=77, error=error)))
    many = bytes(
        EnqueueManyResponse(
            results=[EnqueueResult(task=t, created=c) for t, c in pending],
            created_count=batch,
        )
    )
    model_specs = [
        models.TaskSpec(
            task_type="send_welcome_email", payload=bytes(range(16)), unique_key=f"user-{i}"
        )
        for i in range(batch)
    ]
    wire_specs = [s.to_wire() for s in model_specs]

    def sdk_push() -> object:
        response = WorkResponse.parse(push)
        assert response.task is not None
        return models.Task.from_wire(response.task.task)

    def sdk_push_distinct() -> object:
        response = WorkResponse.parse(push_distinct)
        assert response.task is not None
        return models.Task.from_wire(response.task.task)

    def sdk_result() -> object:
        response = WorkResponse.parse(result)
        assert response.result is not None
        detail = response.result.error
        assert detail is not None
        return (detail.code.name, detail.message, detail.metadata.get("reason", ""))

    def sdk_many() -> object:
        reply = EnqueueManyResponse.parse(many)
        return models.BatchResult(
            results=tuple(models.EnqueueResult.from_wire(r) for r in reply.results),
            created_count=reply.created_count,
            duplicate_count=reply.duplicate_count,
        )

    def ref() -> LeaseRef:
        return LeaseRef(task_id=task_id, attempt=1, lease_token=TOKEN)

    rows: list[tuple[str, Callable[[], object], Callable[[], object], int]] = [
        # name, betterproto2, fastwire, items per call
        (
            "encode_task",
            lambda: bytes(task),
            lambda: fw.encode_task(task),
            1,
        ),
        (
            "encode_work_push",
            lambda: bytes(WorkResponse(task=leased)),
            lambda: fw.encode_work_push(leased),
            1,
        ),
        (
            "encode_work_result (ok)",
            lambda: bytes(WorkResponse(result=WorkResult(request_id=77))),
            lambda: fw.encode_work_result(77, None, None),
            1,
        ),
        (
            "encode_work_result (error+metadata)",
            lambda: bytes(WorkResponse(result=WorkResult(request_id=77, error=error))),
            lambda: fw.encode_work_result(77, error, None),
            1,
        ),
        (
            "encode_work_result (extend: lease)",
            lambda: bytes(WorkResponse(result=WorkResult(request_id=77, lease=lease))),
            lambda: fw.encode_work_result(77, None, lease),
            1,
        ),
        (
            f"encode_enqueue_many_response ({batch})",
            lambda: bytes(
                EnqueueManyResponse(
                    results=[EnqueueResult(task=t, created=c) for t, c in pending],
                    created_count=batch,
                )
            ),
            lambda: fw.encode_enqueue_many_response(pending, batch, 0),
            batch,
        ),
        ("decode_work_response (push)", sdk_push, lambda: fw.decode_work_response(push), 1),
        (
            "decode_work_response (push, distinct timestamps)",
            sdk_push_distinct,
            lambda: fw.decode_work_response(push_distinct),
            1,
        ),
        (
            "decode_work_response (error result)",
            sdk_result,
            lambda: fw.decode_work_response(result),
            1,
        ),
        (
            f"decode_enqueue_many_response ({batch})",
            sdk_many,
            lambda: fw.decode_enqueue_many_response(many),
            batch,
        ),
        (
            "encode_credit",
            lambda: bytes(
                WorkRequest(
                    request_id=1234, credit=CreditUpdate(available=64, target_concurrency=64)
                )
            ),
            lambda: fw.encode_credit(1234, 64, 64),
            1,
        ),
        (
            "encode_ack",
            lambda: bytes(WorkRequest(request_id=1234, ack=AckRequest(lease=ref()))),
            lambda: fw.encode_ack(1234, task_id, 1, TOKEN),
            1,
        ),
        (
            "encode_nack (with retry delay)",
            lambda: bytes(
                WorkRequest(
                    request_id=1234,
                    nack=NackRequest(
                        lease=ref(),
                        error="ValueError: boom",
                        retry_delay_override=timedelta(seconds=2.5),
                    ),
                )
            ),
            lambda: fw.encode_nack(
                1234, task_id, 1, TOKEN, "ValueError: boom", timedelta(seconds=2.5)
            ),
            1,
        ),
        (
            "encode_reject",
            lambda: bytes(
                WorkRequest(
                    request_id=1234,
                    reject=RejectRequest(lease=ref(), error="PermanentTaskError"),
                )
            ),
            lambda: fw.encode_reject(1234, task_id, 1, TOKEN, "PermanentTaskError"),
            1,
        ),
        (
            "encode_extend",
            lambda: bytes(
                WorkRequest(
                    request_id=1234,
                    extend_lease=ExtendLeaseRequest(lease=ref(), extension=timedelta(seconds=60)),
                )
            ),
            lambda: fw.encode_extend(1234, task_id, 1, TOKEN, timedelta(seconds=60)),
            1,
        ),
        (
            f"encode_enqueue_many_request ({batch} wire specs)",
            lambda: bytes(EnqueueManyRequest(context=CONTEXT, queue="emails", tasks=wire_specs)),
            lambda: fw.encode_enqueue_many_request(CONTEXT, "emails", wire_specs),
            batch,
        ),
        (
            f"  ... from SDK specs (to_wire + bytes vs one call, {batch})",
            lambda: bytes(
                EnqueueManyRequest(
                    context=CONTEXT, queue="emails", tasks=[s.to_wire() for s in model_specs]
                )
            ),
            lambda: fw.encode_enqueue_many_request_from_specs(CONTEXT, "emails", model_specs),
            batch,
        ),
    ]

    print(
        f"# codec: betterproto2 vs fastwire — CPython {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores, best of {repeat}"
    )
    print()
    print("| operation | betterproto2 µs/op | fastwire µs/op | speedup | fastwire µs/item |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, reference, fast, items in rows:
        slow_us = best_us(reference, repeat)
        fast_us = best_us(fast, repeat)
        per_item = f"{fast_us / items:,.2f}" if items > 1 else ""
        print(
            f"| {name} | {slow_us:,.1f} | {fast_us:,.1f} | {slow_us / fast_us:,.1f}x | {per_item} |"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
