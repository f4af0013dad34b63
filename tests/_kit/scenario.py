"""One test body, run against RingoTestEnv (trio, asyncio) and a real ringod."""

from __future__ import annotations

import secrets
from datetime import timedelta

from ringo_trio import (
    PermanentTaskError,
    RetryBackoff,
    RingoClient,
    Task,
    TaskContext,
    TaskState,
)
from ringo_trio.testing import run_worker

#: What each task's history must be, whichever daemon ran it:
#: (final state, attempts, last error, attempts the handler saw).
EXPECTED = {
    "flaky": (TaskState.SUCCEEDED, 3, "RuntimeError: flaky 2", [1, 2, 3]),
    "doomed": (TaskState.DEAD, 3, "RuntimeError: doomed 3", [1, 2, 3]),
    "rejected": (TaskState.DEAD, 1, "bad input", [1]),
    "easy": (TaskState.SUCCEEDED, 1, None, [1]),
}


async def retry_scenario(
    client: RingoClient, retry_delay: timedelta
) -> dict[str, tuple[TaskState, int, str | None, list[int]]]:
    """Enqueue the four tasks, each with ``retry_delay`` between attempts,
    work the queue until settled, and return each task's history."""
    queue = client.queue(f"proof-{secrets.token_hex(4)}")
    backoff = RetryBackoff(initial=retry_delay, maximum=retry_delay)
    ids: dict[str, str] = {}
    for name in EXPECTED:
        result = await queue.enqueue(
            task_type="job", payload=name.encode(), max_attempts=3, retry_backoff=backoff
        )
        ids[name] = result.task.id
    seen: dict[str, list[int]] = {name: [] for name in EXPECTED}

    async def handler(task: Task, ctx: TaskContext) -> None:
        name = task.payload.decode()
        seen[name].append(task.attempt)
        if name == "flaky" and task.attempt < 3:
            raise RuntimeError(f"flaky {task.attempt}")
        if name == "doomed":
            raise RuntimeError(f"doomed {task.attempt}")
        if name == "rejected":
            raise PermanentTaskError("bad input")

    await run_worker(queue, handler, until="settled")
    history = {}
    for name, task_id in ids.items():
        task = await queue.get_by_id(task_id)
        history[name] = (task.state, task.attempt, task.last_error, seen[name])
    return history
