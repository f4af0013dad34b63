"""Typed tasks: functions registered by name, enqueued with typed arguments,
awaited for typed results, and run by one worker that routes a queue's task
types to them (docs/tasks.md).

Theory of operation. A `TaskFunction` is a function plus what enqueueing it
needs: its name (the task type on the wire), its queue, its default options
and its `TaskSignature` (``ringo_trio._tasks.codec``), which turns a call's
arguments into the payload and a payload back into arguments. Nothing here
adds to the protocol: a typed task is an ordinary task whose type is the
function's name and whose payload is the registry's encoding (JSON), so raw
workers, the dashboard and ``ringo tasks`` see it as they see any task.

The worker side is an ordinary `Worker` (every stop guarantee unchanged)
whose handler is a `_Router`: it registers exactly the task types the
registry defines on that queue, so other types stay for other workers, and
per task it decodes the payload (a payload that does not decode or validate
is rejected at once — DEAD, never retried: no attempt can fix it), calls the
function, and encodes what it returns as the task's result. A function that
is not ``async`` runs in a worker thread, so it cannot stall the event loop.

`TaskHandle.result` is `TaskQueue.wait` (the ``WaitTask`` call: no polling)
plus the decoding of the result against the function's return annotation.

A task declared with ``schedule=`` (a cron expression) is a schedule stored
in the daemon (docs/schedules.md), named like the task, whose ticks enqueue
the task with no arguments (so every payload parameter needs a default,
checked at decoration). Declaring it stores nothing: the daemon learns of it
from `TaskRegistry.apply_schedules`, an async call (a worker is made
synchronously, so it cannot be the worker's), which ``ringo worker
module:registry`` and the testing kit's ``run_worker`` make before the
worker starts. The daemon fires it exactly once per tick however many
workers applied it.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import weakref
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import anyio

from .._contract.cron import CronError, parse_cron, zone
from .._errors import (
    InvalidArgumentError,
    PermanentTaskError,
    RetryTaskError,
    TaskCancelledError,
    TaskFailedError,
)
from .._models import RetryBackoff, Schedule, Task, TaskSpec, TaskState, check_name
from .._work._handlers import TaskContext
from .codec import CodecError, TaskSignature

if TYPE_CHECKING:
    from .._client import RingoClient
    from .._queue.queue import TaskQueue
    from .._work.worker import Worker

__all__ = [
    "DEFAULT_QUEUE",
    "TaskCall",
    "TaskFunction",
    "TaskHandle",
    "TaskRegistry",
    "TaskRouter",
    "apply_queue_schedules",
]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

#: The queue of a task whose decorator and registry name none.
DEFAULT_QUEUE = "default"

# The registry whose worker took (queue, task name) first, per client: two
# registries' workers splitting one task type between them would each decode
# the other's payloads with the wrong function.
_TAKEN: weakref.WeakKeyDictionary[RingoClient, dict[tuple[str, str], TaskRegistry]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True, slots=True)
class _Options:
    """What every enqueue of one `TaskCall` gets (`TaskSpec`'s fields but the payload)."""

    queue: str
    max_attempts: int | None = None
    retry_backoff: RetryBackoff | None = None
    priority: int = 0
    unique_key: str | None = None
    delay: timedelta | None = None
    not_before: datetime | None = None
    limit_key: str | None = None

    def changed(self, **values: Any) -> _Options:
        """These options with every value given that is not None (a queue
        name checked here, where it is written)."""
        changes = {key: value for key, value in values.items() if value is not None}
        if "queue" in changes:
            check_name("queue", changes["queue"])
        return replace(self, **changes)

    def spec(self, name: str, payload: bytes) -> TaskSpec:
        return TaskSpec(
            task_type=name,
            payload=payload,
            unique_key=self.unique_key,
            max_attempts=self.max_attempts,
            retry_backoff=self.retry_backoff,
            delay=self.delay,
            not_before=self.not_before,
            priority=self.priority,
            limit_key=self.limit_key,
        )


class TaskHandle(Generic[R_co]):
    """One enqueued task of a `TaskFunction`: its id, its status, its result.

    ``created`` is False when ``unique_key`` named a task that existed: the
    handle is then that task's.
    """

    def __init__(
        self, client: RingoClient, queue: str, task_id: str, created: bool, signature: TaskSignature
    ) -> None:
        self._client = client
        self._signature = signature
        self.queue = queue
        self.task_id = task_id
        self.created = created

    def __repr__(self) -> str:
        return f"<TaskHandle {self.task_id} of queue {self.queue!r}>"

    async def status(self) -> Task:
        """The task as the daemon has it now (`TaskQueue.get_by_id`)."""
        return await self._client.queue(self.queue).get_by_id(self.task_id)

    # The timeout is the wait's own, sent to the daemon as the long-poll's
    # bound (an outer cancel scope also works, but cannot tell the daemon).
    async def result(self, timeout: float | timedelta | None = None) -> R_co:  # noqa: ASYNC109
        """Wait until the task ends and return what its function returned,
        decoded to the function's return annotation.

        Raises `TaskFailedError` (the task is DEAD: ``exc.task``,
        ``exc.last_error``), `TaskCancelledError`, or the builtin
        `TimeoutError` when ``timeout`` (seconds or a timedelta; None waits
        as long as it takes) passes first — the task itself is untouched.
        The wait is one long-poll at a time (``WaitTask``, protocol minor
        >= 12), re-issued across reconnects and daemon restarts.
        """
        task = await self._client.queue(self.queue).wait(self.task_id, timeout=timeout)
        return self.decode(task)

    def decode(self, task: Task) -> R_co:
        """The result of a terminal ``task`` of this handle's function."""
        if task.state is TaskState.DEAD:
            raise TaskFailedError(task)
        if task.state is TaskState.CANCELLED:
            raise TaskCancelledError(task)
        try:
            value: R_co = self._signature.decode_result(task.result)
        except CodecError as exc:
            raise InvalidArgumentError(
                f"the result of task {task.id} does not decode as its function returns it: {exc}"
            ) from None
        return value


class TaskCall(Generic[R]):
    """A task function with the options its enqueues get: made by
    ``task.configure(...)`` (per-call options) and by the decorator itself."""

    def __init__(self, function: TaskFunction[R], options: _Options) -> None:
        self._function = function
        self._options = options
        # Every option checked now, where the mistake is, not at enqueue time.
        options.spec(function.name, b"")

    @property
    def name(self) -> str:
        return self._function.name

    @property
    def queue(self) -> str:
        return self._options.queue

    @property
    def options(self) -> Mapping[str, Any]:
        """The options each enqueue gets (``queue``, ``priority``, ...)."""
        return {field: getattr(self._options, field) for field in self._options.__slots__}

    def configure(
        self,
        *,
        queue: str | None = None,
        unique_key: str | None = None,
        delay: timedelta | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        retry_backoff: RetryBackoff | None = None,
        limit_key: str | None = None,
    ) -> TaskCall[R]:
        """The same task with some options changed for the enqueues of the
        result (``delay`` and ``not_before`` replace each other;
        ``limit_key`` names the key the queue's limit rules apply to,
        docs/limits.md)."""
        options = self._options.changed(
            queue=queue,
            unique_key=unique_key,
            priority=priority,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            limit_key=limit_key,
        )
        if delay is not None or not_before is not None:
            options = replace(options, delay=delay, not_before=not_before)
        return TaskCall(self._function, options)

    def spec(self, *args: Any, **kwargs: Any) -> TaskSpec:
        """The `TaskSpec` an enqueue with these arguments sends (for the raw API)."""
        payload = self._function.signature.encode_arguments(args, kwargs)
        return self._options.spec(self.name, payload)

    async def enqueue(self, client: RingoClient, /, *args: Any, **kwargs: Any) -> TaskHandle[R]:
        """Enqueue one call of the function (arguments as you would call it,
        without its `TaskContext`); arguments that do not fit its signature or
        do not encode raise `InvalidArgumentError` and nothing is sent."""
        spec = self.spec(*args, **kwargs)
        result = await client.queue(self.queue).enqueue(spec)
        return self._handle(client, result.task.id, result.created)

    async def enqueue_many(
        self, client: RingoClient, arguments: Iterable[Mapping[str, Any]]
    ) -> list[TaskHandle[R]]:
        """Enqueue one call per mapping of keyword arguments, batched
        (`TaskQueue.enqueue_many`: calls of at most 1,000, in order); one
        handle per mapping, in order. Every mapping is encoded before
        anything is sent."""
        if self._options.unique_key is not None:
            raise InvalidArgumentError(
                "enqueue_many with a unique_key would make every task but the first a duplicate"
            )
        if isinstance(arguments, Mapping):
            raise InvalidArgumentError("arguments must be an iterable of mappings, not a mapping")
        specs = []
        for kwargs in arguments:
            if not isinstance(kwargs, Mapping):
                raise InvalidArgumentError(
                    f"each argument set must be a mapping, got {type(kwargs).__name__}"
                )
            specs.append(self.spec(**kwargs))
        batch = await client.queue(self.queue).enqueue_many(specs)
        return [self._handle(client, r.task.id, r.created) for r in batch.results]

    def _handle(self, client: RingoClient, task_id: str, created: bool) -> TaskHandle[R]:
        return TaskHandle(client, self.queue, task_id, created, self._function.signature)


class TaskFunction(TaskCall[R]):
    """A function registered with `TaskRegistry.task`.

    Calling it calls the function itself (tests pass a
    `ringo_trio.testing.task_context` for its `TaskContext` parameter);
    ``enqueue`` / ``enqueue_many`` / ``configure`` are `TaskCall`'s.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        options: _Options,
        registry: TaskRegistry,
        schedule: str | None = None,
        schedule_timezone: str = "UTC",
    ) -> None:
        self.fn = fn
        self.signature = TaskSignature.of(fn)
        #: The cron expression of the task's schedule (None: not scheduled).
        self.schedule = schedule
        self.schedule_timezone = schedule_timezone
        # Asked once: `inspect.iscoroutinefunction` costs ~1 us a call.
        self._is_async = inspect.iscoroutinefunction(fn)
        self._name = check_name("name", name)
        self.registry = registry
        super().__init__(self, options)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def name(self) -> str:
        """The task type on the wire: ``module:qualname`` unless given."""
        return self._name

    def __repr__(self) -> str:
        return f"<TaskFunction {self._name!r} on queue {self.queue!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    async def run(self, task: Task, ctx: TaskContext) -> bytes | None:
        """Run ``task`` (a task of this function) as its worker does: decode,
        call, encode the result. A payload that does not decode or validate,
        or a result that does not encode, is a `PermanentTaskError`."""
        try:
            kwargs = self.signature.decode_arguments(task.payload)
        except CodecError as exc:
            raise PermanentTaskError(f"arguments of {self._name} do not validate: {exc}") from None
        if self.signature.context_parameter is not None:
            kwargs[self.signature.context_parameter] = ctx
        if self._is_async:
            value = await self.fn(**kwargs)
        else:
            # A plain function may block: it runs in a worker thread, and a
            # stopping worker waits for it (threads cannot be cancelled).
            with _clock_held():
                value = await anyio.to_thread.run_sync(partial(self.fn, **kwargs))
            if inspect.isawaitable(value):
                value = await value
        try:
            return self.signature.encode_result(value)
        except CodecError as exc:
            raise PermanentTaskError(f"the result of {self._name} does not encode: {exc}") from None


def _clock_held() -> contextlib.AbstractContextManager[None]:
    """Under the testing kit's virtual clock, its jumps wait for the thread
    (`ringo_trio.testing._virtual.clock_held`); looked up, not imported, so
    a worker never loads the kit."""
    virtual = sys.modules.get("ringo_trio.testing._virtual")
    return contextlib.nullcontext() if virtual is None else virtual.clock_held()


class _Decorator(Protocol):
    @overload
    def __call__(self, fn: Callable[..., Coroutine[Any, Any, R]], /) -> TaskFunction[R]: ...
    @overload
    def __call__(self, fn: Callable[..., R], /) -> TaskFunction[R]: ...


class TaskRegistry:
    """Task functions by name, and the worker that runs them.

    ::

        tasks = TaskRegistry()

        @tasks.task(queue="emails", max_attempts=5)
        async def send_email(to: str, subject: str, ctx: TaskContext) -> Receipt: ...

        handle = await send_email.enqueue(client, to="a@example.org", subject="hi")
        receipt = await handle.result(timeout=30)
        worker = tasks.worker(client, queue="emails", concurrency=64)

    The registry's own options (``queue``, ``max_attempts``,
    ``retry_backoff``, ``priority``) are defaults for its tasks; a task's
    decorator overrides them, ``configure`` overrides both per call.
    """

    def __init__(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int | None = None,
        retry_backoff: RetryBackoff | None = None,
        priority: int = 0,
    ) -> None:
        check_name("queue", queue)
        self._defaults = _Options(
            queue=queue, max_attempts=max_attempts, retry_backoff=retry_backoff, priority=priority
        )
        self._defaults.spec("-", b"")
        self._tasks: dict[str, TaskFunction[Any]] = {}

    def __repr__(self) -> str:
        return f"<TaskRegistry of {len(self._tasks)} task(s)>"

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[TaskFunction[Any]]:
        return iter(list(self._tasks.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __getitem__(self, name: str) -> TaskFunction[Any]:
        try:
            return self._tasks[name]
        except KeyError:
            raise KeyError(f"no task named {name!r} in this registry") from None

    @overload
    def task(self, fn: Callable[..., Coroutine[Any, Any, R]], /) -> TaskFunction[R]: ...
    @overload
    def task(self, fn: Callable[..., R], /) -> TaskFunction[R]: ...
    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        retry_backoff: RetryBackoff | None = None,
        priority: int | None = None,
        schedule: str | None = None,
        schedule_timezone: str = "UTC",
    ) -> _Decorator: ...
    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        retry_backoff: RetryBackoff | None = None,
        priority: int | None = None,
        schedule: str | None = None,
        schedule_timezone: str = "UTC",
    ) -> Any:
        """Register a function (``async def`` or plain) as a task:
        ``@tasks.task`` or ``@tasks.task(queue=..., ...)``.

        ``name`` (default ``module:qualname``) is the task type stored with
        each task: keep it stable while tasks of it may be queued. A name
        registered twice is an `InvalidArgumentError`.

        ``schedule`` (a cron expression, read in ``schedule_timezone``) runs
        the task with no arguments at each tick, once whatever the number of
        workers: a schedule of the task's queue named like the task, stored
        by `apply_schedules` (docs/tasks.md, Schedules). Every payload
        parameter must then have a default (`InvalidArgumentError` here,
        as for a cron error, which names the field and position).
        """
        options = self._defaults.changed(
            queue=queue, max_attempts=max_attempts, retry_backoff=retry_backoff, priority=priority
        )
        if schedule is not None:
            _check_schedule(schedule, schedule_timezone)

        def register(fn: Callable[..., Any]) -> TaskFunction[Any]:
            if not callable(fn):
                raise InvalidArgumentError(f"a task must be a function, got {type(fn).__name__}")
            task_name = name if name is not None else f"{fn.__module__}:{fn.__qualname__}"
            if task_name in self._tasks:
                raise InvalidArgumentError(
                    f"a task named {task_name!r} is already in this registry"
                    f" ({self._tasks[task_name].fn!r}); give one of them another name="
                )
            function: TaskFunction[Any] = TaskFunction(
                fn,
                name=task_name,
                options=options,
                registry=self,
                schedule=schedule,
                schedule_timezone=schedule_timezone,
            )
            required = function.signature.required_parameters
            if schedule is not None and required:
                raise InvalidArgumentError(
                    f"a scheduled task runs with no arguments: {task_name}'s parameters"
                    f" {', '.join(sorted(required))} need defaults"
                )
            self._tasks[task_name] = function
            return function

        if fn is not None:
            return register(fn)
        return register

    async def apply_schedules(
        self, client: RingoClient, *, queue: str | None = None
    ) -> list[Schedule]:
        """Store (create or replace) the daemon's schedule of each task of
        the registry declared with ``schedule=`` (of ``queue``, or of every
        queue): named like the task, of its queue, its payload the empty
        arguments ``{}``, the task's priority and max attempts. Replacing an
        unchanged schedule keeps its next tick, so every worker may call
        this as it starts (``ringo worker module:registry`` and the testing
        kit's ``run_worker`` do). A schedule whose task left the registry
        is not deleted here (``ringo schedules rm``). Needs protocol minor
        >= 13. The stored schedules, in the registry's order."""
        queues = {task.queue for task in self._tasks.values() if task.schedule is not None}
        stored = []
        for name in sorted(queues):
            if queue is None or name == queue:
                stored += await apply_queue_schedules(self, client.queue(name))
        return stored

    def on_queue(self, queue: str) -> dict[str, TaskFunction[Any]]:
        """The registry's tasks whose queue is ``queue``, by name."""
        return {name: task for name, task in self._tasks.items() if task.queue == queue}

    def _queue_of_all(self) -> str:
        queues = {task.queue for task in self._tasks.values()}
        if len(queues) != 1:
            raise InvalidArgumentError(
                "the registry's tasks are on queues "
                f"{sorted(queues)}: give queue= to run the tasks of one"
                if queues
                else "the registry has no tasks"
            )
        return queues.pop()

    def handler(self, queue: str | None = None) -> TaskRouter:
        """The handler a registry's worker of ``queue`` runs: a `TaskRouter`
        (``router.task_types`` are the types to register), for
        `TaskQueue.worker` and the testing kit. ``queue`` may be left out when
        all the registry's tasks share one."""
        if queue is None:
            queue = self._queue_of_all()
        tasks = self.on_queue(queue)
        if not tasks:
            raise InvalidArgumentError(f"the registry has no task on queue {queue!r}")
        return TaskRouter(queue, tasks)

    def worker(self, client: RingoClient, *, queue: str | None = None, **options: Any) -> Worker:
        """A `Worker` of ``queue`` that runs this registry's tasks of that
        queue, and only those task types (other types stay for other
        workers). ``queue`` may be left out when all the registry's tasks
        share one. ``options`` are `TaskQueue.worker`'s (``concurrency``,
        ``lease_duration``, ``task_timeouts``, ``on_idle``, ...), with the
        same guarantees.

        Another registry's worker on the same client and queue may not run
        a task of the same name (`InvalidArgumentError`).
        """
        if "task_types" in options:
            raise InvalidArgumentError("a registry's worker takes the task types of its tasks")
        router = self.handler(queue)
        taken = _TAKEN.setdefault(client, {})
        for name in router.task_types:
            owner = taken.get((router.queue, name))
            if owner is not None and owner is not self:
                raise InvalidArgumentError(
                    f"task {name!r} on queue {router.queue!r} is already run by another"
                    " registry's worker of this client: a task name means one function per queue"
                )
        worker = client.queue(router.queue).worker(router, task_types=router.task_types, **options)
        for name in router.task_types:
            taken[(router.queue, name)] = self
        return worker


class TaskRouter:
    """The handler of a registry's worker: each task goes to its function."""

    def __init__(self, queue: str, tasks: Mapping[str, TaskFunction[Any]]) -> None:
        self.queue = queue
        self._tasks = dict(tasks)
        self.task_types = list(self._tasks)

    def __repr__(self) -> str:
        return f"<TaskRouter of queue {self.queue!r}: {', '.join(self._tasks)}>"

    async def __call__(self, task: Task, ctx: TaskContext) -> bytes | None:
        function = self._tasks.get(task.task_type)
        if function is None:
            # The worker registered only these types; a daemon that pushed
            # another is wrong, and the task belongs to someone else's worker.
            raise RetryTaskError(f"this worker runs no task named {task.task_type!r}")
        return await function.run(task, ctx)


async def apply_queue_schedules(registry: TaskRegistry, queue: TaskQueue) -> list[Schedule]:
    """`TaskRegistry.apply_schedules` for the registry's tasks of `queue`
    (the testing kit's ``run_worker`` holds a queue, not a client)."""
    stored = []
    for task in registry:
        if task.schedule is None or task.queue != queue.name:
            continue
        options = task._options
        stored.append(
            await queue.put_schedule(
                task.name,
                task.name,
                cron=task.schedule,
                timezone=task.schedule_timezone,
                payload=task.signature.encode_arguments((), {}),
                priority=options.priority,
                max_attempts=options.max_attempts,
            )
        )
    return stored


def _check_schedule(cron: str, timezone: str) -> None:
    """A task's ``schedule=``, checked as `TaskQueue.put_schedule` will."""
    if not isinstance(cron, str):
        raise InvalidArgumentError("schedule must be a cron expression (a str)")
    try:
        tz = zone(timezone)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"schedule_timezone: {exc}") from None
    try:
        parse_cron(cron, tz)
    except CronError as exc:
        raise InvalidArgumentError(f"schedule: {exc}") from None
