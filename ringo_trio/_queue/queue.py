"""TaskQueue: submission, lookup, listing, operator calls and manual claims of one queue.

Every operation validates its arguments before touching the network and
goes through `Connection.call`, which owns the retry rules: only lookups
(`TaskQueue.get_by_id`, `TaskQueue.get_by_unique_key`, each WaitTask of
`TaskQueue.wait`) are ever re-sent after the daemon became unavailable; every
other call here is a mutation and surfaces `UnavailableError` instead of
risking a double apply. `TaskQueue.wait` alone goes on asking through an
outage until its own timeout: it only reads.
"""

from __future__ import annotations

import builtins
import collections
import math
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import anyio

from .._contract import limits as _limits
from .._contract.durations import describe_duration
from .._contract.versions import Feature
from .._errors import InvalidArgumentError, RingoError, UnavailableError, require
from .._models import (
    BatchResult,
    EnqueueResult,
    LimitRule,
    LimitStatus,
    QueueStats,
    Task,
    TaskSpec,
    TaskState,
    check_duration,
    check_int,
    check_name,
    check_unique_key,
)
from .._proto.ringo.v1 import (
    CancelTaskRequest,
    CancelTaskResponse,
    ClaimRequest,
    ClaimResponse,
    DeleteLimitRequest,
    DeleteLimitResponse,
    EnqueueRequest,
    EnqueueResponse,
    GetQueueActivityRequest,
    GetQueueActivityResponse,
    GetQueueStatsRequest,
    GetQueueStatsResponse,
    GetTaskRequest,
    GetTaskResponse,
    ListLimitsRequest,
    ListLimitsResponse,
    ListOrder,
    ListTasksRequest,
    ListTasksResponse,
    RequestContext,
    RetryTaskRequest,
    RetryTaskResponse,
    SetLimitRequest,
    SetLimitResponse,
    SetQueuePausedRequest,
    SetQueuePausedResponse,
    WaitTaskRequest,
    WaitTaskResponse,
)
from .._proto.ringo.v1 import LimitRule as _WireLimitRule
from .._work._concurrency import AdaptiveConcurrency, ResourceConcurrency
from .._work._timeouts import TaskTimeouts
from .._work.worker import DEFAULT_STOP_TIMEOUT, Worker, check_concurrency, new_worker_id
from ._batch import decode_enqueue_many_reply, encode_enqueue_many_request
from .bulk import BulkCalls, check_reason, check_task_types
from .leased import LeasedTask
from .schedules import ScheduleCalls

if TYPE_CHECKING:
    from .._connection import Connection
    from .._work._handlers import Handler

__all__ = ["TaskPage", "TaskQueue"]

_FINISHED = (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)
# `wait`: the longest one WaitTask call parks (the daemon clamps to it too),
# and the pauses between asks while the daemon is away (restarting).
_MAX_PARK = _limits.MAX_TASK_WAIT.total_seconds()
_AWAY_RETRY_INITIAL = 0.2
_AWAY_RETRY_MAX = 2.0


def _wait_limit(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise InvalidArgumentError("timeout must be None or a non-negative number of seconds")
    return float(timeout)


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of `TaskQueue.list_page`."""

    tasks: tuple[Task, ...]
    """Listed tasks carry no payload and no result (`get_by_id` reads them)."""
    next_page_token: str | None
    """Pass to `list_page` (with the same filters) for the next page; None on the last."""


async def _list_page(connection: Connection, request: ListTasksRequest) -> TaskPage:
    reply = await connection.call("ListTasks", request, ListTasksResponse, read_only=True)
    return TaskPage(
        tasks=tuple(Task.from_wire(t) for t in reply.tasks),
        next_page_token=reply.next_page_token or None,
    )


class _TaskIterator:
    """`TaskQueue.list`: each `__anext__` hands out a buffered task or fetches
    the next page in the caller's own task. A plain object rather than an
    async generator, so a caller that stops early leaves no suspended frame
    to finalize and nothing running."""

    def __init__(self, connection: Connection, request: ListTasksRequest) -> None:
        self._connection = connection
        self._request = request
        self._buffer: collections.deque[Task] = collections.deque()
        self._done = False

    def __aiter__(self) -> _TaskIterator:
        return self

    async def __anext__(self) -> Task:
        # A page may be empty yet not the last (a bounded walk): keep going.
        while not self._buffer:
            if self._done:
                raise StopAsyncIteration
            page = await _list_page(self._connection, self._request)
            self._buffer.extend(page.tasks)
            if page.next_page_token is None:
                self._done = True
            else:
                # The request is this iterator's own: the next page is it again,
                # with the cursor.
                self._request.page_token = page.next_page_token
        return self._buffer.popleft()


class _EnqueueManyCall:
    """An EnqueueMany request encoded by the shared codec when sent (so a
    renegotiated ``context`` set by the retry rules is the one encoded)."""

    __slots__ = ("context", "queue", "specs")

    def __init__(self, queue: str, specs: list[TaskSpec]) -> None:
        self.context: RequestContext | None = None
        self.queue = queue
        self.specs = specs

    def SerializeToString(self) -> bytes:
        return encode_enqueue_many_request(self.context, self.queue, self.specs)


class _EnqueueManyReply:
    """Decodes an EnqueueMany reply straight into a `BatchResult`; a created
    task the reply carries without its payload gets the one sent."""

    def __init__(self, specs: list[TaskSpec]) -> None:
        self._payloads = [spec.payload for spec in specs]

    def FromString(self, data: bytes) -> BatchResult:
        try:
            return decode_enqueue_many_reply(data, self._payloads)
        except ValueError as exc:
            raise RingoError(f"malformed EnqueueMany reply from the daemon: {exc}") from None


class TaskQueue(ScheduleCalls, BulkCalls):
    """One named queue of a client. Get it with `RingoClient.queue`."""

    def __init__(self, connection: Connection, name: str) -> None:
        self._connection = connection
        self.name = name

    def __repr__(self) -> str:
        return f"<TaskQueue {self.name!r}>"

    # -- workers --------------------------------------------------------------

    def worker(
        self,
        handler: Handler,
        *,
        task_types: Iterable[str] | None = None,
        concurrency: int | AdaptiveConcurrency | ResourceConcurrency = 1,
        weight: int = 1,
        lease_duration: timedelta = _limits.DEFAULT_LEASE,
        grace_period: timedelta = timedelta(seconds=30),
        on_idle: Callable[[], Any] | None = None,
        idle_counts_scheduled: bool = True,
        task_timeouts: TaskTimeouts | None = None,
        stop_timeout: timedelta = DEFAULT_STOP_TIMEOUT,
        prefetch: int = 0,
    ) -> Worker:
        """A credit-controlled `Worker` of this queue (start it with ``worker.run``).

        ``handler(task, ctx)`` returning acks the task; raising `RetryTaskError`
        (or any other exception) nacks it; `PermanentTaskError` rejects it.
        ``concurrency`` handlers run at once; ``lease_duration`` is renewed
        automatically a third of the way before it ends; `Worker.close`
        waits ``grace_period`` for running handlers before cancelling them.

        Stopping hands work back: a handler the worker cancels because it
        stops (past the grace period, or because ``run`` itself was
        cancelled — an outer cancel scope, ``task.cancel()``, Ctrl-C) has its
        lease *released*: the task is PENDING again at once and keeps its
        attempt (protocol minor >= 7; an older daemon gets a nack). A handler
        that fails spends its attempt as usual. ``stop_timeout`` bounds how
        long a stopping worker waits for its cancelled handlers to exit and
        the daemon to answer their releases; a cancelled ``run`` returns
        within it (unless a handler ignores cancellation: see
        ``task_timeouts``).

        ``on_idle`` (a zero-argument callable, sync or async) is for bounded
        batch runs: once registered, the worker polls the queue's activity
        every 250 ms (``GetQueueActivity``, scoped to ``task_types``); after
        it has been continuously zero for 1 s with no handler running, the
        callback runs once, inside ``run()``. An exception it raises —
        ``SystemExit`` included — propagates out of ``run()`` unchanged.
        Needs protocol minor >= 1. Do not await ``worker.close()`` inside it.

        ``idle_counts_scheduled`` says whether a task scheduled in the future
        (PENDING, its ``available_at`` still to come) keeps the worker from
        being idle. True (the default) counts it: ``on_idle`` never fires
        while such a task waits. False counts only due and running tasks, so
        ``on_idle`` fires while only scheduled tasks remain; it needs
        protocol minor >= 8 (`IncompatibleVersionError` from ``run`` before
        any work otherwise).

        ``concurrency`` may also be a shared controller — an
        `AdaptiveConcurrency` or a `ResourceConcurrency` passed to several
        workers (of any queues and clients of this process): their handlers
        together never exceed its capacity, which is split between them by
        ``weight``. Needs protocol minor >= 2. See docs/worker.md.

        ``task_timeouts`` (a `TaskTimeouts`) bounds each handler call: a
        ``start_to_close`` deadline on its cancel scope (the task is nacked
        with the timeout), a ``no_start`` limit and a ``cancel_grace`` past
        which a handler that ignores cancellation *fences* the worker — it
        stops taking work and ``run()`` raises `WorkerFencedError`. See
        docs/timeouts.md.

        ``prefetch`` (default 0) lets the worker hold that many leased tasks
        beyond ``concurrency``, waiting in push order for a free slot, so
        the next tasks are already here when a handler finishes instead of
        one round trip to the daemon away (graphile-worker's local queue).
        It pays for many short tasks (bench/results.md); a waiting task's
        lease is renewed like a running one's, its attempt not yet spent, and
        it goes back unrun (PENDING, attempt kept) when the worker stops.
        Only with an integer ``concurrency``. See docs/worker.md.
        """

        if not callable(handler):
            raise InvalidArgumentError("handler must be callable")
        if on_idle is not None and not callable(on_idle):
            raise InvalidArgumentError("on_idle must be callable")
        if not isinstance(idle_counts_scheduled, bool):
            raise InvalidArgumentError("idle_counts_scheduled must be a bool")
        if not isinstance(concurrency, AdaptiveConcurrency | ResourceConcurrency):
            concurrency = check_concurrency(concurrency, low=1)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise InvalidArgumentError("weight must be a positive integer")
        if not isinstance(lease_duration, timedelta) or lease_duration < timedelta(0):
            raise InvalidArgumentError("lease_duration must be a non-negative timedelta")
        if lease_duration > _limits.MAX_LEASE:
            raise InvalidArgumentError(
                f"lease_duration must be at most {describe_duration(_limits.MAX_LEASE)}"
                f" (got {describe_duration(lease_duration)})"
            )
        if not isinstance(grace_period, timedelta) or grace_period < timedelta(0):
            raise InvalidArgumentError("grace_period must be a non-negative timedelta")
        if not isinstance(stop_timeout, timedelta) or stop_timeout <= timedelta(0):
            raise InvalidArgumentError("stop_timeout must be a positive timedelta")
        if task_timeouts is not None and not isinstance(task_timeouts, TaskTimeouts):
            raise InvalidArgumentError(
                f"task_timeouts must be a TaskTimeouts or None, got {type(task_timeouts).__name__}"
            )
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise InvalidArgumentError("prefetch must be a non-negative integer")
        if prefetch:
            if not isinstance(concurrency, int):
                raise InvalidArgumentError(
                    "prefetch needs an integer concurrency, not a shared controller"
                )
            check_concurrency(concurrency + prefetch, low=1)
        worker = Worker(
            self._connection,
            self.name,
            handler,
            task_types=check_task_types(task_types),
            concurrency=concurrency,
            weight=weight,
            lease_duration=lease_duration,
            grace_period=grace_period,
            on_idle=on_idle,
            idle_counts_scheduled=idle_counts_scheduled,
            task_timeouts=task_timeouts,
            stop_timeout=stop_timeout,
            prefetch=prefetch,
        )
        self._connection.register_worker(worker)
        return worker

    # -- submission ---------------------------------------------------------

    async def enqueue(self, spec: TaskSpec | None = None, /, **kwargs: Any) -> EnqueueResult:
        """Enqueue one task, given as a `TaskSpec` or as `TaskSpec` keyword arguments.

        A duplicate ``unique_key`` is not an error: the existing task comes
        back with ``created=False``.
        """
        if spec is None:
            spec = TaskSpec(**kwargs)
        elif kwargs:
            raise InvalidArgumentError("pass either a TaskSpec or keyword arguments, not both")
        elif not isinstance(spec, TaskSpec):
            raise InvalidArgumentError(f"spec must be a TaskSpec, got {type(spec).__name__}")
        if spec.limit_key is not None:
            require(self._connection.protocol_minor, Feature.LIMITS, "TaskSpec.limit_key")
        reply = await self._connection.call(
            "Enqueue", EnqueueRequest(queue=self.name, task=spec.to_wire()), EnqueueResponse
        )
        return EnqueueResult.from_wire(reply.result)

    async def enqueue_many(self, specs: Iterable[TaskSpec]) -> BatchResult:
        """Enqueue any number of tasks, in calls of at most 1000, in order.

        Fail-fast: the first failing call raises and later calls are not
        made (earlier ones stay applied; unique keys make a resubmission
        safe). Results keep submission order.

        A created task is the task as sent, payload included. A duplicate's
        task (``created=False``: the task that already held the unique key)
        comes without its payload and result, and with ``last_error`` and
        the progress message cut to 1,024 bytes: the daemon leaves them out
        so that its reply always fits one gRPC message (protocol minor >=
        11; below, when the whole reply would not fit).
        ``get_by_id(result.task.id)`` reads such a task whole.
        """
        specs = list(specs)
        for spec in specs:
            if not isinstance(spec, TaskSpec):
                raise InvalidArgumentError(f"specs must be TaskSpecs, got {type(spec).__name__}")
        if any(spec.limit_key is not None for spec in specs):
            require(self._connection.protocol_minor, Feature.LIMITS, "TaskSpec.limit_key")
        results: list[EnqueueResult] = []
        created = duplicates = 0
        for start in range(0, len(specs), _limits.MAX_BATCH):
            chunk = specs[start : start + _limits.MAX_BATCH]
            # grpclib only calls the response type's FromString: the decoder
            # of this chunk's reply, which knows the payloads sent.
            decoder = cast("type[BatchResult]", _EnqueueManyReply(chunk))
            batch = await self._connection.call(
                "EnqueueMany", _EnqueueManyCall(self.name, chunk), decoder
            )
            results.extend(batch.results)
            created += batch.created_count
            duplicates += batch.duplicate_count
        return BatchResult(
            results=tuple(results), created_count=created, duplicate_count=duplicates
        )

    # -- keyed limits (docs/limits.md) ----------------------------------------

    async def set_limit(
        self,
        prefix: str,
        *,
        rate: float | None = None,
        per: timedelta = timedelta(seconds=1),
        burst: int = 1,
        concurrency: int | None = None,
    ) -> LimitRule:
        """Set (create or replace) this queue's rule for the keys starting
        with `prefix`: at most `rate` task starts per `per` per key, in
        bursts of `burst`, and at most `concurrency` leased tasks per key.
        Needs protocol minor >= 13 (`IncompatibleVersionError`)."""
        require(self._connection.protocol_minor, Feature.LIMITS, "TaskQueue.set_limit")
        if not isinstance(prefix, str):
            raise InvalidArgumentError("prefix must be a string")
        if rate is None and concurrency is None:
            raise InvalidArgumentError("give a rate, a concurrency or both")
        check_duration("per", per)
        check_int("burst", burst, 1, _limits.MAX_LIMIT_BURST)
        if concurrency is not None:
            check_int("concurrency", concurrency, 1, _limits.MAX_LIMIT_CONCURRENCY)
        reply = await self._connection.call(
            "SetLimit",
            SetLimitRequest(
                queue=self.name,
                rule=_WireLimitRule(
                    prefix=prefix,
                    rate=float(rate or 0.0),
                    per=per,
                    burst=burst,
                    concurrency=concurrency or 0,
                ),
            ),
            SetLimitResponse,
        )
        return LimitRule.from_wire(reply.rule)

    async def limits(self, *, with_keys: bool = False) -> list[LimitStatus]:
        """This queue's rules, in prefix order; with `with_keys`, each with
        the keys that have tasks waiting or leased (the most waiting first)."""
        require(self._connection.protocol_minor, Feature.LIMITS, "TaskQueue.limits")
        reply = await self._connection.call(
            "ListLimits",
            ListLimitsRequest(queue=self.name, with_keys=with_keys),
            ListLimitsResponse,
            read_only=True,
        )
        return [LimitStatus.from_wire(s) for s in reply.limits]

    async def delete_limit(self, prefix: str) -> bool:
        """Delete this queue's rule for `prefix`; False when there was none."""
        require(self._connection.protocol_minor, Feature.LIMITS, "TaskQueue.delete_limit")
        reply = await self._connection.call(
            "DeleteLimit", DeleteLimitRequest(queue=self.name, prefix=prefix), DeleteLimitResponse
        )
        return reply.deleted

    # -- lookup -------------------------------------------------------------

    async def get_by_id(self, task_id: str) -> Task:
        """The task with this id; `NotFoundError` if there is none."""
        return await self._get(task_id=check_name("task_id", task_id))

    async def active_count(
        self, task_types: Iterable[str] | None = None, *, due_only: bool = False
    ) -> int:
        """Tasks of this queue not finished yet — PENDING (due or scheduled)
        and LEASED — of ``task_types`` (all types when None): what a worker's
        ``on_idle`` waits to see at zero. ``due_only`` leaves out PENDING
        tasks scheduled in the future (what ``idle_counts_scheduled=False``
        waits on). The daemon stops counting at 1,000 (1,000 means "at least
        1,000"). Needs protocol minor >= 1, and >= 8 with ``due_only``
        (`IncompatibleVersionError` before anything is sent)."""
        if due_only:
            require(
                self._connection.protocol_minor, Feature.DUE_ONLY_ACTIVITY, "active_count(due_only)"
            )
        reply = await self._connection.call(
            "GetQueueActivity",
            GetQueueActivityRequest(
                queue=self.name, task_types=check_task_types(task_types), due_only=due_only
            ),
            GetQueueActivityResponse,
            read_only=True,
        )
        return int(reply.active_task_count)

    async def get_by_unique_key(self, unique_key: str) -> Task:
        """The task with this unique key; `NotFoundError` if there is none."""
        return await self._get(unique_key=check_unique_key(unique_key))

    async def _get(self, *, task_id: str | None = None, unique_key: str | None = None) -> Task:
        reply = await self._connection.call(
            "GetTask",
            GetTaskRequest(queue=self.name, task_id=task_id, unique_key=unique_key),
            GetTaskResponse,
            read_only=True,
        )
        return Task.from_wire(reply.task)

    # The timeout is part of the answer (TimeoutError, and the same rule
    # across asks), not a cancel scope around one call.
    async def wait(
        self,
        task_id: str,
        *,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109
    ) -> Task:
        """The task with this id once it is terminal (SUCCEEDED, DEAD or
        CANCELLED): a SUCCEEDED task carries its `Task.result`.

        The daemon holds each call until the task ends (no polling), up to a
        minute per call; this asks again until then. ``timeout`` (seconds or
        a timedelta; None waits as long as it takes) elapsing first raises the
        builtin `TimeoutError`, and the task is left as it is. The daemon
        going away meanwhile (a restart, a failover) is ridden out: asked
        again once it is back, until the timeout (past it, `UnavailableError`).
        `NotFoundError` if there is no such task (or it was deleted meanwhile);
        `ResourceExhaustedError` when the daemon holds as many waits as it
        allows. Needs protocol minor >= 12 (`IncompatibleVersionError`
        before anything is sent)."""
        task_id = check_name("task_id", task_id)
        limit = _wait_limit(timeout)
        deadline = None if limit is None else anyio.current_time() + limit
        away = _AWAY_RETRY_INITIAL
        while True:
            # Asked each round: a daemon back from a restart may speak older.
            require(self._connection.protocol_minor, Feature.WAIT_TASK, "TaskQueue.wait")
            await self._wait_slot(task_id, deadline, limit)
            try:
                left = _MAX_PARK if deadline is None else deadline - anyio.current_time()
                park = min(max(left, 0.0), _MAX_PARK)
                reply = await self._connection.call(
                    "WaitTask",
                    WaitTaskRequest(
                        queue=self.name, task_id=task_id, timeout=timedelta(seconds=park)
                    ),
                    WaitTaskResponse,
                    read_only=True,
                    extra_timeout=park,
                )
            except UnavailableError:
                # The call recovered the connection once already; a daemon
                # restarting may take longer: ask again until the deadline.
                if self._connection.closed or (
                    deadline is not None and anyio.current_time() >= deadline
                ):
                    raise
                pause = away if deadline is None else min(away, deadline - anyio.current_time())
                away = min(away * 2, _AWAY_RETRY_MAX)
                reply = None
            finally:
                self._connection.wait_slots.release()
            if reply is None:
                await anyio.sleep(pause)
                continue
            away = _AWAY_RETRY_INITIAL
            task = Task.from_wire(reply.task)
            if task.state.is_terminal:
                return task
            if deadline is not None and anyio.current_time() >= deadline:
                raise TimeoutError(
                    f"task {task_id!r} of queue {self.name!r} is still {task.state.name}"
                    f" after {limit:g}s"
                )

    async def _wait_slot(self, task_id: str, deadline: float | None, limit: float | None) -> None:
        """One of the client's parked-wait slots (the daemon holds at most
        MAX_WAITS_PER_CONNECTION per connection: more wait here, in order,
        rather than fail with RESOURCE_EXHAUSTED), taken before the wait's
        own deadline."""
        slots = self._connection.wait_slots
        try:
            slots.acquire_nowait()
            return
        except anyio.WouldBlock:
            pass
        left = math.inf if deadline is None else deadline - anyio.current_time()
        with anyio.move_on_after(left):
            await slots.acquire()
            return
        raise TimeoutError(
            f"task {task_id!r} of queue {self.name!r}: no answer within {limit:g}s (every one"
            f" of this client's {_limits.MAX_WAITS_PER_CONNECTION} parked waits was taken)"
        )

    # -- retry --------------------------------------------------------------

    async def retry(self, unique_key: str) -> Task:
        """Reactivate a SUCCEEDED, DEAD or CANCELLED task, named by its
        unique key (its result is cleared).

        `FailedPreconditionError` if the task is still active.
        """
        return await self._retry(unique_key=check_unique_key(unique_key))

    async def retry_by_id(self, task_id: str) -> Task:
        """Reactivate a SUCCEEDED, DEAD or CANCELLED task, named by its id."""
        return await self._retry(task_id=check_name("task_id", task_id))

    async def _retry(self, *, task_id: str | None = None, unique_key: str | None = None) -> Task:
        reply = await self._connection.call(
            "RetryTask",
            RetryTaskRequest(queue=self.name, task_id=task_id, unique_key=unique_key),
            RetryTaskResponse,
        )
        return Task.from_wire(reply.task)

    # -- inspection (protocol minor >= 9) -----------------------------------

    def list(
        self,
        *,
        states: Iterable[TaskState] | None = None,
        task_types: Iterable[str] | None = None,
        unique_key_prefix: str = "",
        newest_first: bool = False,
        page_size: int = _limits.DEFAULT_LIST_PAGE,
    ) -> AsyncIterator[Task]:
        """The queue's tasks matching the filters, in enqueue order (or
        newest first), fetched ``page_size`` at a time as the iteration
        goes: ``async for task in queue.list(states=[TaskState.DEAD])``.

        Tasks enqueued or changed during the walk never make it repeat or
        skip a task that matched throughout. Listed tasks carry no payload
        and no result, and last_error cut to 1 KiB (`get_by_id` has them).
        Arguments are checked at once; nothing is sent before the first
        ``__anext__``, and leaving the loop early leaves nothing running.

        (Named after what it does for the caller; inside this class the
        built-in is spelled ``builtins.list``.)"""
        request = self._list_request(
            states, task_types, unique_key_prefix, newest_first, page_size, None
        )
        return _TaskIterator(self._connection, request)

    async def list_page(
        self,
        *,
        states: Iterable[TaskState] | None = None,
        task_types: Iterable[str] | None = None,
        unique_key_prefix: str = "",
        newest_first: bool = False,
        page_size: int = _limits.DEFAULT_LIST_PAGE,
        page_token: str | None = None,
    ) -> TaskPage:
        """One page of `list`, for callers that keep the cursor themselves.

        A page may hold fewer than ``page_size`` tasks, even none, and still
        have a ``next_page_token``: a unique-key-prefix filter (or a very
        wide type filter) walks a bounded number of tasks per page, and a
        page whose tasks would not fit one 4 MiB reply (long progress
        messages) ends early."""
        request = self._list_request(
            states, task_types, unique_key_prefix, newest_first, page_size, page_token
        )
        return await _list_page(self._connection, request)

    def _list_request(
        self,
        states: Iterable[TaskState] | None,
        task_types: Iterable[str] | None,
        unique_key_prefix: str,
        newest_first: bool,
        page_size: int,
        page_token: str | None,
    ) -> ListTasksRequest:
        require(self._connection.protocol_minor, Feature.OPERATE, "TaskQueue.list")
        wire_states = []
        for state in states or ():
            if not isinstance(state, TaskState):
                raise InvalidArgumentError(
                    f"states must hold TaskState values, got {type(state).__name__}"
                )
            wire_states.append(state.to_wire())
        if unique_key_prefix:
            check_unique_key(unique_key_prefix)
        check_int("page_size", page_size, 1, _limits.MAX_LIST_PAGE)
        if page_token is not None and not isinstance(page_token, str):
            raise InvalidArgumentError(
                f"page_token must be a string, got {type(page_token).__name__}"
            )
        return ListTasksRequest(
            queue=self.name,
            states=wire_states,
            task_types=check_task_types(task_types),
            unique_key_prefix=unique_key_prefix,
            order=ListOrder.NEWEST_FIRST if newest_first else ListOrder.OLDEST_FIRST,
            page_size=page_size,
            page_token=page_token or "",
        )

    async def stats(self) -> QueueStats:
        """Counts by state and by task type, and the oldest due task's age.
        Exact, and cheap however many tasks the queue holds. A queue without
        tasks answers zeros. ``by_type`` lists at most 10,000 task types
        (the first by name); the totals count every type."""
        require(self._connection.protocol_minor, Feature.OPERATE, "TaskQueue.stats")
        reply = await self._connection.call(
            "GetQueueStats",
            GetQueueStatsRequest(queue=self.name),
            GetQueueStatsResponse,
            read_only=True,
        )
        return QueueStats.from_wire(reply.stats)

    # -- pausing (protocol minor >= 13) -------------------------------------

    async def pause(self) -> bool:
        """Pause the queue: enqueues go on, but no daemon pushes or hands
        out its tasks until `resume`; handlers already running finish and
        settle as usual. True when this changed it (False: it was paused).
        A queue needs no task to be paused; it stays paused across daemon
        restarts. Other daemons on a shared PostgreSQL database follow at
        once, within 5 seconds at worst (docs/operations.md). Protocol minor
        >= 13 (`IncompatibleVersionError` before anything is sent)."""
        return await self._set_paused(True, "TaskQueue.pause")

    async def resume(self) -> bool:
        """Undo `pause`: waiting workers and claims get the queue's tasks at
        once. True when this changed it (False: it was not paused).
        Protocol minor >= 13."""
        return await self._set_paused(False, "TaskQueue.resume")

    async def _set_paused(self, paused: bool, what: str) -> bool:
        require(self._connection.protocol_minor, Feature.PAUSE_QUEUES, what)
        reply = await self._connection.call(
            "SetQueuePaused",
            SetQueuePausedRequest(queue=self.name, paused=paused),
            SetQueuePausedResponse,
        )
        return bool(reply.changed)

    # -- operations (protocol minor >= 9) -----------------------------------

    async def cancel(self, unique_key: str, *, reason: str = "") -> Task:
        """Cancel a PENDING or LEASED task named by its unique key; the task
        comes back CANCELLED (``last_error`` is ``"cancelled: <reason>"``).

        A LEASED task's lease ends at once: its worker learns it at the
        lease's next renewal (every third of the lease) or settlement, and
        cancels the handler; whatever that attempt then reports is not
        stored. Cancelling a CANCELLED task returns it unchanged;
        `FailedPreconditionError` for a SUCCEEDED or DEAD one, `NotFoundError`
        for none. `retry` brings a cancelled task back. Protocol minor >= 9.
        """
        return await self._cancel(reason, unique_key=check_unique_key(unique_key))

    async def cancel_by_id(self, task_id: str, *, reason: str = "") -> Task:
        """`cancel`, naming the task by its id."""
        return await self._cancel(reason, task_id=check_name("task_id", task_id))

    async def _cancel(
        self, reason: str, *, task_id: str | None = None, unique_key: str | None = None
    ) -> Task:
        require(self._connection.protocol_minor, Feature.OPERATE, "cancel")
        check_reason(reason)
        reply = await self._connection.call(
            "CancelTask",
            CancelTaskRequest(
                queue=self.name, task_id=task_id, unique_key=unique_key, reason=reason
            ),
            CancelTaskResponse,
        )
        return Task.from_wire(reply.task)

    # -- manual claim -------------------------------------------------------

    async def claim(
        self,
        limit: int = 1,
        *,
        task_types: Iterable[str] | None = None,
        wait_timeout: timedelta | None = None,
        lease_duration: timedelta | None = None,
        worker_id: str | None = None,
    ) -> builtins.list[LeasedTask]:
        """Lease up to ``limit`` available tasks (the advanced, pull-style API).

        ``wait_timeout`` long-polls for the first task; ``lease_duration``
        defaults to the daemon's. Settle every claimed task with
        `LeasedTask.ack`, `~LeasedTask.nack` or `~LeasedTask.reject` before
        its lease ends, or it is handed out again.
        """
        check_int("limit", limit, 1, _limits.MAX_BATCH)
        types = check_task_types(task_types)
        request = ClaimRequest(
            queue=self.name,
            worker_id=check_name("worker_id", worker_id)
            if worker_id is not None
            else new_worker_id(),
            task_types=types,
            limit=limit,
        )
        extra_timeout = 0.0
        if wait_timeout is not None:
            request.wait_timeout = check_duration(
                "wait_timeout", wait_timeout, maximum=_limits.MAX_WAIT_TIMEOUT
            )
            # The daemon may legitimately hold the call this long.
            extra_timeout = wait_timeout.total_seconds()
        if lease_duration is not None:
            request.lease_duration = check_duration(
                "lease_duration", lease_duration, maximum=_limits.MAX_LEASE
            )
        reply = await self._connection.call(
            "Claim", request, ClaimResponse, extra_timeout=extra_timeout
        )
        received = anyio.current_time()
        return [
            LeasedTask(self._connection, leased, received=received, lease_duration=lease_duration)
            for leased in reply.tasks
        ]
