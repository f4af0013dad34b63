"""`TaskQueue.pause` / `resume` through the SDK, on an in-process daemon on
virtual time (`RingoTestEnv`)."""

from __future__ import annotations

import pathlib

import pytest
import trio
import trio.testing

from ringo_trio import IncompatibleVersionError, Ringo, Task, TaskContext, TaskState
from ringo_trio.testing import RingoTestEnv, spawn_daemon

pytestmark = pytest.mark.trio


async def test_a_paused_queue_runs_nothing_until_resumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: after pause() (True, then False: already paused) a worker
    is handed nothing for an hour of virtual time although the task was
    enqueued, stats() and client.queues() say paused; resume() (True) runs
    the task at the resume's instant (a dispatcher not woken would sleep
    until the test's virtual deadline)."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        assert await queue.pause() is True
        assert await queue.pause() is False
        task = (await queue.enqueue(task_type="send")).task
        ran: list[tuple[str, float]] = []
        done = trio.Event()

        async def handler(task: Task, ctx: TaskContext) -> None:
            ran.append((task.id, trio.current_time()))
            done.set()

        worker = queue.worker(handler)
        with trio.fail_after(2 * 3600):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await env.sleep(hours=1)
                assert ran == []
                assert (await queue.stats()).paused is True
                assert [q.paused for q in await env.client.queues()] == [True]
                resumed_at = trio.current_time()
                assert await queue.resume() is True
                await done.wait()
                await worker.close()
        assert ran == [(task.id, resumed_at)]
        assert (await queue.get_by_id(task.id)).state == TaskState.SUCCEEDED
        assert await queue.resume() is False
        assert (await queue.stats()).paused is False


async def test_pause_needs_minor_13(tmp_path: pathlib.Path) -> None:
    """Property: against a daemon serving minor 12, pause() and resume()
    raise IncompatibleVersionError naming minor 13 (the SDK refuses before
    sending; the daemon's UNIMPLEMENTED would map alike); a minor-12
    daemon's stats say paused=False."""
    with spawn_daemon(tmp_path / "data", extra_args=["--protocol-minor", "12"]) as old:
        with trio.fail_after(30):
            async with Ringo.connect(old.endpoint) as client:
                queue = client.queue("emails")
                with pytest.raises(IncompatibleVersionError, match="minor 13"):
                    await queue.pause()
                with pytest.raises(IncompatibleVersionError, match="minor 13"):
                    await queue.resume()
                assert (await queue.stats()).paused is False
