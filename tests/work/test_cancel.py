"""Cancelling tasks, bulk retry and result values, from the SDK's side.

The virtual-time tests run the daemon in process on trio's autojump clock
(`RingoTestEnv`): the worker's renewals and the daemon's leases move with it,
so "within one renewal interval" is measured in the clock the protocol runs
on, at no real cost. The old-daemon tests need a real ``ringod`` started at
minor 8.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable, Generator
from datetime import timedelta
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from ringo_trio import (
    FailedPreconditionError,
    IncompatibleVersionError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermanentTaskError,
    RetryTaskError,
    Ringo,
    Task,
    TaskContext,
    TaskSpec,
    TaskState,
)
from ringo_trio._contract import limits
from ringo_trio.testing import RingoTestEnv, spawn_daemon
from tests._kit.workers import running, wait_states

pytestmark = pytest.mark.trio

LEASE = timedelta(seconds=9)
# A renewal goes out when a third of the lease is left: every 2/3 of a lease.
RENEWAL_INTERVAL = LEASE.total_seconds() * 2 / 3


def _records(caplog: pytest.LogCaptureFixture, fragment: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if fragment in r.getMessage()]


async def test_a_running_handler_is_cancelled_within_one_renewal_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: cancelling a task whose handler runs cancels that handler through
    its cancel scope no later than the lease's next renewal (one renewal interval
    of virtual time after the cancel); ctx.is_cancelled is true when it sees the
    cancellation; the worker logs "cancelled by an operator" at INFO, and nothing
    at ERROR; the task stays CANCELLED (nothing is settled for it afterwards)."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-running")
            task_id = (await queue.enqueue(task_type="t", unique_key="job")).task.id
            started, stopped = trio.Event(), trio.Event()
            seen: dict[str, float | bool] = {}

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.set()
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    seen["at"] = trio.current_time()
                    seen["ctx_cancelled"] = ctx.is_cancelled
                    stopped.set()
                    raise

            worker = queue.worker(handle, lease_duration=LEASE)
            async with running(worker):
                await started.wait()
                # Anywhere inside the renewal cycle, not just at its start.
                await trio.sleep(1.5)
                cancelled_at = trio.current_time()
                task = await queue.cancel("job", reason="customer withdrew")
                assert task.state is TaskState.CANCELLED
                with trio.fail_after(2 * RENEWAL_INTERVAL):
                    await stopped.wait()
            stored = await queue.get_by_id(task_id)
    assert seen["ctx_cancelled"] is True
    assert seen["at"] - cancelled_at <= RENEWAL_INTERVAL + 0.5  # type: ignore[operator]
    assert stored.state is TaskState.CANCELLED
    assert stored.last_error == "cancelled: customer withdrew"
    assert stored.attempt == 1
    [record] = _records(caplog, "cancelled by an operator")
    assert record.levelno == logging.INFO
    assert task_id in record.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_ack_after_the_cancel_is_dropped_and_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a handler that returns after its task was cancelled (before any
    renewal told the worker) is not resurrected: the ack is answered lease-lost
    with reason cancelled, the task stays CANCELLED without a result, and the
    worker logs at INFO that the outcome was not stored."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-late-ack")
            task_id = (await queue.enqueue(task_type="t")).task.id
            started, release = trio.Event(), trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> bytes:
                started.set()
                await release.wait()
                return b"too late"

            worker = queue.worker(handle, lease_duration=LEASE)
            async with running(worker):
                await started.wait()
                await queue.cancel_by_id(task_id)
                release.set()
                # Closing waits for the daemon's answer to the ack.
            stored = await queue.get_by_id(task_id)
    assert stored.state is TaskState.CANCELLED
    assert stored.result is None
    assert stored.last_error == "cancelled"
    [record] = _records(caplog, "cancelled by an operator")
    assert record.levelno == logging.INFO
    assert "outcome was not stored" in record.getMessage()


def _assert_one_quiet_info(caplog: pytest.LogCaptureFixture, task_id: str) -> None:
    """One INFO line names the task and the operator; nothing at WARNING or
    above, and no traceback anywhere."""
    [record] = _records(caplog, "cancelled by an operator")
    assert record.levelno == logging.INFO
    assert task_id in record.getMessage()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_a_progress_report_after_the_cancel_logs_info_not_a_crash(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a handler that learns of an operator's cancel from its own
    progress report — the daemon answers it LEASE_LOST with reason cancelled
    and ``report_progress`` raises `LeaseLostError`, which the handler lets
    propagate — is not a crash: the worker logs one INFO line naming the task
    and "cancelled by an operator", nothing at ERROR and no traceback; the
    task stays CANCELLED."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-progress")
            task_id = (await queue.enqueue(task_type="t")).task.id
            started, go, exited = trio.Event(), trio.Event(), trio.Event()
            raised: list[BaseException] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.set()
                try:
                    await go.wait()
                    await ctx.report_progress(1, 2, "half way")
                except BaseException as exc:
                    raised.append(exc)
                    raise
                finally:
                    exited.set()

            worker = queue.worker(handle, lease_duration=LEASE)
            async with running(worker):
                await started.wait()
                await queue.cancel_by_id(task_id)
                go.set()  # well before the next renewal: progress tells first
                await exited.wait()
            stored = await queue.get_by_id(task_id)
    assert stored.state is TaskState.CANCELLED
    [error] = raised
    assert isinstance(error, LeaseLostError)
    assert "cancelled" in str(error)
    _assert_one_quiet_info(caplog, task_id)


async def test_a_genuine_crash_still_logs_error(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: only the news of an operator's cancel is quiet. A handler
    raising — even `LeaseLostError`, say from a lease of the manual API —
    when nobody cancelled its task has crashed: ERROR, with its traceback."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("crash")
            task_id = (await queue.enqueue(task_type="t", max_attempts=1)).task.id

            async def handle(task: Task, ctx: TaskContext) -> None:
                raise LeaseLostError("some other lease")

            await env.run_worker(queue, handle, lease_duration=LEASE)
    [record] = _records(caplog, "crashed")
    assert record.levelno == logging.ERROR
    assert task_id in record.getMessage()
    assert record.exc_info is not None


async def test_progress_after_a_renewal_told_of_the_cancel_logs_info_not_a_crash(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a handler cancelled because a lease renewal was answered
    "cancelled", whose cleanup then reports progress (``report_progress``
    raises `LeaseLostError` at once, naming the operator's cancel), is not a
    crash either: one INFO line, nothing at ERROR, no traceback."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-renewal")
            task_id = (await queue.enqueue(task_type="t")).task.id
            started, exited = trio.Event(), trio.Event()
            raised: list[BaseException] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                started.set()
                try:
                    await trio.sleep_forever()
                finally:
                    try:
                        with trio.CancelScope(shield=True):
                            await ctx.report_progress(0, message="stopping")
                    except BaseException as exc:
                        raised.append(exc)
                        raise
                    finally:
                        exited.set()

            worker = queue.worker(handle, lease_duration=LEASE)
            async with running(worker):
                await started.wait()
                await queue.cancel_by_id(task_id)
                await exited.wait()  # at the next renewal
            stored = await queue.get_by_id(task_id)
    assert stored.state is TaskState.CANCELLED
    [error] = raised
    assert isinstance(error, LeaseLostError)
    assert "cancelled by an operator" in str(error)
    _assert_one_quiet_info(caplog, task_id)


async def test_a_settlement_refused_as_cancelled_logs_info_not_a_crash(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a handler that fails (nack) or succeeds (ack) after its task
    was cancelled, before any renewal or progress report told the worker,
    learns nothing itself; the settlement answered "cancelled" gives one INFO
    line per task saying its outcome was not stored, nothing at ERROR, no
    traceback — the handler's own retry request is INFO as always."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    with trio.fail_after(10 * LEASE.total_seconds()):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-settle")
            acked = (await queue.enqueue(task_type="ack")).task.id
            nacked = (await queue.enqueue(task_type="nack")).task.id
            both, release = trio.Event(), trio.Event()
            seen: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> bytes:
                seen.append(task.id)
                if len(seen) == 2:
                    both.set()
                await release.wait()
                if task.task_type == "nack":
                    raise RetryTaskError("try later")
                return b"too late"

            worker = queue.worker(handle, concurrency=2, lease_duration=LEASE)
            async with running(worker):
                await both.wait()
                await queue.cancel_by_id(acked)
                await queue.cancel_by_id(nacked)
                release.set()
            stored = [await queue.get_by_id(i) for i in (acked, nacked)]
    assert [t.state for t in stored] == [TaskState.CANCELLED] * 2
    records = _records(caplog, "cancelled by an operator")
    assert sorted(r.levelno for r in records) == [logging.INFO] * 2
    for task_id in (acked, nacked):
        [record] = [r for r in records if task_id in r.getMessage()]
        assert "outcome was not stored" in record.getMessage()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_cancel_from_the_sdk(autojump_clock: trio.testing.MockClock) -> None:
    """TaskQueue.cancel / cancel_by_id return the CANCELLED task; a cancelled task
    is never handed to a worker; cancelling it again returns it unchanged; a
    SUCCEEDED task is FailedPreconditionError, an unknown one NotFoundError; a
    reason over MAX_ERROR_BYTES is refused before anything is sent; retry brings a
    cancelled task back and it runs."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("cancel-sdk")
            doomed = (await queue.enqueue(task_type="t", unique_key="d")).task
            kept = (await queue.enqueue(task_type="t")).task
            first = await queue.cancel_by_id(doomed.id, reason="dup")
            assert first.state is TaskState.CANCELLED
            assert first.finished_at is not None
            assert await queue.cancel("d") == first
            ran: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                ran.append(task.id)

            await env.run_worker(queue, handle)
            assert ran == [kept.id]
            with pytest.raises(FailedPreconditionError, match="SUCCEEDED"):
                await queue.cancel_by_id(kept.id)
            with pytest.raises(NotFoundError):
                await queue.cancel("nope")
            with pytest.raises(InvalidArgumentError, match="reason"):
                await queue.cancel("d", reason="x" * (limits.MAX_ERROR_BYTES + 1))
            assert (await queue.retry("d")).state is TaskState.PENDING
            await env.run_worker(queue, handle)
            assert ran == [kept.id, doomed.id]
            assert (await queue.get_by_id(doomed.id)).state is TaskState.SUCCEEDED


async def test_retry_many_pages_until_every_dead_task_is_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """retry_many reactivates every DEAD task (of the given types) in batches of
    batch_size, calling until the daemon has no more, and returns the total; tasks
    of other types and states stay as they were."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("retry-many")
            ids: dict[str, list[str]] = {}
            for task_type, n in (("a", 5), ("b", 2)):
                batch = await queue.enqueue_many(
                    [TaskSpec(task_type, max_attempts=1) for _ in range(n)]
                )
                ids[task_type] = [r.task.id for r in batch.results]

            async def fail(task: Task, ctx: TaskContext) -> None:
                raise PermanentTaskError("no")

            await env.run_worker(queue, fail)
            # Virtual time: the default cutoff is the moment retry_many begins,
            # and a task finished at that very instant is not before it.
            await trio.sleep(1)
            pending = (await queue.enqueue(task_type="a")).task

            async def states(task_type: str) -> list[TaskState]:
                return [(await queue.get_by_id(i)).state for i in ids[task_type]]

            assert await queue.retry_many(task_types=["a"], batch_size=2) == 5
            assert await states("a") == [TaskState.PENDING] * 5
            assert await states("b") == [TaskState.DEAD] * 2
            assert (await queue.get_by_id(pending.id)).state is TaskState.PENDING
            assert await queue.retry_many(finished_before=env.now()) == 2
            assert await states("b") == [TaskState.PENDING] * 2
            assert await queue.retry_many() == 0
            with pytest.raises(InvalidArgumentError, match="batch_size"):
                await queue.retry_many(batch_size=limits.MAX_DELETE_BATCH + 1)


# -- result values ------------------------------------------------------------------


async def test_what_a_handler_returns_is_the_tasks_result(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a handler's bytes come back as the SUCCEEDED task's result, a str
    as its UTF-8 bytes; None stores none; any other type is ignored with one
    WARNING naming the type (the task still succeeds); a value over
    MAX_RESULT_BYTES fails the attempt like an exception (exactly the limit is
    stored) — nacked with an error
    naming the limit, logged at ERROR — and the task is not SUCCEEDED. Retry
    clears a stored result."""
    caplog.set_level(logging.INFO, logger="ringo_trio")
    returns: dict[str, object] = {
        "bytes": b"\x00\xffraw",
        "text": "naïve ✓",
        "none": None,
        "dict": {"not": "a result"},
        "dict2": {"still": "not"},
        "limit": b"x" * limits.MAX_RESULT_BYTES,
        "huge": b"x" * (limits.MAX_RESULT_BYTES + 1),
    }
    with trio.fail_after(120):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("results")
            ids = {
                kind: (await queue.enqueue(task_type=kind, max_attempts=1)).task.id
                for kind in returns
            }

            async def handle(task: Task, ctx: TaskContext) -> object:
                return returns[task.task_type]

            await env.run_worker(queue, handle)
            tasks = {kind: await queue.get_by_id(i) for kind, i in ids.items()}
            assert tasks["bytes"].result == b"\x00\xffraw"
            assert tasks["text"].result == "naïve ✓".encode()
            assert tasks["limit"].result == returns["limit"]  # the limit itself is stored
            for kind in ("none", "dict", "dict2"):
                assert tasks[kind].state is TaskState.SUCCEEDED
                assert tasks[kind].result is None
            huge = tasks["huge"]
            assert huge.state is TaskState.DEAD
            assert huge.result is None
            assert huge.last_error is not None
            assert str(limits.MAX_RESULT_BYTES) in huge.last_error
            assert (await queue.retry_by_id(ids["bytes"])).result is None
            assert (await queue.get_by_id(ids["bytes"])).result is None
    [warning] = _records(caplog, "returned a dict")
    assert warning.levelno == logging.WARNING
    [refused] = _records(caplog, "cannot store")
    assert refused.levelno == logging.ERROR
    assert "now DEAD" in refused.getMessage()  # its one attempt is spent


class _Later:
    """An awaitable that is not a coroutine (a future, a library's handle)."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def __await__(self) -> Generator[Any, None, bytes]:
        return _result_after_a_checkpoint(self._value).__await__()


async def test_a_plain_function_handler_and_the_awaitable_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property: a handler may be a plain function (docs/worker.md): what it
    returns is the result, and when that is awaitable — a coroutine or any
    other awaitable — it is awaited and its value is the result, never the
    awaitable itself (red when only coroutines are awaited)."""
    made: dict[str, Callable[[], object]] = {
        "value": lambda: b"plain",
        "coroutine": lambda: _result_after_a_checkpoint(b"from a coroutine"),
        "awaitable": lambda: _Later(b"from an awaitable"),
    }
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("plain")
            ids = {
                kind: (await queue.enqueue(task_type=kind, max_attempts=1)).task.id for kind in made
            }

            def handle(task: Task, ctx: TaskContext) -> object:
                return made[task.task_type]()

            # The worker itself, not `run_worker`, whose counting wrapper awaits.
            async with running(queue.worker(handle)):  # type: ignore[arg-type]
                await wait_states(queue, list(ids.values()), {TaskState.SUCCEEDED})
            results = {kind: (await queue.get_by_id(i)).result for kind, i in ids.items()}
    assert results == {
        "value": b"plain",
        "coroutine": b"from a coroutine",
        "awaitable": b"from an awaitable",
    }


async def _result_after_a_checkpoint(value: bytes) -> bytes:
    await trio.lowlevel.checkpoint()
    return value


async def test_a_manual_ack_carries_a_result(autojump_clock: trio.testing.MockClock) -> None:
    """LeasedTask.ack(result=...) stores bytes or a str (as UTF-8); a result over
    MAX_RESULT_BYTES or of another type is InvalidArgumentError before anything is
    sent, and the lease stays usable."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("manual-results")
            first = (await queue.enqueue(task_type="t")).task
            second = (await queue.enqueue(task_type="t")).task
            [a, b] = await queue.claim(2)
            with pytest.raises(InvalidArgumentError, match=str(limits.MAX_RESULT_BYTES)):
                await a.ack(b"x" * (limits.MAX_RESULT_BYTES + 1))
            with pytest.raises(InvalidArgumentError, match="bytes or str"):
                await a.ack(42)  # type: ignore[arg-type]
            await a.ack(b"one")
            await b.ack(result="two")
            assert (await queue.get_by_id(first.id)).result == b"one"
            assert (await queue.get_by_id(second.id)).result == b"two"


# -- an older daemon ---------------------------------------------------------------


async def test_an_older_daemon_gets_acks_without_results(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Against a minor-8 daemon a returned result is dropped with one warning and
    never fails the ack (worker and manual API alike, even a result over the
    limit, which is not looked at); cancel and retry_many are
    IncompatibleVersionError before anything is sent."""
    caplog.set_level(logging.WARNING, logger="ringo_trio")
    monkey = pytest.MonkeyPatch()
    # One warning per process: start from a process that has not warned yet.
    monkey.setattr("ringo_trio._work._handlers._dropped_result_warned", False)
    try:
        with spawn_daemon(tmp_path / "old", protocol_minor=8) as daemon, trio.fail_after(60):
            async with Ringo.connect(daemon.endpoint) as client:
                assert client.protocol_minor == 8
                queue = client.queue("old")
                ids = [(await queue.enqueue(task_type="t")).task.id for _ in range(2)]

                async def handle(task: Task, ctx: TaskContext) -> bytes:
                    return b"x" * (limits.MAX_RESULT_BYTES + 1)

                async with running(queue.worker(handle)):
                    await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
                ids.append((await queue.enqueue(task_type="t")).task.id)
                [leased] = await queue.claim()
                await leased.ack(result="x" * (limits.MAX_RESULT_BYTES + 1))
                tasks = [await queue.get_by_id(i) for i in ids]
                assert [t.state for t in tasks] == [TaskState.SUCCEEDED] * 3
                assert [t.result for t in tasks] == [None] * 3
                with pytest.raises(IncompatibleVersionError):
                    await queue.cancel_by_id(ids[0])
                with pytest.raises(IncompatibleVersionError):
                    await queue.retry_many()
    finally:
        monkey.undo()
    assert len(_records(caplog, "result values")) == 1
