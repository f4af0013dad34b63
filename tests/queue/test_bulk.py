"""Bulk actions by filter through the SDK (protocol minor 14): `cancel_many`,
`retry_many(unique_key_prefix=)` and `purge(task_types=, unique_key_prefix=)`
on an in-process daemon on virtual time; the daemon's RPCs under them."""

from __future__ import annotations

import pathlib

import pytest
import trio
import trio.testing

from ringo_trio import (
    AttemptOutcome,
    IncompatibleVersionError,
    InvalidArgumentError,
    Ringo,
    TaskSpec,
    TaskState,
)
from ringo_trio.testing import RingoTestEnv, spawn_daemon

pytestmark = pytest.mark.trio


async def test_cancel_many_cancels_exactly_what_matches_in_batches(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property (the filter decides, nothing else): cancel_many with a type
    and a key prefix cancels every PENDING and LEASED task matching both,
    across several batches, and no other; a LEASED one's lease ends (its
    worker's settle is refused) and its history says CANCELLED; finished
    tasks are untouched."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        specs = [TaskSpec("mail", unique_key=f"tenant-a:{n}") for n in range(25)]
        specs += [TaskSpec("mail", unique_key=f"tenant-b:{n}") for n in range(5)]
        specs += [TaskSpec("sms", unique_key=f"tenant-a:sms{n}") for n in range(5)]
        await queue.enqueue_many(specs)
        [leased] = await queue.claim(task_types=["mail"], worker_id="w1")
        assert leased.task.unique_key == "tenant-a:0"
        [done] = await queue.claim(task_types=["sms"])
        await done.ack()

        cancelled = await queue.cancel_many(
            task_types=["mail", "sms"], unique_key_prefix="tenant-a:", reason="bad", batch_size=7
        )
        assert cancelled == 25 + 4
        states = {}
        async for task in queue.list():
            states[task.unique_key] = task.state
        assert {k for k, s in states.items() if s == TaskState.CANCELLED} == {
            f"tenant-a:{n}" for n in range(25)
        } | {f"tenant-a:sms{n}" for n in range(1, 5)}
        assert states["tenant-a:sms0"] == TaskState.SUCCEEDED
        assert all(states[f"tenant-b:{n}"] == TaskState.PENDING for n in range(5))
        with pytest.raises(Exception, match="cancel"):
            await leased.ack()
        history = (await queue.get_by_unique_key("tenant-a:0")).history
        assert [(a.outcome, a.error) for a in history] == [
            (AttemptOutcome.CANCELLED, "cancelled: bad")
        ]
        assert await queue.cancel_many(states=[TaskState.LEASED]) == 0
        with pytest.raises(InvalidArgumentError, match="active state"):
            await queue.cancel_many(states=[TaskState.DEAD])


async def test_retry_and_purge_by_prefix_and_type(autojump_clock: trio.testing.MockClock) -> None:
    """Property: retry_many(unique_key_prefix=) retries only the DEAD tasks
    whose key starts with it; purge(task_types=, unique_key_prefix=) deletes
    only the finished tasks matching both."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("q")
        await queue.enqueue_many(
            [TaskSpec("a", unique_key=f"x:{n}", max_attempts=1) for n in range(4)]
            + [TaskSpec("b", unique_key=f"y:{n}", max_attempts=1) for n in range(3)]
        )
        for leased in await queue.claim(10):
            await leased.reject("dead")
        await env.sleep(seconds=1)  # "finished before" the retry began
        assert await queue.retry_many(unique_key_prefix="x:", batch_size=3) == 4
        assert (await queue.stats()).dead == 3
        for leased in await queue.claim(10):
            await leased.ack()
        await env.sleep(seconds=1)
        assert await queue.purge(task_types=["a"], unique_key_prefix="x:1") == 1
        assert await queue.purge(task_types=["b"]) == 3
        remaining = sorted([t.unique_key or "" async for t in queue.list()])
        assert remaining == ["x:0", "x:2", "x:3"]


async def test_bulk_filters_need_minor_14(tmp_path: pathlib.Path) -> None:
    """Property (the gate): against a daemon serving minor 13, cancel_many
    and the new filters raise IncompatibleVersionError before sending."""
    with spawn_daemon(tmp_path / "data", extra_args=["--protocol-minor", "13"]) as old:
        with trio.fail_after(30):
            async with Ringo.connect(old.endpoint) as client:
                queue = client.queue("q")
                with pytest.raises(IncompatibleVersionError, match="minor 14"):
                    await queue.cancel_many()
                with pytest.raises(IncompatibleVersionError, match="minor 14"):
                    await queue.retry_many(unique_key_prefix="x")
                with pytest.raises(IncompatibleVersionError, match="minor 14"):
                    await queue.purge(task_types=["a"])
                assert await queue.purge() == 0
