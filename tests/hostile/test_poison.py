"""Poison: requests that would store a time no engine can read back, against
a real ringod on each engine.

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
import pytest
from grpclib.const import Status

from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    EnqueueRequest,
    NackRequest,
    RetryBackoff,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests.server._client import connect, expect_status, new_queue, ref

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
                    "exceeds the maximum of 31536000s",
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
                "retry_delay_override: 259200000000s exceeds the maximum of 31536000s",
            )
            task = await client.get(queue, leased.task.id)
            assert task.state == TaskState.LEASED
            assert task.last_error == ""
            await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
