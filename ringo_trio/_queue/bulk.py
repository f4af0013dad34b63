"""TaskQueue's bulk calls: retry, cancel and purge every task that matches a
filter, in batches (docs/operations.md, "Bulk actions")."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._contract import limits as _limits
from .._contract.durations import MAX_RETENTION
from .._contract.versions import Feature
from .._errors import InvalidArgumentError, require
from .._models import QueueStats, TaskState, check_duration, check_int, check_name, check_unique_key
from .._proto.ringo.v1 import (
    CancelTasksRequest,
    CancelTasksResponse,
    DeleteTasksRequest,
    DeleteTasksResponse,
    RetryTasksRequest,
    RetryTasksResponse,
)

if TYPE_CHECKING:
    from .._connection import Connection

__all__ = ["BulkCalls"]

_FINISHED = (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)
_ACTIVE = (TaskState.PENDING, TaskState.LEASED)


def check_task_types(task_types: Iterable[str] | None) -> builtins.list[str]:
    if task_types is None:
        return []
    # A bare string is an iterable of one-letter "types": always a mistake.
    if isinstance(task_types, str | bytes):
        raise InvalidArgumentError("task_types must be a collection of strings, not a string")
    types = [check_name("task type", t) for t in task_types]
    if len(types) > _limits.MAX_TASK_TYPES:
        raise InvalidArgumentError(f"at most {_limits.MAX_TASK_TYPES} task types per call")
    return types


def _prefix(minor: int, prefix: str) -> str:
    if not isinstance(prefix, str):
        raise InvalidArgumentError(
            f"unique_key_prefix must be a string, got {type(prefix).__name__}"
        )
    if prefix:
        require(minor, Feature.BULK_BY_FILTER, "unique_key_prefix")
        check_unique_key(prefix)
    return prefix


def _states(
    states: Iterable[TaskState], allowed: tuple[TaskState, ...], other: str, empty: str
) -> builtins.list[TaskState]:
    """A bulk call's states, each once, in order: all of them in ``allowed``
    (``other`` says what a state outside is), at least one (``empty``)."""
    if isinstance(states, TaskState | str):
        raise InvalidArgumentError("states must be a collection of TaskState")
    wanted: builtins.list[TaskState] = []
    for state in states:
        if state not in allowed:
            raise InvalidArgumentError(f"states: {state!r} is not {other}")
        if state not in wanted:
            wanted.append(state)
    if not wanted:
        raise InvalidArgumentError(empty)
    return wanted


def check_reason(reason: str) -> None:
    """A cancel's reason: stored as the task's last_error, so an error's limit."""
    if not isinstance(reason, str):
        raise InvalidArgumentError(f"reason must be a string, got {type(reason).__name__}")
    if len(reason.encode("utf-8", "surrogatepass")) > _limits.MAX_ERROR_BYTES:
        raise InvalidArgumentError(
            f"reason exceeds the {_limits.MAX_ERROR_BYTES}-byte limit (MAX_ERROR_BYTES)"
        )


class BulkCalls:
    """The bulk methods of `TaskQueue` (which sets these two)."""

    name: str
    _connection: Connection

    if TYPE_CHECKING:

        async def stats(self) -> QueueStats: ...  # TaskQueue's

    async def _daemon_now(self) -> datetime:
        """The daemon's clock, as its stats read it (never this machine's)."""
        as_of = (await self.stats()).as_of
        if as_of is None:
            raise InvalidArgumentError("daemon reply carried no time (stats.as_of)")
        return as_of

    async def retry_many(
        self,
        *,
        task_types: Iterable[str] | None = None,
        unique_key_prefix: str = "",
        finished_before: datetime | None = None,
        batch_size: int = _limits.DEFAULT_BULK_BATCH,
    ) -> int:
        """Reactivate every DEAD task (of ``task_types``; whose unique key
        starts with ``unique_key_prefix``, protocol minor >= 14; finished
        before ``finished_before``), in batches; how many were retried.

        Each batch of at most ``batch_size`` (1..10,000; 1,000 by default,
        so an SQLite daemon's loop is held ~30 ms at a time) is one RetryTasks
        call, oldest finished first, applied in one transaction; the loop
        ends when the daemon reports nothing more. Without
        ``finished_before`` the cutoff is the moment ``retry_many`` began,
        by the daemon's clock (read with one `stats` call: the cutoff is
        compared with times the daemon wrote, so this machine's clock, or a
        test's virtual one, must not decide it), so a task that dies again
        while it pages is not retried twice.
        Like every mutation it is never re-sent after `UnavailableError`;
        the batches before it stay applied. Protocol minor >= 9.
        """
        require(self._connection.protocol_minor, Feature.OPERATE, "retry_many")
        types = check_task_types(task_types)
        prefix = _prefix(self._connection.protocol_minor, unique_key_prefix)
        check_int("batch_size", batch_size, 1, _limits.MAX_DELETE_BATCH)
        if finished_before is None:
            finished_before = await self._daemon_now()
        elif not isinstance(finished_before, datetime) or finished_before.tzinfo is None:
            raise InvalidArgumentError("finished_before must be a timezone-aware datetime")
        request = RetryTasksRequest(
            queue=self.name,
            task_types=types,
            unique_key_prefix=prefix,
            finished_before=finished_before,
            limit=batch_size,
        )
        return await self._until_done("RetryTasks", request, RetryTasksResponse, "retried_count")

    # -- purge (protocol minor >= 9) ----------------------------------------

    async def purge(
        self,
        *,
        states: Iterable[TaskState] = _FINISHED,
        older_than: timedelta | None = None,
        task_types: Iterable[str] | None = None,
        unique_key_prefix: str = "",
        batch_size: int = _limits.DEFAULT_BULK_BATCH,
    ) -> int:
        """Delete finished tasks (SUCCEEDED, DEAD, CANCELLED) that finished
        more than ``older_than`` ago (any age when None), in batches; how
        many were deleted. Their unique keys can be used again.
        ``task_types`` and ``unique_key_prefix`` narrow it further (protocol
        minor >= 14).

        Each batch (``batch_size`` tasks, at most 10,000, 1,000 by default:
        an SQLite daemon's loop is held ~30 ms at a time) is one DeleteTasks
        call and one transaction on the daemon, oldest finished first;
        batches follow one another until the daemon finds no more. The age
        is measured on the daemon's clock (one `stats` call), once, at the
        start: it is compared with the finish times the daemon wrote. After an
        error the batches already done stay done: call it again. Needs
        protocol minor >= 9 (`IncompatibleVersionError` before anything is
        sent)."""
        require(self._connection.protocol_minor, Feature.OPERATE, "purge")
        wanted = _states(
            states,
            _FINISHED,
            "a finished state; only SUCCEEDED, DEAD or CANCELLED tasks can be purged",
            "states must name at least one finished state",
        )
        check_int("batch_size", batch_size, 1, _limits.MAX_DELETE_BATCH)
        types = check_task_types(task_types)
        if types:
            require(self._connection.protocol_minor, Feature.BULK_BY_FILTER, "purge(task_types)")
        prefix = _prefix(self._connection.protocol_minor, unique_key_prefix)
        finished_before = None
        if older_than is not None:
            check_duration("older_than", older_than, maximum=MAX_RETENTION)
            finished_before = await self._daemon_now() - older_than
        request = DeleteTasksRequest(
            queue=self.name,
            states=[state.to_wire() for state in wanted],
            finished_before=finished_before,
            limit=batch_size,
            task_types=types,
            unique_key_prefix=prefix,
        )
        return await self._until_done("DeleteTasks", request, DeleteTasksResponse, "deleted_count")

    async def cancel_many(
        self,
        *,
        states: Iterable[TaskState] = _ACTIVE,
        task_types: Iterable[str] | None = None,
        unique_key_prefix: str = "",
        reason: str = "",
        batch_size: int = _limits.DEFAULT_BULK_BATCH,
    ) -> int:
        """Cancel every PENDING and/or LEASED task (of ``task_types``; whose
        unique key starts with ``unique_key_prefix``), as `cancel` does for
        one, in batches; how many were cancelled.

        Each batch of at most ``batch_size`` (1..10,000) is one CancelTasks
        call, oldest enqueued first, in one transaction. Only tasks enqueued
        before the call began (by the daemon's clock) are cancelled, so
        tasks enqueued while it pages are left alone. Protocol minor >= 14.
        """
        require(self._connection.protocol_minor, Feature.BULK_BY_FILTER, "cancel_many")
        wanted = _states(
            states,
            _ACTIVE,
            "an active state; only PENDING or LEASED tasks can be cancelled",
            "states must name PENDING, LEASED or both",
        )
        check_reason(reason)
        check_int("batch_size", batch_size, 1, _limits.MAX_DELETE_BATCH)
        request = CancelTasksRequest(
            queue=self.name,
            states=[state.to_wire() for state in wanted],
            task_types=check_task_types(task_types),
            unique_key_prefix=_prefix(self._connection.protocol_minor, unique_key_prefix),
            created_before=await self._daemon_now(),
            reason=reason,
            limit=batch_size,
        )
        return await self._until_done(
            "CancelTasks", request, CancelTasksResponse, "cancelled_count"
        )

    async def _until_done(
        self, method: str, request: Any, reply_type: type[Any], counted: str
    ) -> int:
        """Call `method` batch after batch until the daemon reports no more;
        the sum of each reply's `counted`."""
        total = 0
        while True:
            reply = await self._connection.call(method, request, reply_type)
            total += int(getattr(reply, counted))
            if not reply.more:
                return total
