"""Poison: requests that would store a time no engine can read back, against
a real ringod on each engine; and a database that runs out of space.

Before the limits, a legal backoff or nack delay of 3,000,000 days pushed the
next retry past year 9999: from then on every GetTask of the task, every
long-poll Claim and idle Work stream on its queue answered INTERNAL, and on
PostgreSQL the nack itself answered INTERNAL *after* it had committed. Now
each is refused INVALID_ARGUMENT, naming the field and the limit, before
anything is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import anyio
import asyncpg  # type: ignore[import-untyped]
import pytest
from grpclib.const import Status

from ringo_trio._proto.grpc.health.v1 import (
    HealthCheckRequest,
    HealthCheckResponseServingStatus,
)
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    EnqueueRequest,
    NackRequest,
    RetryBackoff,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import connect, expect_status, new_queue, ref

pytestmark = pytest.mark.anyio

FAR = timedelta(days=3_000_000)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgres"])
def ringod(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        with spawn_daemon(None, postgres_dsn=dsn) as daemon:
            yield daemon
    else:
        with spawn_daemon(tmp_path_factory.mktemp("poison") / "data") as daemon:
            yield daemon


async def test_a_far_future_backoff_is_refused_before_it_is_stored(ringod: DaemonProcess) -> None:
    """Defect: a backoff of 3,000,000 days was accepted and poisoned the task
    and its queue at the first nack. Refused INVALID_ARGUMENT naming the
    field and the 365-day limit; nothing is enqueued."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(ringod) as client:
            for backoff in (RetryBackoff(initial=FAR), RetryBackoff(maximum=FAR)):
                request = EnqueueRequest(
                    context=client.context,
                    queue=queue,
                    task=TaskSpec(task_type="t", retry_backoff=backoff),
                )
                await expect_status(
                    client.stub.enqueue(request),
                    Status.INVALID_ARGUMENT,
                    "task.retry_backoff.",
                    "exceeds the maximum of 365 days",
                )
            assert await client.activity(queue) == 0


async def test_a_far_future_nack_delay_is_refused_and_commits_nothing(
    ringod: DaemonProcess,
) -> None:
    """Defect: on PostgreSQL nack(delay=3e6 days) answered INTERNAL after it
    had committed. Refused INVALID_ARGUMENT naming the field; the lease is
    untouched (the task is still LEASED and the same lease acks it)."""
    queue = new_queue()
    with anyio.fail_after(15):
        async with connect(ringod) as client:
            await client.enqueue(queue)
            [leased] = await client.claim(queue)
            assert leased.task is not None
            await expect_status(
                client.stub.nack(
                    NackRequest(
                        context=client.context,
                        lease=ref(leased),
                        error="e",
                        retry_delay_override=FAR,
                    )
                ),
                Status.INVALID_ARGUMENT,
                "retry_delay_override: 3000000 days exceeds the maximum of 365 days",
            )
            task = await client.get(queue, leased.task.id)
            assert task.state == TaskState.LEASED
            assert task.last_error == ""
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))


_DISK_FULL = """
    CREATE FUNCTION public.disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
        USING ERRCODE = 'disk_full'; END $$;
    CREATE TRIGGER disk_full BEFORE INSERT OR UPDATE ON public.tasks
        FOR EACH ROW EXECUTE FUNCTION public.disk_full();
"""


async def test_a_full_database_is_resource_exhausted_and_not_serving_until_it_has_room(
    postgres_dsn: str,
) -> None:
    """Defect: with the disk full, enqueue and claim answered INTERNAL while
    health stayed SERVING. Against a real ringod on PostgreSQL whose server
    answers every write with SQLSTATE 53100 (disk_full, from a trigger: a
    full disk needs root): writes answer RESOURCE_EXHAUSTED, reads work,
    health says NOT_SERVING, and once writes work again health returns to
    SERVING by itself and the enqueue succeeds."""
    queue = new_queue()
    serving = HealthCheckResponseServingStatus.SERVING
    with spawn_daemon(None, postgres_dsn=postgres_dsn) as daemon, anyio.fail_after(30):
        async with connect(daemon) as client:
            kept = await client.enqueue(queue)
            admin = await asyncpg.connect(postgres_dsn)
            try:
                await admin.execute(_DISK_FULL)
                await expect_status(
                    client.enqueue(queue), Status.RESOURCE_EXHAUSTED, "storage full"
                )
                await expect_status(client.claim(queue), Status.RESOURCE_EXHAUSTED)
                status = await client.health.check(HealthCheckRequest())
                assert status.status == HealthCheckResponseServingStatus.NOT_SERVING
                assert await client.get(queue, kept.id) == kept
                await admin.execute("DROP TRIGGER disk_full ON public.tasks")
            finally:
                await admin.close()
            async for answer in client.health.watch(HealthCheckRequest()):
                if answer.status == serving:
                    break
            await client.enqueue(queue)
            assert await client.activity(queue) == 2
