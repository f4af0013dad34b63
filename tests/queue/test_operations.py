"""Every public unary operation against a real daemon, through Ringo.local and Ringo.connect."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
import trio

from ringo_trio import (
    FailedPreconditionError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    RetryBackoff,
    RingoClient,
    RingoError,
    TaskSpec,
    TaskState,
)
from ringo_trio._contract import versions

pytestmark = pytest.mark.trio

MakeClient = Callable[[], RingoClient]


async def test_enqueue_dedupes_by_unique_key(make_client: MakeClient) -> None:
    """A duplicate unique key returns the existing task with created=False, never an error."""
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("mail")
            first = await queue.enqueue(task_type="send", payload=b"a", unique_key="k")
            again = await queue.enqueue(TaskSpec("send", payload=b"other", unique_key="k"))
            assert first.created
            assert not again.created
            assert again.task.id == first.task.id
            assert again.task.payload == b"a"
            assert first.task.state is TaskState.PENDING
            assert first.task.queue == "mail"
            plain = await queue.enqueue(task_type="send")
            assert plain.created
            assert plain.task.unique_key is None


async def test_lookups(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            created = (await queue.enqueue(task_type="t", payload=b"p", unique_key="u1")).task
            assert (await queue.get_by_id(created.id)) == created
            assert (await queue.get_by_unique_key("u1")).id == created.id
            with pytest.raises(NotFoundError):
                await queue.get_by_id("0" * 32)
            with pytest.raises(NotFoundError):
                await queue.get_by_unique_key("nope")
            # Queues are separate namespaces.
            with pytest.raises(NotFoundError):
                await client.queue("other").get_by_unique_key("u1")


async def test_enqueue_many_batches_in_order_and_aggregates(make_client: MakeClient) -> None:
    """enqueue_many splits into calls of <= 1000, keeps order and sums the counts."""
    with trio.fail_after(30):
        async with make_client() as client:
            queue = client.queue("bulk")
            await queue.enqueue(task_type="t", unique_key="k-5")
            specs = [
                TaskSpec("t", payload=str(i).encode(), unique_key=f"k-{i}") for i in range(2300)
            ]
            result = await queue.enqueue_many(specs)
            assert len(result) == 2300
            assert (result.created_count, result.duplicate_count) == (2299, 1)
            assert [r.task.unique_key for r in result.results] == [f"k-{i}" for i in range(2300)]
            assert not result.results[5].created
            assert result.results[6].created
            empty = await queue.enqueue_many([])
            assert (len(empty), empty.created_count) == (0, 0)


async def test_enqueue_many_fails_fast(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            with pytest.raises(InvalidArgumentError):
                await client.queue("q").enqueue_many([TaskSpec("t"), "nope"])  # type: ignore[list-item]


async def test_claim_ack_and_stale_lease(make_client: MakeClient) -> None:
    """ack settles the task; a settled lease raises LeaseLostError and changes nothing."""
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t", unique_key="a")).task
            [leased] = await queue.claim(worker_id="w-1")
            assert leased.task.id == task.id
            assert leased.attempt == 1
            assert leased.worker_id == "w-1"
            assert leased.lease_until is not None
            assert leased.task.state is TaskState.LEASED
            await leased.ack()
            done = await queue.get_by_id(task.id)
            assert done.state is TaskState.SUCCEEDED
            assert done.finished_at is not None
            for settle in (leased.ack(), leased.nack("x"), leased.reject("x")):
                with pytest.raises(LeaseLostError):
                    await settle
            with pytest.raises(LeaseLostError):
                await leased.extend_lease(timedelta(seconds=5))
            assert (await queue.get_by_id(task.id)).state is TaskState.SUCCEEDED


async def test_nack_with_delay_and_reject(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            await queue.enqueue(task_type="t", unique_key="n")
            await queue.enqueue(task_type="t", unique_key="r")
            leases = {lt.task.unique_key: lt for lt in await queue.claim(2)}
            # Past MAX_DELAY the SDK refuses before sending: the lease is intact.
            with pytest.raises(InvalidArgumentError, match="delay must be at most 365 days"):
                await leases["n"].nack("far", delay=timedelta(days=366))
            await leases["n"].nack("boom " * 10, delay=timedelta(hours=1))
            await leases["r"].reject("é" * 300_000)  # truncated to 256 KiB by the SDK
            nacked = await queue.get_by_unique_key("n")
            assert nacked.state is TaskState.PENDING
            assert nacked.last_error == ("boom " * 10)
            assert nacked.available_at is not None
            assert leases["n"].lease_until is not None
            assert nacked.available_at > leases["n"].lease_until
            dead = await queue.get_by_unique_key("r")
            assert dead.state is TaskState.DEAD
            assert dead.last_error is not None
            assert len(dead.last_error.encode()) <= 256 * 1024
            # The nacked task is scheduled an hour out: nothing to claim now.
            assert await queue.claim(5) == []


async def test_retry_by_key_and_id(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            task = (await queue.enqueue(task_type="t", unique_key="r1")).task
            with pytest.raises(FailedPreconditionError):
                await queue.retry("r1")  # still active
            [leased] = await queue.claim()
            await leased.reject("no")
            again = await queue.retry("r1")
            assert again.id == task.id
            assert again.state is TaskState.PENDING
            [leased] = await queue.claim()
            await leased.ack()
            assert (await queue.retry_by_id(task.id)).state is TaskState.PENDING
            with pytest.raises(NotFoundError):
                await queue.retry("missing")
            with pytest.raises(NotFoundError):
                await queue.retry_by_id("f" * 32)


async def test_claim_filters_limits_and_long_polls(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            for i in range(3):
                await queue.enqueue(task_type="a", unique_key=f"a{i}")
            await queue.enqueue(task_type="b", unique_key="b0")
            only_b = await queue.claim(10, task_types=["b"])
            assert [lt.task.unique_key for lt in only_b] == ["b0"]
            two = await queue.claim(2, task_types=["a", "c"])
            assert len(two) == 2
            # Empty queue: the long poll waits for wait_timeout, then returns nothing.
            rest = await queue.claim(5)
            assert len(rest) == 1
            start = trio.current_time()
            assert await queue.claim(wait_timeout=timedelta(milliseconds=300)) == []
            assert trio.current_time() - start >= 0.25

            # A long poll is woken by an enqueue.
            async def enqueue_later() -> None:
                await trio.sleep(0.2)
                await queue.enqueue(task_type="a", unique_key="late")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(enqueue_later)
                got = await queue.claim(wait_timeout=timedelta(seconds=10))
            assert [lt.task.unique_key for lt in got] == ["late"]


async def test_extend_lease_updates_lease_until(make_client: MakeClient) -> None:
    """extend_lease resets the lease to server-now + extension and updates lease_until."""
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            await queue.enqueue(task_type="t")
            [leased] = await queue.claim(lease_duration=timedelta(seconds=2))
            before = leased.lease_until
            assert before is not None
            await leased.extend_lease(timedelta(minutes=10))
            assert leased.lease_until is not None
            assert leased.lease_until - before > timedelta(minutes=9)
            stored = await queue.get_by_id(leased.task.id)
            assert stored.lease_until == leased.lease_until
            with pytest.raises(InvalidArgumentError):
                await leased.extend_lease(timedelta(0))


async def test_report_progress_is_stored(make_client: MakeClient) -> None:
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            await queue.enqueue(task_type="t")
            [leased] = await queue.claim()
            await leased.report_progress(3, 10, "three of ten")
            task = await queue.get_by_id(leased.task.id)
            assert task.progress is not None
            assert (task.progress.current, task.progress.total) == (3.0, 10.0)
            assert task.progress.message == "three of ten"


async def test_expired_lease_is_reclaimed_and_old_lease_is_lost(make_client: MakeClient) -> None:
    """After expiry a new claim gets attempt 2; the attempt-1 lease can change nothing."""
    with trio.fail_after(20):
        async with make_client() as client:
            queue = client.queue("q")
            # No backoff, so the expired task is claimable at once.
            no_wait = RetryBackoff(initial=timedelta(0), maximum=timedelta(0))
            await queue.enqueue(task_type="t", unique_key="e", retry_backoff=no_wait)
            [old] = await queue.claim(lease_duration=timedelta(milliseconds=200))
            await trio.sleep(0.4)
            [new] = await queue.claim(lease_duration=timedelta(seconds=30))
            assert new.task.id == old.task.id
            assert new.attempt == old.attempt + 1
            with pytest.raises(LeaseLostError):
                await old.ack()
            assert (await queue.get_by_unique_key("e")).state is TaskState.LEASED
            await new.ack()


async def test_client_lifecycle(make_client: MakeClient) -> None:
    """close() is idempotent and safe from another task; calls after close raise RingoError."""
    with trio.fail_after(20):
        client = make_client()
        async with client:
            assert client.protocol_minor == versions.MINOR
            assert client.endpoint is not None
            queue = client.queue("q")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.aclose)
                nursery.start_soon(client.aclose)
            await client.close()
            assert client.closed
            with pytest.raises(RingoError, match="closed"):
                await queue.enqueue(task_type="t")
            with pytest.raises(RingoError, match="closed"):
                client.queue("other")
        with pytest.raises(RingoError, match="only once"):
            async with client:
                pass


async def test_body_exception_propagates_unwrapped(make_client: MakeClient) -> None:
    """An exception from the body of `async with client` comes out as itself, not in a group."""
    with trio.fail_after(20):
        with pytest.raises(KeyError, match="mine"):
            async with make_client():
                raise KeyError("mine")
