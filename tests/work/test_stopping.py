"""Stopping is a protocol step: whatever stops a worker hands its work back.

Each test names the property it guards. Leases given back by a stopping
worker are *released*: the task is PENDING at once with its attempt count as
before the lease (``attempt == 0`` for a task leased once), so ``max_attempts=1``
tasks survive a stop. The real-process forms (Ctrl-C, asyncio under
``asyncio.run``) are in ``test_stop_processes.py``.
"""

from __future__ import annotations

import gc
import logging
import os
import pathlib
import signal
import weakref
from collections.abc import Iterator
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import (
    LeaseLostError,
    RetryTaskError,
    Ringo,
    RingoError,
    Task,
    TaskContext,
    TaskQueue,
    TaskState,
    WorkerAlreadyRunError,
)
from ringo_trio.testing import DaemonProcess, RingoTestEnv, spawn_daemon
from tests._kit.workers import enqueue, running, wait_states

pytestmark = pytest.mark.trio


async def all_back(queue: TaskQueue, ids: list[str]) -> None:
    """Every task is PENDING and none spent an attempt."""
    for task_id in ids:
        task = await queue.get_by_id(task_id)
        assert (task.state, task.attempt) == (TaskState.PENDING, 0), task


class Started:
    """Counts handlers that started; `wait(n)` returns once n are running."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = trio.Event()

    def note(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait(self, n: int) -> None:
        while self.count < n:
            await self._changed.wait()

    async def forever(self, task: Task, ctx: TaskContext) -> None:
        """A handler that counts itself started, then runs until cancelled."""
        self.note()
        await trio.sleep_forever()


async def test_cancelling_run_releases_every_lease_without_spending_attempts(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """Cancellation = drain: an outer cancel scope around ``run`` stops it, and
    before ``run`` returns every lease is back — PENDING, attempt not spent,
    even at max_attempts=1 (a nack would have made them DEAD)."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("cancel-scope")
            ids = await enqueue(queue, 8, max_attempts=1)
            started = Started()

            worker = queue.worker(started.forever, concurrency=8)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(worker.run)
                    await started.wait(8)
                    scope.cancel()
            assert scope.cancelled_caught
            assert worker.running == 0
            await all_back(queue, ids)


async def test_a_cancelled_run_returns_within_stop_timeout_from_a_frozen_daemon(
    daemon: DaemonProcess,
) -> None:
    """Property: ``stop_timeout`` bounds a cancelled ``run`` even when the
    daemon answers nothing (frozen by SIGSTOP: no release is answered, the
    stream is never closed from its side): ``run`` returns once it is spent,
    abandoning the leases to expiry, instead of waiting for the daemon."""
    stop_timeout = 1.0
    with trio.fail_after(30):
        async with Ringo.connect(daemon.endpoint) as client:
            queue = client.queue("frozen")
            await enqueue(queue, 4)
            started = Started()
            worker = queue.worker(
                started.forever, concurrency=4, stop_timeout=timedelta(seconds=stop_timeout)
            )
            cancelled: list[bool] = []

            async def run(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    await worker.run()
                cancelled.append(scope.cancelled_caught)

            async with trio.open_nursery() as nursery:
                scope = await nursery.start(run)
                await started.wait(4)
                os.kill(daemon.pid, signal.SIGSTOP)
                try:
                    scope.cancel()
                    # The bound under test, with room for a loaded machine.
                    with trio.fail_after(stop_timeout + 5):
                        await worker.close()
                finally:
                    os.kill(daemon.pid, signal.SIGCONT)
            assert cancelled == [True]
            assert worker.running == 0


async def test_stop_skips_the_grace_period_and_releases_every_lease(
    tmp_path: pathlib.Path,
) -> None:
    """``worker.stop()`` is a stop at once: with a 60 s grace period and every
    handler running, it returns once ``run`` has finished, and every lease
    is back — PENDING, attempt not spent (max_attempts=1). Before ``run``
    starts it returns at once and ``run`` then does nothing."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("stop")
            ids = await enqueue(queue, 8, max_attempts=1)
            started = Started()

            never_run = queue.worker(started.forever)
            await never_run.stop()
            await never_run.run()  # returns at once: stopped before it began

            worker = queue.worker(
                started.forever, concurrency=8, grace_period=timedelta(seconds=60)
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.run)
                await started.wait(8)
                with trio.move_on_after(10) as bounded:
                    await worker.stop()
                assert not bounded.cancelled_caught  # not the 60 s grace period
                assert worker.running == 0
            await all_back(queue, ids)


async def test_a_keyboard_interrupt_in_a_handler_comes_out_of_run_bare(
    tmp_path: pathlib.Path,
) -> None:
    """KeyboardInterrupt delivered inside a handler stops the whole worker,
    hands back the other leases, and comes out of ``run`` as itself — not
    wrapped in exception groups of the SDK's task groups — so a plain
    ``except KeyboardInterrupt`` around ``await worker.run()`` matches."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("interrupt")
            ids = await enqueue(queue, 4, max_attempts=1)
            started = Started()

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.note()
                if started.count == 4:
                    raise KeyboardInterrupt
                await trio.sleep_forever()

            worker = queue.worker(handle, concurrency=4)
            with pytest.raises(KeyboardInterrupt):
                await worker.run()
            # The interrupted handler's lease goes back like the others.
            await all_back(queue, ids)


async def test_a_handler_that_outlives_the_stop_cannot_crash_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler that ignores cancellation past ``stop_timeout`` and returns
    after the stream ended finds no session to settle into: ``run`` returns
    cleanly (no ClosedResourceError) and the task is not lost — its lease is
    left to expire and it is PENDING again afterwards."""
    # Only the lease's expiry is waited for: virtual time, in-process daemon.
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("outlives")
            [task_id] = await enqueue(queue, 1)
            started = Started()

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.note()
                with trio.CancelScope(shield=True):
                    await trio.sleep(1.0)

            worker = queue.worker(
                handle,
                grace_period=timedelta(0),
                stop_timeout=timedelta(seconds=0.2),
                lease_duration=timedelta(seconds=1),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                await worker.close()
            await wait_states(queue, [task_id], {TaskState.PENDING})


async def test_close_past_the_grace_period_keeps_a_single_attempt_task_alive(
    tmp_path: pathlib.Path,
) -> None:
    """A routine deploy does not kill tasks: with max_attempts=1, a handler
    still running when the grace period ends is released, not nacked — the
    task is PENDING (not DEAD) and another worker then runs it to success."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("deploy")
            [task_id] = await enqueue(queue, 1, max_attempts=1)
            started = Started()

            worker = queue.worker(started.forever, grace_period=timedelta(seconds=0.2))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                await worker.close()
            await all_back(queue, [task_id])
            async with running(queue.worker(lambda task, ctx: None)):
                await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
            assert (await queue.get_by_id(task_id)).attempt == 1


async def test_progress_after_the_grace_period_is_refused_naming_why(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a handler cancelled because the grace period ended (its lease
    is being handed back) that reports progress from its cleanup gets
    `LeaseLostError` naming that reason, and nothing is stored for the lease:
    the task is PENDING with its attempt unspent and no progress (red when a
    cancelled handler whose lease is still held could report, or when the
    reason is lost)."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("late-progress")
            [task_id] = await enqueue(queue, 1)
            started = Started()
            raised: list[LeaseLostError] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.note()
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        try:
                            await ctx.report_progress(1, 2, "cleaning up")
                        except LeaseLostError as exc:
                            raised.append(exc)

            worker = queue.worker(handle, grace_period=timedelta(seconds=5))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                await worker.close()
            await all_back(queue, [task_id])
            assert (await queue.get_by_id(task_id)).progress is None
    [error] = raised
    assert "grace period" in str(error)


async def test_client_aclose_is_bounded_by_the_callers_deadline(tmp_path: pathlib.Path) -> None:
    """The caller's deadline wins: ``client.aclose()`` under ``move_on_after``
    returns at that deadline even while a handler ignores cancellation (it
    does not wait out the handler in an unbounded shield)."""
    with trio.fail_after(30):
        client = Ringo.local(tmp_path)
        async with client:
            queue = client.queue("bounded")
            await enqueue(queue, 1)
            started = Started()
            handler_done = trio.Event()

            async def stubborn(task: Task, ctx: TaskContext) -> None:
                started.note()
                try:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(3)
                finally:
                    handler_done.set()

            worker = queue.worker(stubborn, grace_period=timedelta(seconds=10))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                with trio.move_on_after(0.5) as bounded:
                    await client.aclose()
                assert bounded.cancelled_caught
                assert not handler_done.is_set()  # returned before the handler ended
                assert client.closed


async def test_closed_workers_are_not_kept_alive_by_their_client(tmp_path: pathlib.Path) -> None:
    """Closed workers are released: a client does not keep a reference to its
    finished (or never run) workers, so a long-lived client that makes many
    short-lived workers does not grow."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("many")
            refs = []
            for i in range(200):
                worker = queue.worker(lambda task, ctx: None)
                if i % 40 == 0:
                    async with running(worker):
                        pass
                else:
                    await worker.close()
                refs.append(weakref.ref(worker))
            del worker
            gc.collect()
            assert [r for r in refs if r() is not None] == []


async def test_a_second_run_is_a_runtime_error(tmp_path: pathlib.Path) -> None:
    """Port compatibility: ``run`` twice raises a RuntimeError (and a RingoError)."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            worker = client.queue("twice").worker(lambda task, ctx: None)
            async with running(worker):
                with pytest.raises(WorkerAlreadyRunError) as caught:
                    await worker.run()
            assert isinstance(caught.value, RuntimeError)
            assert isinstance(caught.value, RingoError)


async def test_retry_delay_takes_seconds_as_the_asyncio_sdk_did() -> None:
    """Port compatibility: ``RetryTaskError(delay=5.0)`` means five seconds."""
    assert RetryTaskError("x", delay=5.0).delay == timedelta(seconds=5)
    assert RetryTaskError("x", delay=2).delay == timedelta(seconds=2)
    assert RetryTaskError("x", delay=timedelta(minutes=1)).delay == timedelta(minutes=1)
    for bad in (-1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(RingoError):
            RetryTaskError("x", delay=bad)  # type: ignore[arg-type]


async def test_handler_outcomes_are_logged_at_the_level_a_user_expects(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Silent failures are gone: a RetryTaskError on the last attempt is
    WARNING saying the task is now DEAD (with attempts left it is INFO:
    tests/work/test_last_attempt_log.py), a PermanentTaskError WARNING, a
    crash ERROR with its traceback — each with the task id, queue and
    attempt as structured ``extra`` — and a success logs nothing."""
    from ringo_trio import PermanentTaskError

    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("logs")
            ids = await enqueue(queue, 4, max_attempts=1)
            outcome = dict(zip(ids, ["ok", "retry", "permanent", "crash"], strict=True))

            async def handle(task: Task, ctx: TaskContext) -> None:
                match outcome[task.id]:
                    case "retry":
                        raise RetryTaskError("busy", delay=0.0)
                    case "permanent":
                        raise PermanentTaskError("bad input")
                    case "crash":
                        raise ValueError("boom")

            caplog.set_level(logging.INFO, logger="ringo_trio")
            async with running(queue.worker(handle, concurrency=4)):
                await wait_states(queue, ids, {TaskState.SUCCEEDED, TaskState.DEAD})
    records = {
        r.ringo_task_id: r  # type: ignore[attr-defined]
        for r in caplog.records
        if hasattr(r, "ringo_task_id")
    }
    assert ids[0] not in records
    retry, permanent, crash = (records[i] for i in ids[1:])
    assert (retry.levelno, retry.exc_info) == (logging.WARNING, None)
    assert "now DEAD" in retry.getMessage()
    assert permanent.levelno == logging.WARNING
    # Dead because it failed permanently, not because attempts ran out.
    assert "last attempt" not in permanent.getMessage()
    assert crash.levelno == logging.ERROR
    assert crash.exc_info is not None
    assert isinstance(crash.exc_info[1], ValueError)
    for record, task_id in ((retry, ids[1]), (crash, ids[3])):
        assert record.ringo_queue == "logs"  # type: ignore[attr-defined]
        assert record.ringo_attempt == 1  # type: ignore[attr-defined]
        assert task_id in record.getMessage()


async def test_context_is_cancelled_alias(tmp_path: pathlib.Path) -> None:
    """Port compatibility: ``ctx.is_cancelled`` follows ``ctx.cancelled``."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("alias")
            [task_id] = await enqueue(queue, 1)
            seen: list[tuple[bool, bool]] = []
            started = Started()

            async def handle(task: Task, ctx: TaskContext) -> None:
                seen.append((ctx.cancelled, ctx.is_cancelled))
                started.note()
                try:
                    await trio.sleep_forever()
                finally:
                    seen.append((ctx.cancelled, ctx.is_cancelled))

            worker = queue.worker(handle, grace_period=timedelta(0))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                await worker.close()
            assert seen == [(False, False), (True, True)]
            await all_back(queue, [task_id])


@pytest.fixture
def minor6_daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "minor6", protocol_minor=6) as daemon:
        yield daemon


async def test_an_older_daemon_gets_todays_nack(minor6_daemon: DaemonProcess) -> None:
    """Older daemons keep today's behaviour: below minor 7 there is no release,
    so a stopping worker nacks (the attempt is spent, the task is not lost),
    its error saying the worker stopped."""
    with trio.fail_after(30):
        async with Ringo.connect(minor6_daemon.endpoint) as client:
            assert client.protocol_minor == 6
            queue = client.queue("old")
            [task_id] = await enqueue(queue, 1, max_attempts=3)
            started = Started()

            worker = queue.worker(started.forever, grace_period=timedelta(0))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait(1)
                await worker.close()
            task = await queue.get_by_id(task_id)
            assert (task.state, task.attempt) == (TaskState.PENDING, 1)
            # The nack says why the attempt ended: the worker, not the task.
            assert task.last_error == "the worker stopped before the handler finished"
