"""EnqueueMany's reply, encoded straight from the engine's tasks.

Theory of operation
-------------------
The reply echoes every task of the batch, so the generic encoder
(`encode(build(EnqueueManyResponse, ...))`: a message walk per
result, task and backoff) was ~5 ms per 1,000 tasks of the daemon's CPU. The
tasks of one batch share their queue, task types, timestamps and retry
policy; this encoder writes a task's fields 1-15 and 20 in field order (the order
the generic encoder writes) and encodes what repeats once per reply: the
queue and task type, and fields 6-15 (numbers, backoff, timestamps, last
error) keyed by their values, since equal values encode alike.

A task with anything beyond those — progress, worker, lease, result, unknown
fields: a duplicate's existing task may carry them — is encoded by the
generic encoder, so every byte is the one the generic encoder writes; a
property test holds the two byte-equal (tests/server/test_enqueue_reply.py).

A *compact* reply (`reply_bounds.compact`: minor >= 11, or an echo too big
for one reply) is the generic encoding of each task made compact: the
payload is left out and last_error cut, the other tasks go through
`compact` first.

It lives with the daemon, not in `ringo_trio._wire`, because the compact
reply is the daemon's policy (`reply_bounds`, storage's `cut_error`), which
the shared package may not import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ringo_trio._proto.ringo.v1 import Task
from ringo_trio._wire.codec import encode
from ringo_trio._wire.primitives import SMALL, varint, write_timestamp

from ..storage.listing import cut_error
from .reply_bounds import compact as _compact

__all__ = ["encode_enqueue_many_reply"]


def _field(tag: bytes, data: bytes | bytearray) -> bytes:
    size = len(data)
    return tag + (SMALL[size] if size < 0x80 else varint(size)) + data


def encode_enqueue_many_reply(
    results: Sequence[tuple[Task, bool]], created: int, duplicates: int, *, compact: bool = False
) -> bytes:
    """``EnqueueManyResponse(results=[EnqueueResult(task, created), ...],
    created_count=created, duplicate_count=duplicates)``, encoded; each
    task `compact` (`reply_bounds.compact`) when asked."""
    out = bytearray()
    heads: dict[tuple[str, str], bytes] = {}
    tails: dict[tuple[Any, ...], bytes] = {}
    for task, was in results:
        values: dict[str, Any] = task.__dict__
        body: bytes | bytearray
        if (
            values["progress"] is not None
            or values["worker_id"]
            or values["lease_until"] is not None
            or values["result"] is not None
            or values["history"]
            or values["_unknown_fields"]
        ):
            body = encode(_compact(task) if compact else task)
        else:
            # Fields 2-3 and 6-15 repeat across a batch: encoded once each.
            pair = (values["queue"], values["task_type"])
            head = heads.get(pair)
            if head is None:
                head = heads[pair] = _texts(((b"\x12", pair[0]), (b"\x1a", pair[1])))
            shared = (
                values["state"],
                values["attempt"],
                values["max_attempts"],
                values["priority"],
                values["retry_backoff"],
                values["created_at"],
                values["updated_at"],
                values["available_at"],
                values["finished_at"],
                cut_error(values["last_error"]) if compact else values["last_error"],
            )
            backoff = shared[4]
            # Equal values encode alike (equal instants, durations too).
            key = (
                *shared[:4],
                None if backoff is None else tuple(backoff.__dict__.values()),
                *shared[5:],
            )
            tail = tails.get(key)
            if tail is None:
                tail = tails[key] = _tail(*shared)
            body = bytearray()
            text = values["id"]
            if text:
                body += _field(b"\x0a", text.encode())
            body += head
            payload = values["payload"]
            if payload and not compact:
                body += _field(b"\x22", payload)
            text = values["unique_key"]
            if text:
                body += _field(b"\x2a", text.encode())
            body += tail
            # Fields 16-19 are absent on this path: field 20 follows the tail.
            text = values["limit_key"]
            if text:
                body += _field(b"\xa2\x01", text.encode())
        size = len(body)
        # EnqueueResult: field 1 the task, field 2 `created` when true.
        result = b"\x0a" + (SMALL[size] if size < 0x80 else varint(size)) + body
        if was:
            result += b"\x10\x01"
        out += _field(b"\x0a", result)
    if created:
        out += b"\x10" + varint(created)
    if duplicates:
        out += b"\x18" + varint(duplicates)
    return bytes(out)


def _texts(fields: Any) -> bytes:
    return b"".join(_field(tag, text.encode()) for tag, text in fields if text)


def _tail(
    state: int,
    attempt: int,
    max_attempts: int,
    priority: int,
    backoff: Any,
    *rest: Any,
) -> bytes:
    """Fields 6-15 of a task: numbers, backoff, timestamps, last error."""
    out = bytearray()
    for tag, number in (
        (b"\x30", state),
        (b"\x38", attempt),
        (b"\x40", max_attempts),
        (b"\x48", priority),
    ):
        if number:
            out += tag + varint(number)
    if backoff is not None:
        out += _field(b"\x52", encode(backoff))
    *moments, last_error = rest
    for tag, moment in zip((b"\x5a", b"\x62", b"\x6a", b"\x72"), moments, strict=True):
        if moment is not None:
            out += tag
            write_timestamp(out, moment, None)
    if last_error:
        out += _field(b"\x7a", last_error.encode())
    return bytes(out)
