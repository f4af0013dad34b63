"""TaskQueue.list / list_page / stats and RingoClient.queues against an
in-process daemon (virtual time)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
import trio

from ringo_trio import (
    IncompatibleVersionError,
    InvalidArgumentError,
    TaskSpec,
    TaskState,
    UnavailableError,
)
from ringo_trio._contract import limits
from ringo_trio.testing import RingoTestEnv
from tests._kit.sdk_fixtures import count_calls, route_calls

pytestmark = pytest.mark.trio


async def test_list_fetches_pages_lazily_and_stops_when_left(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: `list` fetches a page only when the iteration needs it, so
    leaving the loop after 4 tasks at page_size 3 sent exactly 2 ListTasks
    calls; building the iterator sends nothing; a full walk yields every
    task once, in enqueue order or newest first, and the client keeps
    working after a loop was left early."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        batch = await queue.enqueue_many([TaskSpec("t", payload=b"p") for _ in range(10)])
        ids = [r.task.id for r in batch.results]
        sent = count_calls(env.client, monkeypatch)
        listing = queue.list(page_size=3)
        assert sent == []
        seen = []
        async for task in listing:
            seen.append(task.id)
            if len(seen) == 4:
                break
        assert seen == ids[:4]
        assert sent == ["ListTasks", "ListTasks"]
        assert [t.id async for t in queue.list(page_size=3)] == ids
        newest = [t.id async for t in queue.list(newest_first=True, page_size=4)]
        assert newest == ids[::-1]
        assert {t.payload async for t in queue.list()} == {b""}


async def test_list_filters_and_list_page_tokens(autojump_clock: trio.testing.MockClock) -> None:
    """Property: states, task types and unique-key prefix filter the listing;
    list_page hands out a token that, passed back with the same filters,
    continues where the page ended, and None on the last page; a page of
    one task is a page."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        await queue.enqueue_many([TaskSpec(f"t{i % 2}", unique_key=f"k{i}") for i in range(6)])
        [claimed] = await queue.claim(worker_id="w", task_types=["t1"])
        await claimed.reject("nope")
        dead = [t.unique_key async for t in queue.list(states=[TaskState.DEAD])]
        assert dead == [claimed.task.unique_key]
        ones = [t.unique_key async for t in queue.list(task_types=["t1"])]
        assert ones == ["k1", "k3", "k5"]
        pending_k = [
            t.unique_key
            async for t in queue.list(states=[TaskState.PENDING], unique_key_prefix="k")
        ]
        assert pending_k == ["k0", "k2", "k3", "k4", "k5"]
        first = await queue.list_page(task_types=["t0"], page_size=2)
        assert [t.unique_key for t in first.tasks] == ["k0", "k2"]
        assert first.next_page_token is not None
        rest = await queue.list_page(
            task_types=["t0"], page_size=2, page_token=first.next_page_token
        )
        assert [t.unique_key for t in rest.tasks] == ["k4"]
        assert rest.next_page_token is None
        one = await queue.list_page(task_types=["t0"], page_size=1)
        assert [t.unique_key for t in one.tasks] == ["k0"]
        with pytest.raises(dataclasses.FrozenInstanceError):
            first.next_page_token = None  # type: ignore[misc]


async def test_stats_and_queues(autojump_clock: trio.testing.MockClock) -> None:
    """Property: stats count the queue's tasks by state and type, and the
    oldest due task's age grows with the daemon's clock; queues() lists every
    queue holding a task, by name, without the per-type breakdown."""
    async with RingoTestEnv.start() as env:
        mail = env.client.queue("mail")
        await mail.enqueue_many([TaskSpec("send"), TaskSpec("send"), TaskSpec("bounce")])
        await mail.enqueue(task_type="send", delay=timedelta(hours=1))
        await env.client.queue("audit").enqueue(task_type="log")
        [leased] = await mail.claim(worker_id="w")
        await leased.ack()
        await env.sleep(90)
        stats = await mail.stats()
        assert (stats.pending, stats.leased, stats.succeeded) == (3, 0, 1)
        assert {t.task_type: (t.pending, t.succeeded) for t in stats.by_type} == {
            "send": (2, 1),
            "bounce": (1, 0),
        }
        assert stats.oldest_pending_age is not None
        assert stats.oldest_pending_age >= timedelta(seconds=90)
        assert stats.as_of == env.now()
        empty = await env.client.queue("nothing").stats()
        assert (empty.pending, empty.by_type, empty.oldest_pending_age) == (0, (), None)
        queues = await env.client.queues()
        assert [q.queue for q in queues] == ["audit", "mail"]
        assert queues[1].pending == 3
        assert queues[1].by_type == ()


async def test_bad_arguments_and_old_daemons_fail_before_sending(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a page size outside 1..MAX_LIST_PAGE, a state that is not a
    TaskState, a claim's limit outside 1..MAX_BATCH, a wait's timeout that
    is not a non-negative number of seconds (a bool, a string, a negative
    number, NaN), or a daemon session below minor 9 fails at once, with
    nothing sent."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        sent = count_calls(env.client, monkeypatch)
        for page_size in (0, limits.MAX_LIST_PAGE + 1):
            with pytest.raises(InvalidArgumentError, match="page_size"):
                queue.list(page_size=page_size)
        with pytest.raises(InvalidArgumentError, match="TaskState"):
            await queue.list_page(states=["dead"])  # type: ignore[list-item]
        with pytest.raises(InvalidArgumentError, match="UNSPECIFIED"):
            queue.list(states=[TaskState.UNSPECIFIED])
        for limit in (0, limits.MAX_BATCH + 1):
            with pytest.raises(InvalidArgumentError, match="limit"):
                await queue.claim(limit)
        for timeout in (True, "1", -1, float("nan"), timedelta(seconds=-1)):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                await queue.wait("0" * 26, timeout=timeout)  # type: ignore[arg-type]
        connection = env.client._connection
        monkeypatch.setattr(
            connection, "_session", dataclasses.replace(connection.session, minor=8)
        )
        with pytest.raises(IncompatibleVersionError, match="minor"):
            queue.list()
        with pytest.raises(IncompatibleVersionError, match="minor"):
            await queue.stats()
        with pytest.raises(IncompatibleVersionError, match="minor"):
            await env.client.queues()
        assert sent == []


async def test_a_read_is_asked_again_after_a_drop_and_a_write_is_not(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a call that only reads (a lookup by id or unique key, a
    list page, stats, the active count, the rules) is sent again, once,
    when its connection dropped and came back, and answers; a call that
    writes (an enqueue, a cancel, a rule set) is not, since it may have
    been applied: its UnavailableError reaches the caller."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        task = (await queue.enqueue(task_type="t", unique_key="k")).task
        dropped: list[str] = []

        async def first_call_drops(send: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            if method not in dropped:
                dropped.append(method)
                raise UnavailableError("dropped")
            return await send(method, *args, **kwargs)

        route_calls(env.client, monkeypatch, first_call_drops)
        assert (await queue.get_by_id(task.id)).id == task.id
        assert (await queue.get_by_unique_key("k")).id == task.id
        assert [t.id for t in (await queue.list_page()).tasks] == [task.id]
        assert (await queue.stats()).pending == 1
        assert await queue.active_count() == 1
        assert await queue.limits() == []
        with pytest.raises(UnavailableError):
            await queue.enqueue(task_type="t")
        with pytest.raises(UnavailableError):
            await queue.cancel_by_id(task.id)
        with pytest.raises(UnavailableError):
            await queue.set_limit("p:", concurrency=1)
        assert (await queue.get_by_id(task.id)).state is TaskState.PENDING
