"""`Task.history` through the SDK (protocol minor 14): a real Worker's
retries, then the outcome, as `get_by_id`, `get_by_unique_key` and `wait`
answer them; a daemon below minor 14 answers no history."""

from __future__ import annotations

import pathlib
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    AttemptOutcome,
    PermanentTaskError,
    RetryTaskError,
    Ringo,
    Task,
    TaskContext,
    TaskState,
)
from ringo_trio.testing import RingoTestEnv, spawn_daemon

pytestmark = pytest.mark.trio


async def test_a_workers_retries_are_in_the_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property (what happened on attempts 1 and 2): a handler that fails
    twice (a retry, then an exception) and then succeeds leaves three
    attempts, FAILED, FAILED, SUCCEEDED, each with the worker's id, start,
    end and error, by id, by unique key and from wait(); a rejected task
    ends with one REJECTED attempt."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        calls: dict[str, int] = {}

        async def handler(task: Task, ctx: TaskContext) -> None:
            calls[task.id] = calls.get(task.id, 0) + 1
            if task.task_type == "poison":
                raise PermanentTaskError("cannot parse")
            if calls[task.id] == 1:
                raise RetryTaskError("smtp busy", delay=timedelta(seconds=5))
            if calls[task.id] == 2:
                raise ValueError("connection reset")

        flaky = (await queue.enqueue(task_type="send", unique_key="k1")).task
        poison = (await queue.enqueue(task_type="poison")).task
        worker = queue.worker(handler)
        with trio.fail_after(600):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                done = await queue.wait(flaky.id, timeout=timedelta(seconds=300))
                await queue.wait(poison.id, timeout=timedelta(seconds=300))
                await worker.close()

        assert done.state == TaskState.SUCCEEDED
        assert [(a.attempt, a.outcome) for a in done.history] == [
            (1, AttemptOutcome.FAILED),
            (2, AttemptOutcome.FAILED),
            (3, AttemptOutcome.SUCCEEDED),
        ]
        assert {a.worker_id for a in done.history} == {worker.worker_id}
        assert done.history[0].error == "smtp busy"
        assert "connection reset" in (done.history[1].error or "")
        assert done.history[2].error is None
        for a in done.history:
            assert a.started_at is not None
            assert a.ended_at is not None
            assert a.started_at <= a.ended_at
        assert done.history[0].ended_at <= done.history[1].started_at  # type: ignore[operator]
        assert await queue.get_by_id(flaky.id) == done
        assert await queue.get_by_unique_key("k1") == done
        rejected = await queue.get_by_id(poison.id)
        assert [(a.outcome, a.error) for a in rejected.history] == [
            (AttemptOutcome.REJECTED, "cannot parse")
        ]


async def test_a_daemon_below_minor_14_answers_no_history(tmp_path: pathlib.Path) -> None:
    """Property (the gate): a daemon serving minor 13 leaves Task.history
    empty, while the same daemon at minor 14 answers the attempt."""
    for minor, expected in (("13", 0), ("14", 1)):
        with spawn_daemon(tmp_path / minor, extra_args=["--protocol-minor", minor]) as daemon:
            with trio.fail_after(30):
                async with Ringo.connect(daemon.endpoint) as client:
                    queue = client.queue("q")
                    task = (await queue.enqueue(task_type="t")).task
                    [claimed] = await queue.claim(lease_duration=timedelta(seconds=30))
                    await claimed.nack("nope", delay=timedelta(hours=1))
                    got = await queue.get_by_id(task.id)
                    assert len(got.history) == expected, got.history
