"""Bulk actions by filter (protocol minor 14): cancel, retry and delete the
tasks of a queue that match a ListTasks filter, at most `limit` per call.

The tasks are picked by the listing walk (`Storage.list_tasks`: the same
indexed, keyset-paged walk ListTasks runs, oldest enqueued first), then
changed by id in one statement per engine (`cancel_ids`, `delete_ids`) or,
for a retry, one `retry` each: every filter ListTasks knows works here
without a statement per combination of filters. A call walks until it has
`limit` matching tasks or the queue's matching tasks end, so it costs about
as many index entries as the filter matches (pages of `MAX_LIST_PAGE`);
`more` tells the caller to ask again. Bulk retries and deletes without a key
prefix keep their direct statements (`retry_dead`, `delete_finished`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from ringo_trio._contract.limits import MAX_LIST_PAGE
from ringo_trio._proto.ringo.v1 import Task

from .base import FailedPrecondition, NotFound, Storage, TaskFilter


async def matching(
    storage: Storage,
    queue: str,
    where: TaskFilter,
    limit: int,
    keep: Callable[[Task], bool | None],
) -> tuple[list[str], bool]:
    """Up to `limit` ids of tasks matching `where` and `keep`, oldest
    enqueued first, and whether more may match. `keep` answering None stops
    the walk there (the tasks after it are newer: a `created_before` cut)."""
    ids: list[str] = []
    after: int | None = None
    while True:
        page = await storage.list_tasks(
            queue, where, newest_first=False, after=after, limit=MAX_LIST_PAGE
        )
        for task, seq in zip(page.tasks, page.seqs, strict=True):
            verdict = keep(task)
            if verdict is None:
                return ids, False
            if verdict:
                ids.append(task.id)
                if len(ids) == limit:
                    return ids, seq != page.seqs[-1] or page.next_after is not None
        if page.next_after is None:
            return ids, False
        after = page.next_after


def _before(moment: datetime | None, cutoff: datetime | None) -> bool:
    return cutoff is None or (moment is not None and moment < cutoff)


async def cancel_matching(
    storage: Storage,
    queue: str,
    where: TaskFilter,
    created_before: datetime | None,
    reason: str,
    limit: int,
    now: datetime,
) -> tuple[list[tuple[str, str]], bool]:
    """CancelTasks: (id, limit_key) of each cancelled task, and `more`."""

    def keep(task: Task) -> bool | None:
        # At the cutoff too: the SDK's cutoff is the daemon's clock when the
        # call began, and a task enqueued in that microsecond is older.
        at = task.created_at
        return True if created_before is None or (at is not None and at <= created_before) else None

    ids, more = await matching(storage, queue, where, limit, keep)
    if not ids:
        return [], False
    return await storage.cancel_ids(queue, ids, reason, now), more


async def retry_matching(
    storage: Storage,
    queue: str,
    where: TaskFilter,
    finished_before: datetime | None,
    limit: int,
    now: datetime,
) -> tuple[int, bool]:
    """RetryTasks with a key prefix: each picked DEAD task retried as
    RetryTask does (one transaction each); one that changed meanwhile is
    left as it is."""
    ids, more = await matching(
        storage, queue, where, limit, lambda t: _before(t.finished_at, finished_before)
    )
    retried = 0
    for task_id in ids:
        try:
            await storage.retry(queue, now, task_id=task_id)
        except (NotFound, FailedPrecondition):
            continue
        retried += 1
    return retried, more


async def delete_matching(
    storage: Storage,
    queue: str,
    where: TaskFilter,
    finished_before: datetime | None,
    limit: int,
) -> tuple[int, bool]:
    """DeleteTasks with a type or key filter."""
    ids, more = await matching(
        storage, queue, where, limit, lambda t: _before(t.finished_at, finished_before)
    )
    if not ids:
        return 0, False
    return await storage.delete_ids(queue, ids, where.states), more
