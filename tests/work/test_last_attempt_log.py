"""The worker's log line for a failed attempt says when it was the task's
last: "asked for a retry" alone read as if another attempt would come, while
the daemon had made the task DEAD."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from ringo_trio import RetryTaskError, Task, TaskContext, TaskState
from ringo_trio._contract.work.client import LeaseKey
from ringo_trio._work._handlers import Running, log_outcome
from ringo_trio.testing import RingoTestEnv
from tests._kit.workers import running, wait_states

pytestmark = pytest.mark.trio


def _outcomes(caplog: pytest.LogCaptureFixture, task_id: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if getattr(r, "ringo_task_id", None) == task_id and "attempt" in r.getMessage()
    ]


@pytest.mark.parametrize("how", ["retry", "crash"])
async def test_a_failure_on_the_last_attempt_is_logged_as_the_task_dying(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Property: a RetryTaskError (or a crash) on attempts 1 and 2 of 3 is
    logged as before ("asked for a retry" at INFO / "crashed" at ERROR, no
    word of DEAD); on attempt 3 of 3 the line says "on its last attempt, so
    the task is now DEAD", at WARNING at least, with ``ringo_dead`` True in
    its extra — and the task is indeed DEAD."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("last")
            task_id = (await queue.enqueue(task_type="t", max_attempts=3)).task.id

            async def handle(task: Task, ctx: TaskContext) -> None:
                if how == "retry":
                    raise RetryTaskError("mail server busy", delay=0)
                raise ValueError("boom")

            async with running(queue.worker(handle)):
                [task] = await wait_states(queue, [task_id], {TaskState.DEAD})
    assert task.attempt == 3
    records = _outcomes(caplog, task_id)
    assert [r.ringo_attempt for r in records] == [1, 2, 3]  # type: ignore[attr-defined]
    *earlier, last = records
    for record in earlier:
        assert "DEAD" not in record.getMessage()
        assert record.ringo_dead is False  # type: ignore[attr-defined]
        assert record.levelno == (logging.INFO if how == "retry" else logging.ERROR)
    what = "asked for a retry" if how == "retry" else "crashed"
    assert (
        f"(t, attempt 3 of 3) of queue 'last' {what} on its last attempt, so the task is now DEAD"
        in last.getMessage()
    )
    assert last.levelno == (logging.WARNING if how == "retry" else logging.ERROR)
    assert last.ringo_dead is True  # type: ignore[attr-defined]


async def test_a_task_pushed_without_an_attempt_limit_is_never_called_dead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: a push whose ``max_attempts`` is 0 (no limit stated: a daemon
    that leaves the default unresolved) makes no failure "the last attempt":
    the line is the ordinary one, at its own level, ``ringo_dead`` False (red
    when 0 counts as a limit every attempt has reached)."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    task = Task(
        id="t1",
        queue="q",
        task_type="t",
        payload=b"",
        state=TaskState.LEASED,
        attempt=7,
        max_attempts=0,
    )
    context = TaskContext(task, LeaseKey("t1", 7), "w1", None)  # type: ignore[arg-type]
    running = Running(trio.CancelScope(), context)
    log_outcome("q", running, logging.INFO, "asked for a retry", "busy", nacked=True)
    [record] = _outcomes(caplog, "t1")
    assert "DEAD" not in record.getMessage()
    assert (record.levelno, record.ringo_dead) == (logging.INFO, False)  # type: ignore[attr-defined]
