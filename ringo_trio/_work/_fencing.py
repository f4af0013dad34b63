"""Fencing: what a worker does when a handler will not stop (``task_timeouts``).

Theory of operation
-------------------
A handler's scope carries its deadline — the earlier of ``start_to_close``
and ``heartbeat``, the latter pushed forward by each progress call
(`_progressed`: the scope's deadline moves; no task polls) — so one scope
ties lease, timeouts and drain together. Whether a cancelled handler really
stops is watched by a sans-IO `Watchdog` (`ringo_trio._work._timeouts`) and
one task of the worker's run group that sleeps in a cancel scope whose
deadline is the earliest moment some handler becomes overdue (pulled in when
a handler is cancelled). A handler still running ``cancel_grace`` after its
cancellation, or a task whose handler could not start within ``no_start``
(the loop was blocked), *fences* the worker: drain at once (no credit any
more), hand back whatever is pushed afterwards, report to the supervisor,
then close as usual; ``run`` raises `WorkerFencedError` — only once the stuck
handler has exited, since the handler group cannot be left before. Ending the
process is the only remedy for code that ignores cancellation: that is
`ringo supervise`'s job.

`Fencing` — one per worker with ``task_timeouts``, composed, not inherited —
owns the watchdog, the watch's nap and the worker's `Fence` once it has one.
The worker calls it when a handler starts (`Fencing.admit`), is cancelled
(`Fencing.cancelled`) and exits (the watchdog's ``expired`` and ``exited``,
read inline on that path, then `Fencing.found_stuck`); fencing calls back
the worker's ``on_fence``, which stops taking work.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .._errors import WorkerFencedError
from .._interrupts import protected
from .._supervise import child as _supervision
from ._timeouts import Stuck, TaskTimeouts, Watchdog

if TYPE_CHECKING:
    from ._handlers import Running

__all__ = ["Fence", "Fencing"]


@dataclass(eq=False)
class Fence:
    """Why a worker fenced itself: a stuck handler, or one that could not start."""

    fencing: Fencing
    running: Running
    stuck: Stuck[Running] | None = None
    waited: float = 0.0

    def text(self) -> str:
        watchdog = self.fencing.watchdog
        context = self.running.context
        task = f"task {context.task.id} (attempt {context.attempt})"
        if self.stuck is None:
            detail = (
                f"{task} waited {self.waited:.3g}s for its handler to start, past"
                f" no_start={watchdog.no_start:g}s: something blocks the event loop"
                " (a blocking call in a handler?); the task was handed back unrun"
            )
        else:
            detail = (
                f"{task} ignored its cancellation ({self.stuck.why}) for"
                f" {self.stuck.ignored_for:.3g}s, past cancel_grace={watchdog.cancel_grace:g}s"
            )
        return (
            f"{self.fencing.describe} is fenced:"
            f" {detail}. It stopped taking work. A handler that ignores cancellation or"
            " blocks the event loop can only be stopped by ending its process: run"
            " workers under process supervision (`ringo supervise`), which replaces a"
            " fenced process"
        )

    def error(self) -> WorkerFencedError:
        return WorkerFencedError(self.text())


class Fencing:
    """One worker's side of ``task_timeouts``: its handlers' deadlines, the
    watch over cancelled ones, and its `Fence` once it fenced itself.

    ``describe`` names the worker in the fence's text; ``on_fence`` is
    called once, when it fences: the worker stops taking work (drain, then
    close as usual)."""

    def __init__(
        self, timeouts: TaskTimeouts, *, describe: str, on_fence: Callable[[], None]
    ) -> None:
        self.watchdog: Watchdog[Running] = Watchdog(timeouts)
        self.describe = describe
        self.fence: Fence | None = None
        self._on_fence = on_fence
        self._nap: anyio.CancelScope | None = None

    def admit(self, running: Running) -> str | None:
        """Arm a starting handler's deadline; or say why it must not start."""
        watchdog = self.watchdog
        now = anyio.current_time()
        if self.fence is not None:
            return "the worker is fenced; the task was handed back unrun"
        waited = watchdog.waited_too_long(running.arrived, now)
        if waited is not None:
            self._fence_now(Fence(self, running, waited=waited))
            return (
                f"no_start timeout of {watchdog.no_start:g}s exceeded: the handler could not"
                f" start for {waited:.3g}s after the task arrived (the worker's event loop was"
                " blocked); handed back unrun"
            )
        deadline = watchdog.started(running, now)
        if deadline is not None:
            running.scope.deadline = deadline
            running.show_deadline(watchdog.start_to_close_deadline(running))
            self._wake_watch(deadline + watchdog.cancel_grace)
        if watchdog.heartbeat is not None:
            running.on_progress(functools.partial(self._progressed, running))
        return None

    def _progressed(self, running: Running, now: float) -> None:
        """A progress call pushes the handler's scope deadline forward. Never
        earlier, so the watch, asleep until the old moment at the latest,
        needs no waking: it finds nothing due then and sleeps on."""
        deadline = self.watchdog.progressed(running, now)
        if deadline is not None:
            running.scope.deadline = deadline

    def cancelled(self, running: Running, why: str) -> None:
        """A handler was cancelled: it has ``cancel_grace`` to exit."""
        self._wake_watch(self.watchdog.cancelled(running, anyio.current_time(), why))

    def _wake_watch(self, when: float) -> None:
        nap = self._nap
        if nap is not None and when < nap.deadline:
            nap.deadline = when

    @protected
    async def watch(self) -> None:
        """Fence the worker once a cancelled handler outlives ``cancel_grace``."""
        watchdog = self.watchdog
        while self.fence is None:
            stuck = watchdog.stuck(anyio.current_time())
            if stuck is not None:
                self.found_stuck(stuck)
                return
            when = watchdog.next_check()
            with anyio.CancelScope(deadline=math.inf if when is None else when) as nap:
                self._nap = nap
                await anyio.sleep_forever()
            self._nap = None

    def found_stuck(self, stuck: Stuck[Running]) -> None:
        """A handler ignored its cancellation past ``cancel_grace``."""
        fence = self.fence
        if fence is None:
            self._fence_now(Fence(self, stuck.key, stuck=stuck))
        elif fence.running is stuck.key:
            fence.stuck = stuck  # found again when it exited: the final figure

    def _fence_now(self, fence: Fence) -> None:
        """Stop taking work at once, tell the supervisor, then close as usual."""
        if self.fence is not None:
            return
        self.fence = fence
        self._on_fence()
        # It must not raise; should it anyway, a handler's slot is still freed.
        with contextlib.suppress(Exception):
            _supervision.report_fence(fence.text())
