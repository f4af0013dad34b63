"""The differences docs/migrating.md's table promises a user of the asyncio
SDK (``ringo_task_queue``), each checked against the code, so the guide
cannot go stale silently again (issue 28)."""

from __future__ import annotations

import importlib

import pytest
import trio
import trio.testing

import ringo_trio
from ringo_trio import InvalidArgumentError, Ringo, TaskSpec, TaskTimeouts, WorkerFencedError
from ringo_trio.testing import RingoTestEnv


def test_the_api_differences_of_the_table() -> None:
    """Property: the submodules are gone (import from ringo_trio), a client
    has no start(), the models no from_proto/to_proto, TaskTimeouts no
    ``enabled``; WorkerFencedError is a RingoError and not a RuntimeError;
    gzip and grpcio channel options are refused."""
    for old in ("errors", "models", "worker", "client", "concurrency"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"ringo_trio.{old}")
    assert not hasattr(ringo_trio.RingoClient, "start")
    assert not hasattr(ringo_trio.Task, "from_proto")
    assert not hasattr(ringo_trio.TaskSpec, "to_proto")
    assert not hasattr(TaskTimeouts(), "enabled")
    assert issubclass(WorkerFencedError, ringo_trio.RingoError)
    assert not issubclass(WorkerFencedError, RuntimeError)
    assert issubclass(ringo_trio.WorkerAlreadyRunError, RuntimeError)
    assert issubclass(InvalidArgumentError, ValueError)
    with pytest.raises(InvalidArgumentError, match="gzip"):
        Ringo.connect("127.0.0.1:7233", compression="gzip")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Ringo.connect("127.0.0.1:7233", channel_options=[])  # type: ignore[call-arg]


@pytest.mark.trio
async def test_the_behaviour_differences_of_the_table(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: BatchResult.results is a tuple; a crash's last_error is
    "Type: message" (a RetryTaskError's its message alone); a progress
    message is cut to 4 KiB."""
    with trio.fail_after(3600):  # virtual
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("migrating")
            batch = await queue.enqueue_many(
                [TaskSpec(task_type="t", max_attempts=1) for _ in range(2)]
            )
            assert isinstance(batch.results, tuple)

            async def handler(task: ringo_trio.Task, ctx: ringo_trio.TaskContext) -> None:
                await ctx.report_progress(1, 1, "é" * 5000)
                raise KeyError("id")

            await env.run_worker(queue, handler)
            for result in batch.results:
                task = await queue.get_by_id(result.task.id)
                assert task.last_error == "KeyError: 'id'"
                assert task.progress is not None
                assert len(task.progress.message.encode()) == 4096
