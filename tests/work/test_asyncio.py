"""The SDK under asyncio (through anyio): no trio-asyncio bridge, same behaviour."""

from __future__ import annotations

import pathlib
from datetime import timedelta

import anyio
import pytest

from ringo_trio import (
    LeaseLostError,
    NotFoundError,
    Ringo,
    RingoError,
    TaskSpec,
    TaskState,
    UnavailableError,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.processes import kill_local_daemon, pid_alive
from tests._kit.workers import Concurrent

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_local_operations_asyncio(tmp_path: pathlib.Path) -> None:
    with anyio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            first = await queue.enqueue(task_type="t", unique_key="k")
            assert first.created
            assert not (await queue.enqueue(task_type="t", unique_key="k")).created
            batch = await queue.enqueue_many(
                [TaskSpec("t", unique_key=f"b{i}") for i in range(1500)]
            )
            assert batch.created_count == 1500
            [leased] = await queue.claim(task_types=["t"], lease_duration=timedelta(seconds=30))
            await leased.extend_lease(timedelta(minutes=1))
            await leased.ack()
            with pytest.raises(LeaseLostError):
                await leased.ack()
            assert (await queue.get_by_id(leased.task.id)).state is TaskState.SUCCEEDED
            assert (await queue.retry_by_id(leased.task.id)).state is TaskState.PENDING
            with pytest.raises(NotFoundError):
                await queue.get_by_unique_key("missing")


async def test_remote_operations_asyncio(daemon: DaemonProcess) -> None:
    with anyio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("q")
            await queue.enqueue(task_type="t", unique_key="k")
            [leased] = await queue.claim()
            await leased.reject("bad")
            assert (await queue.retry("k")).state is TaskState.PENDING
            [leased] = await queue.claim()
            await leased.nack("again", delay=timedelta(0))
            assert (await queue.get_by_unique_key("k")).last_error == "again"


async def test_local_crash_recovery_asyncio(tmp_path: pathlib.Path) -> None:
    """Under asyncio too: a crashed daemon is restarted, mutations are not replayed,
    reads are re-sent."""
    with anyio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            old = kill_local_daemon(client)
            with pytest.raises(UnavailableError):
                await queue.enqueue(task_type="t", unique_key="lost")
            assert client.daemon_pid != old
            with pytest.raises(NotFoundError):
                await queue.get_by_unique_key("lost")
            kill_local_daemon(client)
            assert (await queue.get_by_id(task.id)).id == task.id


async def test_cancellation_and_close_asyncio(tmp_path: pathlib.Path) -> None:
    with anyio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            pid = client.daemon_pid
            queue = client.queue("q")
            with anyio.move_on_after(0.3) as scope:
                await queue.claim(wait_timeout=timedelta(seconds=30))
            assert scope.cancelled_caught
            assert (await queue.enqueue(task_type="t")).created
        assert pid is not None
        assert not pid_alive(pid)
        with pytest.raises(RingoError, match="closed"):
            await queue.enqueue(task_type="t")


async def test_body_exception_unwrapped_asyncio(tmp_path: pathlib.Path) -> None:
    with anyio.fail_after(30), pytest.raises(KeyError):
        async with Ringo.local(tmp_path):
            raise KeyError("mine")


async def test_cancelled_start_asyncio(tmp_path: pathlib.Path) -> None:
    """Cancelling the start under asyncio leaves no daemon behind (checked by the
    autouse no_leaked_daemons fixture)."""
    with anyio.fail_after(30):
        with anyio.move_on_after(0.05):
            async with Ringo.local(tmp_path):
                pytest.fail("must not get here")


async def test_worker_asyncio(tmp_path: pathlib.Path) -> None:
    """The Worker runs unchanged under asyncio: outcomes, progress, the
    concurrency bound, and a graceful close."""
    from ringo_trio import PermanentTaskError, Task, TaskContext

    with anyio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("asyncio-worker")
            batch = await queue.enqueue_many([TaskSpec("t") for _ in range(60)])
            bad = (await queue.enqueue(task_type="bad")).task.id
            ids = [r.task.id for r in batch.results]
            handlers = Concurrent()

            async def handle(task: Task, ctx: TaskContext) -> None:
                if task.task_type == "bad":
                    raise PermanentTaskError("no")
                with handlers.one():
                    await ctx.report_progress(1, 1)
                    await anyio.sleep(0.005)

            worker = queue.worker(handle, concurrency=5)
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                while True:
                    states = {(await queue.get_by_id(t)).state for t in [*ids, bad]}
                    if TaskState.PENDING not in states and TaskState.LEASED not in states:
                        break
                    await anyio.sleep(0.05)
                await worker.close()
            assert handlers.peak == 5
            assert (await queue.get_by_id(bad)).state is TaskState.DEAD
            assert {(await queue.get_by_id(t)).state for t in ids} == {TaskState.SUCCEEDED}


async def test_prefetch_asyncio(tmp_path: pathlib.Path) -> None:
    """Under asyncio too (anyio's task group), a prefetching worker runs
    at most ``concurrency`` handlers while it holds more leases, and every
    task runs exactly once."""
    from ringo_trio import Task, TaskContext

    with anyio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("asyncio-prefetch")
            batch = await queue.enqueue_many([TaskSpec("t") for _ in range(40)])
            ids = [r.task.id for r in batch.results]
            seen: list[str] = []
            handlers = Concurrent()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    seen.append(task.id)
                    await anyio.sleep(0.005)

            worker = queue.worker(handle, concurrency=3, prefetch=5)
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                while True:
                    states = {(await queue.get_by_id(t)).state for t in ids}
                    if states == {TaskState.SUCCEEDED}:
                        break
                    await anyio.sleep(0.05)
                await worker.close()
            assert handlers.peak == 3
            assert sorted(seen) == sorted(ids)
