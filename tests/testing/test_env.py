"""RingoTestEnv: an in-process daemon on the event loop's clock, over the real protocol."""

from __future__ import annotations

import itertools
from datetime import timedelta
from pathlib import Path

import pytest
import trio
import trio.testing

from ringo_trio import RetryBackoff, Task, TaskContext, TaskState
from ringo_trio.testing import RingoTestEnv
from tests._kit.storage import checkpointed

pytestmark = pytest.mark.trio

HOUR = timedelta(hours=1)


async def test_a_one_hour_retry_delay_times_three_attempts_runs_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: under trio's autojump clock, a task failing three times with a
    one-hour retry delay is attempted three times, one (virtual) hour apart in
    the daemon's own timestamps, and ends DEAD with the last error — the test
    waits for nothing real (no socket, no wall-clock delay)."""
    begin = trio.current_time()
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("emails")
        enqueued = await queue.enqueue(
            task_type="send",
            payload=b"x",
            max_attempts=3,
            retry_backoff=RetryBackoff(initial=HOUR, maximum=HOUR),
        )
        seen: list[tuple[int, float]] = []
        third = trio.Event()

        async def handler(task: Task, ctx: TaskContext) -> None:
            seen.append((task.attempt, trio.current_time()))
            if task.attempt == 3:
                third.set()
            raise RuntimeError(f"smtp down (attempt {task.attempt})")

        worker = queue.worker(handler)
        # Virtual time: a daemon whose clock did not follow trio's would never
        # make the retry due, and this fails instead of hanging.
        with trio.fail_after(6 * 3600):
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await third.wait()
                await worker.close()  # the third failure is settled first
        task = await queue.get_by_id(enqueued.task.id)
    assert task.state == TaskState.DEAD
    assert task.attempt == 3
    assert task.last_error is not None
    assert "smtp down (attempt 3)" in task.last_error
    assert [attempt for attempt, _ in seen] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(seen)]
    assert all(3600 <= gap < 3600 + 120 for gap in gaps), gaps
    assert trio.current_time() - begin >= 2 * 3600


async def test_the_client_reaches_the_in_process_daemon_through_the_given_transport(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: the environment's client is wired by the transport it was
    given (RingoClient(transport=...)): the daemon binds no port, the client
    names the in-memory endpoint, and a task it enqueues is the daemon's,
    stamped with the daemon's (virtual) time."""
    async with RingoTestEnv.start() as env:
        assert env.daemon.port is None
        assert env.client.endpoint == "in-memory:0"
        queue = env.client.queue("q")
        result = await queue.enqueue(task_type="t", payload=b"p")
        await env.sleep(hours=5)
        stored = await queue.get_by_id(result.task.id)
        assert stored.payload == b"p"
        assert stored.created_at is not None
        assert env.now() - stored.created_at >= timedelta(hours=5)


async def test_a_hand_driven_clock_moves_only_when_the_test_sleeps(
    mock_clock: trio.testing.MockClock,
) -> None:
    """Property: under trio's hand-driven MockClock (no autojump) a task
    delayed by an hour does not run until the test lets the hour pass with
    env.sleep; then it runs, at its due time in the daemon's clock."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("manual")
        result = await queue.enqueue(task_type="t", delay=HOUR)
        ran: list[float] = []

        async def handler(task: Task, ctx: TaskContext) -> None:
            ran.append(trio.current_time())

        worker = queue.worker(handler)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await env.sleep(minutes=59)
            assert ran == []
            assert (await queue.get_by_id(result.task.id)).state is TaskState.PENDING
            await env.sleep(minutes=2)
            assert len(ran) == 1
            task = await queue.get_by_id(result.task.id)
            assert task.state is TaskState.SUCCEEDED
            assert task.created_at is not None
            assert task.finished_at is not None
            assert HOUR <= task.finished_at - task.created_at < HOUR + timedelta(minutes=2)
            await worker.close()


async def test_storage_upkeep_runs_on_a_real_clock_only(tmp_path: Path) -> None:
    """Property: an in-process daemon on real time checkpoints its WAL in
    the upkeep thread while it serves, as `ringod` does."""
    real_dir = tmp_path / "real"
    with trio.fail_after(30):
        async with RingoTestEnv.start(time="real", data_dir=real_dir) as env:
            assert env.daemon.config.storage_upkeep
            await env.client.queue("q").enqueue(task_type="t", payload=bytes(16 * 1024))
            while not checkpointed(real_dir):  # noqa: ASYNC110 (SQLite's -shm is the witness)
                await trio.sleep(0.01)


async def test_no_storage_upkeep_on_the_loop_clock(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """Property: one on the event loop's clock (the default, for virtual
    time) runs no upkeep, since a wait for a real thread would let virtual
    time run ahead of it."""
    async with RingoTestEnv.start(data_dir=tmp_path) as env:
        assert not env.daemon.config.storage_upkeep
