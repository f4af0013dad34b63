"""The daemon's operator RPCs (protocol minor 9): inspect, cancel, purge and
bulk-retry the tasks of a queue (docs/operations.md).

`QueueService` admits each call (session, minor) and hands it here with the
daemon's `now`; these methods validate the request against the limits in
`_limits` and call the engine. Errors are the engine's conditions, mapped
to status codes by the service's `_rpc` wrapper like every unary call.
"""

from __future__ import annotations

import logging
from datetime import datetime

from ringo_trio._proto.ringo.v1 import (
    CancelTaskRequest,
    CancelTaskResponse,
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
)

from . import _validate as v
from ._wakeups import QueueWakeups
from .storage._base import Storage

__all__ = ["Operations"]

log = logging.getLogger("ringo_trio.server")


class Operations:
    def __init__(self, storage: Storage, wakeups: QueueWakeups) -> None:
        self._storage = storage
        self._wakeups = wakeups

    # -- inspection ----------------------------------------------------------

    async def list_tasks(self, message: ListTasksRequest, now: datetime) -> ListTasksResponse:
        raise NotImplementedError("ListTasks")

    async def get_queue_stats(
        self, message: GetQueueStatsRequest, now: datetime
    ) -> GetQueueStatsResponse:
        raise NotImplementedError("GetQueueStats")

    async def list_queues(self, message: ListQueuesRequest, now: datetime) -> ListQueuesResponse:
        raise NotImplementedError("ListQueues")

    # -- operations ----------------------------------------------------------

    async def cancel_task(self, message: CancelTaskRequest, now: datetime) -> CancelTaskResponse:
        queue = v.name(message.queue, "queue")
        task_id, unique_key = v.lookup(message.task_id, message.unique_key)
        reason = v.cancel_reason(message.reason)
        task = await self._storage.cancel(
            queue, reason, now, task_id=task_id, unique_key=unique_key
        )
        # Nothing to wake: a cancel makes no task claimable. A LEASED task's
        # worker learns it at its next renewal or settlement (LeaseLost).
        return CancelTaskResponse(task=task)

    async def retry_tasks(self, message: RetryTasksRequest, now: datetime) -> RetryTasksResponse:
        queue = v.name(message.queue, "queue")
        task_types = v.task_types(message.task_types)
        limit = v.batch_limit(message.limit)
        retried = await self._storage.retry_dead(
            queue, task_types, message.finished_before, limit, now
        )
        if retried:
            self._wakeups.notify(queue)
        # A full batch may have left more behind; the caller asks again (the
        # SDK fixes finished_before first, so tasks dying meanwhile do not
        # keep it going).
        return RetryTasksResponse(retried_count=retried, more=retried >= limit)

    # -- purge ---------------------------------------------------------------

    async def delete_tasks(self, message: DeleteTasksRequest, now: datetime) -> DeleteTasksResponse:
        queue = v.name(message.queue, "queue")
        states = v.finished_states(message.states)
        limit = v.batch_limit(message.limit)
        deleted = await self._storage.delete_finished(queue, states, message.finished_before, limit)
        if deleted:
            # Deleting is for good: leave a trace an operator can find.
            log.info("DeleteTasks deleted %d finished task(s) of queue %r", deleted, queue)
        return DeleteTasksResponse(deleted_count=deleted, more=deleted == limit)
