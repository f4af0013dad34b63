"""SetQueuePaused (minor 13): a paused queue takes enqueues but is neither
pushed nor claimed; leases out run on; a resume pushes at once.

The SQLite tests run an in-process daemon on virtual time
(`tests/_kit/virtual_daemon.py`), where a dispatcher not woken by the
resume would sleep forever (nothing else is due) and the test's virtual
limit fails it. The PostgreSQL test runs two ``ringod`` processes on one
database: a pause and a resume through A reach B's worker through
LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract.versions import FEATURES, Feature
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    ExtendLeaseRequest,
    GetQueueStatsRequest,
    ListQueuesRequest,
    ReportProgressRequest,
    SetQueuePausedRequest,
    SetQueuePausedResponse,
    TaskState,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import Client, WorkStream, connect, expect_status, new_queue, open_work
from tests._kit.grpc_client import ref as lease_ref
from tests._kit.postgres import postgres_daemons
from tests._kit.virtual_daemon import PROMPT, now, on_virtual_time, quiet, virtual_daemon

PAUSE_MINOR = FEATURES[Feature.PAUSE_QUEUES]
GUARD = 30
# Long enough for anything a broken pause would push (an enqueue's wake-up
# arrives at its own instant on virtual time).
LONG = 120.0


async def _set(client: Client, queue: str, paused: bool) -> SetQueuePausedResponse:
    return await client.stub.set_queue_paused(
        SetQueuePausedRequest(context=client.context, queue=queue, paused=paused)
    )


async def _no_task_for(work: WorkStream, seconds: float) -> None:
    """Read the stream for `seconds`: no task may arrive."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(seconds):
            await work.wait_tasks(len(work.tasks) + 1)


@on_virtual_time
async def test_a_paused_queue_pushes_and_claims_nothing_until_resumed() -> None:
    """Property: on a paused queue an enqueue creates its task, a registered
    worker with credit is pushed nothing (for two minutes), a long-poll Claim
    answers empty at its timeout; a resume pushes the task to the parked
    worker at the resume's instant. Pausing twice or resuming twice answers
    changed=False."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        open_work(client) as work,
    ):
        await work.register(queue)
        await work.call(credit=CreditUpdate(available=4))
        first = await _set(client, queue, True)
        assert (first.paused, first.changed) == (True, True)
        assert (await _set(client, queue, True)).changed is False
        task = await client.enqueue(queue)
        assert task.state == TaskState.PENDING
        await _no_task_for(work, LONG)
        assert await client.claim(queue, wait_timeout=timedelta(seconds=60)) == []
        resumed_at = now()
        again = await _set(client, queue, False)
        assert (again.paused, again.changed) == (False, True)
        [leased] = await work.wait_tasks(1)
        assert now() - resumed_at < PROMPT
        assert leased.task is not None
        assert leased.task.id == task.id
        assert (await _set(client, queue, False)).changed is False


@on_virtual_time
async def test_a_parked_long_poll_claim_gets_the_task_at_the_resume() -> None:
    """Property: a Claim long-polling a paused queue that holds a task gets
    it at the resume's instant, not at its timeout."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        await _set(client, queue, True)
        task = await client.enqueue(queue)
        claim = asyncio.create_task(client.claim(queue, wait_timeout=timedelta(seconds=50)))
        await quiet(30)
        assert not claim.done()
        resumed_at = now()
        await _set(client, queue, False)
        [leased] = await claim
        assert now() - resumed_at < PROMPT
        assert leased.task is not None
        assert leased.task.id == task.id


@on_virtual_time
async def test_leases_out_when_paused_still_renew_report_and_ack() -> None:
    """Property: pausing takes nothing back: a task pushed before the pause
    still renews its lease, reports progress and acks (SUCCEEDED) on the
    Work stream, while a second task enqueued meanwhile stays PENDING."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        open_work(client) as work,
    ):
        running = await client.enqueue(queue)
        await work.register(queue)
        await work.call(credit=CreditUpdate(available=2))
        [leased] = await work.wait_tasks(1)
        await _set(client, queue, True)
        waiting = await client.enqueue(queue)
        extended = await work.call(
            extend_lease=ExtendLeaseRequest(
                lease=lease_ref(leased), extension=timedelta(seconds=60)
            )
        )
        assert extended.error is None
        assert extended.lease is not None
        progress = await work.call(
            progress=ReportProgressRequest(lease=lease_ref(leased), current=1, total=2)
        )
        assert progress.error is None
        await _no_task_for(work, 30)
        acked = await work.call(ack=AckRequest(lease=lease_ref(leased)))
        assert acked.error is None
        assert (await client.get(queue, running.id)).state == TaskState.SUCCEEDED
        assert (await client.get(queue, waiting.id)).state == TaskState.PENDING


@on_virtual_time
async def test_stats_and_the_queue_list_show_paused_and_old_minors_are_refused() -> None:
    """Property: GetQueueStats and ListQueues answer paused (a queue paused
    ahead of time, without tasks, is listed); SetQueuePaused on a session
    below minor 13 is UNIMPLEMENTED and changes nothing; an empty queue
    name is INVALID_ARGUMENT naming the field."""
    queue = new_queue()
    async with (
        virtual_daemon() as served,
        connect(served.daemon) as client,
        connect(served.daemon, minor=PAUSE_MINOR - 1) as old,
    ):
        await expect_status(_set(old, queue, True), Status.UNIMPLEMENTED, "minor 13")
        await expect_status(_set(client, "", True), Status.INVALID_ARGUMENT, "queue")
        stats = await client.stub.get_queue_stats(
            GetQueueStatsRequest(context=client.context, queue=queue)
        )
        assert stats.stats is not None
        assert stats.stats.paused is False
        await _set(client, queue, True)
        stats = await client.stub.get_queue_stats(
            GetQueueStatsRequest(context=client.context, queue=queue)
        )
        assert stats.stats is not None
        assert stats.stats.paused is True
        listed = await client.stub.list_queues(ListQueuesRequest(context=client.context))
        assert [(q.queue, q.paused) for q in listed.queues] == [(queue, True)]


@on_virtual_time
async def test_a_restarted_daemon_keeps_the_queue_paused(tmp_path: Path) -> None:
    """Property: the flag is stored: a daemon restarted on the same data
    reads it before serving and pushes nothing of the paused queue."""
    queue = new_queue()
    data = tmp_path
    async with virtual_daemon(data) as served, connect(served.daemon) as client:
        await _set(client, queue, True)
        await client.enqueue(queue)
    async with (
        virtual_daemon(data) as served,
        connect(served.daemon) as client,
        open_work(client) as work,
    ):
        assert queue in served.daemon.paused.names
        await work.register(queue)
        await work.call(credit=CreditUpdate(available=1))
        await _no_task_for(work, LONG)
        await _set(client, queue, False)
        assert len(await work.wait_tasks(1)) == 1


# -- PostgreSQL: two ringod processes on one database -------------------------


@pytest.fixture
def pg_pair(postgres_dsn: str) -> Iterator[list[DaemonProcess]]:
    with postgres_daemons(postgres_dsn, 2) as pair:
        yield pair


@pytest.mark.anyio
async def test_postgres_a_pause_through_one_daemon_stops_the_other(
    pg_pair: list[DaemonProcess],
) -> None:
    """Property (PostgreSQL): a pause through daemon A stops daemon B: a task
    enqueued through A after the pause is neither pushed to B's registered
    worker nor claimed through B (the pause's notification reaches B before
    the enqueue's: commit order); a resume through A makes B push it (the
    re-read backstop is 5 s, the guard allows no more than notifications)."""
    a, b = pg_pair
    queue = new_queue()
    with anyio.fail_after(GUARD):
        async with connect(a) as on_a, connect(b) as on_b, open_work(on_b) as work:
            await work.register(queue)
            await work.call(credit=CreditUpdate(available=2))
            await _set(on_a, queue, True)
            task = await on_a.enqueue(queue)
            await _no_task_for(work, 1.0)
            assert await on_b.claim(queue, wait_timeout=timedelta(seconds=0.5)) == []
            await _set(on_a, queue, False)
            with anyio.fail_after(3):  # within the notification, before a re-read
                [leased] = await work.wait_tasks(1)
            assert leased.task is not None
            assert leased.task.id == task.id
