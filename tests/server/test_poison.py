"""A daemon whose storage holds a poisoned row, or has no room to write.

In-process on virtual time (`tests/_kit/virtual_daemon.py`), because the test reaches into the
engine's own SQLite connection, and the long-poll and the room probe then
cost no real time: to plant a row no request can write any more
(a time past year 9999, as a backoff of millions of days left before the
limits existed), and to make the database full on cue
(``PRAGMA max_page_count``, which fails writes with SQLITE_FULL exactly as a
full disk does).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    EnqueueManyRequest,
    RetryTaskRequest,
    TaskSpec,
    TaskState,
)
from ringo_trio.server.daemon import _ROOM_PROBE_INTERVAL
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.grpc_client import Client, connect, expect_status, new_queue, open_work
from tests._kit.virtual_daemon import PROMPT, Served, now, on_virtual_time, virtual_daemon

pytestmark = pytest.mark.anyio

INT64_MAX = 2**63 - 1
SERVING = HealthCheckResponseServingStatus.SERVING
NOT_SERVING = HealthCheckResponseServingStatus.NOT_SERVING


def _engine(served: Served) -> SQLiteEngine:
    assert isinstance(served.daemon.storage, SQLiteEngine)
    return served.daemon.storage


async def health(client: Client) -> HealthCheckResponseServingStatus:
    return (await client.health.check(HealthCheckRequest())).status


@on_virtual_time
async def test_a_task_poisoned_past_year_9999_takes_down_no_call() -> None:
    """Property: one PENDING task whose stored available_at is past year 9999
    does not break its queue: GetTask answers it (at the latest representable
    moment), a long-poll Claim on the queue answers empty at its wait_timeout
    rather than INTERNAL, an idle Work stream on it stays up and pushes the
    next task enqueued, and RetryTask repairs the task so it is claimed
    again."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        engine = _engine(served)
        poisoned = await client.enqueue(queue)
        engine._conn().execute(
            "UPDATE tasks SET available_at = ? WHERE id = ?", (INT64_MAX, poisoned.id)
        )
        task = await client.get(queue, poisoned.id)
        assert task.state == TaskState.PENDING
        assert task.available_at == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
        started = now()
        assert await client.claim(queue, wait_timeout=timedelta(milliseconds=200)) == []
        assert 0.2 <= now() - started < 0.2 + PROMPT

        async with open_work(client) as work:
            await work.register(queue, max_concurrency=4)
            await work.call(credit=CreditUpdate(available=4))
            fresh = await client.enqueue(queue)
            [pushed] = await work.wait_tasks(1)
            assert pushed.task is not None
            assert pushed.task.id == fresh.id

        retried = await client.stub.retry_task(
            RetryTaskRequest(context=client.context, queue=queue, task_id=poisoned.id)
        )
        assert retried.task is not None
        assert retried.task.state == TaskState.PENDING
        [leased] = await client.claim(queue)
        assert leased.task is not None
        assert leased.task.id == poisoned.id


@on_virtual_time
async def test_a_full_disk_is_resource_exhausted_and_not_serving_until_writes_work() -> None:
    """Property: while storage has no room to write, enqueue and claim answer
    RESOURCE_EXHAUSTED (nothing was written: the queue is exactly as before)
    and health says NOT_SERVING; reads keep working; once there is room
    again health returns to SERVING by itself, by the room probe's next
    round (within its interval, virtual time), and writes succeed."""
    queue = new_queue()
    async with virtual_daemon() as served, connect(served.daemon) as client:
        engine = _engine(served)
        batch = [TaskSpec(task_type="t") for _ in range(1000)]
        enqueued = await client.stub.enqueue_many(
            EnqueueManyRequest(context=client.context, queue=queue, tasks=batch)
        )
        first = enqueued.results[0].task
        assert first is not None
        kept = await client.enqueue(queue, task_type="kept")
        assert await health(client) == SERVING
        db = engine._conn()
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")

        await expect_status(
            client.enqueue(queue, task_type="big", payload=b"x" * 100_000),
            Status.RESOURCE_EXHAUSTED,
            "storage full, nothing was written",
        )
        assert await health(client) == NOT_SERVING
        await expect_status(client.claim(queue, limit=1000), Status.RESOURCE_EXHAUSTED)
        assert await client.get(queue, kept.id) == kept
        assert await client.get(queue, first.id) == first  # not leased
        assert await client.activity(queue, "big") == 0

        db.execute("PRAGMA max_page_count = 1073741823")
        freed = now()
        async for answer in client.health.watch(HealthCheckRequest()):
            if answer.status == SERVING:
                break
        assert now() - freed < _ROOM_PROBE_INTERVAL + PROMPT
        await client.enqueue(queue, task_type="big", payload=b"x" * 100_000)
        assert len(await client.claim(queue, limit=1000)) == 1000
