"""WaitTask (minor 12): a parked call answers when its task becomes terminal.

Most tests run an in-process SQLite daemon on virtual time
(`tests/_kit/virtual_daemon.py`) with the batched recheck pushed out of reach
(``wait_recheck=1000``), so a call that answers with a terminal task before
its timeout was woken by the settlement's own hook. The PostgreSQL tests run
``ringod`` processes, two on one database for the cross-daemon wake-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import limits
from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CancelTaskRequest,
    ClaimRequest,
    CreditUpdate,
    LeasedTask,
    NackRequest,
    RejectRequest,
    Task,
    TaskState,
    WaitTaskRequest,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import Client, connect, expect_status, new_queue, open_work, ref
from tests._kit.postgres import postgres_daemons
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, quiet, virtual_daemon

WAIT_MINOR = FEATURES[Feature.WAIT_TASK]
LONG = timedelta(seconds=50)
GUARD = 30
# Rechecks out of reach: only a settlement's own wake-up answers in time.
NO_RECHECK = {"wait_recheck": 1000.0}


async def _wait(client: Client, queue: str, task_id: str, park: timedelta = LONG) -> Task:
    response = await client.stub.wait_task(
        WaitTaskRequest(context=client.context, queue=queue, task_id=task_id, timeout=park)
    )
    assert response.task is not None
    return response.task


def _in_background(
    client: Client, queue: str, task_id: str, results: list[tuple[float, Task]]
) -> asyncio.Task[None]:
    async def wait() -> None:
        task = await _wait(client, queue, task_id)
        results.append((now(), task))

    return asyncio.create_task(wait())


async def _leased(client: Client, queue: str, **spec: object) -> tuple[Task, LeasedTask]:
    task = await client.enqueue(queue, **spec)
    [leased] = await client.claim(queue, lease_duration=timedelta(seconds=5))
    return task, leased


@pytest.mark.parametrize("how", ["ack", "reject", "last_nack", "cancel", "expiry"])
@on_virtual_time
async def test_a_parked_wait_answers_when_its_task_ends(how: str) -> None:
    """Property: a parked WaitTask answers at the very instant its task becomes
    terminal, whichever way: ack (SUCCEEDED), reject and a last nack (DEAD),
    CancelTask (CANCELLED), a lease expiring into DEAD (the reaper's
    recheck) — with the periodic recheck out of reach, so each path's own
    wake-up is what answers."""
    queue = new_queue()
    results: list[tuple[float, Task]] = []
    async with (
        virtual_daemon(**NO_RECHECK) as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as worker,
    ):
        task, leased = await _leased(worker, queue, max_attempts=1)
        lease_end = now() + 5
        waiting = _in_background(waiter, queue, task.id, results)
        await quiet()
        assert served.daemon.waits.parked == 1
        settled_at = now()
        match how:
            case "ack":
                await worker.stub.ack(AckRequest(context=worker.context, lease=ref(leased)))
            case "reject":
                await worker.stub.reject(
                    RejectRequest(context=worker.context, lease=ref(leased), error="no")
                )
            case "last_nack":
                await worker.stub.nack(
                    NackRequest(context=worker.context, lease=ref(leased), error="no")
                )
            case "cancel":
                await worker.stub.cancel_task(
                    CancelTaskRequest(context=worker.context, queue=queue, task_id=task.id)
                )
            case "expiry":
                settled_at = lease_end
        await waiting
        expected = {
            "ack": TaskState.SUCCEEDED,
            "reject": TaskState.DEAD,
            "last_nack": TaskState.DEAD,
            "cancel": TaskState.CANCELLED,
            "expiry": TaskState.DEAD,
        }
        [(answered_at, answered)] = results
        assert answered.state == expected[how]
        assert answered_at - settled_at < PROMPT + 0.1  # the reaper coalesces by 50 ms
        assert served.daemon.waits.parked == 0


@on_virtual_time
async def test_a_work_stream_ack_wakes_a_parked_wait() -> None:
    """Property: an ack through the Work stream (the group commit) wakes a
    parked WaitTask at the ack's instant."""
    queue = new_queue()
    results: list[tuple[float, Task]] = []
    async with (
        virtual_daemon(**NO_RECHECK) as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as worker,
        open_work(worker) as work,
    ):
        task = await worker.enqueue(queue)
        waiting = _in_background(waiter, queue, task.id, results)
        await work.register(queue)
        await work.call(credit=CreditUpdate(available=1))
        [leased] = await work.wait_tasks(1)
        await quiet()
        assert results == []
        acked_at = now()
        await work.call(ack=AckRequest(lease=ref(leased)))
        await waiting
        [(answered_at, answered)] = results
        assert answered.state == TaskState.SUCCEEDED
        assert answered_at - acked_at < PROMPT


@on_virtual_time
async def test_a_terminal_task_is_answered_at_once_and_a_timeout_answers_the_snapshot() -> None:
    """Property: WaitTask on a task already terminal answers at once; on one
    that stays PENDING it answers at its timeout (clamped to MAX_TASK_WAIT)
    with the task as it stands, untouched; a nack that leaves the task
    PENDING does not end the wait."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        done, leased = await _leased(client, queue)
        await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
        started = now()
        assert (await _wait(client, queue, done.id)).state == TaskState.SUCCEEDED
        assert now() - started < PROMPT
        pending = await client.enqueue(queue)
        started = now()
        snapshot = await _wait(client, queue, pending.id, park=timedelta(seconds=3))
        assert snapshot.state == TaskState.PENDING
        assert 3 <= now() - started < 3 + PROMPT
        assert snapshot == await client.get(queue, pending.id)
        started = now()
        snapshot = await _wait(client, queue, pending.id, park=timedelta(hours=1))
        assert snapshot.state == TaskState.PENDING
        clamp = limits.MAX_TASK_WAIT.total_seconds()
        assert clamp <= now() - started < clamp + PROMPT
        assert served.daemon.waits.parked == 0


@on_virtual_time
async def test_unknown_tasks_old_minors_and_bad_fields_are_refused() -> None:
    """Property: an unknown task is NOT_FOUND, a session below minor 12 is
    UNIMPLEMENTED, a negative timeout INVALID_ARGUMENT; none parks."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        connect(served.daemon, minor=WAIT_MINOR - 1) as old,
    ):
        await expect_status(_wait(client, queue, "no-such-task"), Status.NOT_FOUND)
        task = await client.enqueue(queue)
        await expect_status(_wait(old, queue, task.id), Status.UNIMPLEMENTED, "minor 12")
        await expect_status(
            _wait(client, queue, task.id, park=timedelta(seconds=-1)),
            Status.INVALID_ARGUMENT,
            "timeout",
        )
        assert served.daemon.waits.parked == 0


@on_virtual_time
async def test_the_daemon_limit_answers_resource_exhausted_and_frees_its_slots() -> None:
    """Property: past --max-waits a WaitTask is RESOURCE_EXHAUSTED; the slots
    come back after calls time out and after a client disconnects mid-wait
    (nothing leaks), so a later call parks again."""
    queue = new_queue()
    async with virtual_daemon(max_waits=2) as served, connect(served.daemon) as client:
        task = await client.enqueue(queue)
        async with connect(served.daemon) as leaving:
            parked = [asyncio.create_task(_wait(leaving, queue, task.id)) for _ in range(2)]
            await quiet()
            assert served.daemon.waits.parked == 2
            await expect_status(_wait(client, queue, task.id), Status.RESOURCE_EXHAUSTED)
            for call in parked:
                call.cancel()
            await asyncio.gather(*parked, return_exceptions=True)
        await quiet()
        assert served.daemon.waits.parked == 0
        assert served.daemon.waits.connections() == 0
        short = timedelta(seconds=1)
        await asyncio.gather(*(_wait(client, queue, task.id, short) for _ in range(2)))
        assert served.daemon.waits.parked == 0
        assert served.daemon.waits.waited_ids() == 0
        assert (await _wait(client, queue, task.id, short)).state == TaskState.PENDING


@on_virtual_time
async def test_the_connection_limit_answers_resource_exhausted_and_frees_its_slots() -> None:
    """Property: one connection parks at most MAX_WAITS_PER_CONNECTION calls;
    one more on it is RESOURCE_EXHAUSTED while another connection still
    parks, and once they are answered the connection parks again."""
    queue = new_queue()
    per_connection = limits.MAX_WAITS_PER_CONNECTION
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as busy,
        connect(served.daemon) as other,
    ):
        task, leased = await _leased(other, queue)
        parked = [asyncio.create_task(_wait(busy, queue, task.id)) for _ in range(per_connection)]
        await quiet()
        assert served.daemon.waits.parked == per_connection
        await expect_status(_wait(busy, queue, task.id), Status.RESOURCE_EXHAUSTED, "connection")
        elsewhere = asyncio.create_task(_wait(other, queue, task.id))
        await quiet()
        assert served.daemon.waits.parked == per_connection + 1
        await other.stub.ack(AckRequest(context=other.context, lease=ref(leased)))
        answers = await asyncio.gather(*parked, elsewhere)
        assert {t.state for t in answers} == {TaskState.SUCCEEDED}
        assert served.daemon.waits.parked == 0
        assert served.daemon.waits.connections() == 0
        assert (await _wait(busy, queue, task.id)).state == TaskState.SUCCEEDED


@on_virtual_time
async def test_shutdown_answers_parked_waits_with_the_snapshot() -> None:
    """Property: a daemon shutting down answers its parked WaitTask calls at
    once with the task as it stands (the client asks again elsewhere)."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        task = await client.enqueue(queue)
        waiting = asyncio.create_task(_wait(client, queue, task.id))
        await quiet()
        stopped_at = now()
        served.stop.set()
        answered = await waiting
        assert answered.state == TaskState.PENDING
        assert now() - stopped_at < PROMPT


# -- PostgreSQL: ringod processes -------------------------------------------


@pytest.fixture
def pg_pair(postgres_dsn: str) -> Iterator[list[DaemonProcess]]:
    """Two daemons on one database whose rechecks are out of reach: only a
    notification can wake one for the other's settlement."""
    with postgres_daemons(postgres_dsn, 2, ["--wait-recheck", "1000"]) as pair:
        yield pair


@pytest.mark.anyio
async def test_postgres_a_settlement_on_another_daemon_wakes_the_waiter(
    pg_pair: list[DaemonProcess],
) -> None:
    """Property (PostgreSQL): a task settled through daemon B wakes a WaitTask
    parked on daemon A sharing the database (LISTEN/NOTIFY on the waited id);
    with A's recheck out of reach the call would otherwise run to its 50 s
    timeout, past the guard. Then a cancel through B wakes another, and a
    deletion through B answers NOT_FOUND."""
    a, b = pg_pair
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(a) as on_a, connect(b) as on_b:
            task = await on_b.enqueue(queue)
            [leased] = await on_b.claim(queue)
            async with anyio.create_task_group() as tg:
                answers: list[Task] = []

                async def wait() -> None:
                    answers.append(await _wait(on_a, queue, task.id))

                tg.start_soon(wait)
                await anyio.sleep(0.5)  # parked (if not yet, it answers SUCCEEDED at once)
                await on_b.stub.ack(AckRequest(context=on_b.context, lease=ref(leased)))
            assert [t.state for t in answers] == [TaskState.SUCCEEDED]
            other = await on_b.enqueue(queue)
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_into, on_a, queue, other.id, answers)
                await anyio.sleep(0.5)
                await on_b.stub.cancel_task(
                    CancelTaskRequest(context=on_b.context, queue=queue, task_id=other.id)
                )
            assert answers[-1].state == TaskState.CANCELLED
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_into, on_a, queue, other.id, answers)
                await anyio.sleep(0.5)
                # Already CANCELLED: answered at once. The registration then
                # is withdrawn, nothing is left in the table.
            assert answers[-1].state == TaskState.CANCELLED


async def wait_into(client: Client, queue: str, task_id: str, answers: list[Task]) -> None:
    answers.append(await _wait(client, queue, task_id))


@pytest.fixture
def pg_daemon(postgres_dsn: str) -> Iterator[DaemonProcess]:
    with spawn_daemon(None, postgres_dsn=postgres_dsn, extra_args=["--max-waits", "2"]) as d:
        yield d


@pytest.mark.anyio
async def test_postgres_waits_answer_and_free_their_slots(pg_daemon: DaemonProcess) -> None:
    """Property (PostgreSQL): an already terminal task is answered at once, an
    unknown one NOT_FOUND, a third parked call RESOURCE_EXHAUSTED, and the
    slots come back once the parked calls are answered by the ack."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(pg_daemon) as client:
            task = await client.enqueue(queue)
            [leased] = await client.claim(queue)
            await expect_status(_wait(client, queue, "nope"), Status.NOT_FOUND)
            answers: list[Task] = []
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(wait_into, client, queue, task.id, answers)
                await anyio.sleep(0.5)
                await expect_status(_wait(client, queue, task.id), Status.RESOURCE_EXHAUSTED)
                await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
            assert [t.state for t in answers] == [TaskState.SUCCEEDED] * 2
            # Terminal: answered at once (the 50 s timeout is past the guard),
            # and the two slots are free again.
            for _ in range(2):
                assert (await _wait(client, queue, task.id)).state == TaskState.SUCCEEDED


@pytest.mark.anyio
async def test_a_wait_answers_the_snapshot_before_the_clients_deadline(
    daemon: DaemonProcess,
) -> None:
    """Property: a WaitTask whose client deadline (1 s) comes before its
    timeout (50 s) answers with the task as it stands shortly before that
    deadline, instead of running into it: the caller gets the task, not
    DEADLINE_EXCEEDED. So does a long-poll Claim that finds nothing (an
    empty answer). Real time: the deadline is the client's clock."""
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(daemon) as client:
            task = await client.enqueue(queue, delay=timedelta(hours=1))
            request = WaitTaskRequest(
                context=client.context, queue=queue, task_id=task.id, timeout=LONG
            )
            started = anyio.current_time()
            response = await client.stub.wait_task(request, timeout=1.0)
            assert response.task is not None
            assert response.task.state == TaskState.PENDING
            assert anyio.current_time() - started < 1.0
            claim = ClaimRequest(
                context=client.context, queue=queue, limit=1, worker_id="w1", wait_timeout=LONG
            )
            started = anyio.current_time()
            assert (await client.stub.claim(claim, timeout=1.0)).tasks == []
            assert anyio.current_time() - started < 1.0


@on_virtual_time
async def test_a_wait_woken_near_its_timeout_by_a_retry_waits_out_its_timeout() -> None:
    """Property: a nack that leaves the task PENDING half a second before the
    wait's timeout does not end the wait early: it answers at its timeout
    (3 s), with the task as it then stands, not at the nack."""
    queue = new_queue()
    async with (
        virtual_daemon(**NO_RECHECK) as served,
        connect(served.daemon) as waiter,
        connect(served.daemon) as worker,
    ):
        task, leased = await _leased(worker, queue, max_attempts=3)
        started = now()
        waiting = asyncio.create_task(_wait(waiter, queue, task.id, park=timedelta(seconds=3)))
        await asyncio.sleep(2.5)
        await worker.stub.nack(NackRequest(context=worker.context, lease=ref(leased), error="no"))
        answered = await waiting
        assert answered.state == TaskState.PENDING
        assert 3 <= now() - started < 3 + PROMPT
