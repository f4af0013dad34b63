"""Shared concurrency controllers with real workers, real daemons and real streams.

Each test names, in its docstring, the property a user relies on. Handlers
measure what they observe themselves (how many run at once, per queue);
every test runs under a ``fail_after`` guard.
"""

from __future__ import annotations

import pathlib
from datetime import timedelta

import pytest
import trio

from ringo_trio import (
    IncompatibleVersionError,
    InvalidArgumentError,
    RetryTaskError,
    Ringo,
    Task,
    TaskContext,
    TaskState,
    Worker,
)
from ringo_trio._work._concurrency import AdaptiveConcurrency, ResourceConcurrency, ResourceSample
from ringo_trio.testing import DaemonProcess
from tests._kit.processes import eventually
from tests._kit.proxy import CuttableProxy
from tests._kit.workers import enqueue, enqueue_retrying, running, wait_states

pytestmark = pytest.mark.trio


class Meter:
    """Counts handlers running at once, in total and per queue, as they see it."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.total = 0
        self.peak = 0
        self.done = 0

    def enter(self, queue: str) -> None:
        self.now[queue] = self.now.get(queue, 0) + 1
        self.total += 1
        self.peak = max(self.peak, self.total)

    def leave(self, queue: str) -> None:
        self.now[queue] -= 1
        self.total -= 1
        self.done += 1


async def test_one_controller_bounds_two_queues_and_splits_by_weight(
    tmp_path: pathlib.Path,
) -> None:
    """One controller shared by the workers of two queues: the handlers running
    at once, counted by the handlers themselves, never exceed its capacity;
    while both queues have work the capacity is split by weight (2:1 of 6 is
    4 and 2); when one worker closes, the other gets the whole capacity."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            controller = AdaptiveConcurrency(min=6, max=6)  # a fixed shared capacity
            meter = Meter()
            gate = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                queue = task.queue
                meter.enter(queue)
                try:
                    await gate.wait()
                    await trio.sleep(0.002)
                finally:
                    meter.leave(queue)

            grace = timedelta(seconds=1)
            wa = client.queue("a").worker(
                handle, concurrency=controller, weight=2, grace_period=grace
            )
            wb = client.queue("b").worker(
                handle, concurrency=controller, weight=1, grace_period=grace
            )
            async with running(wa), running(wb):
                # Both are attached before there is work: a queue with a
                # backlog would let the first worker commit the whole capacity.
                a_ids = await enqueue(client.queue("a"), 60)
                b_ids = await enqueue(client.queue("b"), 60)
                await eventually(lambda: meter.total >= 6, within=20)
                await trio.sleep(0.2)  # nothing more gets in
                assert meter.now == {"a": 4, "b": 2}
                assert (wa.concurrency, wb.concurrency) == (4, 2)
                gate.set()
                await wait_states(client.queue("a"), a_ids, {TaskState.SUCCEEDED}, within=40)
                await wait_states(client.queue("b"), b_ids, {TaskState.SUCCEEDED}, within=40)
                assert meter.peak == 6

                gate = trio.Event()
                await wb.close()
                assert wa.concurrency == 6
                more = await enqueue(client.queue("a"), 12)
                await eventually(lambda: meter.now["a"] == 6, within=20)
                gate.set()
                await wait_states(client.queue("a"), more, {TaskState.SUCCEEDED}, within=20)
            assert meter.peak == 6
            assert controller.held == 0  # both workers ended: every permit is back


async def test_no_permit_leaks_when_a_stream_drops_with_handlers_running(
    proxied_daemon: tuple[DaemonProcess, CuttableProxy],
) -> None:
    """Workers of two clients share a capacity of 4 (2 each). Worker A's stream
    is cut while its two handlers ignore cancellation: they keep their
    permits, so A's new stream gets no work and the total never exceeds 4;
    B is unaffected. Once they exit, A gets its share back and works again.
    After everything settles the pool holds exactly the two shares (credit of
    the two idle workers) and nothing runs; after both close it holds
    nothing: no permit leaked, none was counted twice."""
    daemon, proxy = proxied_daemon
    with trio.fail_after(90):
        async with (
            Ringo.connect(f"127.0.0.1:{proxy.port}") as via_proxy,
            Ringo.connect(daemon.endpoint) as direct,
        ):
            controller = AdaptiveConcurrency(min=4, max=4)
            meter = Meter()
            stubborn_may_end = trio.Event()
            stubborn: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                queue = task.queue
                meter.enter(queue)
                try:
                    if task.queue == "a" and ctx.attempt == 1 and len(stubborn) < 2:
                        stubborn.append(task.id)
                        with trio.CancelScope(shield=True):
                            await stubborn_may_end.wait()
                        return
                    await trio.sleep(0.01)
                finally:
                    meter.leave(queue)

            qa, qb = via_proxy.queue("a"), direct.queue("b")
            wa = qa.worker(handle, concurrency=controller, lease_duration=timedelta(seconds=2))
            wb = qb.worker(handle, concurrency=controller, lease_duration=timedelta(seconds=2))
            async with running(wa), running(wb):
                try:
                    first = await enqueue(qa, 2)
                    await eventually(lambda: len(stubborn) == 2, within=20)
                    proxy.cut()
                    a_ids = await enqueue_retrying(qa, 20)
                    b_ids = await enqueue(qb, 40)
                    await wait_states(qb, b_ids, {TaskState.SUCCEEDED}, within=30)
                    # A reconnected, but its share is held by its two stubborn handlers.
                    assert wa.running == 2
                    assert (await qa.get_by_id(a_ids[0])).state is TaskState.PENDING
                    assert meter.peak <= 4
                finally:
                    stubborn_may_end.set()  # a failing test must not leave them running
                await wait_states(qa, a_ids + first, {TaskState.SUCCEEDED}, within=40)
                await eventually(lambda: controller.running == 0, within=10)
                assert controller.held == 4  # two idle workers, each holding its share as credit
                assert (wa.running, wb.running) == (0, 0)
            assert meter.peak <= 4
            assert controller.held == 0


async def test_congestion_shrinks_an_adaptive_controller_and_success_regrows_it(
    tmp_path: pathlib.Path,
) -> None:
    """AIMD with a real worker: successes grow the capacity from min (slow
    start) to max; handlers raising RetryTaskError(congestion=True) cut it to
    half or less and put it in probing mode; successes after that end probing
    and grow it back to max."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            controller = AdaptiveConcurrency(min=1, max=8)
            queue = client.queue("aimd")
            congested = False
            capacities: list[int] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                capacities.append(controller.capacity)
                await trio.sleep(0.01)
                if congested:
                    raise RetryTaskError("downstream is overloaded", congestion=True)

            worker = queue.worker(handle, concurrency=controller)
            async with running(worker):
                ids = await enqueue(queue, 200)
                await eventually(lambda: controller.capacity == 8, within=20)
                congested = True
                await eventually(lambda: controller.capacity <= 4, within=20)
                assert controller.probing
                congested = False
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
                more = await enqueue(queue, 200)
                await eventually(lambda: controller.capacity == 8, within=20)
                assert not controller.probing
                await wait_states(queue, more, {TaskState.SUCCEEDED}, within=30)
            assert capacities[0] == 1


async def test_a_crash_or_a_plain_retry_is_not_congestion(tmp_path: pathlib.Path) -> None:
    """Property: only ``RetryTaskError(congestion=True)`` cuts an adaptive
    controller. Handlers that crash or ask for an ordinary retry tell its law
    nothing: grown to max, it stays at max and does not probe (red when any
    failure counts as congestion)."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            controller = AdaptiveConcurrency(min=1, max=4)
            queue = client.queue("failures")
            failing = False

            async def handle(task: Task, ctx: TaskContext) -> None:
                await trio.sleep(0.01)
                if failing:
                    if task.task_type == "crash":
                        raise ValueError("a bug, not an overload")
                    raise RetryTaskError("try again", delay=0.0)

            async with running(queue.worker(handle, concurrency=controller)):
                ids = await enqueue(queue, 40)
                await eventually(lambda: controller.capacity == 4, within=20)
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
                failing = True
                failed = [
                    (await queue.enqueue(task_type=kind, max_attempts=1)).task.id
                    for kind in ("crash", "retry") * 10
                ]
                await wait_states(queue, failed, {TaskState.DEAD}, within=30)
                assert (controller.capacity, controller.probing) == (4, False)


async def test_a_resource_controller_resizes_running_workers(tmp_path: pathlib.Path) -> None:
    """A ResourceConcurrency's sampling runs inside the attached workers (no
    extra context manager): a resource above its target shrinks the capacity
    of the running workers, one below it lets the capacity grow back."""
    with trio.fail_after(60):
        async with Ringo.local(tmp_path) as client:
            usage = 0.1
            controller = ResourceConcurrency(
                min=1,
                max=8,
                cpu_target=0.5,
                interval=timedelta(milliseconds=50),
                sampler=lambda: ResourceSample(cpu=usage),
            )
            gate = trio.Event()

            async def handle(task: Task, ctx: TaskContext) -> None:
                await gate.wait()

            queue = client.queue("resource")
            ids = await enqueue(queue, 30)
            worker = queue.worker(handle, concurrency=controller)
            async with running(worker):
                await eventually(lambda: worker.concurrency == 8 and worker.running == 8)
                usage = 4.0  # eight times the target: shrink
                await eventually(lambda: controller.capacity == 1)
                assert worker.concurrency == 1
                assert worker.running == 8  # running handlers are never revoked
                gate.set()
                usage = 0.1
                await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=30)
            assert controller.held == 0


async def test_controller_misuse_is_refused(tmp_path: pathlib.Path) -> None:
    """set_concurrency on a controller-attached worker raises
    InvalidArgumentError; a bad concurrency or weight fails at once."""
    async with Ringo.local(tmp_path) as client:
        controller = AdaptiveConcurrency()
        worker: Worker = client.queue("misuse").worker(lambda t, c: None, concurrency=controller)
        assert worker.concurrency == 0  # not running: no share yet
        with pytest.raises(InvalidArgumentError):
            await worker.set_concurrency(3)
        with pytest.raises(InvalidArgumentError):
            client.queue("misuse").worker(lambda t, c: None, concurrency=controller, weight=0)
        with pytest.raises(InvalidArgumentError):
            client.queue("misuse").worker(lambda t, c: None, concurrency="many")  # type: ignore[arg-type]


@pytest.mark.parametrize("old_daemon", [1], indirect=True)
async def test_controllers_need_minor_2(old_daemon: DaemonProcess) -> None:
    """A controller-attached worker against a minor-1 daemon fails run() with
    IncompatibleVersionError before any work, and holds no permit."""
    with trio.fail_after(20):
        async with Ringo.connect(old_daemon.endpoint) as client:
            queue = client.queue("old")
            [task_id] = await enqueue(queue, 1)
            controller = AdaptiveConcurrency(min=2, max=2)
            worker = queue.worker(lambda task, ctx: None, concurrency=controller)
            with pytest.raises(IncompatibleVersionError, match="minor"):
                await worker.run()
            assert (await queue.get_by_id(task_id)).state is TaskState.PENDING
            assert controller.held == 0
