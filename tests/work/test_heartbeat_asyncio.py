"""The heartbeat timeout under asyncio (anyio's cancel scope instead of
trio's), on `AutojumpEventLoop`: virtual time, as under trio's autojump."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest

from ringo_trio import RetryBackoff, Task, TaskContext, TaskState, TaskTimeouts
from ringo_trio.testing import AutojumpEventLoop, RingoTestEnv

pytestmark = pytest.mark.anyio

HEARTBEAT = 1.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"loop_factory": AutojumpEventLoop})


async def test_a_silent_handler_is_cancelled_under_asyncio() -> None:
    """Property: under asyncio too, progress pushes the handler's deadline
    forward, and a handler that stops reporting is cancelled one heartbeat
    after its last report; the attempt is spent with an error naming the
    heartbeat timeout, and the retry runs."""
    with anyio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("silent-asyncio")
            backoff = RetryBackoff(initial=timedelta(milliseconds=20))
            task_id = (await queue.enqueue(task_type="t", retry_backoff=backoff)).task.id
            errors: list[str | None] = []
            last_report = cancelled_at = 0.0

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal last_report, cancelled_at
                errors.append(task.last_error)
                if ctx.attempt > 1:
                    return
                for _ in range(3):
                    await anyio.sleep(HEARTBEAT * 0.9)
                    ctx.mark_progress()
                    last_report = anyio.current_time()
                try:
                    await anyio.sleep_forever()
                finally:
                    cancelled_at = anyio.current_time()

            timeouts = TaskTimeouts(heartbeat=timedelta(seconds=HEARTBEAT))
            await env.run_worker(queue, handle, task_timeouts=timeouts)
            task = await queue.get_by_id(task_id)
    assert task.state is TaskState.SUCCEEDED
    assert task.attempt == 2
    [first, retried] = errors
    assert first is None
    assert retried is not None
    assert retried.startswith("heartbeat timeout of 1s exceeded")
    assert last_report > 2 * HEARTBEAT
    assert cancelled_at == pytest.approx(last_report + HEARTBEAT, abs=1e-6)
