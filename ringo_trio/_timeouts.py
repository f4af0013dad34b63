"""`TaskTimeouts`: the per-task time limits a worker enforces on its handlers.

The worker ties each handler's cancel scope to these limits (see
docs/timeouts.md); a supervised process also hands them to its watchdog.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ._errors import InvalidArgumentError

__all__ = ["TaskTimeouts"]


@dataclass(frozen=True, slots=True)
class TaskTimeouts:
    """Time limits for every task a worker runs.

    * ``start_to_close``: how long one handler call may run. Past it the
      handler's cancel scope is cancelled and the task is nacked with an
      error naming the timeout (its retry follows the task's backoff).
    * ``no_start``: how long a task delivered to this worker may wait for its
      handler to start. Past it the worker's event loop is starved: the task
      is handed back and the worker is fenced.
    * ``cancel_grace``: how long a cancelled handler (timeout, lost lease,
      dropped stream, close) may take to exit. A handler still running past
      it fences the worker: it stops taking work and ``run()`` raises
      `WorkerFencedError`; under ``ringo supervise`` the process is replaced.
    """

    start_to_close: timedelta | None = None
    no_start: timedelta | None = None
    cancel_grace: timedelta = timedelta(seconds=10)

    def __post_init__(self) -> None:
        for name in ("start_to_close", "no_start", "cancel_grace"):
            value = getattr(self, name)
            if value is None and name != "cancel_grace":
                continue
            if not isinstance(value, timedelta):
                raise InvalidArgumentError(f"TaskTimeouts.{name} must be a timedelta")
            if value <= timedelta(0):
                raise InvalidArgumentError(f"TaskTimeouts.{name} must be positive")
