"""`TaskTimeouts` and the sans-IO watchdog a worker enforces them with.

Theory of operation
-------------------
A worker runs each handler under its own cancel scope. With `TaskTimeouts`
that scope also carries the handler's deadline — the earlier of its
``start_to_close`` deadline and its ``heartbeat`` deadline, which every
progress call (`TaskContext.mark_progress`, ``report_progress``) pushes
forward — so one scope ties together everything that can stop a handler:
its lease (lost → cancelled), its timeouts (deadline), and the worker's
drain (close past the grace period → cancelled). What a scope cannot do is make a handler *stop*:
code that shields itself, swallows the cancellation, or blocks the event loop
runs on. `Watchdog` keeps the books on that, without I/O or clocks (every
call takes ``now``), so hypothesis can drive it (``tests/work/test_timeouts.py``):

* each handler's **cancellation moment** is the earliest of its
  ``start_to_close`` deadline, its ``heartbeat`` deadline (last progress plus
  ``heartbeat``) and its first explicit cancellation;
* a handler still running ``cancel_grace`` after that moment is **stuck**;
  the worker fences itself then (see docs/timeouts.md).

Finding the earliest moment is O(1) without a heap: deadlines are a moment
plus one constant (start + ``start_to_close``; last progress +
``heartbeat``, moved to the end of its table on each progress), and explicit
cancellations are noted as they happen, so all three tables are already
sorted by insertion order (Python dicts keep it) as long as ``now`` never
goes backwards. A heartbeat deadline already passed is never moved: the
handler was cancelled then, whatever it reports later. Finished handlers
leave every table at once, so nothing stale accumulates.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from .._errors import InvalidArgumentError

__all__ = ["Stuck", "TaskTimeouts", "Watchdog"]


@dataclass(frozen=True, slots=True)
class TaskTimeouts:
    """Time limits for every task a worker runs (see docs/timeouts.md).

    * ``start_to_close``: how long one handler call may run. Past it the
      handler's cancel scope is cancelled and the task is nacked with an
      error naming the timeout (its retry follows the task's backoff). A
      handler that returns after the deadline without ever yielding is not
      acked either.
    * ``no_start``: how long a task delivered to this worker may wait for its
      handler to start. Past it the worker's event loop is starved: the task
      is handed back unrun (retried at once) and the worker is fenced.
    * ``cancel_grace``: how long a cancelled handler (timeout, lost lease,
      dropped stream, close) may take to exit. A handler still running past
      it fences the worker: it stops taking work and ``run()`` raises
      `WorkerFencedError`; under ``ringo supervise`` the process is replaced.
    * ``heartbeat``: the longest a handler may go without reporting progress
      (`TaskContext.mark_progress` or ``report_progress``), counted from its
      start, then from each report. Past it the handler is cancelled and the
      task nacked with an error naming the heartbeat timeout, as for
      ``start_to_close``. Not the lease renewal, which the worker does by
      itself however quiet the handler is.
    """

    start_to_close: timedelta | None = None
    no_start: timedelta | None = None
    cancel_grace: timedelta = timedelta(seconds=10)
    heartbeat: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("start_to_close", "no_start", "cancel_grace", "heartbeat"):
            value = getattr(self, name)
            if value is None and name != "cancel_grace":
                continue
            if not isinstance(value, timedelta):
                raise InvalidArgumentError(f"TaskTimeouts.{name} must be a timedelta")
            if value <= timedelta(0):
                raise InvalidArgumentError(f"TaskTimeouts.{name} must be positive")


K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Stuck(Generic[K]):
    """A handler that ran on ``cancel_grace`` or longer after it was cancelled."""

    key: K
    why: str  # what cancelled it
    cancelled_at: float
    ignored_for: float  # seconds from cancellation to the moment it was found


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


class Watchdog(Generic[K]):
    """Which running handlers ignore their cancellation (see the module docstring).

    ``K`` identifies one handler call. The driver reports `started`,
    `cancelled` and `exited`; it sleeps until `next_check` and then asks
    `stuck`. ``now`` must never decrease between calls.
    """

    def __init__(self, timeouts: TaskTimeouts) -> None:
        self.start_to_close = _seconds(timeouts.start_to_close)
        self.no_start = _seconds(timeouts.no_start)
        self.cancel_grace = timeouts.cancel_grace.total_seconds()
        self.heartbeat = _seconds(timeouts.heartbeat)
        # key -> start_to_close deadline; sorted by deadline (start + constant).
        self._deadlines: dict[K, float] = {}
        # key -> heartbeat deadline; sorted by deadline (last progress +
        # constant: a progress moves its key to the end).
        self._beats: dict[K, float] = {}
        # key -> (first explicit cancellation, why); sorted by that moment.
        self._cancelled: dict[K, tuple[float, str]] = {}

    def __len__(self) -> int:
        return len(self._deadlines.keys() | self._beats.keys() | self._cancelled.keys())

    def waited_too_long(self, arrived: float, now: float) -> float | None:
        """How long a task arriving at ``arrived`` waited, if past ``no_start``."""
        waited = now - arrived
        if self.no_start is not None and waited > self.no_start:
            return waited
        return None

    def started(self, key: K, now: float) -> float | None:
        """A handler starts now; returns its scope's deadline, the earlier of
        its start_to_close and heartbeat deadlines (None: neither is set)."""
        if self.start_to_close is not None:
            self._deadlines[key] = now + self.start_to_close
        if self.heartbeat is not None:
            self._beats[key] = now + self.heartbeat
        return self.deadline(key)

    def deadline(self, key: K) -> float | None:
        """The running handler's scope deadline (None: no deadline)."""
        stc = self._deadlines.get(key)
        beat = self._beats.get(key)
        if stc is None or beat is None:
            return beat if stc is None else stc
        return min(stc, beat)

    def start_to_close_deadline(self, key: K) -> float | None:
        return self._deadlines.get(key)

    def progressed(self, key: K, now: float) -> float | None:
        """The handler reported progress now: its heartbeat deadline moves to
        ``now + heartbeat``. Returns its new scope deadline, or None when
        nothing moved (no heartbeat, not running, or already past it: a
        handler is not rescued by a report made after its deadline)."""
        beat = self._beats.get(key)
        if beat is None or now >= beat:
            return None
        assert self.heartbeat is not None
        # To the end of the table, which keeps it sorted: ``now`` is the latest.
        del self._beats[key]
        self._beats[key] = now + self.heartbeat
        return self.deadline(key)

    def expired(self, key: K, now: float) -> str | None:
        """The timeout text of the handler's earliest deadline passed by
        ``now`` (None: none has passed)."""
        deadline = self._deadlines.get(key)
        beat = self._beats.get(key)
        if deadline is not None and now >= deadline and (beat is None or deadline <= beat):
            return self.timeout_text()
        if beat is not None and now >= beat:
            return self.heartbeat_text()
        return None

    def cancelled(self, key: K, now: float, why: str) -> float:
        """A handler was cancelled (not by its deadline); returns when it is due
        to have exited. Only the first cancellation counts."""
        if key not in self._cancelled:
            self._cancelled[key] = (now, why)
        return self._cancelled[key][0] + self.cancel_grace

    def exited(self, key: K, now: float) -> Stuck[K] | None:
        """A handler finished; it is forgotten. Returns it as `Stuck` when it
        exited only ``cancel_grace`` or more after its cancellation."""
        deadline = self._deadlines.pop(key, None)
        beat = self._beats.pop(key, None)
        cancel = self._cancelled.pop(key, None)
        moment = self._moment(deadline, beat, cancel)
        if moment is None or now < moment[0] + self.cancel_grace:
            return None
        return Stuck(key, moment[1], moment[0], now - moment[0])

    def next_check(self) -> float | None:
        """The earliest moment a handler running now becomes stuck (None: never)."""
        head = self._head()
        return None if head is None else head[1] + self.cancel_grace

    def stuck(self, now: float) -> Stuck[K] | None:
        """A running handler that is past its grace now (the earliest one)."""
        head = self._head()
        if head is None or now < head[1] + self.cancel_grace:
            return None
        key, moment, why = head
        return Stuck(key, why, moment, now - moment)

    def timeout_text(self) -> str:
        return f"start_to_close timeout of {self.start_to_close:g}s exceeded"

    def heartbeat_text(self) -> str:
        return (
            f"heartbeat timeout of {self.heartbeat:g}s exceeded: no progress reported"
            " (ctx.mark_progress / ctx.report_progress)"
        )

    def _moment(
        self, deadline: float | None, beat: float | None, cancel: tuple[float, str] | None
    ) -> tuple[float, str] | None:
        """The earliest of a handler's moments; on a tie a timeout wins."""
        best = cancel
        if beat is not None and (best is None or beat <= best[0]):
            best = beat, self.heartbeat_text()
        if deadline is not None and (best is None or deadline <= best[0]):
            best = deadline, self.timeout_text()
        return best

    def _head(self) -> tuple[K, float, str] | None:
        """The handler with the earliest cancellation moment, if any: the
        earliest of the three tables' heads (each is sorted)."""
        best: tuple[K, float, str] | None = None
        if self._deadlines:
            key = next(iter(self._deadlines))
            best = (key, self._deadlines[key], self.timeout_text())
        if self._beats:
            key = next(iter(self._beats))
            moment = self._beats[key]
            if best is None or moment < best[1]:
                best = (key, moment, self.heartbeat_text())
        if self._cancelled:
            key = next(iter(self._cancelled))
            moment, why = self._cancelled[key]
            if best is None or moment < best[1]:
                best = (key, moment, why)
        return best
