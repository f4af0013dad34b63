"""The daemon's operator RPCs (protocol minor 9): inspect, cancel, purge and
bulk-retry the tasks of a queue; pause and resume it (minor 13, `paused`)
(docs/operations.md).

`QueueService` admits each call (session, minor) and hands it here with the
daemon's `now`; these methods validate the request against the limits in
`_limits` and call the engine. Replies stay within ``MAX_REPLY_BYTES``
(`reply_bounds`): a ListTasks page too big for one is answered short with a
page token, GetQueueStats counts at most ``MAX_STATS_TASK_TYPES`` types one
by one. Errors are the engine's conditions, mapped
to status codes by the service's `_rpc` wrapper like every unary call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import struct
from datetime import datetime

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    CancelTaskRequest,
    CancelTaskResponse,
    CancelTasksRequest,
    CancelTasksResponse,
    DeleteTasksRequest,
    DeleteTasksResponse,
    GetQueueStatsRequest,
    GetQueueStatsResponse,
    ListQueuesRequest,
    ListQueuesResponse,
    ListTasksRequest,
    ListTasksResponse,
    RetryTasksRequest,
    RetryTasksResponse,
    SetQueuePausedRequest,
    SetQueuePausedResponse,
    TaskState,
)

from ..storage import bulk
from ..storage.base import Storage, TaskFilter
from . import validate as v
from .paused import PausedQueues
from .reply_bounds import fitting, task_bound
from .waits import TaskWaits
from .wakeups import QueueWakeups

__all__ = ["Operations"]

log = logging.getLogger("ringo_trio.server")


class Operations:
    def __init__(
        self, storage: Storage, wakeups: QueueWakeups, waits: TaskWaits, paused: PausedQueues
    ) -> None:
        self._storage = storage
        self._wakeups = wakeups
        self._waits = waits
        self._paused = paused

    # -- inspection ----------------------------------------------------------

    async def list_tasks(self, message: ListTasksRequest, now: datetime) -> ListTasksResponse:
        queue = v.name(message.queue, "queue")
        where = TaskFilter(
            states=v.task_states(message.states),
            task_types=tuple(v.task_types(message.task_types)),
            unique_key_prefix=v.key_prefix(message.unique_key_prefix),
        )
        newest_first = v.list_order(message.order)
        limit = v.page_size(message.page_size)
        filters = _filters_digest(queue, where, newest_first)
        after = _task_cursor(message.page_token, filters)
        page = await self._storage.list_tasks(
            queue, where, newest_first=newest_first, after=after, limit=limit
        )
        tasks, next_after = page.tasks, page.next_after
        keep = fitting([task_bound(task) for task in tasks])
        if keep < len(tasks):
            # Too big for one reply (long progress messages): a short page,
            # and the next one starts after its last task.
            tasks, next_after = tasks[:keep], page.seqs[keep - 1]
        token = "" if next_after is None else _task_token(next_after, filters)
        return ListTasksResponse(tasks=tasks, next_page_token=token)

    async def get_queue_stats(
        self, message: GetQueueStatsRequest, now: datetime
    ) -> GetQueueStatsResponse:
        queue = v.name(message.queue, "queue")
        stats = await self._storage.queue_stats(queue, now, by_type=True)
        # A queue may hold any number of task types; the reply must fit.
        del stats.by_type[limits.MAX_STATS_TASK_TYPES :]
        return GetQueueStatsResponse(stats=stats)

    async def list_queues(self, message: ListQueuesRequest, now: datetime) -> ListQueuesResponse:
        limit = v.page_size(message.page_size)
        after = _queue_cursor(message.page_token)
        # One more than asked tells whether a next page exists.
        queues = await self._storage.list_queues(now, after=after, limit=limit + 1)
        token = ""
        if len(queues) > limit:
            queues = queues[:limit]
            token = _queue_token(queues[-1].queue)
        return ListQueuesResponse(queues=queues, next_page_token=token)

    # -- operations ----------------------------------------------------------

    async def cancel_task(self, message: CancelTaskRequest, now: datetime) -> CancelTaskResponse:
        queue = v.name(message.queue, "queue")
        task_id, unique_key = v.lookup(message.task_id, message.unique_key)
        # Stored as the task's last_error, so an error's limit.
        reason = v.error_text(message.reason, "reason")
        task = await self._storage.cancel(
            queue, reason, now, task_id=task_id, unique_key=unique_key
        )
        # A cancel makes no task claimable, but a LEASED keyed task's end
        # frees a slot of its key's concurrency: the queue's claimers are
        # woken then. Its worker learns it at its next renewal or settlement
        # (LeaseLost); its WaitTask callers learn it now.
        if task.limit_key and self._storage.limited(queue):
            self._wakeups.notify(queue)
        self._waits.settled((task.id,))
        return CancelTaskResponse(task=task)

    async def retry_tasks(self, message: RetryTasksRequest, now: datetime) -> RetryTasksResponse:
        queue = v.name(message.queue, "queue")
        task_types = v.task_types(message.task_types)
        limit = v.batch_limit(message.limit)
        prefix = v.key_prefix(message.unique_key_prefix)
        if prefix:
            # Minor 14: the listing walk picks them (storage/bulk.py).
            where = TaskFilter((int(TaskState.DEAD),), tuple(task_types), prefix)
            retried, more = await bulk.retry_matching(
                self._storage, queue, where, message.finished_before, limit, now
            )
        else:
            retried = await self._storage.retry_dead(
                queue, task_types, message.finished_before, limit, now
            )
            more = retried >= limit
        if retried:
            self._wakeups.notify(queue)
        # A full batch may have left more behind; the caller asks again (the
        # SDK fixes finished_before first, so tasks dying meanwhile do not
        # keep it going).
        return RetryTasksResponse(retried_count=retried, more=more)

    async def cancel_tasks(self, message: CancelTasksRequest, now: datetime) -> CancelTasksResponse:
        queue = v.name(message.queue, "queue")
        where = TaskFilter(
            tuple(v.active_states(message.states)),
            tuple(v.task_types(message.task_types)),
            v.key_prefix(message.unique_key_prefix),
        )
        reason = v.error_text(message.reason, "reason")
        limit = v.batch_limit(message.limit)
        cancelled, more = await bulk.cancel_matching(
            self._storage, queue, where, message.created_before, reason, limit, now
        )
        # As CancelTask, per task: keyed leases free slots; waiters hear now.
        if any(key for _, key in cancelled) and self._storage.limited(queue):
            self._wakeups.notify(queue)
        if cancelled:
            self._waits.settled(tuple(task_id for task_id, _ in cancelled))
            log.info("CancelTasks cancelled %d task(s) of queue %r", len(cancelled), queue)
        return CancelTasksResponse(cancelled_count=len(cancelled), more=more)

    async def set_queue_paused(
        self, message: SetQueuePausedRequest, now: datetime
    ) -> SetQueuePausedResponse:
        queue = v.name(message.queue, "queue")
        changed = await self._paused.set(queue, message.paused, now)
        log.info(
            "queue %r %s%s",
            queue,
            "paused" if message.paused else "resumed",
            "" if changed else " (it already was)",
        )
        return SetQueuePausedResponse(paused=message.paused, changed=changed)

    # -- purge ---------------------------------------------------------------

    async def delete_tasks(self, message: DeleteTasksRequest, now: datetime) -> DeleteTasksResponse:
        queue = v.name(message.queue, "queue")
        states = v.finished_states(message.states)
        limit = v.batch_limit(message.limit)
        task_types = v.task_types(message.task_types)
        prefix = v.key_prefix(message.unique_key_prefix)
        if task_types or prefix:
            # Minor 14: the listing walk picks them (storage/bulk.py).
            where = TaskFilter(tuple(states), tuple(task_types), prefix)
            deleted, more = await bulk.delete_matching(
                self._storage, queue, where, message.finished_before, limit
            )
        else:
            deleted = await self._storage.delete_finished(
                queue, states, message.finished_before, limit
            )
            more = deleted == limit
        if deleted:
            # The deleted ids are not named: a waiter on one reads NOT_FOUND.
            self._waits.recheck()
            # Deleting is for good: leave a trace an operator can find.
            log.info("DeleteTasks deleted %d finished task(s) of queue %r", deleted, queue)
        return DeleteTasksResponse(deleted_count=deleted, more=more)


# -- page tokens -------------------------------------------------------------
#
# Opaque to clients, but plain: no secret, so a token outlives a daemon
# restart and works on every daemon of a shared store. A ListTasks token is
# version, cursor seq and a digest of the queue, filters and order: sent with
# other filters it is refused instead of silently resuming a different walk.
# Forging one gains nothing (the caller could list that queue anyway).

_TASK_TOKEN = struct.Struct(">BQ8s")
_TASK_TOKEN_VERSION = 1
_QUEUE_TOKEN_VERSION = b"q1:"
# Longer than any token this daemon hands out; checked before decoding.
_MAX_TOKEN_CHARS = 2 * (len(_QUEUE_TOKEN_VERSION) + limits.MAX_NAME_BYTES)


def _filters_digest(queue: str, where: TaskFilter, newest_first: bool) -> bytes:
    canonical = "\x00".join(
        [
            queue,
            ",".join(map(str, sorted(where.states))),
            "\x00".join(sorted(where.task_types)),
            where.unique_key_prefix,
            "newest" if newest_first else "oldest",
        ]
    )
    return hashlib.blake2b(canonical.encode(), digest_size=8, person=b"ringo-list").digest()


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode(token: str) -> bytes:
    if len(token) > _MAX_TOKEN_CHARS or not token.isascii():
        raise v.FieldError("page_token", "is not a token this daemon handed out")
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise v.FieldError("page_token", "is not a token this daemon handed out") from None


def _task_token(after: int, filters: bytes) -> str:
    return _encode(_TASK_TOKEN.pack(_TASK_TOKEN_VERSION, after, filters))


def _task_cursor(token: str, filters: bytes) -> int | None:
    if not token:
        return None
    raw = _decode(token)
    if len(raw) != _TASK_TOKEN.size:
        raise v.FieldError("page_token", "is not a ListTasks token this daemon handed out")
    version, after, digest = _TASK_TOKEN.unpack(raw)
    if version != _TASK_TOKEN_VERSION or after >= 2**63:
        raise v.FieldError("page_token", "is not a ListTasks token this daemon handed out")
    if digest != filters:
        raise v.FieldError(
            "page_token", "belongs to another queue, filter or order than this request's"
        )
    return int(after)


def _queue_token(queue: str) -> str:
    return _encode(_QUEUE_TOKEN_VERSION + queue.encode())


def _queue_cursor(token: str) -> str:
    if not token:
        return ""
    raw = _decode(token)
    if not raw.startswith(_QUEUE_TOKEN_VERSION):
        raise v.FieldError("page_token", "is not a ListQueues token this daemon handed out")
    try:
        return raw[len(_QUEUE_TOKEN_VERSION) :].decode()
    except UnicodeDecodeError:
        raise v.FieldError(
            "page_token", "is not a ListQueues token this daemon handed out"
        ) from None
