"""Hypothesis strategies for testing Ringo handlers (needs ``hypothesis``).

* `task_specs` draws valid `TaskSpec`s (every value within the protocol's
  limits, so the daemon accepts them all);
* `outcome_scripts` draws what a handler does on each attempt of a task
  (``"ack"``, ``"retry"``, ``"crash"``, ``"reject"``); `scripted_handler`
  plays such scripts, and `expected_history` says where the daemon must
  leave a task that followed one: its final state, attempts and last error.

A property test of the retry rules, then, is: enqueue any specs, give each
task any script, work the queue until settled, and compare every task with
`expected_history` (docs/testing.md has it in full).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Literal

from hypothesis import strategies as st

from .._errors import PermanentTaskError, RetryTaskError
from .._models import RetryBackoff, Task, TaskSpec, TaskState
from .._work._handlers import Handler, TaskContext

__all__ = [
    "OUTCOMES",
    "Outcome",
    "expected_history",
    "names",
    "outcome_scripts",
    "retry_backoffs",
    "scripted_handler",
    "task_specs",
]

Outcome = Literal["ack", "retry", "crash", "reject"]
OUTCOMES: tuple[Outcome, ...] = ("ack", "retry", "crash", "reject")

_NAME_CHARS = string.ascii_letters + string.digits + "-_."


def names(max_size: int = 20) -> st.SearchStrategy[str]:
    """Queue names, task types and unique keys: 1..``max_size`` plain characters."""
    return st.text(_NAME_CHARS, min_size=1, max_size=max_size)


def retry_backoffs(
    longest: timedelta = timedelta(minutes=10),
) -> st.SearchStrategy[RetryBackoff]:
    """Backoffs whose delays are at most ``longest`` (each virtual second of
    waiting costs a little real time, so keep it modest)."""
    seconds = longest.total_seconds()

    @st.composite
    def build(draw: st.DrawFn) -> RetryBackoff:
        initial = draw(st.floats(0.0, seconds, allow_nan=False))
        maximum = draw(st.floats(initial, seconds, allow_nan=False))
        multiplier = draw(st.floats(1.0, 4.0, allow_nan=False))
        return RetryBackoff(
            initial=timedelta(seconds=initial),
            maximum=timedelta(seconds=maximum),
            multiplier=multiplier,
        )

    return build()


def task_specs(
    *,
    task_types: st.SearchStrategy[str] | None = None,
    payloads: st.SearchStrategy[bytes] | None = None,
    max_attempts: st.SearchStrategy[int] | None = None,
    delays: st.SearchStrategy[timedelta | None] | None = None,
    unique_keys: st.SearchStrategy[str | None] | None = None,
    backoffs: st.SearchStrategy[RetryBackoff | None] | None = None,
) -> st.SearchStrategy[TaskSpec]:
    """Valid `TaskSpec`s; each field's strategy can be replaced.

    Defaults: a short task type, up to 64 payload bytes, 1..5 attempts, no
    delay or one of up to an hour, no unique key (give ``unique_keys`` to
    test deduplication), a backoff of up to ten minutes or the daemon's
    default, and a priority in -5..5.
    """
    return st.builds(
        TaskSpec,
        task_type=task_types if task_types is not None else names(),
        payload=payloads if payloads is not None else st.binary(max_size=64),
        unique_key=unique_keys if unique_keys is not None else st.none(),
        max_attempts=max_attempts if max_attempts is not None else st.integers(1, 5),
        retry_backoff=backoffs if backoffs is not None else st.none() | retry_backoffs(),
        delay=(
            delays
            if delays is not None
            else st.none() | st.timedeltas(timedelta(0), timedelta(hours=1))
        ),
        priority=st.integers(-5, 5),
    )


def outcome_scripts(max_size: int = 5) -> st.SearchStrategy[list[Outcome]]:
    """What the handler does on attempts 1, 2, ...; past the script's end it acks."""
    return st.lists(st.sampled_from(OUTCOMES), max_size=max_size)


def _error(outcome: Outcome, attempt: int) -> str:
    return f"scripted {outcome} (attempt {attempt})"


def scripted_handler(scripts: Mapping[str, Sequence[Outcome]]) -> Handler:
    """A handler doing, for the task with id ``i`` on attempt ``n``, what
    ``scripts[i][n - 1]`` says (ack past the end, and for unknown ids)."""

    async def handler(task: Task, ctx: TaskContext) -> None:
        script = scripts.get(task.id, ())
        outcome = script[task.attempt - 1] if task.attempt <= len(script) else "ack"
        if outcome == "retry":
            raise RetryTaskError(_error(outcome, task.attempt))
        if outcome == "crash":
            raise RuntimeError(_error(outcome, task.attempt))
        if outcome == "reject":
            raise PermanentTaskError(_error(outcome, task.attempt))

    return handler


def expected_history(
    script: Sequence[Outcome], max_attempts: int
) -> tuple[TaskState, int, str | None]:
    """Where a task following ``script`` ends: (state, attempts, last error).

    The rules it models: an ack succeeds, a reject is DEAD at once, a retry
    or a crash spends the attempt and is DEAD once ``max_attempts`` are
    spent; the last error stays after a later success.
    """
    last_error: str | None = None
    for attempt in range(1, max_attempts + 1):
        outcome = script[attempt - 1] if attempt <= len(script) else "ack"
        if outcome == "ack":
            return TaskState.SUCCEEDED, attempt, last_error
        last_error = _error(outcome, attempt)
        if outcome == "crash":
            last_error = f"RuntimeError: {last_error}"
        if outcome == "reject":
            return TaskState.DEAD, attempt, last_error
    return TaskState.DEAD, max_attempts, last_error
