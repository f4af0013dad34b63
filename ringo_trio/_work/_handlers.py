"""Running handlers: what one gets (`TaskContext`), what runs it, how it is settled.

`Handlers` holds every handler of one worker, from its push to its
settlement: `Running` is one of them as the worker tracks it (its cancel
scope, its `TaskContext`, when the push arrived, its admission ticket);
`handler_group` is the nursery they run in (`Backend`: trio's own under
trio); `call_handler` is the one SDK frame a Ctrl-C may land below
(`ringo_trio._interrupts`). The worker (`ringo_trio._work.worker`) opens the
streams, starts each handler and decides when to stop.

*Cleanup is armed before the await that can be cancelled.* A handler's
settlement (ack / nack / reject / release, or "exited" after a lost lease)
happens in the ``finally`` of its task (`Handlers.finish`), synchronously —
the frame goes into an unbounded send channel and the session's bookkeeping
is plain method calls — so no cancellation can skip it or leak a slot.

*Results and cancellation.* What a handler returns is its task's result:
bytes, or a str (stored as UTF-8), sent with the ack (protocol minor >= 9;
dropped, with one warning, below). None stores nothing; any other value is
ignored with one warning per type; a value over ``MAX_RESULT_BYTES`` fails
the attempt like an exception (nack). An operator's CancelTask reaches the
worker as a ``LEASE_LOST`` with reason ``cancelled`` on the lease's next
renewal, progress report or settlement: the handler's scope is cancelled
as for any lost lease, and the worker logs it at INFO, not as an error —
once: the `LeaseLostError` a handler then gets from ``report_progress``
and lets propagate is that news, not a crash (`Handlers.handle`).

*Prefetch*: with ``prefetch`` the worker holds more leases than it runs.
A push that finds one of the ``concurrency`` slots free (`Slots`) starts
at once; the others wait in the slots' FIFO *without a task*
(`Running.waiting`), and the handler that frees a slot starts the next one
in its ``finally``. A task parked on a capacity limiter per prefetched push
cost ~6 µs of worker CPU per task (its park, its wake-up, a scheduler
round), a tenth of a 10 ms task's (bench/results.md "Levers"). A waiting
task's lease is tracked like a running one's; when it is cancelled — a
stopping worker (`hand_back_waiting`), a lost lease, the stream's end — it
starts without a slot, only to go back unrun in its ``finally``, attempt
kept, so every exit still goes through `Handlers.handle`. Without prefetch
there are no slots and no wait.

*Timeouts*: ``TaskTimeouts(heartbeat=...)`` is fed by
`TaskContext.mark_progress` (and ``report_progress``, which calls it): each
call pushes the handler's scope deadline forward (``_beat``, set by
`ringo_trio._work._fencing.Fencing.admit` through `Running.on_progress`).
"""

from __future__ import annotations

import collections
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
from .._contract.work.client import CANCELLED_BY_OPERATOR, LeaseKey, Outcome, State
from .._errors import InvalidArgumentError, LeaseLostError, PermanentTaskError, RetryTaskError
from .._interrupts import protected, unprotected
from .._models import Task, truncate_utf8
from ._driver import command_exception
from ._permits import Signal

if TYPE_CHECKING:
    from ._concurrency import Membership
    from ._driver import StreamDriver
    from ._fencing import Fencing

__all__ = [
    "Backend",
    "Handler",
    "Handlers",
    "ResultRefused",
    "Running",
    "Scope",
    "Slots",
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
        # LeaseLostError is then that news, not a crash (`Handlers.handle`).
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


class Slots:
    """The ``concurrency`` slots of a prefetching worker: how many run, and
    the pushed tasks waiting for one, in push order."""

    __slots__ = ("queue", "total", "used")

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.queue: collections.deque[Running] = collections.deque()


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
    waiting: bool = False  # prefetched, not started: waiting in `Slots.queue`

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


def _handed_back_unrun(why: str) -> str:
    """The error a lease goes back with when its handler never started."""
    return f"the worker is stopping; handed back unrun ({why})"


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
    *,
    nacked: bool = False,
) -> None:
    """One handler outcome. ``nacked``: the attempt failed and the task is
    to be retried, unless that was its last attempt, when the daemon makes it
    DEAD; the line says so then (at WARNING at least), since "asked for a
    retry" alone read as if another attempt would come."""
    context = running.context
    task = context.task
    dead = nacked and 0 < task.max_attempts <= context.attempt
    if dead:
        what = f"{what} on its last attempt, so the task is now DEAD"
        level = max(level, logging.WARNING)
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
            "ringo_dead": dead,
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


class Handlers:
    """Every handler of one worker, from its push to its settlement.

    ``running``: the handlers of the live stream, by lease key; ``orphans``:
    handlers of ended streams that ignored their cancellation and have not
    exited yet (they keep their slots: the worker's "Slots and zombies").
    ``backend`` runs them while the worker's handler group is open;
    ``membership`` is the worker's place in a shared controller's pool while
    it runs; ``stop_reason`` is why the worker stops at once (None: it does
    not), the error text a stopped handler's lease goes back with. The worker
    starts each handler (`Worker._start_handler`) with `handle`; what it
    needs besides comes through the callbacks: ``interrupted`` (a
    KeyboardInterrupt or SystemExit landed in a handler), ``rebalance``
    (with a shared controller, before each settlement) and ``orphan_exited``
    (a handler of an ended stream exited, at this time).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        queue_name: str,
        worker_id: str,
        close_requested: anyio.Event,
        fencing: Fencing | None,
        interrupted: Callable[[BaseException], None],
        rebalance: Callable[[], None],
        orphan_exited: Callable[[float], None],
    ) -> None:
        self.backend: Backend | None = None
        # With ``prefetch``: the ``concurrency`` slots handlers run in; the
        # prefetched pushes wait for one (`start`). None: every push runs.
        self.slots: Slots | None = None
        self.running: dict[LeaseKey, Running] = {}
        self.orphans: set[Running] = set()
        self.membership: Membership | None = None
        self.stop_reason: str | None = None
        self._handler = handler
        self._queue_name = queue_name
        self._worker_id = worker_id
        self._close_requested = close_requested
        self._fencing = fencing
        self._interrupted = interrupted
        self._rebalance = rebalance
        self._orphan_exited = orphan_exited
        self._all_idle: anyio.Event | None = None
        # Return types a handler gave that are no result value (warned once each).
        self._ignored_returns: set[str] = set()

    @property
    def count(self) -> int:
        """Handlers running, orphans included."""
        return len(self.running) + len(self.orphans)

    def start(self, running: Running) -> None:
        """Start the handler of a push just tracked in ``running``: at once,
        or with ``prefetch`` when one of the slots is free, else once a
        handler frees one (`_slot_freed`)."""
        slots = self.slots
        if slots is None:
            self._spawn(running, False)
        elif slots.used < slots.total:
            slots.used += 1
            self._spawn(running, True)
        elif self._close_requested.is_set():
            # Pushed before the daemon saw the drain: back unrun at once.
            self._spawn(running, False)
        else:
            running.waiting = True
            slots.queue.append(running)

    def _spawn(self, running: Running, slot: bool) -> None:
        backend = self.backend
        assert backend is not None
        backend.spawn(self.handle, running, slot)

    def resize(self, total: int) -> None:
        """The number of slots changed (`Worker.set_concurrency`): waiting
        tasks start if it grew; if it shrank, running ones finish first."""
        slots = self.slots
        if slots is not None:
            slots.total = total
            self._start_waiting(slots)

    def _slot_freed(self) -> None:
        slots = self.slots
        if slots is not None:  # None: the run is over, and so are the slots
            slots.used -= 1
            self._start_waiting(slots)

    def _start_waiting(self, slots: Slots) -> None:
        queue = slots.queue
        while queue and slots.used < slots.total:
            running = queue.popleft()
            running.waiting = False
            slots.used += 1
            if self._fencing is not None:
                # no_start measures the event loop's delay in starting a
                # handler, not the wait for a slot a prefetch is made of.
                assert self.backend is not None
                running.arrived = self.backend.clock()
            self._spawn(running, True)

    def _start_unrun(self, running: Running) -> None:
        """A waiting task must go back: it leaves the queue (a worker whose
        handlers never free a slot must not keep every task it was ever
        pushed) and starts without a slot, its handler going straight to its
        ``finally`` (handed back unrun)."""
        if running.waiting:
            running.waiting = False
            if self.slots is not None:
                self.slots.queue.remove(running)
            self._spawn(running, False)

    @protected
    async def handle(self, running: Running, slot: bool) -> None:
        """Run one handler and settle its lease, whatever happens to it.
        ``slot``: it holds one of the `Slots` (prefetch), to free when it
        exits; a prefetching worker's handler without one was cancelled
        while waiting for one, and goes back unrun."""
        context = running.context
        live, key, task = context._live, context._key, context.task
        # Unless the handler finishes, the worker stopped it: the lease goes
        # back without spending the attempt.
        outcome = Outcome.RELEASE
        error = self.stop_reason or "the worker stopped before the handler finished"
        delay: float | None = None
        result: bytes | None = None
        fencing = self._fencing
        try:
            if self._close_requested.is_set() or (self.slots is not None and not slot):
                # Pushed before the daemon saw the drain, or cancelled while
                # waiting for a slot: not started at all.
                error = _handed_back_unrun(error)
                return
            with running.scope:
                if fencing is not None:
                    refusal = fencing.admit(running)
                    if refusal is not None:
                        error = refusal  # handed back unrun
                        return
                try:
                    returned = await call_handler(self._handler, task, context)
                    result = result_value(
                        returned, live.session.minor, self._queue_name, self._ignored_returns
                    )
                    outcome, error = Outcome.ACK, ""
                except ResultRefused as exc:
                    outcome, error = Outcome.NACK, str(exc)
                    log_outcome(
                        self._queue_name,
                        running,
                        logging.ERROR,
                        "returned a value it cannot store",
                        error,
                        nacked=True,
                    )
                except RetryTaskError as exc:
                    outcome = Outcome.NACK
                    running.congested = exc.congestion
                    error = error_text(exc)
                    if exc.delay is not None:
                        delay = exc.delay.total_seconds()
                    log_outcome(
                        self._queue_name,
                        running,
                        logging.INFO,
                        "asked for a retry",
                        error,
                        nacked=True,
                    )
                except PermanentTaskError as exc:
                    outcome, error = Outcome.REJECT, error_text(exc)
                    log_outcome(
                        self._queue_name, running, logging.WARNING, "failed permanently", error
                    )
                except Exception as exc:
                    outcome = Outcome.NACK
                    error = f"{type(exc).__name__}: {error_text(exc)}"
                    if not (isinstance(exc, LeaseLostError) and running.by_operator):
                        log_outcome(
                            self._queue_name,
                            running,
                            logging.ERROR,
                            "crashed",
                            error,
                            exc_info=exc,
                            nacked=True,
                        )
                    # else: how the handler learnt of an operator's cancel,
                    # which `task_cancelled` logged at INFO; nobody's error.
        except anyio.get_cancelled_exc_class():
            raise
        except BaseException as exc:
            # KeyboardInterrupt / SystemExit delivered inside a handler: the
            # whole worker stops (and `run` re-raises it, bare); the handler
            # group must not see it, or it would tear the stream down first.
            self._interrupted(exc)
        finally:
            if slot:
                self._slot_freed()
            if fencing is not None:
                watchdog = fencing.watchdog
                now = anyio.current_time()
                expired = watchdog.expired(running, now)
                if expired is not None:
                    # Whatever it did past its deadline — returned without
                    # ever yielding, swallowed the cancellation — is no success.
                    outcome, error, delay = Outcome.NACK, expired, None
                stuck = watchdog.exited(running, now)
                if stuck is not None:
                    fencing.found_stuck(stuck)
            self.finish(live, key, running, outcome, error, delay, result)

    def hand_back_waiting(self) -> None:
        """The worker is stopping: prefetched tasks still waiting for a slot
        go back at once instead of at the end of the grace period."""
        if self.slots is not None:
            for running in list(self.slots.queue):
                self._start_unrun(running)

    @protected
    def finish(
        self,
        live: StreamDriver,
        key: LeaseKey,
        running: Running,
        outcome: Outcome,
        error: str,
        delay: float | None,
        result: bytes | None = None,
    ) -> None:
        """Settle a handler that exited (synchronously: no cancellation can
        skip it) and free its slot."""
        now = live.clock()
        if self.running.get(key) is running:
            del self.running[key]
        elif running in self.orphans:
            self.orphans.discard(running)
            self._orphan_exited(now)
        membership = self.membership
        if membership is not None:
            # An ACK is set only once the handler has returned.
            if outcome is Outcome.ACK:
                signal = Signal.SUCCESS
            else:
                signal = Signal.CONGESTION if running.congested else Signal.FAILURE
            membership.finished(running.ticket, signal)
            # Before the settlement asks for credit, so that credit already
            # follows a cut this very outcome caused.
            self._rebalance()
        session = live.session
        if session.holds(key) and session.state in (State.ACTIVE, State.DRAINING):
            live.act(
                session.settle(key, outcome, now, error=error, retry_delay=delay, result=result)
            )
        elif session.state is not State.ERROR:
            # Lost, or its stream ended: nothing to settle, but its slot frees.
            live.act(session.handler_exited(key, now))
        if not self.running and self._all_idle is not None:
            self._all_idle.set()

    async def all_exited(self, within: float) -> None:
        """Wait up to ``within`` seconds for the live stream's handlers to exit."""
        if self.running and within > 0:
            self._all_idle = anyio.Event()
            with anyio.move_on_after(within):
                await self._all_idle.wait()

    def orphan(self, live: StreamDriver) -> None:
        """``live`` ended: its handlers still running after their cancellation
        keep their slots (see "Slots and zombies") but not the session."""
        for key, running in list(self.running.items()):
            if running.live is live:
                del self.running[key]
                self.orphans.add(running)

    def cancel(self, key: LeaseKey, why: str) -> None:
        """Cancel the handler holding ``key`` (its lease was lost)."""
        running = self.running.get(key)
        if running is not None:
            self._cancel(running, why)

    def task_cancelled(self, key: LeaseKey) -> None:
        """The daemon says an operator cancelled this lease's task."""
        # Not an error: someone chose to stop this task (CancelTask).
        running = self.running.get(key)
        if running is not None:
            running.cancelled_by_operator()
            log_outcome(
                self._queue_name,
                running,
                logging.INFO,
                "was cancelled by an operator",
                "its handler is being cancelled",
            )
            return
        log.info(
            "task %s (attempt %d) of queue %r was cancelled by an operator; its handler had"
            " finished, and its outcome was not stored",
            key.task_id,
            key.attempt,
            self._queue_name,
            extra={
                "ringo_task_id": key.task_id,
                "ringo_queue": self._queue_name,
                "ringo_attempt": key.attempt,
                "ringo_worker_id": self._worker_id,
            },
        )

    def cancel_all(self, why: str) -> None:
        """Cancel every handler, orphans included."""
        for running in [*self.running.values(), *self.orphans]:
            self._cancel(running, why)

    def _cancel(self, running: Running, why: str) -> None:
        running.cancel(why)
        if self._fencing is not None:
            self._fencing.cancelled(running, why)
        self._start_unrun(running)
