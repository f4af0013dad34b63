"""Running one handler: what it gets (`TaskContext`), what runs it, what its result stores.

`Running` is one handler as the worker tracks it: its cancel scope, its
`TaskContext` and the worker's notes (when the push arrived, its admission
ticket, whether it reported congestion). `handler_group` is the nursery
every handler of a worker runs in (`Backend`: trio's own under trio).
`call_handler` is the one SDK frame a Ctrl-C may land below
(`ringo_trio._interrupts`). `result_value` and `encode_result` turn a
handler's return value into the result its ack stores. What a handler's
outcome does to its lease — settlement, slots, stops — is the worker's
(`ringo_trio._work.worker`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import CoroutineType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import sniffio

from .._contract import limits as _limits
from .._contract.versions import FEATURES, Feature, Features
from .._contract.work.client import CANCELLED_BY_OPERATOR, LeaseKey
from .._errors import InvalidArgumentError, LeaseLostError
from .._interrupts import unprotected
from .._models import Task, truncate_utf8
from ._driver import command_exception

if TYPE_CHECKING:
    from ._driver import StreamDriver

__all__ = [
    "Backend",
    "Handler",
    "ResultRefused",
    "Running",
    "Scope",
    "TaskContext",
    "call_handler",
    "encode_result",
    "error_text",
    "handler_group",
    "log_outcome",
    "result_value",
    "results_stored",
]

# One logger for everything a worker logs, under the name it always had.
log = logging.getLogger("ringo_trio._work.worker")

Handler = Callable[[Task, "TaskContext"], Awaitable[Any]]


class TaskContext:
    """What a handler gets besides its `Task`.

    ``cancelled`` becomes true when the lease is lost, the stream drops, an
    operator cancels the task (`TaskQueue.cancel`; the worker learns it at
    its next renewal, progress report or settlement), or the worker is
    closed past its grace period — the handler is cancelled at the same
    moment. (A ``task_timeouts`` deadline cancels the handler's scope
    without it.) The lease token stays inside the worker.
    """

    __slots__ = (
        "_beat",
        "_by_operator",
        "_cancelled",
        "_deadline",
        "_key",
        "_last_progress",
        "_live",
        "_task",
        "_waiter",
        "_why",
        "_worker_id",
    )

    def __init__(self, task: Task, key: LeaseKey, worker_id: str, live: StreamDriver) -> None:
        self._task = task
        self._key = key
        self._worker_id = worker_id
        self._live = live
        self._cancelled = False
        self._why = ""  # what cancelled it first
        # The daemon said an operator cancelled the task: the handler's
        # LeaseLostError is then that news, not a crash (`Worker._handle`).
        self._by_operator = False
        self._waiter: anyio.Event | None = None
        self._last_progress: float | None = None
        self._deadline: float | None = None
        # With a heartbeat timeout: pushes the handler's deadline forward.
        self._beat: Callable[[float], None] | None = None

    @property
    def task(self) -> Task:
        return self._task

    @property
    def attempt(self) -> int:
        return self._key.attempt

    @property
    def max_attempts(self) -> int:
        return self._task.max_attempts

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def is_cancelled(self) -> bool:
        """Alias of `cancelled`, the asyncio SDK's name."""
        return self._cancelled

    @property
    def deadline(self) -> float | None:
        """`anyio.current_time()` at which ``start_to_close`` cancels this
        handler; None without that timeout. Pass it on to calls that take one."""
        return self._deadline

    async def wait_cancelled(self) -> None:
        """Return once the handler has been told to stop (lease lost, stream gone, close)."""
        if self._cancelled:
            return
        if self._waiter is None:
            self._waiter = anyio.Event()
        await self._waiter.wait()

    def mark_progress(self) -> None:
        """Note local progress without any RPC. With
        ``TaskTimeouts(heartbeat=...)`` this is what keeps the handler from
        being cancelled: the heartbeat timeout counts from the last call."""
        now = anyio.current_time()
        self._last_progress = now
        beat = self._beat
        if beat is not None:
            beat(now)

    @property
    def last_progress(self) -> float | None:
        """`anyio.current_time()` of the last `mark_progress` / `report_progress`."""
        return self._last_progress

    async def report_progress(self, current: float, total: float = 0.0, message: str = "") -> None:
        """Store progress on the task, correlated on the Work stream.

        Raises `LeaseLostError` when the lease is gone (the handler is being
        cancelled then anyway) and `UnavailableError` when the stream dropped
        before the daemon answered.
        """
        for what, value in (("current", current), ("total", total)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgumentError(f"{what} must be a number")
        if not isinstance(message, str):
            raise InvalidArgumentError("message must be a string")
        if self._cancelled or not self._live.session.holds(self._key):
            why = CANCELLED_BY_OPERATOR if self._by_operator else self._why
            raise LeaseLostError(
                "the task's lease is no longer held by this worker" + (f": {why}" if why else "")
            )
        self.mark_progress()
        frame = self._live.session.report_progress(
            self._key,
            float(current),
            float(total),
            truncate_utf8(message, _limits.MAX_PROGRESS_MESSAGE_BYTES),
            anyio.current_time(),
        )
        error = await self._live.command(frame)
        if error is not None:
            raise command_exception(error)

    def _cancel(self, why: str = "") -> None:
        if not self._cancelled:
            self._why = why
        self._cancelled = True
        if self._waiter is not None:
            self._waiter.set()


class Scope(Protocol):
    """A handler's cancel scope: anyio's, or under trio trio's own."""

    deadline: float

    def cancel(self) -> None: ...

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class Backend:
    """What runs handlers, picked once per worker run for the event loop.

    Under trio, trio's own nursery, cancel scope and clock: anyio's task
    group wraps every child in a task handle, which costs about as much again
    as the nursery's own spawn (~15 µs of a no-op handler's ~230 µs of worker
    CPU), and anyio's cancel scope and ``current_time`` wrap trio's (~4 µs
    and ~0.5 µs per call); a handler needs none of it — it catches
    everything but the cancellation itself, which anyio code inside it sees
    as trio's either way.
    """

    spawn: Callable[..., object]
    scope: Callable[[], Scope]
    clock: Callable[[], float]


@asynccontextmanager
async def handler_group() -> AsyncIterator[Backend]:
    """The handler group (see `Backend`)."""
    if sniffio.current_async_library() == "trio":
        import trio  # here: an asyncio program never imports trio

        async with trio.open_nursery() as nursery:
            yield Backend(nursery.start_soon, trio.CancelScope, trio.current_time)
    else:
        async with anyio.create_task_group() as group:
            yield Backend(group.start_soon, anyio.CancelScope, anyio.current_time)


@dataclass(eq=False, slots=True)
class Running:
    """One running handler: its scope, its context and the worker's notes on it."""

    scope: Scope
    context: TaskContext
    arrived: float = 0.0  # when the push was read (no_start counts from here)
    ticket: int = 0  # its admission, for a shared controller's control law
    congested: bool = False  # it raised RetryTaskError(congestion=True)

    def cancel(self, why: str = "") -> None:
        self.context._cancel(why)
        self.scope.cancel()

    @property
    def live(self) -> StreamDriver:
        """The stream it was pushed on."""
        return self.context._live

    @property
    def by_operator(self) -> bool:
        """The daemon said an operator cancelled its task."""
        return self.context._by_operator

    def cancelled_by_operator(self) -> None:
        self.context._by_operator = True

    def show_deadline(self, start_to_close: float | None) -> None:
        """What `TaskContext.deadline` tells the handler."""
        self.context._deadline = start_to_close

    def on_progress(self, beat: Callable[[float], None]) -> None:
        """Have each progress call report its time to ``beat`` (the heartbeat
        timeout's deadline moves with it)."""
        self.context._beat = beat


def error_text(error: BaseException) -> str:
    try:
        text = str(error) or type(error).__name__
    except Exception:
        text = type(error).__name__
    return truncate_utf8(text, _limits.MAX_ERROR_BYTES)


def log_outcome(
    queue_name: str,
    running: Running,
    level: int,
    what: str,
    error: str,
    exc_info: BaseException | None = None,
) -> None:
    context = running.context
    task = context.task
    log.log(
        level,
        "task %s (%s, attempt %d of %d) of queue %r %s: %s",
        task.id,
        task.task_type,
        context.attempt,
        task.max_attempts,
        queue_name,
        what,
        error,
        exc_info=exc_info,
        extra={
            "ringo_task_id": task.id,
            "ringo_task_type": task.task_type,
            "ringo_queue": queue_name,
            "ringo_attempt": context.attempt,
            "ringo_worker_id": context.worker_id,
        },
    )


def encode_result(value: bytes | bytearray | memoryview | str) -> bytes:
    """A result value as stored: bytes as they are, a str as UTF-8;
    `InvalidArgumentError` naming the limit when it is larger than
    ``MAX_RESULT_BYTES``."""
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(data) > _limits.MAX_RESULT_BYTES:
        raise InvalidArgumentError(
            f"result: {len(data)} bytes exceeds the {_limits.MAX_RESULT_BYTES}-byte limit"
            " (MAX_RESULT_BYTES)"
        )
    return data


_dropped_result_warned = False


def results_stored(minor: int) -> bool:
    """Whether the negotiated minor stores result values. Below minor 9 a
    result is dropped — the ack itself goes ahead, never failed by it — with
    one warning per process."""
    global _dropped_result_warned
    if Features(minor).has(Feature.RESULT_VALUES):
        return True
    if not _dropped_result_warned:
        _dropped_result_warned = True
        log.warning(
            "the daemon speaks protocol minor %d: result values (minor %d) are not stored;"
            " tasks are acked without them",
            minor,
            FEATURES[Feature.RESULT_VALUES],
        )
    return False


class ResultRefused(Exception):
    """A handler returned a value too large to store: its attempt fails."""


def result_value(returned: object, minor: int, queue_name: str, ignored: set[str]) -> bytes | None:
    """What a handler's return value stores with its SUCCEEDED task: bytes
    or str (as UTF-8); None stores nothing. Other types are not results
    (handlers written before results existed return anything): ignored
    with one warning per type (``ignored``: the types warned of). Too
    large: `ResultRefused`."""
    if returned is None:
        return None
    if not isinstance(returned, bytes | bytearray | memoryview | str):
        name = type(returned).__qualname__
        if name not in ignored:
            ignored.add(name)
            log.warning(
                "a handler of queue %r returned a %s; only bytes or str are stored as"
                " the task's result, so it is ignored (warned once per type)",
                queue_name,
                name,
            )
        return None
    if not results_stored(minor):
        return None
    try:
        return encode_result(returned)
    except InvalidArgumentError as exc:
        raise ResultRefused(f"the handler's return value cannot be stored: {exc}") from None


@unprotected
async def call_handler(handler: Handler, task: Task, context: TaskContext) -> object:
    """The user's handler, the one SDK frame a Ctrl-C may land below
    (`ringo_trio._interrupts`)."""
    returned: object = handler(task, context)
    # A coroutine, nearly always: its exact type is checked before the
    # general (Python-level) test.
    if type(returned) is CoroutineType or inspect.isawaitable(returned):
        returned = await returned
    return returned
