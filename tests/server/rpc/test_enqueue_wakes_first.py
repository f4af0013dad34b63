"""A producer's Enqueue and a waiting worker on one daemon loop: who goes first.

The daemon serves both on one event loop, so once new tasks are committed it
either writes the producer's reply or starts the waiting dispatcher's claim
first. It starts the claim (`QueueService._enqueued`): enqueue → handler
start at low load is what a waiting worker waits on (bench/results.md,
"Latency at low load"). The daemon runs in-process, so the test sees the
order on the daemon's side, not as two sockets happen to deliver it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from ringo_trio._proto.ringo.v1 import (
    CreditUpdate,
    EnqueueManyRequest,
    EnqueueRequest,
    GetQueueActivityRequest,
    TaskSpec,
)
from ringo_trio.server.daemon import Daemon
from ringo_trio.server.storage.base import Storage
from tests._kit.grpc_client import connect, new_queue, open_work, serving

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("rpc", ["enqueue", "enqueue_many"])
async def test_a_waiting_workers_claim_starts_before_the_enqueue_is_answered(
    make_engine: Callable[[], Storage], rpc: str
) -> None:
    """Property (low-load latency, both engines, both producer calls): a
    task enqueued while a Work stream with credit waits on its queue is
    claimed for that stream before the daemon answers the Enqueue. Red when
    the reply goes first (`_enqueued` without its yield)."""
    engine = make_engine()
    queue = new_queue("first")
    order: list[str] = []
    claim_pushes, next_wakeup = engine.claim_pushes, engine.next_wakeup

    async def claim_recorded(*args: Any) -> Any:
        order.append("claim")
        return await claim_pushes(*args)

    async def next_wakeup_recorded(*args: Any) -> Any:
        # The dispatcher found nothing and asks when to look again; with no
        # answer it waits on the queue's wake-up right after this returns.
        wake_at = await next_wakeup(*args)
        order.append("idle")
        return wake_at

    engine.claim_pushes = claim_recorded  # type: ignore[method-assign]
    engine.next_wakeup = next_wakeup_recorded  # type: ignore[method-assign]

    def prepare(daemon: Daemon) -> None:
        service = daemon.queue_service
        answer = getattr(service, rpc)

        async def answer_recorded(message: Any) -> Any:
            response = await answer(message)
            order.append("reply")
            return response

        setattr(service, rpc, answer_recorded)

    with anyio.fail_after(30):
        async with (
            serving(engine, prepare) as daemon,
            connect(daemon.endpoint) as client,
            open_work(client) as work,
        ):
            await work.register(queue, worker_id="w1", max_concurrency=4)
            await work.send(credit=CreditUpdate(available=4))
            # Waiting: its last round found nothing and no round began
            # since, over a round trip (on PostgreSQL a wake-up of the
            # daemon's own LISTEN may start one more round first).
            seen: list[str] = []
            while not (order and order[-1] == "idle" and order == seen):
                seen = list(order)
                await client.stub.get_queue_activity(
                    GetQueueActivityRequest(context=client.context, queue=queue)
                )
            assert "reply" not in order
            order.clear()
            spec = TaskSpec(task_type="t", payload=b"x")
            if rpc == "enqueue":
                await client.stub.enqueue(
                    EnqueueRequest(context=client.context, queue=queue, task=spec)
                )
            else:
                await client.stub.enqueue_many(
                    EnqueueManyRequest(context=client.context, queue=queue, tasks=[spec])
                )
            while not work.tasks:
                assert await work.frame() is not None
    # (After its push the dispatcher claims again and finds nothing.)
    assert order[:2] == ["claim", "reply"], order
    assert len(work.tasks) == 1
