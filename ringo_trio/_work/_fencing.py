"""Fencing: what a worker does when a handler will not stop (``task_timeouts``).

Theory of operation
-------------------
A handler's scope carries its deadline — the earlier of ``start_to_close``
and ``heartbeat``, the latter pushed forward by each progress call
(`_progressed`: the scope's deadline moves; no task polls) — so one scope
ties lease, timeouts and drain together. Whether a cancelled handler really stops
is watched by a sans-IO `Watchdog` (`ringo_trio._work._timeouts`) and one
task of the worker's run group that sleeps in a cancel scope whose deadline
is the earliest moment some handler becomes overdue (pulled in when a
handler is cancelled). A handler still running ``cancel_grace`` after its
cancellation, or a task whose handler could not start within ``no_start``
(the loop was blocked), *fences* the worker: drain at once (no credit any
more), hand back whatever is pushed afterwards, report to the supervisor,
then close as usual; ``run`` raises `WorkerFencedError` — only once the stuck
handler has exited, since the handler group cannot be left before. Ending the
process is the only remedy for code that ignores cancellation: that is
`ringo supervise`'s job.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .._contract.work.client import State
from .._errors import WorkerFencedError
from .._interrupts import protected
from .._supervise import child as _supervision
from ._timeouts import Stuck, Watchdog

if TYPE_CHECKING:
    from ._driver import StreamDriver
    from .worker import _Running

__all__ = ["Fence", "Fencing"]


@dataclass(eq=False)
class Fence:
    """Why a worker fenced itself: a stuck handler, or one that could not start."""

    worker: Fencing
    running: _Running
    stuck: Stuck[_Running] | None = None
    waited: float = 0.0

    def text(self) -> str:
        watchdog = self.worker._watchdog
        assert watchdog is not None
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
            f"{self.worker._describe()} is fenced:"
            f" {detail}. It stopped taking work. A handler that ignores cancellation or"
            " blocks the event loop can only be stopped by ending its process: run"
            " workers under process supervision (`ringo supervise`), which replaces a"
            " fenced process"
        )

    def error(self) -> WorkerFencedError:
        return WorkerFencedError(self.text())


class Fencing:
    """The worker's side of fencing (mixed into `Worker`)."""

    _watchdog: Watchdog[_Running] | None
    _watch_nap: anyio.CancelScope | None
    _fence: Fence | None
    _live: StreamDriver | None
    _close_requested: anyio.Event

    def _describe(self) -> str:
        raise NotImplementedError

    def _admit(self, watchdog: Watchdog[_Running], running: _Running) -> str | None:
        """Arm a starting handler's deadline; or say why it must not start."""
        now = anyio.current_time()
        if self._fence is not None:
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
            running.context._deadline = watchdog.start_to_close_deadline(running)
            self._wake_watch(deadline + watchdog.cancel_grace)
        if watchdog.heartbeat is not None:
            running.context._beat = functools.partial(self._progressed, watchdog, running)
        return None

    @staticmethod
    def _progressed(watchdog: Watchdog[_Running], running: _Running, now: float) -> None:
        """A progress call pushes the handler's scope deadline forward. Never
        earlier, so the watch, asleep until the old moment at the latest,
        needs no waking: it finds nothing due then and sleeps on."""
        deadline = watchdog.progressed(running, now)
        if deadline is not None:
            running.scope.deadline = deadline

    def _wake_watch(self, when: float) -> None:
        nap = self._watch_nap
        if nap is not None and when < nap.deadline:
            nap.deadline = when

    @protected
    async def _watch(self, watchdog: Watchdog[_Running]) -> None:
        """Fence the worker once a cancelled handler outlives ``cancel_grace``."""
        while self._fence is None:
            stuck = watchdog.stuck(anyio.current_time())
            if stuck is not None:
                self._fence_stuck(stuck)
                return
            when = watchdog.next_check()
            with anyio.CancelScope(deadline=math.inf if when is None else when) as nap:
                self._watch_nap = nap
                await anyio.sleep_forever()
            self._watch_nap = None

    def _fence_stuck(self, stuck: Stuck[_Running]) -> None:
        fence = self._fence
        if fence is None:
            self._fence_now(Fence(self, stuck.key, stuck=stuck))
        elif fence.running is stuck.key:
            fence.stuck = stuck  # found again when it exited: the final figure

    def _fence_now(self, fence: Fence) -> None:
        """Stop taking work at once, tell the supervisor, then close as usual."""
        if self._fence is not None:
            return
        self._fence = fence
        live = self._live
        if live is not None and live.session.state is State.ACTIVE:
            # Draining stops the daemon's pushes and the session's credit; a
            # push already on its way is handed back by `_admit`.
            live.send_command(live.session.drain(anyio.current_time()))
        self._close_requested.set()
        # It must not raise; should it anyway, a handler's slot is still freed.
        with contextlib.suppress(Exception):
            _supervision.report_fence(fence.text())
