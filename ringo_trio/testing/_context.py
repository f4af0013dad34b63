"""task_context: a real `TaskContext` for calling a handler directly in a unit test.

A handler is ``async def handler(task, ctx)``; testing its logic should not
need a daemon. `task_context` builds the `Task` and a `TestTaskContext` — a
`TaskContext` whose lease lives in the test instead of on a Work stream:
``report_progress`` is recorded (`TestTaskContext.progress`) instead of sent,
``cancel()`` does what a lost lease or a closing worker does (``cancelled``
turns true, ``wait_cancelled`` returns, later progress reports raise
`LeaseLostError`), and ``deadline`` is what ``task_timeouts`` would set.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, cast

import anyio.lowlevel

from .._contract.work.client import LeaseKey
from .._errors import LeaseLostError
from .._models import Progress, Task, TaskState
from .._work._driver import StreamDriver
from .._work._handlers import TaskContext

__all__ = ["TestTaskContext", "task_context"]


class TestTaskContext(TaskContext):
    """A `TaskContext` recording what the handler reports; see `task_context`."""

    __test__ = False  # not a pytest test class
    __slots__ = ("_link",)

    def __init__(self, task: Task, *, worker_id: str, deadline: float | None) -> None:
        link = _Link()
        super().__init__(task, LeaseKey(task.id, task.attempt), worker_id, cast(StreamDriver, link))
        self._link = link
        self._deadline = deadline

    @property
    def progress(self) -> list[Progress]:
        """Every progress report, in order (``updated_at`` is None: no daemon stamped it)."""
        return list(self._link.reports)

    def cancel(self) -> None:
        """Take the lease away, as a lost lease or a closing worker does."""
        self._link.held = False
        self._cancel()


def task_context(
    task: Task | None = None,
    *,
    task_type: str = "task",
    payload: bytes = b"",
    queue: str = "test",
    attempt: int = 1,
    max_attempts: int = 3,
    deadline: float | None = None,
    worker_id: str = "test-worker",
) -> TestTaskContext:
    """A context for ``await handler(ctx.task, ctx)``.

    Give a `Task` or let one be built (LEASED, ``attempt`` of ``max_attempts``,
    a random id). ``deadline`` is an `anyio.current_time` value, as
    ``task_timeouts`` would set it.
    """
    if task is None:
        task = Task(
            id=secrets.token_hex(16),
            queue=queue,
            task_type=task_type,
            payload=payload,
            state=TaskState.LEASED,
            attempt=attempt,
            max_attempts=max_attempts,
            worker_id=worker_id,
        )
    return TestTaskContext(task, worker_id=worker_id, deadline=deadline)


@dataclass(frozen=True, slots=True)
class _Report:
    request_id: int
    current: float
    total: float
    message: str


class _Link:
    """What a `TaskContext` uses of its stream (``session.holds``,
    ``session.report_progress``, ``command``), kept in the test."""

    def __init__(self) -> None:
        self.held = True
        self.reports: list[Progress] = []
        self.session = self

    def holds(self, key: LeaseKey) -> bool:
        return self.held

    def report_progress(
        self, key: LeaseKey, current: float, total: float, message: str, now: float
    ) -> _Report:
        return _Report(len(self.reports), current, total, message)

    async def command(self, frame: Any) -> None:
        await anyio.lowlevel.checkpoint()
        if not self.held:
            raise LeaseLostError("the task's lease is no longer held by this worker")
        self.reports.append(
            Progress(
                current=frame.current,
                total=frame.total,
                message=frame.message,
            )
        )
