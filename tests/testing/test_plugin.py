"""The pytest plugin's fixtures, under pytest-trio and under anyio's plugin."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
import trio
import trio.testing

from ringo_trio import RingoClient, Task, TaskContext, TaskState
from ringo_trio.testing import AutojumpEventLoop, RingoTestEnv


async def delayed_task_runs_hours_later(env: RingoTestEnv, client: RingoClient) -> None:
    queue = client.queue("plugin")
    result = await queue.enqueue(task_type="t", delay=timedelta(hours=2))
    begin = anyio.current_time()
    ran_at: list[float] = []

    async def handler(task: Task, ctx: TaskContext) -> None:
        ran_at.append(anyio.current_time())

    assert await env.run_worker(queue, handler, until="settled") == 1
    assert ran_at[0] - begin >= 2 * 3600
    assert (await queue.get_by_id(result.task.id)).state is TaskState.SUCCEEDED


@pytest.mark.trio
async def test_fixtures_under_pytest_trio(
    autojump_clock: trio.testing.MockClock, ringo_env: RingoTestEnv, ringo_client: RingoClient
) -> None:
    """Property: under pytest-trio the plugin's ringo_env runs on the test's
    (mock) clock — a task delayed by two hours runs two virtual hours later — and
    ringo_client is that environment's client."""
    assert ringo_client is ringo_env.client
    await delayed_task_runs_hours_later(ringo_env, ringo_client)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return ("asyncio", {"loop_factory": AutojumpEventLoop})


@pytest.mark.anyio
async def test_fixtures_under_anyio_asyncio(
    ringo_env: RingoTestEnv, ringo_client: RingoClient
) -> None:
    """Property: under anyio's plugin on asyncio (AutojumpEventLoop) the same
    fixtures work, on the same virtual time."""
    assert ringo_client is ringo_env.client
    await delayed_task_runs_hours_later(ringo_env, ringo_client)
