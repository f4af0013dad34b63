"""ListTasks, GetQueueStats and ListQueues through a real daemon: validation
statuses, page tokens, the minor-9 gate."""

from __future__ import annotations

import base64

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    GetQueueStatsRequest,
    ListOrder,
    ListQueuesRequest,
    ListTasksRequest,
    TaskState,
)
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import Client, connect, expect_status, new_queue

pytestmark = pytest.mark.anyio


def _list(client: Client, queue: str, **fields: object) -> ListTasksRequest:
    return ListTasksRequest(context=client.context, queue=queue, **fields)  # type: ignore[arg-type]


async def test_list_tasks_pages_with_opaque_tokens(daemon: DaemonProcess) -> None:
    """Property: pages of page_size follow each other through next_page_token
    until it is empty; together they are the queue's tasks in enqueue order
    (newest first when asked), each once, without payloads."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with connect(daemon) as client:
            ids = [(await client.enqueue(queue, payload=b"p")).id for _ in range(7)]
            for order, want in ((ListOrder.OLDEST_FIRST, ids), (ListOrder.NEWEST_FIRST, ids[::-1])):
                seen, token = [], ""
                while True:
                    reply = await client.stub.list_tasks(
                        _list(client, queue, page_size=3, page_token=token, order=order)
                    )
                    assert len(reply.tasks) <= 3
                    assert all(t.payload == b"" for t in reply.tasks)
                    seen += [t.id for t in reply.tasks]
                    token = reply.next_page_token
                    if not token:
                        break
                assert seen == want
            default = await client.stub.list_tasks(_list(client, queue))
            assert len(default.tasks) == 7
            assert default.next_page_token == ""


async def test_page_tokens_are_refused_when_forged_or_sent_with_other_filters(
    daemon: DaemonProcess,
) -> None:
    """Property: a garbage token, a token for another filter, order or queue,
    and a ListQueues token sent to ListTasks are INVALID_ARGUMENT naming
    page_token; never a silently different walk."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with connect(daemon) as client:
            for _ in range(3):
                await client.enqueue(queue, task_type="a")
            first = await client.stub.list_tasks(_list(client, queue, page_size=1))
            token = first.next_page_token
            assert token
            ok = await client.stub.list_tasks(_list(client, queue, page_size=1, page_token=token))
            assert ok.tasks[0].id != first.tasks[0].id
            raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            raw[-1] ^= 1
            tampered = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
            bad_requests = [
                _list(client, queue, page_token="not a token!"),
                _list(client, queue, page_token="x" * 5000),
                _list(client, queue, page_token=tampered),
                _list(client, queue, page_token=token, task_types=["a"]),
                _list(client, queue, page_token=token, states=[TaskState.PENDING]),
                _list(client, queue, page_token=token, order=ListOrder.NEWEST_FIRST),
                _list(client, queue, page_token=token, unique_key_prefix="k"),
                _list(client, new_queue(), page_token=token),
            ]
            for request in bad_requests:
                await expect_status(
                    client.stub.list_tasks(request), Status.INVALID_ARGUMENT, "page_token"
                )
            queues = await client.stub.list_queues(
                ListQueuesRequest(context=client.context, page_size=1)
            )
            if queues.next_page_token:
                await expect_status(
                    client.stub.list_tasks(_list(client, queue, page_token=queues.next_page_token)),
                    Status.INVALID_ARGUMENT,
                    "page_token",
                )
            await expect_status(
                client.stub.list_queues(
                    ListQueuesRequest(context=client.context, page_token=token)
                ),
                Status.INVALID_ARGUMENT,
                "page_token",
            )


async def test_inspection_requests_beyond_the_limits_are_invalid_argument(
    daemon: DaemonProcess,
) -> None:
    """Property: every input limit of the inspection RPCs is enforced with
    INVALID_ARGUMENT naming the field (and the limit where there is one)."""
    queue = new_queue()
    page = limits.MAX_LIST_PAGE + 1
    with anyio.fail_after(20):
        async with connect(daemon) as client:
            cases = [
                (_list(client, ""), "queue"),
                (_list(client, "q" * (limits.MAX_NAME_BYTES + 1)), "queue"),
                (_list(client, queue, page_size=page), str(limits.MAX_LIST_PAGE)),
                (_list(client, queue, states=[TaskState.UNSPECIFIED]), "states[0]"),
                (_list(client, queue, task_types=[""]), "task_types[0]"),
                (
                    _list(client, queue, task_types=["t"] * (limits.MAX_TASK_TYPES + 1)),
                    str(limits.MAX_TASK_TYPES),
                ),
                (
                    _list(client, queue, unique_key_prefix="k" * (limits.MAX_UNIQUE_KEY_BYTES + 1)),
                    "unique_key_prefix",
                ),
                (_list(client, queue, unique_key_prefix="a\x00"), "unique_key_prefix"),
            ]
            for request, fragment in cases:
                await expect_status(
                    client.stub.list_tasks(request), Status.INVALID_ARGUMENT, fragment
                )
            await expect_status(
                client.stub.get_queue_stats(GetQueueStatsRequest(context=client.context)),
                Status.INVALID_ARGUMENT,
                "queue",
            )
            await expect_status(
                client.stub.list_queues(ListQueuesRequest(context=client.context, page_size=page)),
                Status.INVALID_ARGUMENT,
                "page_size",
                str(limits.MAX_LIST_PAGE),
            )


async def test_stats_and_queue_listing(daemon: DaemonProcess) -> None:
    """Property: GetQueueStats counts the queue's tasks by state and type with
    the daemon's clock as as_of; ListQueues pages through every queue with a
    task, by name, each with its counts and no per-type breakdown."""
    prefix = new_queue("zz-inspect")
    names = [f"{prefix}-{i}" for i in range(3)]
    with anyio.fail_after(20):
        async with connect(daemon) as client:
            for n, name in enumerate(names):
                for _ in range(n + 1):
                    await client.enqueue(name, task_type="a")
            await client.enqueue(names[0], task_type="b")
            [leased] = await client.claim(names[0])
            reply = await client.stub.get_queue_stats(
                GetQueueStatsRequest(context=client.context, queue=names[0])
            )
            stats = reply.stats
            assert stats is not None
            assert (stats.pending, stats.leased) == (1, 1)
            assert sorted(t.task_type for t in stats.by_type) == ["a", "b"]
            assert stats.as_of is not None
            assert stats.oldest_pending_at is not None
            found: dict[str, int] = {}
            token = ""
            while True:
                page = await client.stub.list_queues(
                    ListQueuesRequest(context=client.context, page_size=2, page_token=token)
                )
                assert len(page.queues) <= 2
                for q in page.queues:
                    assert q.queue not in found
                    assert q.by_type == []
                    found[q.queue] = q.pending + q.leased
                token = page.next_page_token
                if not token:
                    break
            assert {n: found[n] for n in names} == {names[0]: 2, names[1]: 2, names[2]: 3}
            assert list(found) == sorted(found)
            assert leased.task is not None


async def test_minor8_session_cannot_inspect(daemon: DaemonProcess) -> None:
    """Property: the inspection RPCs are gated on the session's minor: a
    minor-8 session gets UNIMPLEMENTED naming minor 9."""
    queue = new_queue()
    with anyio.fail_after(20):
        async with connect(daemon, minor=8) as client:
            await expect_status(
                client.stub.list_tasks(_list(client, queue)), Status.UNIMPLEMENTED, "minor 9"
            )
            await expect_status(
                client.stub.get_queue_stats(
                    GetQueueStatsRequest(context=client.context, queue=queue)
                ),
                Status.UNIMPLEMENTED,
            )
            await expect_status(
                client.stub.list_queues(ListQueuesRequest(context=client.context)),
                Status.UNIMPLEMENTED,
            )
