"""Replies within `MAX_REPLY_BYTES` (docs/protocol.md, "Limits").

Theory of operation
-------------------
A gRPC client with default settings refuses a message over 4 MiB
(``RESOURCE_EXHAUSTED``), and it refuses it after the daemon acted on the
call: an EnqueueMany it then retries into duplicates, a Claim whose leases
nobody holds. So no reply may be bigger, whatever the tasks hold.

A reply of one task fits by the limits alone (`ONE_TASK_BYTES`: payload,
result and error at their maximum are 2.3 MiB). The replies whose number of
tasks the daemon chooses are cut to fit, measured with `task_bound`, an
upper bound of a task's encoded size read off its field lengths without
encoding it (a property test holds it above the real encoding):

* **Claim** (`claim_within`) answers fewer tasks rather than a bigger
  message: what a storage round leased beyond the reply's room is returned
  (`Storage.release`: PENDING, attempt unspent) before the reply is sent,
  and later rounds ask only for what the largest task seen so far leaves
  room for. The first task always fits.
* **EnqueueMany** answers each task `compact`: without payload and result,
  with last_error and the progress message cut to `MAX_LIST_ERROR_BYTES`
  (minor >= 11 always; below, when the full echo would not fit).
  `COMPACT_TASK_BYTES` times `MAX_BATCH` fits.
* **ListTasks** answers the longest prefix of its page that fits
  (`fitting`), with a page token after the last task it answers.
* **GetQueueStats** counts at most `MAX_STATS_TASK_TYPES` task types one by one.
* **ListSchedules** and **ListLimits** answer the longest prefix of their
  list that fits (`fitting`): a schedule's payload may be 1 MiB, and every
  queue's rules with their keys may be more than one reply; listing one
  queue at a time gets the rest.

ListQueues pages, RetryTasks, DeleteTasks and the Work stream's frames fit
by their limits; tests/server/rpc/test_reply_bounds.py calls every RPC at its
limits with a default grpcio client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import LeasedTask, Task

from ..storage.listing import cut_error

__all__ = [
    "CLAIM_ROUND",
    "COMPACT_TASK_BYTES",
    "ELEMENT_BYTES",
    "ONE_TASK_BYTES",
    "REPLY_BUDGET",
    "claim_within",
    "compact",
    "enqueue_results_fit",
    "fitting",
    "leased_bound",
    "task_bound",
]

ELEMENT_BYTES = 6
"""What a repeated element costs beyond its own encoding: a one-byte field
key and a length prefix of at most 5 bytes."""
REPLY_BUDGET = limits.MAX_REPLY_BYTES - 256
"""Room for a reply's list of tasks; 256 bytes are left for its other fields
(counts, a page token)."""

# Everything of a task but its texts and bytes, at its widest: state,
# attempt, max_attempts and priority as 10-byte varints, a backoff of two
# Durations and a double, five Timestamps, progress numbers and time, and
# the key and a 5-byte length prefix of each text and bytes field.
_TASK_FIXED = 320
# A TaskAttempt but its texts (minor 14): its element framing, attempt and
# outcome as 10-byte varints, two Timestamps, two texts' keys and prefixes.
_ATTEMPT_FIXED = 80
# A task's whole history at its widest: MAX_TASK_HISTORY attempts, each with
# a worker id of MAX_NAME_BYTES and an error of MAX_HISTORY_ERROR_CHARS
# characters (4 UTF-8 bytes at most each).
_HISTORY_BYTES = limits.MAX_TASK_HISTORY * (
    _ATTEMPT_FIXED + limits.MAX_NAME_BYTES + 4 * limits.MAX_HISTORY_ERROR_CHARS
)
# A Lease but its texts (task id, token, worker id): attempt, until, ttl,
# keys and length prefixes; plus the LeasedTask's own two keys and prefixes.
_LEASE_FIXED = 128


def _utf8(text: str) -> int:
    # Sizes on the wire are UTF-8 bytes; ASCII (the common case) skips the encode.
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def task_bound(task: Task) -> int:
    """At least the size of ``encode(task)``."""
    size = (
        _TASK_FIXED
        + len(task.payload)
        + _utf8(task.id)
        + _utf8(task.queue)
        + _utf8(task.task_type)
        + _utf8(task.unique_key)
        + _utf8(task.last_error)
        + _utf8(task.worker_id)
        + _utf8(task.limit_key)
        + len(task._unknown_fields)
    )
    for attempt in task.history:
        size += (
            _ATTEMPT_FIXED
            + _utf8(attempt.worker_id)
            + _utf8(attempt.error)
            + len(attempt._unknown_fields)
        )
    if task.result is not None:
        size += len(task.result)
    if task.progress is not None:
        size += _utf8(task.progress.message) + len(task.progress._unknown_fields)
    if task.retry_backoff is not None:
        size += len(task.retry_backoff._unknown_fields)
    return size


def leased_bound(item: LeasedTask) -> int:
    """At least the size of ``encode(item)``."""
    size = _LEASE_FIXED + len(item._unknown_fields)
    if item.task is not None:
        size += task_bound(item.task)
    lease = item.lease
    if lease is not None:
        size += _utf8(lease.task_id) + _utf8(lease.lease_token) + _utf8(lease.worker_id)
        size += len(lease._unknown_fields)
    return size


def _worst_task(**fields: int) -> int:
    # The bound of a task whose texts have the given byte sizes (ids are 32
    # characters; 64 leaves room for ids of other daemons of a shared store).
    return _TASK_FIXED + 64 + sum(fields.values())


ONE_TASK_BYTES = _worst_task(
    payload=limits.MAX_PAYLOAD_BYTES,
    result=limits.MAX_RESULT_BYTES,
    # A cancelled task's error is "cancelled: " and a reason of up to this.
    last_error=limits.MAX_ERROR_BYTES + 64,
    progress=limits.MAX_PROGRESS_MESSAGE_BYTES,
    names=4 * limits.MAX_NAME_BYTES,
    unique_key=limits.MAX_UNIQUE_KEY_BYTES,
    history=_HISTORY_BYTES,
)
"""A reply of one task (GetTask, RetryTask, CancelTask, Enqueue) is at most
this (the names: type, queue, worker, limit key)."""
COMPACT_TASK_BYTES = _worst_task(
    last_error=limits.MAX_LIST_ERROR_BYTES,
    progress=limits.MAX_LIST_ERROR_BYTES,
    names=4 * limits.MAX_NAME_BYTES,
    unique_key=limits.MAX_UNIQUE_KEY_BYTES,
)
"""A `compact` task is at most this."""
# EnqueueResult: its element framing, the task's, and `created`.
_ENQUEUE_RESULT_BYTES = 2 * ELEMENT_BYTES + 2
assert ONE_TASK_BYTES + 2 * ELEMENT_BYTES <= REPLY_BUDGET
assert limits.MAX_BATCH * (COMPACT_TASK_BYTES + _ENQUEUE_RESULT_BYTES) <= REPLY_BUDGET


def fitting(bounds: Sequence[int], budget: int = REPLY_BUDGET) -> int:
    """How many of the leading elements of a repeated field, of these
    `bounds`, fit in `budget` bytes (at least one when there is one)."""
    used = 0
    for index, bound in enumerate(bounds):
        used += bound + ELEMENT_BYTES
        if used > budget:
            return max(index, 1)
    return len(bounds)


def compact(task: Task) -> Task:
    """`task` as a compact EnqueueMany reply carries it."""
    progress = task.progress
    if progress is not None:
        progress = dataclasses.replace(progress, message=cut_error(progress.message))
    return dataclasses.replace(
        task,
        payload=b"",
        result=None,
        last_error=cut_error(task.last_error),
        progress=progress,
        history=[],
    )


def enqueue_results_fit(tasks: Sequence[Task], budget: int = REPLY_BUDGET) -> bool:
    """Whether an EnqueueMany reply echoing `tasks` whole fits in `budget`."""
    used = 0
    for task in tasks:
        used += task_bound(task) + _ENQUEUE_RESULT_BYTES
        if used > budget:
            return False
    return True


# A claimed task has no result (a task holds one only while SUCCEEDED) and
# no history (pushes and claims leave it out); its lease adds a task id, a
# token (512 bytes each at most) and a worker id.
_CLAIMED_TASK_BYTES = (
    ONE_TASK_BYTES
    - limits.MAX_RESULT_BYTES
    - _HISTORY_BYTES
    + _LEASE_FIXED
    + 2 * 512
    + limits.MAX_NAME_BYTES
)
CLAIM_ROUND = limits.MAX_MESSAGE_BYTES // _CLAIMED_TASK_BYTES
"""The most tasks one storage round of a Claim leases: their rows hold at
most one maximum message (64 MiB) whatever the payloads, as before replies
were bounded, and a claim of 1000 small tasks takes 20 rounds."""


async def claim_within(
    claim: Callable[[int], Awaitable[list[LeasedTask]]],
    release: Callable[[list[LeasedTask]], Awaitable[object]],
    limit: int,
    budget: int = REPLY_BUDGET,
) -> list[LeasedTask]:
    """Up to `limit` tasks leased by `claim(n)` (which leases up to n, in
    claim order) whose ClaimResponse fits in `budget`; at least one when
    any was leased. What a round leased beyond the room goes to `release`
    before this returns, so every lease not answered is handed back."""
    kept: list[LeasedTask] = []
    room = budget
    largest = 0
    while len(kept) < limit:
        ask = min(limit - len(kept), CLAIM_ROUND)
        if largest:
            # The tasks seen so far are the best guess of the next ones:
            # ask for no more than that leaves room for.
            ask = min(ask, room // largest)
            if ask <= 0:
                break
        batch = await claim(ask)
        cut = len(batch)
        for index, item in enumerate(batch):
            size = leased_bound(item) + ELEMENT_BYTES
            largest = max(largest, size)
            if size > room and (kept or index):
                cut = index
                break
            room -= size
        kept += batch[:cut]
        if cut < len(batch):
            await release(batch[cut:])
            break
        if len(batch) < ask:
            break
    return kept
