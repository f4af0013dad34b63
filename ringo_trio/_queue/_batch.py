"""EnqueueMany on the SDK's side: the request encoded straight from the specs,
the reply decoded straight into SDK models.

Theory of operation
-------------------
The generic path (the shared codec, `ringo_trio._wire.codec`: a betterproto2
message per spec, result, task and backoff, then `batch_result` copying each
into a model) was most of an ``enqueue_many`` call's SDK CPU: ~12 ms per 1,000
tasks for the reply, ~2 ms for the request. A batch is up to 1,000 tasks of
one queue, written in one transaction: the same queue, task types, state,
timestamps and retry policy over and over.

*The reply.* Fields 1-5 of a task (id, queue, type, payload, unique key) are
read one by one, queue and type through a memo of the reply; fields 6-15,
which encoders write after them and a batch's tasks mostly share, are
decoded once per distinct run of bytes. Each `Task` is built once. Anything
else sends the reply to the generic path, which decides: a field this
decoder does not read (progress, worker, lease, result — a duplicate's
existing task may carry them), an unknown field, a wrong wire type, fields
out of order, a malformed byte. So the result, or the error, is always
exactly what the generic decoder gives.

*The request.* A spec's fields 1-3 are written inline, fields 4-8
(attempts, policy, schedule, priority) encoded once per distinct value by
the generic encoder: byte for byte the generic request.

*Payloads of created tasks.* A compact reply (protocol minor >= 11, and
any reply whose full echo would not fit in one gRPC message) carries no
payloads. A created task is exactly what was sent, so a created task whose
reply carries no payload gets the payload of the spec it was made from
(`payloads`); a duplicate's task keeps what the reply says (no payload when
compact: `TaskQueue.get_by_id` has it).

This module is SDK-side (it reads and builds `ringo_trio._models`), which is
why it is not in `ringo_trio._wire`: the daemon imports that package, never
the SDK. The daemon's encoder of the same reply is
`ringo_trio.server.rpc.enqueue_reply`. Property tests hold both directions to
the generic path on arbitrary and corrupted input
(tests/wire/test_batch_wire.py, against tests/_kit/generic_frames.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .._models import BatchResult, EnqueueResult, RetryBackoff, Task, TaskSpec, TaskState
from .._proto.ringo.v1 import EnqueueManyRequest, EnqueueManyResponse, RequestContext
from .._proto.ringo.v1 import RetryBackoff as _WireRetryBackoff
from .._proto.ringo.v1 import TaskState as _WireTaskState
from .._wire.codec import build, decode, encode
from .._wire.primitives import read_len, read_timestamp, read_varint, varint

__all__ = ["batch_result", "decode_enqueue_many_reply", "encode_enqueue_many_request"]

_M32 = 0xFFFF_FFFF
_STATES = {int(member): TaskState.from_wire(int(member)) for member in _WireTaskState}


class _Generic(Exception):
    """Not a reply this decoder reads: the generic decoder takes it."""


def decode_enqueue_many_reply(
    buffer: bytes | bytearray | memoryview, payloads: Sequence[bytes] = ()
) -> BatchResult:
    """The `BatchResult` of an EnqueueMany reply; `ValueError` (or
    `InvalidArgumentError`) on malformed input, as the generic decoder.
    ``payloads[i]`` is the payload sent for result i: a created task whose
    reply carries none gets it."""
    buf = buffer if type(buffer) is bytes else bytes(buffer)
    try:
        return _decode(buf, payloads)
    except (_Generic, ValueError, IndexError):
        return _filled(batch_result(decode(buf, EnqueueManyResponse)), payloads)


def batch_result(reply: EnqueueManyResponse) -> BatchResult:
    """A decoded EnqueueMany reply as a `BatchResult` (the generic path);
    `InvalidArgumentError` for a result without its task."""
    return BatchResult(
        results=tuple(EnqueueResult.from_wire(result) for result in reply.results),
        created_count=reply.created_count,
        duplicate_count=reply.duplicate_count,
    )


def _filled(batch: BatchResult, payloads: Sequence[bytes]) -> BatchResult:
    """`batch` with the payloads of created tasks the reply left out."""
    results = list(batch.results)
    for index, (result, payload) in enumerate(zip(results, payloads, strict=False)):
        if result.created and payload and not result.task.payload:
            task = dataclasses.replace(result.task, payload=payload)
            results[index] = EnqueueResult(task, True)
    return dataclasses.replace(batch, results=tuple(results))


_Tail = tuple[Any, ...]  # fields 6-15, in `Task`'s order: see `_tail`


def _decode(buf: bytes, payloads: Sequence[bytes] = ()) -> BatchResult:
    end = len(buf)
    pos = 0
    results: list[EnqueueResult] = []
    created_count = duplicate_count = 0
    strings: dict[bytes, str] = {}
    tails: dict[bytes, _Tail] = {}
    while pos < end:
        key = buf[pos]
        if key == 0x0A:
            start, pos = read_len(buf, pos + 1, end)
            index = len(results)
            sent = payloads[index] if index < len(payloads) else b""
            results.append(_result(buf, start, pos, strings, tails, sent))
        elif key == 0x10:
            created_count, pos = read_varint(buf, pos + 1, end)
            created_count &= _M32
        elif key == 0x18:
            duplicate_count, pos = read_varint(buf, pos + 1, end)
            duplicate_count &= _M32
        else:
            raise _Generic
    return BatchResult(tuple(results), created_count, duplicate_count)


def _result(
    buf: bytes,
    pos: int,
    end: int,
    strings: dict[bytes, str],
    tails: dict[bytes, _Tail],
    sent: bytes,
) -> EnqueueResult:
    span: tuple[int, int] | None = None
    created = False
    while pos < end:
        key = buf[pos]
        if key == 0x0A:
            span = read_len(buf, pos + 1, end)
            pos = span[1]
        elif key == 0x10:
            value, pos = read_varint(buf, pos + 1, end)
            created = value != 0
        else:
            raise _Generic
    if span is None:
        raise _Generic  # the generic decoder names the missing task
    # `created` follows the task on the wire: the task is read once it is known.
    return EnqueueResult(_task(buf, *span, strings, tails, sent if created else b""), created)


def _task(
    buf: bytes,
    pos: int,
    end: int,
    strings: dict[bytes, str],
    tails: dict[bytes, _Tail],
    payload: bytes = b"",
) -> Task:
    """Fields 1-5 (unique per task) one by one; fields 6-15, which encoders
    write after them and a batch's tasks mostly share, decoded once per
    distinct run of bytes. `payload` stands when the reply carries none."""
    task_id = queue = task_type = unique_key = ""
    while pos < end:
        key = buf[pos]
        if key > 0x2A or key & 7 != 2:
            break
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
            if pos > end:
                raise _Generic
        else:
            start, pos = read_len(buf, pos + 1, end)
        if key == 0x0A:
            task_id = buf[start:pos].decode()
        elif key == 0x22:
            payload = buf[start:pos]
        elif key == 0x12 or key == 0x1A:
            raw = buf[start:pos]
            text = strings.get(raw)
            if text is None:
                text = strings[raw] = raw.decode()
            if key == 0x12:
                queue = text
            else:
                task_type = text
        elif key == 0x2A:
            unique_key = buf[start:pos].decode()
        else:
            raise _Generic
    rest = buf[pos:end]
    tail = tails.get(rest)
    if tail is None:
        tail = tails[rest] = _tail(buf, pos, end)
    # Positional, in the dataclass's field order (the property test checks it).
    return Task(
        task_id,
        queue,
        task_type,
        payload,
        tail[0],
        tail[1],
        tail[2],
        tail[3],
        unique_key or None,
        tail[4],
        tail[5],
        tail[6],
        tail[7],
        tail[8],
        tail[9],
        None,
        None,
        None,
        None,
        tail[10],
    )


def _tail(buf: bytes, pos: int, end: int) -> _Tail:
    """(state, attempt, max_attempts, priority, retry_backoff, created_at,
    updated_at, available_at, finished_at, last_error, limit_key) from fields
    6-15 and 20."""
    state = attempt = max_attempts = priority = 0
    backoff: RetryBackoff | None = None
    moments: list[datetime | None] = [None, None, None, None]
    last_error = limit_key = ""
    while pos < end:
        key = buf[pos]
        if key == 0x30 or key == 0x38 or key == 0x40 or key == 0x48:
            value, pos = read_varint(buf, pos + 1, end)
            if key == 0x30:
                state = value & _M32
            elif key == 0x38:
                attempt = value & _M32
            elif key == 0x40:
                max_attempts = value & _M32
            else:
                priority = value & _M32
                if priority >> 31:
                    priority -= 1 << 32
        elif key == 0x5A or key == 0x62 or key == 0x6A or key == 0x72:
            index = (key - 0x5A) >> 3
            # A message field sent twice: the generic decoder refuses it.
            if moments[index] is not None:
                raise _Generic
            moments[index], pos = read_timestamp(buf, pos + 1, end, None)
        elif key == 0x52:
            if backoff is not None:
                raise _Generic
            start, pos = read_len(buf, pos + 1, end)
            backoff = RetryBackoff.from_wire(decode(buf[start:pos], _WireRetryBackoff))
        elif key == 0x7A:
            start, pos = read_len(buf, pos + 1, end)
            last_error = buf[start:pos].decode()
        elif key == 0xA2 and pos + 1 < end and buf[pos + 1] == 0x01:
            # Field 20, limit_key (minor 13): an enqueue's own field.
            start, pos = read_len(buf, pos + 2, end)
            limit_key = buf[start:pos].decode()
        else:
            # Fields 16-19 (two-byte keys), 1-5 out of order, unknown fields.
            raise _Generic
    # Values this SDK does not know (a newer daemon) are UNSPECIFIED, as in
    # `TaskState.from_wire`.
    return (
        _STATES.get(state, TaskState.UNSPECIFIED),
        attempt,
        max_attempts,
        priority,
        backoff,
        *moments,
        last_error or None,
        limit_key or None,
    )


# -- the request ----------------------------------------------------------------------


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


def encode_enqueue_many_request(
    context: RequestContext | None, queue: str, specs: Sequence[TaskSpec]
) -> bytes:
    """``EnqueueManyRequest(context, queue, tasks=[spec.to_wire() ...])``,
    encoded without a wire message per spec: byte for byte the generic
    encoding, which a property test holds it to. Fields 4-8 of a spec
    (attempts, policy, schedule, priority) are encoded once per distinct
    value in the batch."""
    out = bytearray(encode(build(EnqueueManyRequest, context=context, queue=queue)))
    tails: dict[tuple[Any, ...], bytes] = {}
    for spec in specs:
        shared = (
            spec.max_attempts,
            spec.retry_backoff,
            spec.delay,
            spec.not_before,
            spec.priority,
        )
        tail = tails.get(shared)
        if tail is None:
            tail = tails[shared] = _spec_tail(spec)
        body = _field(b"\x0a", spec.task_type.encode()) if spec.task_type else b""
        if spec.payload:
            body += _field(b"\x12", spec.payload)
        if spec.unique_key:
            body += _field(b"\x1a", spec.unique_key.encode())
        body += tail
        if spec.limit_key:
            body += _field(b"\x4a", spec.limit_key.encode())
        out += _field(b"\x1a", body)
    return bytes(out)


def _spec_tail(spec: TaskSpec) -> bytes:
    """Fields 4-8 of ``spec.to_wire()``, encoded by the generic encoder."""
    wire = spec.to_wire()
    wire.task_type = ""
    wire.payload = b""
    wire.unique_key = ""
    wire.limit_key = ""
    return encode(wire)
