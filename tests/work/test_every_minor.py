"""The Work stream at every protocol minor the SDK speaks (0 … MINOR): a
worker, with and without a prefetch, against a current daemon while the SDK
offers only that minor, as a client of that release would."""

from __future__ import annotations

import pathlib

import pytest
import trio

from ringo_trio import PermanentTaskError, RetryTaskError, Ringo, Task, TaskContext, TaskState
from ringo_trio._contract import versions
from tests._kit.workers import Concurrent, enqueue, running, wait_states

pytestmark = pytest.mark.trio


@pytest.mark.parametrize("prefetch", [0, 3], ids=["plain", "prefetch"])
@pytest.mark.parametrize("minor", range(versions.MINOR + 1), ids=lambda m: f"minor{m}")
async def test_every_minor_works_every_task_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, minor: int, prefetch: int
) -> None:
    """At every minor: each task is handled, and settled as its handler
    said (ack → SUCCEEDED; a retry → handled again, attempt 2; a reject →
    DEAD); none lost, none run twice on one attempt, never more handlers at
    once than the concurrency."""
    monkeypatch.setattr(versions, "MINOR", minor)
    with trio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("minors")
            ids = await enqueue(queue, 24, max_attempts=3)
            attempts: dict[str, list[int]] = {}
            handlers = Concurrent()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    attempts.setdefault(task.id, []).append(ctx.attempt)
                    await trio.sleep(0.002)
                    if task.id == ids[0]:
                        raise PermanentTaskError("refused")
                    if task.id == ids[1] and ctx.attempt == 1:
                        raise RetryTaskError("again", delay=0.0)

            async with running(queue.worker(handle, concurrency=4, prefetch=prefetch)):
                done = await wait_states(
                    queue, ids, {TaskState.SUCCEEDED, TaskState.DEAD}, within=30
                )
            states = {task.id: task.state for task in done}
            assert states[ids[0]] is TaskState.DEAD
            assert {states[i] for i in ids[1:]} == {TaskState.SUCCEEDED}
            assert attempts[ids[1]] == [1, 2]
            assert all(attempts[i] == [1] for i in ids if i != ids[1])
            assert handlers.peak <= 4
