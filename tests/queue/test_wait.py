"""`TaskQueue.wait`: a task's outcome without polling, on both engines, through
a daemon restart."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from ringo_trio import (
    IncompatibleVersionError,
    NotFoundError,
    Ringo,
    Task,
    TaskState,
    UnavailableError,
)
from ringo_trio._contract import limits, versions
from ringo_trio.testing import DaemonProcess, RingoTestEnv, spawn_daemon
from tests._kit.processes import free_port
from tests._kit.sdk_fixtures import count_calls, route_calls

pytestmark = pytest.mark.trio

GUARD = 40


@pytest.fixture(params=["sqlite", "postgres"])
def engine_daemon(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[DaemonProcess]:
    """A ringod on a fixed port (a restart comes back where the client looks),
    on SQLite or on a PostgreSQL database of its own."""
    listen = ["--listen", f"127.0.0.1:{free_port()}"]
    if request.param == "sqlite":
        with spawn_daemon(tmp_path / "data", extra_args=listen) as d:
            yield d
        return
    dsn = request.getfixturevalue("postgres_dsn")
    with spawn_daemon(None, postgres_dsn=dsn, extra_args=listen) as d:
        yield d


async def test_wait_returns_the_task_once_it_succeeds(engine_daemon: DaemonProcess) -> None:
    """Property (both engines): wait returns the task once a worker acks it,
    with its result; waiting on it again answers at once; an unknown id is
    NotFoundError."""
    with trio.fail_after(GUARD):
        async with Ringo.connect(engine_daemon.endpoint) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            got: list[Task] = []
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    got.append(await queue.wait(task.id, timeout=GUARD))

                nursery.start_soon(wait)
                [leased] = await queue.claim()
                await leased.ack(result=b"done")
            [done] = got
            assert done.state is TaskState.SUCCEEDED
            assert done.result == b"done"
            assert (await queue.wait(task.id)).state is TaskState.SUCCEEDED
            with pytest.raises(NotFoundError):
                await queue.wait("0" * 32, timeout=GUARD)


async def test_a_timeout_raises_and_leaves_the_task_alone(engine_daemon: DaemonProcess) -> None:
    """Property (both engines): a wait whose timeout elapses raises the builtin
    TimeoutError and the task is exactly as it was (still PENDING, never
    claimed); timeout=0 is one look."""
    with trio.fail_after(GUARD):
        async with Ringo.connect(engine_daemon.endpoint) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            with pytest.raises(TimeoutError):
                await queue.wait(task.id, timeout=0.5)
            with pytest.raises(TimeoutError):
                await queue.wait(task.id, timeout=0)
            assert await queue.get_by_id(task.id) == task


async def test_wait_needs_minor_12(
    engine_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: an SDK session below minor 12 refuses wait before sending
    anything (IncompatibleVersionError naming `TaskQueue.wait`: the daemon's
    own refusal would name the RPC, WaitTask)."""
    monkeypatch.setattr(versions, "MINOR", versions.FEATURES[versions.Feature.WAIT_TASK] - 1)
    with trio.fail_after(GUARD):
        async with Ringo.connect(engine_daemon.endpoint) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            with pytest.raises(IncompatibleVersionError, match=r"TaskQueue\.wait needs .*minor 12"):
                await queue.wait(task.id, timeout=GUARD)


async def test_wait_rides_out_a_daemon_restart(engine_daemon: DaemonProcess) -> None:
    """Property (both engines): a daemon restarting while wait is parked does
    not surface: the wait asks again once the daemon is back and returns the
    task when it is acked afterwards."""
    with trio.fail_after(GUARD):
        async with Ringo.connect(engine_daemon.endpoint) as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            got: list[Task] = []
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    got.append(await queue.wait(task.id, timeout=GUARD))

                nursery.start_soon(wait)
                await trio.sleep(0.3)
                await trio.to_thread.run_sync(engine_daemon.kill)
                # Down longer than one call's own recovery (0.2 + 0.6 + 1.5 s).
                await trio.sleep(3.0)
                await trio.to_thread.run_sync(engine_daemon.start)
                [leased] = await queue.claim()
                await leased.ack()
            assert [t.state for t in got] == [TaskState.SUCCEEDED]


# -- on virtual time (the daemon in process, trio's autojump clock) ----------------


async def test_a_wait_outlasts_the_daemons_parks(autojump_clock: trio.testing.MockClock) -> None:
    """Property: a wait asks again each time the daemon's park (at most a
    minute) ends with the task still running, without a timeout and with
    one longer than a park: both return the task that succeeds 150 virtual
    seconds in, neither an error at the end of the first park."""
    with trio.fail_after(3600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("q")
            ids = [(await queue.enqueue(task_type="t")).task.id for _ in range(2)]
            got: dict[str, Task] = {}

            async def wait(task_id: str, limit: float | None) -> None:
                got[task_id] = await queue.wait(task_id, timeout=limit)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait, ids[0], None)
                nursery.start_soon(wait, ids[1], 300)
                await trio.sleep(150)
                for leased in await queue.claim(2):
                    await leased.ack()
            assert {task_id: task.state for task_id, task in got.items()} == {
                ids[0]: TaskState.SUCCEEDED,
                ids[1]: TaskState.SUCCEEDED,
            }


async def test_waits_past_the_parked_ones_wait_their_turn_in_the_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a client parks at most MAX_WAITS_PER_CONNECTION waits at the
    daemon; one more waits in the client for a slot. With a timeout it
    raises TimeoutError at its own deadline, naming the slots; without one
    it parks as soon as a parked wait ends, and returns its task."""
    with trio.fail_after(3600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("q")
            parked = [
                (await queue.enqueue(task_type="t")).task.id
                for _ in range(limits.MAX_WAITS_PER_CONNECTION)
            ]
            extra = (await queue.enqueue(task_type="extra")).task.id
            got: list[str] = []

            async def wait(task_id: str) -> None:
                got.append((await queue.wait(task_id)).id)

            async with trio.open_nursery() as nursery:
                for task_id in parked:
                    nursery.start_soon(wait, task_id)
                await trio.sleep(1)
                start = trio.current_time()
                with pytest.raises(TimeoutError, match="parked waits"):
                    await queue.wait(extra, timeout=10)
                assert trio.current_time() - start == pytest.approx(10)
                nursery.start_soon(wait, extra)
                await trio.sleep(1)
                [first] = await queue.claim(task_types=["t"])
                await first.ack()
                await trio.sleep(1)
                [late] = await queue.claim(task_types=["extra"])
                await late.ack()
                await trio.sleep(1)
                assert got == [first.task.id, extra]
                nursery.cancel_scope.cancel()


async def test_a_wait_at_its_deadline_asks_no_more(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a wait whose deadline has come when an answer arrives raises
    TimeoutError there and then: timeout=0 is exactly one look, and a 5 s
    timeout on a task that stays PENDING ends 5 virtual seconds later after
    one ask (the daemon parked it 5 s), not in asks at the deadline."""
    with trio.fail_after(3600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            sent = count_calls(env.client, monkeypatch, most=2)
            with pytest.raises(TimeoutError):
                await queue.wait(task.id, timeout=0)
            assert sent == ["WaitTask"]
            start = trio.current_time()
            with pytest.raises(TimeoutError):
                await queue.wait(task.id, timeout=5)
            assert trio.current_time() - start == pytest.approx(5)
            assert sent == ["WaitTask", "WaitTask"]


async def test_a_wait_on_a_daemon_away_backs_off_until_its_deadline(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: while the daemon cannot be reached, a wait asks again after
    0.2 s, the pause doubling to at most 2 s, and raises UnavailableError
    at its own deadline: not later, and not in a loop of asks. Each ask is
    sent twice at once (WaitTask only reads, so the connection replays it
    once after a drop)."""
    with trio.fail_after(3600):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("q")
            task = (await queue.enqueue(task_type="t")).task
            asked: list[float] = []

            async def away(send: Any, method: str, *args: Any, **kwargs: Any) -> Any:
                asked.append(trio.current_time())
                if len(asked) > 20:
                    raise AssertionError(f"asked in a loop: {asked}")
                raise UnavailableError("the daemon is away")

            route_calls(env.client, monkeypatch, away)
            start = trio.current_time()
            with pytest.raises(UnavailableError):
                await queue.wait(task.id, timeout=6)
            assert trio.current_time() - start == pytest.approx(6)
            # The last pause is cut short by the deadline (1 s of 2).
            rounds = [0.0, 0.2, 0.6, 1.4, 3.0, 5.0, 6.0]
            assert [round(at - start, 6) for at in asked] == [r for r in rounds for _ in (1, 2)]
