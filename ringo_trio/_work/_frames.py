"""The SDK's reading of the Work stream: the daemon's frames decoded straight
into what the worker's reader takes (`PushedTask`, `WorkResultFrame`).

Theory of operation
-------------------
Per task a worker decodes one push and one command result; the generic path
(`ringo_trio._wire.codec.decode`, then `as_frames` copying the messages into
models) builds a betterproto2 message per level on the way and was, with the
commands' encoding, ~23 % of a no-op worker's CPU (bench/results.md, "Where
the time goes"). The commands the worker sends are bytes only, encoded in
the shared `ringo_trio._wire.work`.

A frame whose body is one push (``WorkResponse.task``), one result
(``WorkResponse.result``) or a batch of those (minor >= 10) is read field by
field, each field at most once and in field-number order — the order every
encoder writes — straight into `PushedTask` / `WorkResultFrame`. Anything
else goes to the generic path, which decides: another body (registered,
heartbeat), a push without its task or lease, a result carrying an error, a
task with progress or a result, an unknown field, a repeated or out-of-order
field, a wrong wire type, a malformed byte. So the result, or the error, is
always exactly the generic path's.

This module is SDK-side (it builds `ringo_trio._models`), which is why it is
not in `ringo_trio._wire`: the daemon imports that package, never the SDK.
Property tests hold the decoder to the generic path on arbitrary and
corrupted input (tests/wire/test_work_wire.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from .._models import RetryBackoff, Task, TaskState
from .._proto.ringo.v1 import RetryBackoff as _WireRetryBackoff
from .._proto.ringo.v1 import TaskState as _WireTaskState
from .._proto.ringo.v1 import WorkResponse
from .._wire.codec import decode
from .._wire.primitives import (
    read_duration,
    read_len,
    read_seconds_nanos,
    read_timestamp,
    read_varint,
)

__all__ = ["PushedTask", "WorkResultFrame", "as_frames", "decode_work_response"]


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


_M32: Final = 0xFFFF_FFFF
_M64: Final = (1 << 64) - 1
_STATES: Final = {int(member): TaskState.from_wire(int(member)) for member in _WireTaskState}
_UNSPECIFIED: Final = TaskState.UNSPECIFIED

# Decoded retry policies by their bytes: a worker sees a handful, and the
# models are frozen, so sharing one never changes a result. Bounded by clearing.
_BACKOFFS: dict[bytes, RetryBackoff | None] = {}
_BACKOFF_MEMO_SIZE: Final = 256


def _task_factory() -> Callable[..., Task]:
    """`Task`'s positional constructor, setting each slot through its own
    descriptor: the frozen dataclass's ``__init__`` goes through
    ``object.__setattr__`` per field, twice the cost (~1 µs of a push). The
    same `Task`, equal and as frozen (the property test compares it with the
    generic decoder's)."""
    names = [field.name for field in dataclasses.fields(Task)]
    scope: dict[str, Any] = {"new": object.__new__, "Task": Task}
    scope.update({f"set_{name}": getattr(Task, name).__set__ for name in names})
    body = "".join(f"    set_{name}(task, {name})\n" for name in names)
    exec(f"def make({', '.join(names)}):\n    task = new(Task)\n{body}    return task\n", scope)
    factory: Callable[..., Task] = scope["make"]
    return factory


_new_task: Final = _task_factory()

_Decoded = PushedTask | WorkResultFrame | WorkResponse | list[PushedTask | WorkResultFrame]


class _Generic(Exception):
    """Not a frame this decoder reads: the generic decoder takes it."""


def decode_work_response(buffer: bytes | bytearray | memoryview) -> _Decoded:
    """A task push as `PushedTask`, a command result as `WorkResultFrame`,
    a batch (minor >= 10) as the list of its elements, each one of those
    two; any other frame (registered, heartbeat, a push without its task or
    lease) as the decoded `WorkResponse`. Raises `ValueError` on malformed
    input, and on a batch holding anything but pushes and results."""
    buf = buffer if type(buffer) is bytes else bytes(buffer)
    try:
        return _decode(buf)
    except (_Generic, ValueError, IndexError):
        return as_frames(decode(buf, WorkResponse))


def _decode(buf: bytes) -> PushedTask | WorkResultFrame | list[PushedTask | WorkResultFrame]:
    end = len(buf)
    if end and buf[0] == 0x2A:  # WorkResponse.batch
        start, pos = read_len(buf, 1, end)
        if pos != end:
            raise _Generic
        frames: list[PushedTask | WorkResultFrame] = []
        while start < end:
            if buf[start] != 0x0A:  # WorkResponseBatch.responses
                raise _Generic
            element, start = read_len(buf, start + 1, end)
            frames.append(_frame(buf, element, start))
        return frames
    return _frame(buf, 0, end)


def _frame(buf: bytes, pos: int, end: int) -> PushedTask | WorkResultFrame:
    """The WorkResponse in buf[pos:end], if its body is a push or a result."""
    if pos == end:
        raise _Generic
    key = buf[pos]
    start, stop = read_len(buf, pos + 1, end)
    if stop != end:
        raise _Generic  # a second field: a oneof set twice, or unknown
    if key == 0x12:
        return _push(buf, start, stop)
    if key == 0x1A:
        return _result(buf, start, stop)
    raise _Generic


def _result(buf: bytes, pos: int, end: int) -> WorkResultFrame:
    """A WorkResult without an error: its request id and the lease's until."""
    request_id = 0
    until = None
    if pos < end and buf[pos] == 0x08:
        request_id, pos = read_varint(buf, pos + 1, end)
        request_id &= _M64
    if pos < end and buf[pos] == 0x1A:
        start, pos = read_len(buf, pos + 1, end)
        until = _lease(buf, start, pos)[4]
    if pos != end:
        raise _Generic  # an error detail (rare: the generic path reads it), or else
    return WorkResultFrame(request_id, "", "", "", until)


def _push(buf: bytes, pos: int, end: int) -> PushedTask:
    """A LeasedTask: its task (field 1), then its lease (field 2)."""
    if pos >= end or buf[pos] != 0x0A:
        raise _Generic
    start, pos = read_len(buf, pos + 1, end)
    task = _task(buf, start, pos)
    if pos >= end or buf[pos] != 0x12:
        raise _Generic
    start, pos = read_len(buf, pos + 1, end)
    if pos != end:
        raise _Generic
    task_id, attempt, token, worker_id, until, ttl = _lease(buf, start, pos)
    return PushedTask(task, task_id, attempt, token, worker_id, until, ttl)


# `_lease` and `_task` read a one-byte length inline (`read_len` otherwise):
# ~10 % of a push. A length byte past `end` leaves `pos` past `end`, which
# every later field check and the final ``pos != end`` refuse.


def _lease(
    buf: bytes, pos: int, end: int
) -> tuple[str, int, str, str, datetime | None, float | None]:
    task_id = token = worker_id = ""
    attempt = 0
    until = ttl = None
    if pos < end and buf[pos] == 0x0A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        task_id = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x10:
        attempt, pos = read_varint(buf, pos + 1, end)
        attempt &= _M32
    if pos < end and buf[pos] == 0x1A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        token = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x22:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        worker_id = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x2A:
        until, pos = read_timestamp(buf, pos + 1, end, None)
    if pos < end and buf[pos] == 0x32:
        ttl, pos = _seconds(buf, pos + 1, end)
    if pos != end:
        raise _Generic
    return task_id, attempt, token, worker_id, until, ttl


# Seconds within which `_seconds` counts microseconds itself: a count of
# microseconds below 2**53 is exact as a float, so the division is the same
# correctly rounded one whether Python divides the ints or, compiled (mypyc),
# their floats (~285 years; a timedelta holds far more: the codec reads those).
_SECONDS_SPAN: Final = (1 << 53) // 1_000_000 - 1
# The last ttl read, by its bytes: the pushes of one batch frame share one
# (one claim, one moment of sending). A tuple, replaced whole.
_last_ttl: tuple[bytes, float] = (b"", 0.0)


def _seconds(buf: bytes, pos: int, end: int) -> tuple[float, int]:
    """A Duration as ``total_seconds()`` of the generic decoder's timedelta.

    Few ttls repeat beyond a batch, so the codec's memo of timedeltas
    (`read_duration`) would mostly miss; whole microseconds, what the daemon
    sends, are counted here, anything else is the codec's."""
    global _last_ttl
    start, stop = read_len(buf, pos, end)
    body = buf[start:stop]
    last = _last_ttl
    if body == last[0]:
        return last[1], stop
    seconds, nanos = read_seconds_nanos(buf, start, stop)
    if nanos % 1000 or not -_SECONDS_SPAN <= seconds <= _SECONDS_SPAN:
        return read_duration(buf, pos, end, None)[0].total_seconds(), stop
    # timedelta.total_seconds() is this very division of its microseconds.
    value = (seconds * 1_000_000 + nanos // 1000) / 1_000_000
    _last_ttl = (body, value)
    return value, stop


def _task(buf: bytes, pos: int, end: int) -> Task:
    """Fields 1-15, 17 and 18 of a Task, each optional, in that order;
    progress (16) or a result (19) sends the frame to the generic path."""
    task_id = queue = task_type = unique_key = last_error = worker_id = limit_key = ""
    payload = b""
    state = attempt = max_attempts = priority = 0
    backoff = None
    created = updated = available = finished = lease_until = None
    if pos < end and buf[pos] == 0x0A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        task_id = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x12:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        queue = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x1A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        task_type = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x22:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        payload = buf[start:pos]
    if pos < end and buf[pos] == 0x2A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        unique_key = buf[start:pos].decode()
    if pos < end and buf[pos] == 0x30:
        state, pos = read_varint(buf, pos + 1, end)
    if pos < end and buf[pos] == 0x38:
        attempt, pos = read_varint(buf, pos + 1, end)
        attempt &= _M32
    if pos < end and buf[pos] == 0x40:
        max_attempts, pos = read_varint(buf, pos + 1, end)
        max_attempts &= _M32
    if pos < end and buf[pos] == 0x48:
        priority, pos = read_varint(buf, pos + 1, end)
        priority &= _M32
        if priority >> 31:
            priority -= 1 << 32
    if pos < end and buf[pos] == 0x52:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        raw = buf[start:pos]
        if raw in _BACKOFFS:
            backoff = _BACKOFFS[raw]
        else:
            backoff = RetryBackoff.from_wire(decode(raw, _WireRetryBackoff))
            if len(_BACKOFFS) >= _BACKOFF_MEMO_SIZE:
                _BACKOFFS.clear()
            _BACKOFFS[raw] = backoff
    if pos < end and buf[pos] == 0x5A:
        created, pos = read_timestamp(buf, pos + 1, end, None)
    if pos < end and buf[pos] == 0x62:
        updated, pos = read_timestamp(buf, pos + 1, end, None)
    if pos < end and buf[pos] == 0x6A:
        available, pos = read_timestamp(buf, pos + 1, end, None)
    if pos < end and buf[pos] == 0x72:
        finished, pos = read_timestamp(buf, pos + 1, end, None)
    if pos < end and buf[pos] == 0x7A:
        size = buf[pos + 1]
        if size < 0x80:
            start = pos + 2
            pos = start + size
        else:
            start, pos = read_len(buf, pos + 1, end)
        last_error = buf[start:pos].decode()
    # Two-byte keys: a lone 0x8A/0x92 would be a truncated key, which
    # `read_len` then refuses (the bytes after it are past `end`).
    if pos + 1 < end and buf[pos] == 0x8A and buf[pos + 1] == 0x01:
        start, pos = read_len(buf, pos + 2, end)
        worker_id = buf[start:pos].decode()
    if pos + 1 < end and buf[pos] == 0x92 and buf[pos + 1] == 0x01:
        lease_until, pos = read_timestamp(buf, pos + 2, end, None)
    if pos + 1 < end and buf[pos] == 0xA2 and buf[pos + 1] == 0x01:
        start, pos = read_len(buf, pos + 2, end)
        limit_key = buf[start:pos].decode()
    if pos != end:
        raise _Generic
    # Positional, in the dataclass's field order (the property test checks it).
    # A state this SDK does not know (a newer daemon) is UNSPECIFIED, as in
    # `TaskState.from_wire`.
    return _new_task(
        task_id,
        queue,
        task_type,
        payload,
        _STATES.get(state & _M32, _UNSPECIFIED),
        attempt,
        max_attempts,
        priority,
        unique_key or None,
        backoff,
        created,
        updated,
        available,
        finished,
        last_error or None,
        None,
        worker_id or None,
        lease_until,
        None,
        limit_key or None,
        (),
    )


# -- the generic path --------------------------------------------------------------


def as_frames(response: WorkResponse) -> _Decoded:
    """A decoded WorkResponse as `decode_work_response` gives it. Raises
    `ValueError` on a batch holding anything but pushes and results."""
    batch = response.batch
    if batch is None:
        return _as_frame(response)
    frames: list[PushedTask | WorkResultFrame] = []
    for index, element in enumerate(batch.responses):
        frame = _as_frame(element)
        if isinstance(frame, WorkResponse):
            raise ValueError(f"batch.responses[{index}]: a batch holds pushes and results only")
        frames.append(frame)
    return frames


def _as_frame(response: WorkResponse) -> PushedTask | WorkResultFrame | WorkResponse:
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
