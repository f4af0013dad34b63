"""The Work-stream worker against real daemon processes and real streams.

Each test names, in its docstring, the property a user relies on. The ones
about failure (daemon killed, stream cut, handlers that ignore cancellation)
use real processes and a TCP proxy the test controls; every test runs under
a ``fail_after`` guard.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from datetime import timedelta

import pytest
import trio

from ringo_trio import (
    IncompatibleVersionError,
    InvalidArgumentError,
    PermanentTaskError,
    RetryTaskError,
    Ringo,
    RingoError,
    Task,
    TaskContext,
    TaskSpec,
    TaskState,
    UnavailableError,
)
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.processes import eventually, free_port, kill_local_daemon
from tests._kit.proxy import CuttableProxy
from tests._kit.workers import Concurrent, enqueue, enqueue_retrying, running, wait_states

pytestmark = pytest.mark.trio

Handler = Callable[[Task, TaskContext], object]


# -- outcomes -------------------------------------------------------------------


async def test_outcomes_follow_what_the_handler_does(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """Returning acks (SUCCEEDED), RetryTaskError nacks with its delay,
    PermanentTaskError rejects (DEAD), any other exception nacks with its text."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("outcomes")
            ids = {}
            for kind in ("ok", "retry", "permanent", "boom"):
                ids[kind] = (await queue.enqueue(task_type=kind, max_attempts=3)).task.id

            async def handle(task: Task, ctx: TaskContext) -> None:
                assert ctx.task == task
                assert ctx.attempt == 1
                assert ctx.max_attempts == 3
                assert ctx.worker_id == worker.worker_id
                assert not ctx.cancelled
                if task.task_type == "retry":
                    raise RetryTaskError("later", delay=timedelta(hours=1))
                if task.task_type == "permanent":
                    raise PermanentTaskError("never")
                if task.task_type == "boom":
                    raise KeyError("no such thing")

            worker = queue.worker(handle, concurrency=4)
            async with running(worker):
                ok = (await wait_states(queue, [ids["ok"]], {TaskState.SUCCEEDED}))[0]
                dead = (await wait_states(queue, [ids["permanent"]], {TaskState.DEAD}))[0]
                [retry, boom] = await wait_states(
                    queue, [ids["retry"], ids["boom"]], {TaskState.PENDING}
                )
            assert ok.attempt == 1
            assert dead.last_error == "never"
            assert retry.last_error == "later"
            assert retry.available_at is not None
            assert retry.updated_at is not None
            # The handler's delay overrides the task's 1 s backoff.
            assert retry.available_at - retry.updated_at >= timedelta(minutes=59)
            assert boom.last_error is not None
            assert "KeyError" in boom.last_error


async def test_every_task_is_worked_exactly_once_and_concurrency_is_a_bound(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """No task lost, none worked twice when nothing fails, and never more
    handlers at once than the worker's concurrency (the credit bound)."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("bound")
            ids = await enqueue(queue, 300)
            seen: list[str] = []
            handlers = Concurrent()

            all_in = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    seen.append(task.id)
                    # The first credit covers 8 tasks: they all start before
                    # any finishes, so the worker demonstrably uses its bound.
                    if handlers.now == 8:
                        all_in.set()
                    with trio.fail_after(10):
                        await all_in.wait()
                    await trio.sleep(0.005)

            async with running(queue.worker(handle, concurrency=8)):
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=50)
            assert sorted(seen) == sorted(ids)
            assert handlers.peak == 8


async def test_report_progress_is_stored_and_correlated(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """report_progress travels on the Work stream, waits for its own result,
    and the daemon stores it on the task."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("progress")
            [task_id] = await enqueue(queue, 1)
            reported = trio.Event()
            release = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                for step in range(1, 4):
                    await ctx.report_progress(step, 3, f"step {step}")
                assert ctx.last_progress is not None
                reported.set()
                await release.wait()

            async with running(queue.worker(handle)):
                await reported.wait()
                task = await queue.get_by_id(task_id)
                assert task.state is TaskState.LEASED
                assert task.progress is not None
                assert (task.progress.current, task.progress.total) == (3, 3)
                assert task.progress.message == "step 3"
                release.set()
                await wait_states(queue, [task_id], {TaskState.SUCCEEDED})


# Lease renewal, lease loss, close within grace and on_idle's quiet second only
# wait for time: they run in virtual time in test_worker_time.py.


# -- close ----------------------------------------------------------------------


async def test_close_from_another_task_before_and_during_run(tmp_path: pathlib.Path) -> None:
    """close() is idempotent and callable from any task: before run (run then
    returns at once), concurrently from several tasks, and after run ended."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("close")
            early = queue.worker(lambda task, ctx: None)
            await early.close()
            await early.run()  # returns at once: closed before it started
            with pytest.raises(RingoError):
                await early.run()

            worker = queue.worker(lambda task, ctx: None)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                for _ in range(3):
                    nursery.start_soon(worker.close)
            await worker.close()


async def test_closing_the_client_drains_its_workers(tmp_path: pathlib.Path) -> None:
    """Leaving ``async with client`` drains the client's workers first: a
    running handler finishes within grace and is acked, and run() returns."""
    with trio.fail_after(30):
        returned = trio.Event()
        started = trio.Event()
        async with trio.open_nursery() as nursery:
            async with Ringo.local(tmp_path) as client:
                queue = client.queue("drain")
                [task_id] = await enqueue(queue, 1)

                async def handle(task: Task, ctx: TaskContext) -> None:
                    started.set()
                    await trio.sleep(0.3)

                worker = queue.worker(handle, grace_period=timedelta(seconds=5))

                async def run_worker() -> None:
                    await worker.run()
                    returned.set()

                nursery.start_soon(run_worker)
                await started.wait()
            assert returned.is_set()
        async with Ringo.local(tmp_path) as again:
            assert (await again.queue("drain").get_by_id(task_id)).state is TaskState.SUCCEEDED


# -- runtime concurrency ------------------------------------------------------------


async def test_set_concurrency_resizes_without_cancelling(tmp_path: pathlib.Path) -> None:
    """set_concurrency at runtime: raising it admits more handlers at once,
    lowering it cancels no running handler and admits nothing new until the
    worker is below the new limit."""
    with trio.fail_after(40):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("resize")
            ids = await enqueue(queue, 40)
            gate = trio.Event()
            now_running = 0
            cancelled = 0

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal now_running, cancelled
                now_running += 1
                try:
                    await gate.wait()
                except trio.Cancelled:
                    cancelled += 1
                    raise
                finally:
                    now_running -= 1

            worker = queue.worker(handle, concurrency=2)
            async with running(worker):
                await eventually(lambda: now_running >= 2, within=10)
                await worker.set_concurrency(6)
                assert worker.concurrency == 6
                await eventually(lambda: now_running >= 6, within=10)
                await worker.set_concurrency(1)
                await trio.sleep(0.3)
                assert now_running == 6  # nobody cancelled, nobody new
                assert cancelled == 0
                gate.set()
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
            assert cancelled == 0


async def test_invalid_worker_arguments_are_refused(tmp_path: pathlib.Path) -> None:
    """Bad worker arguments fail at once with InvalidArgumentError."""
    async with Ringo.local(tmp_path) as client:
        queue = client.queue("args")

        def ok(task: Task, ctx: TaskContext) -> None:
            return None

        bad: list[dict[str, object]] = [
            {"concurrency": 0},
            {"concurrency": True},
            {"concurrency": 2**31},
            {"weight": 0},
            {"lease_duration": timedelta(seconds=-1)},
            {"grace_period": timedelta(seconds=-1)},
            {"on_idle": 3},
            {"task_types": "abc"},
            {"task_timeouts": object()},
        ]
        for kwargs in bad:
            with pytest.raises(InvalidArgumentError):
                queue.worker(ok, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            queue.worker(42)  # type: ignore[arg-type]
        worker = queue.worker(ok)
        with pytest.raises(InvalidArgumentError):
            await worker.set_concurrency(-1)


# -- on_idle ---------------------------------------------------------------------


class _Stop(BaseException):
    pass


async def test_on_idle_exception_propagates_unchanged(tmp_path: pathlib.Path) -> None:
    """An exception raised by on_idle (even a BaseException) comes out of
    run() itself, unwrapped, and stops the worker."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("idle-raise")

            def on_idle() -> None:
                raise _Stop("batch finished")

            worker = queue.worker(lambda task, ctx: None, on_idle=on_idle)
            with pytest.raises(_Stop, match="batch finished"):
                await worker.run()


@pytest.mark.parametrize("old_daemon", [0], indirect=True)
async def test_on_idle_needs_minor_1(old_daemon: DaemonProcess) -> None:
    """A feature the negotiated minor lacks fails run() before any work starts."""
    with trio.fail_after(20):
        async with Ringo.connect(old_daemon.endpoint) as client:
            queue = client.queue("old")
            [task_id] = await enqueue(queue, 1)
            worker = queue.worker(lambda task, ctx: None, on_idle=lambda: None)
            with pytest.raises(IncompatibleVersionError, match="minor"):
                await worker.run()
            assert (await queue.get_by_id(task_id)).state is TaskState.PENDING


async def test_on_idle_counts_scheduled_tasks_unless_told_not_to(tmp_path: pathlib.Path) -> None:
    """Property: with only a task scheduled an hour ahead, on_idle fires for a
    worker built with idle_counts_scheduled=False (the scheduled task is not
    work to wait for), and not for a default worker of the same queue, whose
    idle count includes it; active_count(due_only=True) agrees."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("idle-scheduled")
            [later] = await enqueue(queue, 1, delay=timedelta(hours=1))
            assert await queue.active_count() == 1
            assert await queue.active_count(due_only=True) == 0
            due_only_fired: list[float] = []
            default_fired: list[float] = []
            due_only = queue.worker(
                lambda task, ctx: None,
                on_idle=lambda: due_only_fired.append(trio.current_time()),
                idle_counts_scheduled=False,
            )
            default = queue.worker(
                lambda task, ctx: None,
                on_idle=lambda: default_fired.append(trio.current_time()),
            )
            async with running(default), running(due_only):
                await eventually(lambda: bool(due_only_fired), within=15)
                # Both monitors poll on the same cadence: give the default
                # one as long again, past its quiet second.
                await trio.sleep(1.5)
            assert default_fired == []
            assert (await queue.get_by_id(later)).state is TaskState.PENDING


@pytest.mark.parametrize("old_daemon", [7], indirect=True)
async def test_idle_without_scheduled_tasks_needs_minor_8(old_daemon: DaemonProcess) -> None:
    """Property: idle_counts_scheduled=False and active_count(due_only=True)
    are refused by the SDK itself (IncompatibleVersionError naming the
    negotiated minor) on a minor-7 daemon, which may not know the field and
    would count scheduled tasks; run() fails before any work."""
    with trio.fail_after(20):
        async with Ringo.connect(old_daemon.endpoint) as client:
            queue = client.queue("old")
            [task_id] = await enqueue(queue, 1)
            with pytest.raises(IncompatibleVersionError, match="negotiated minor is 7"):
                await queue.active_count(due_only=True)
            assert await queue.active_count() == 1
            worker = queue.worker(
                lambda task, ctx: None, on_idle=lambda: None, idle_counts_scheduled=False
            )
            with pytest.raises(IncompatibleVersionError, match="negotiated minor is 7"):
                await worker.run()
            assert (await queue.get_by_id(task_id)).state is TaskState.PENDING


@pytest.mark.parametrize("old_daemon", [1], indirect=True)
async def test_dynamic_concurrency_needs_minor_2(old_daemon: DaemonProcess) -> None:
    """set_concurrency needs minor 2: before run it makes run() refuse, during
    run it raises; a plain worker still works at minor 1 (and without ordered ids)."""
    with trio.fail_after(30):
        async with Ringo.connect(old_daemon.endpoint) as client:
            queue = client.queue("old")
            resized = queue.worker(lambda task, ctx: None)
            await resized.set_concurrency(3)
            with pytest.raises(IncompatibleVersionError):
                await resized.run()
            [task_id] = await enqueue(queue, 1)
            plain = queue.worker(lambda task, ctx: None)
            async with running(plain):
                await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
                with pytest.raises(IncompatibleVersionError):
                    await plain.set_concurrency(5)


# -- failures --------------------------------------------------------------------


class Interruptible:
    """A 20 ms handler that, once ``after`` tasks are done, holds new tasks
    until `release` — so handlers are mid-task when the failure under test
    hits; counts the handlers cancelled by it."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.done = self.held = self.cancelled = 0
        self._release = trio.Event()

    async def __call__(self, task: Task, ctx: TaskContext) -> None:
        try:
            if self.done >= self.after and not self._release.is_set():
                self.held += 1
                await self._release.wait()
            await trio.sleep(0.02)
        except trio.Cancelled:
            self.cancelled += 1
            raise
        self.done += 1

    async def interrupt(self, failure: Callable[[], object]) -> None:
        """Cause ``failure`` while at least 4 handlers are held; wait until
        they were cancelled by it; then let work flow again."""
        await eventually(lambda: self.held >= 4, within=20)
        failure()
        await eventually(lambda: self.cancelled >= 4, within=10)
        self._release.set()


async def test_daemon_sigkill_mid_stream_loses_nothing(
    tmp_path: pathlib.Path, sdk_minor: int
) -> None:
    """The local daemon SIGKILLed mid-stream: running handlers are cancelled,
    the worker reconnects to the restarted daemon, no task is lost and every
    task ends SUCCEEDED."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("kill")
            ids = await enqueue(queue, 200)
            handle = Interruptible(after=40)
            old_pid = client.daemon_pid
            worker = queue.worker(handle, concurrency=16, lease_duration=timedelta(seconds=2))
            async with running(worker):
                await handle.interrupt(lambda: kill_local_daemon(client))
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=45)
                assert client.daemon_pid != old_pid


async def test_stream_cut_by_a_proxy_reconnects_and_loses_nothing(
    proxied_daemon: tuple[DaemonProcess, CuttableProxy],
) -> None:
    """A stream dropped by the network (TCP proxy cuts the connection):
    handlers of the dropped stream are cancelled, the worker opens a new
    stream, and every task still ends SUCCEEDED."""
    _, proxy = proxied_daemon
    with trio.fail_after(60):
        async with Ringo.connect(f"127.0.0.1:{proxy.port}") as client:
            queue = client.queue("cut")
            ids = await enqueue(queue, 150)
            handle = Interruptible(after=30)
            worker = queue.worker(handle, concurrency=8, lease_duration=timedelta(seconds=2))
            async with running(worker):
                await handle.interrupt(proxy.cut)
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=45)
            assert proxy.cuts == 1


async def test_a_handler_ignoring_cancellation_does_not_block_reconnect(
    proxied_daemon: tuple[DaemonProcess, CuttableProxy],
) -> None:
    """A handler that shields itself from cancellation does not stop the
    worker from reconnecting and working other tasks, but it keeps its slot:
    the worker never runs more handlers at once than its concurrency."""
    _, proxy = proxied_daemon
    with trio.fail_after(60):
        async with Ringo.connect(f"127.0.0.1:{proxy.port}") as client:
            queue = client.queue("stubborn")
            [stubborn] = await enqueue(queue, 1, priority=10)
            stubborn_started = trio.Event()
            stubborn_may_end = trio.Event()
            others_done: list[str] = []
            handlers = Concurrent()
            gated: list[str] = []
            three_in = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                with handlers.one():
                    if task.id == stubborn and ctx.attempt == 1:
                        stubborn_started.set()
                        with trio.CancelScope(shield=True):
                            await stubborn_may_end.wait()
                        return
                    if task.task_type == "gated":
                        gated.append(task.id)
                        if len(gated) == 3:
                            three_in.set()
                        with trio.fail_after(10):
                            await three_in.wait()
                    await trio.sleep(0.01)
                    others_done.append(task.id)

            worker = queue.worker(handle, concurrency=3, lease_duration=timedelta(seconds=2))
            async with running(worker):
                await stubborn_started.wait()
                proxy.cut()
                ids = await enqueue_retrying(queue, 30)
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
                assert worker.running == 1  # the stubborn one, still holding its slot
                assert handlers.peak <= 3
                stubborn_may_end.set()
                # Once it has exited, its slot is back: three run at once
                # again (each gated task waits until all three are in).
                await eventually(lambda: worker.running == 0, within=10)
                more = await queue.enqueue_many([TaskSpec("gated") for _ in range(3)])
                await wait_states(
                    queue, [r.task.id for r in more.results], {TaskState.SUCCEEDED}, within=30
                )
                assert three_in.is_set()
                assert len(gated) == 3  # at once, first try: none timed out and came back
            assert set(ids) <= set(others_done)
            assert handlers.peak <= 3


async def test_reconnect_is_bounded(tmp_path: pathlib.Path) -> None:
    """When the daemon is gone for good, run() raises the cause after three
    failed recoveries instead of retrying forever."""
    port = free_port()
    daemon = spawn_daemon(tmp_path / "gone", extra_args=["--listen", f"127.0.0.1:{port}"])
    caught: list[BaseException] = []
    try:
        with trio.fail_after(60):
            async with Ringo.connect(daemon.endpoint) as client:
                worker = client.queue("gone").worker(lambda task, ctx: None)

                async def run(*, task_status: trio.TaskStatus[None]) -> None:
                    try:
                        await worker.run(task_status=task_status)
                    except RingoError as exc:
                        caught.append(exc)

                async with trio.open_nursery() as nursery:
                    await nursery.start(run)
                    os.kill(daemon.process.pid, 9)
    finally:
        daemon.stop()
    assert len(caught) == 1
    assert isinstance(caught[0], UnavailableError)
