"""RingoTestEnv: an in-process daemon on the event loop's clock, and a client wired to it.

Theory of operation
-------------------
*One loop, one clock.* The daemon is asyncio code. Under trio it runs on a
``trio_asyncio`` loop the environment opens, and the client's transport
(`InMemoryTransport`) crosses into that same loop rather than opening its own;
under asyncio both use the running loop. The daemon's `Clock` is a
`LoopClock` reading that loop's ``time()``, which under trio-asyncio *is*
trio's clock. So with trio's ``MockClock(autojump_threshold=0)`` (pytest-trio's
``autojump_clock`` fixture) everything moves together: the daemon's lease
expiries, retry delays, ``not_before`` times, session TTLs and its own timers,
and the worker's renewal and heartbeat timers on the SDK side.

*No sockets.* Client and daemon talk HTTP/2 through in-memory pipes
(`ringo_trio.server.rpc.memory`), so when every task is blocked nothing is in
flight: autojump only ever skips to the next timer — a retry becoming due, a
lease running out — never past a reply that a socket was about to deliver
(which is why a real daemon and ``autojump_clock`` fail with "Deadline
exceeded").

*Ownership.* `RingoTestEnv.start` is an async context manager owning, in
order: the trio-asyncio loop (trio only), a task group running
``Daemon.serve``, and the client. Leaving it closes the client (its workers
drain), then stops the daemon gracefully and waits for it; the database lives
in a temporary directory removed last.
"""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
import sniffio

from .._client import RingoClient
from .._errors import InvalidArgumentError
from .._models import Task, TaskState
from .._queue.queue import TaskQueue
from .._tasks.registry import TaskRegistry, apply_queue_schedules
from .._transport.memory import RunOnDaemonLoop, serving_in_memory
from .._work._handlers import Handler, TaskContext
from ..server.clock import Clock, LoopClock
from ..server.daemon import Daemon, DaemonConfig
from ..server.storage.sqlite import SQLiteEngine
from ._virtual import check_virtual_clock

__all__ = ["RingoTestEnv", "TimeMode", "Until", "run_worker"]

TimeMode = Literal["loop", "real"]
Until = Literal["settled", "idle"] | int


class RingoTestEnv:
    """A daemon in this process and a `RingoClient` of it; see `RingoTestEnv.start`."""

    def __init__(self, client: RingoClient, daemon: Daemon, run_aio: RunOnDaemonLoop[Any]) -> None:
        self.client = client
        #: The in-process daemon (its storage, clock and configuration).
        self.daemon = daemon
        self._run_aio = run_aio

    @staticmethod
    @asynccontextmanager
    async def start(
        *,
        time: TimeMode = "loop",
        data_dir: str | Path | None = None,
        start: datetime | None = None,
        session_ttl: timedelta | None = None,
    ) -> AsyncIterator[RingoTestEnv]:
        """Start a daemon in this process and yield the environment.

        ``time="loop"`` (the default): the daemon's clock follows the running
        event loop's, which must be virtual — trio's ``MockClock`` (pytest-trio's
        ``autojump_clock`` or ``mock_clock``) or `AutojumpEventLoop` — so time
        skips to whatever is next due; on a real clock this raises
        `RealClockError` naming the fix (a test expecting virtual time would
        otherwise sit out every delay in real time). ``time="real"``: the
        daemon reads the wall clock whatever the loop's clock does. ``start``
        is the daemon's date at the start (default: now). ``data_dir`` keeps
        the SQLite database there (default: a temporary directory, removed on
        exit).
        """
        if time == "loop":
            check_virtual_clock()
        async with AsyncExitStack() as stack:
            if data_dir is None:
                data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ringo-env-"))
            database = Path(data_dir) / "ringo.db"
            # No upkeep thread on a virtual clock (see DaemonConfig).
            config = DaemonConfig(port=0, storage_upkeep=time == "real")
            if session_ttl is not None:
                config = dataclasses.replace(config, session_ttl=session_ttl)

            def make_daemon(loop_time: Callable[[], float]) -> Daemon:
                clock = Clock() if time == "real" else LoopClock(loop_time, start)
                return Daemon(config, SQLiteEngine(database), clock=clock)

            daemon, transport, run_aio = await stack.enter_async_context(
                serving_in_memory(make_daemon)
            )
            client = await stack.enter_async_context(RingoClient(transport=transport))
            yield RingoTestEnv(client, daemon, run_aio)

    def now(self) -> datetime:
        """The daemon's current time (what task timestamps are made of)."""
        return self.daemon.clock.now()

    async def sleep(
        self, seconds: float = 0, *, minutes: float = 0, hours: float = 0, days: float = 0
    ) -> None:
        """Let time pass, everything due meanwhile happening in order.

        Under an autojump clock this is instant; under trio's hand-driven
        ``MockClock()`` (no autojump, rate 0: pytest-trio's ``mock_clock``),
        where nothing moves unless told to, it drives the clock itself, from
        one timer to the next, up to the target; otherwise it is real time.
        """
        delta = timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        if sniffio.current_async_library() == "trio":
            from ._trio_clock import hand_driven, jump_through

            clock = hand_driven()
            if clock is not None:
                await jump_through(clock, delta.total_seconds())
                return
        await anyio.sleep(delta.total_seconds())

    async def run_worker(
        self,
        queue: TaskQueue | TaskRegistry,
        handler: Handler | None = None,
        /,
        *,
        until: Until = "settled",
        task_types: Iterable[str] | None = None,
        **worker_options: Any,
    ) -> int:
        """Run a worker of ``queue`` with ``handler`` until ``until`` holds, then
        close it (gracefully); return how many handler calls finished.

        ``env.run_worker(registry, queue="emails")`` runs a `TaskRegistry`'s
        tasks of that queue instead, as ``registry.worker`` would (``queue``
        may be left out when all its tasks share one).

        ``until``:

        * ``"settled"`` (the default): no task of the queue (of ``task_types``)
          is PENDING or LEASED — every one SUCCEEDED, DEAD or CANCELLED. Tasks scheduled
          for later (retries, ``delay``, ``not_before``) are waited for: under
          a mock clock that costs no real time.
        * ``"idle"``: no handler runs and nothing is due now: tasks scheduled
          for later are left PENDING and not waited for (nor are leases held
          by other workers).
        * an int ``n``: ``n`` handler calls have finished (returned or
          raised). The handler is called no more than ``n`` times: a task
          pushed meanwhile is handed back (released, PENDING, its attempt not
          spent) when the worker closes, at once (``grace_period`` defaults
          to zero here).

        Each handler call's settlement (ack, nack, reject) has reached the
        daemon before a condition is checked. ``worker_options`` go to
        `TaskQueue.worker` (``concurrency``, ``lease_duration``, ...).
        """
        daemon = self.daemon
        registry = queue if isinstance(queue, TaskRegistry) else None
        queue, handler, task_types = _what_to_run(
            self.client, queue, handler, task_types, worker_options
        )
        if registry is not None:
            # As ``ringo worker module:registry`` does before its worker starts.
            await apply_queue_schedules(registry, queue)

        async def nothing_due(types: list[str]) -> bool:
            now = daemon.clock.now()
            wakeup = await self._run_aio(daemon.storage.next_wakeup(queue.name, types, now))
            return wakeup is None or wakeup > now

        return await _run_worker(queue, handler, until, task_types, worker_options, nothing_due)


async def run_worker(
    queue: TaskQueue,
    handler: Handler | TaskRegistry,
    *,
    until: Literal["settled"] | int = "settled",
    task_types: Iterable[str] | None = None,
    **worker_options: Any,
) -> int:
    """`RingoTestEnv.run_worker` for a queue of any client (a real ``ringod`` too).

    ``handler`` may be a `TaskRegistry`: its tasks of ``queue`` run.
    ``until="idle"`` needs to see the daemon's schedule, so only the
    environment's own method offers it.
    """
    if until == "idle":  # type: ignore[comparison-overlap]  # untyped callers
        raise InvalidArgumentError('until="idle" needs RingoTestEnv.run_worker')
    if isinstance(handler, TaskRegistry):
        if task_types is not None:
            raise InvalidArgumentError("a TaskRegistry is its own handler and task types")
        router = handler.handler(queue.name)
        await apply_queue_schedules(handler, queue)
        return await _run_worker(queue, router, until, router.task_types, worker_options, None)
    return await _run_worker(queue, handler, until, task_types, worker_options, None)


def _what_to_run(
    client: RingoClient,
    queue: TaskQueue | TaskRegistry,
    handler: Handler | None,
    task_types: Iterable[str] | None,
    worker_options: dict[str, Any],
) -> tuple[TaskQueue, Handler, Iterable[str] | None]:
    """A queue and its handler, or a registry's tasks of one queue and their router."""
    if not isinstance(queue, TaskRegistry):
        if handler is None:
            raise InvalidArgumentError("run_worker needs a handler for a TaskQueue")
        return queue, handler, task_types
    if handler is not None or task_types is not None:
        raise InvalidArgumentError("a TaskRegistry is its own handler and task types")
    router = queue.handler(worker_options.pop("queue", None))
    return client.queue(router.queue), router, router.task_types


async def _run_worker(
    queue: TaskQueue,
    handler: Handler,
    until: Until,
    task_types: Iterable[str] | None,
    worker_options: dict[str, Any],
    nothing_due: Callable[[list[str]], Awaitable[bool]] | None,
) -> int:
    if isinstance(until, bool) or not (
        until in ("settled", "idle") or (isinstance(until, int) and until > 0)
    ):
        raise InvalidArgumentError('until must be "settled", "idle" or a positive int')
    types = list(task_types or ())
    finished: list[tuple[str, int]] = []
    changed = anyio.Event()
    started = 0
    if isinstance(until, int):
        # Calls past the count never reach the handler: they wait to be
        # handed back when the worker closes, which need not wait for them.
        worker_options.setdefault("grace_period", timedelta(0))

    async def counted(task: Task, ctx: TaskContext) -> Any:
        nonlocal started
        started += 1
        if isinstance(until, int) and started > until:
            await anyio.sleep_forever()
        try:
            result = handler(task, ctx)
            if inspect.isawaitable(result):
                return await result
            return result
        finally:
            finished.append((task.id, task.attempt))
            changed.set()

    async def reached() -> bool:
        if isinstance(until, int):
            return len(finished) >= until
        if worker.running:
            return False
        if until == "settled":
            return await queue.active_count(types or None) == 0
        assert nothing_due is not None
        return await nothing_due(types)

    worker = queue.worker(counted, task_types=task_types, **worker_options)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        confirmed = 0
        while True:
            while confirmed < len(finished):
                await _settlement_applied(queue, *finished[confirmed])
                confirmed += 1
            if await reached():
                break
            await changed.wait()
            changed = anyio.Event()
        await worker.close()
    return len(finished)


async def _settlement_applied(queue: TaskQueue, task_id: str, attempt: int) -> None:
    """Wait until the daemon no longer shows ``attempt`` of the task leased.

    A handler returns before its worker sends the settlement; backing off
    (1 ms doubling to 1 s) also covers a lease that only expiry ends.
    """
    pause = 0.001
    while True:
        task = await queue.get_by_id(task_id)
        if task.state is not TaskState.LEASED or task.attempt != attempt:
            return
        await anyio.sleep(pause)
        pause = min(pause * 2, 1.0)
