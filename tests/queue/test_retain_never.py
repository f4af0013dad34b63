"""``ringod --retain-succeeded never``: a Work stream's ack deletes its task,
on both engines, through a daemon (in process, on the in-memory transport,
so the test can see its parked WaitTask calls)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from datetime import timedelta

import pytest
import trio

from ringo_trio import RingoClient, TaskRegistry, TaskState
from ringo_trio._transport.memory import serving_in_memory
from ringo_trio.server import flags
from ringo_trio.server.clock import LoopClock
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.retention import RetentionPolicy
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.processes import eventually
from tests.queue.test_purge import exists

GUARD = 60
tasks = TaskRegistry(queue="never")
_gates: list[trio.Event] = []
_ran: list[int] = []


@tasks.task
async def quick(n: int) -> int:
    _ran.append(n)
    return n


@tasks.task
async def held(n: int) -> int:
    await _gates[-1].wait()
    return 2 * n


@pytest.mark.trio
async def test_the_flag_reads_never_for_succeeded_tasks_only() -> None:
    """`--retain-succeeded never` is the zero retention that has acks delete
    (`RetentionPolicy.delete_at_ack`); DEAD and CANCELLED tasks cannot be
    kept no time, so `never` is refused for them before the daemon starts."""
    parser = flags.build_parser()
    args = parser.parse_args(["--retain-succeeded", "never"])
    assert args.retain_succeeded == timedelta(0)
    assert RetentionPolicy(succeeded=args.retain_succeeded).delete_at_ack
    for state in ("dead", "cancelled"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"--retain-{state}", "never"])


def _never_daemon(
    engine: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> Callable[[Callable[[], float]], Daemon]:
    """`serving_in_memory`'s factory of a ``--retain-succeeded never``
    daemon on `engine`, its store fresh."""
    storage: Storage
    if engine == "sqlite":
        storage = SQLiteEngine(tmp_path / "ringo.db")
    else:
        storage = PostgresEngine(request.getfixturevalue("postgres_dsn"))
    never = flags.build_parser().parse_args(["--retain-succeeded", "never"]).retain_succeeded

    def make(loop_time: Callable[[], float]) -> Daemon:
        config = DaemonConfig(port=0, retention=RetentionPolicy(succeeded=never))
        return Daemon(config, storage, clock=LoopClock(loop_time))

    return make


@pytest.mark.trio
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_acks_delete_their_tasks_and_a_waited_task_keeps_its_result(
    engine: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """Property (both engines, ``--retain-succeeded never``): every task a
    worker finishes is deleted by its ack (not found, its unique key free,
    no SUCCEEDED count left), while a task a WaitTask was parked on when it
    succeeded is kept SUCCEEDED, and the waiter gets its result."""
    make = _never_daemon(engine, tmp_path, request)
    gate = trio.Event()
    _gates.append(gate)
    _ran.clear()
    with trio.fail_after(GUARD):
        async with (
            serving_in_memory(make) as (daemon, transport, _run),
            RingoClient(transport=transport) as client,
        ):
            queue = client.queue("never")
            quick_ones = [
                await quick.configure(unique_key=f"k{i}").enqueue(client, i) for i in range(20)
            ]
            waited = await held.enqueue(client, 21)
            results: list[int] = []
            async with trio.open_nursery() as nursery:
                worker = tasks.worker(client, concurrency=8)
                await nursery.start(worker.run)

                async def wait() -> None:
                    results.append(await waited.result(timeout=GUARD))

                nursery.start_soon(wait)
                await eventually(lambda: daemon.waits.parked > 0, GUARD)
                gate.set()
                await eventually(lambda: len(_ran) == 20 and bool(results), GUARD)
                # Closing drains: every ack is settled once it returns.
                await worker.close()
            for handle in quick_ones:
                assert not await exists(queue, handle.task_id)
            assert results == [42]
            kept = await queue.get_by_id(waited.task_id)
            assert kept.state is TaskState.SUCCEEDED
            stats = await queue.stats()
            assert (stats.pending, stats.leased, stats.succeeded) == (0, 0, 1)
            again = await quick.configure(unique_key="k0").enqueue(client, 0)
            assert again.task_id != quick_ones[0].task_id


@pytest.mark.trio
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_wait_asked_again_after_its_task_succeeded_still_gets_the_result(
    engine: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    """Property (both engines, ``--retain-succeeded never``): no result is
    lost to a client that waits all along. It waits in calls of at most a
    minute and asks again when one ends; an ack landing between two calls,
    when no call is parked, keeps the task for the next one (the daemon's
    re-ask window), which gets the result instead of `NotFoundError`."""
    make = _never_daemon(engine, tmp_path, request)
    gate = trio.Event()
    _gates.append(gate)
    with trio.fail_after(GUARD):
        async with (
            serving_in_memory(make) as (daemon, transport, _run),
            RingoClient(transport=transport) as client,
        ):
            handle = await held.enqueue(client, 5)
            async with trio.open_nursery() as nursery:
                worker = tasks.worker(client, concurrency=2)
                await nursery.start(worker.run)
                with pytest.raises(TimeoutError):
                    await handle.result(timeout=0.2)
                assert daemon.waits.parked == 0
                gate.set()
                # Closing drains: the handler finishes and its ack is settled.
                await worker.close()
            assert await handle.result(timeout=GUARD) == 10
