"""Task timeouts, the cancellation grace and fencing (``task_timeouts=``).

The bookkeeping (`ringo_trio._work._timeouts.Watchdog`) is sans-IO and checked
against a naive model by hypothesis, with no clock at all. The worker tests
whose handlers block the event loop (``time.sleep``) run against a real
daemon in real time: limits of a few tenths of a second, every test under a
``fail_after`` guard, and no assertion about how fast anything happened —
margins only order events. Those that only wait for deadlines and graces
run on the in-process daemon (`RingoTestEnv`) in virtual time.
"""

from __future__ import annotations

import pathlib
import re
import time
from datetime import timedelta
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ringo_trio import (
    InvalidArgumentError,
    RetryBackoff,
    Ringo,
    Task,
    TaskContext,
    TaskQueue,
    TaskSpec,
    TaskState,
    Worker,
)
from ringo_trio._errors import WorkerFencedError
from ringo_trio._supervise import child as _supervision
from ringo_trio._work._timeouts import TaskTimeouts, Watchdog
from ringo_trio.testing import RingoTestEnv
from tests._kit.workers import wait_states

FAST_RETRY = RetryBackoff(initial=timedelta(milliseconds=20), maximum=timedelta(milliseconds=20))


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


# -- the sans-IO watchdog ---------------------------------------------------------


class WatchdogMachine(RuleBasedStateMachine):
    """`Watchdog` against a model that scans every handler.

    Properties: the next check is the earliest (cancellation moment + grace)
    over running handlers, where the moment is the earliest of the
    start_to_close deadline, the heartbeat deadline (last progress before it
    passed + heartbeat; progress after it moves nothing) and the first
    explicit cancellation; a handler's scope deadline is the earlier of its
    two deadlines; `expired` names the earliest deadline passed; `stuck`
    names such a handler exactly when that moment is due; `exited` reports a
    handler exactly when it left at or past its moment + grace, naming the
    reason of its moment; finished handlers are forgotten.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_key = 0
        self.watchdog: Watchdog[int] | None = None
        self.grace = 0.0
        self.start_to_close: float | None = None
        self.heartbeat: float | None = None
        # key -> [deadline, heartbeat deadline, first cancel moment], each or None
        self.model: dict[int, list[float | None]] = {}

    @rule(
        start_to_close=st.none() | st.sampled_from([0.5, 1.0, 3.0]),
        heartbeat=st.none() | st.sampled_from([0.25, 0.5, 2.0]),
        grace=st.sampled_from([0.25, 1.0, 2.0]),
    )
    @precondition(lambda self: self.watchdog is None)
    def configure(
        self, start_to_close: float | None, heartbeat: float | None, grace: float
    ) -> None:
        self.grace = grace
        self.watchdog = Watchdog(
            TaskTimeouts(
                start_to_close=None if start_to_close is None else seconds(start_to_close),
                heartbeat=None if heartbeat is None else seconds(heartbeat),
                cancel_grace=seconds(grace),
            )
        )
        self.start_to_close = start_to_close
        self.heartbeat = heartbeat

    def moment(self, key: int) -> float | None:
        times = [t for t in self.model[key] if t is not None]
        return min(times) if times else None

    def reason(self, key: int) -> str:
        """Why the handler's moment came: on a tie a timeout wins."""
        assert self.watchdog is not None
        deadline, beat, cancel = self.model[key]
        moment = self.moment(key)
        if deadline == moment:
            return self.watchdog.timeout_text()
        if beat == moment:
            return self.watchdog.heartbeat_text()
        assert cancel == moment
        return "lease lost"

    def scope_deadline(self, key: int) -> float | None:
        times = [t for t in self.model[key][:2] if t is not None]
        return min(times) if times else None

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule()
    @precondition(lambda self: self.watchdog is not None)
    def start(self) -> None:
        assert self.watchdog is not None
        key = self.next_key
        self.next_key += 1
        deadline = self.watchdog.started(key, self.now)
        stc = None if self.start_to_close is None else self.now + self.start_to_close
        beat = None if self.heartbeat is None else self.now + self.heartbeat
        self.model[key] = [stc, beat, None]
        assert deadline == self.scope_deadline(key)
        assert self.watchdog.start_to_close_deadline(key) == stc

    @rule(data=st.data())
    @precondition(lambda self: self.watchdog is not None and self.model)
    def progress(self, data: st.DataObject) -> None:
        assert self.watchdog is not None
        key = data.draw(st.sampled_from(sorted(self.model)))
        moved = self.watchdog.progressed(key, self.now)
        beat = self.model[key][1]
        if beat is None or self.now >= beat:
            assert moved is None
        else:
            assert self.heartbeat is not None
            self.model[key][1] = self.now + self.heartbeat
            assert moved == self.scope_deadline(key)

    @rule(data=st.data())
    @precondition(lambda self: self.watchdog is not None and self.model)
    def cancel(self, data: st.DataObject) -> None:
        assert self.watchdog is not None
        key = data.draw(st.sampled_from(sorted(self.model)))
        due = self.watchdog.cancelled(key, self.now, "lease lost")
        if self.model[key][2] is None:
            self.model[key][2] = self.now
        assert due == self.model[key][2] + self.grace

    @rule(data=st.data())
    @precondition(lambda self: self.watchdog is not None and self.model)
    def exit(self, data: st.DataObject) -> None:
        assert self.watchdog is not None
        key = data.draw(st.sampled_from(sorted(self.model)))
        moment = self.moment(key)
        texts = [self.watchdog.timeout_text, self.watchdog.heartbeat_text]
        passed = [
            (t, i) for i, t in enumerate(self.model[key][:2]) if t is not None and self.now >= t
        ]
        expected = texts[min(passed)[1]]() if passed else None
        assert self.watchdog.expired(key, self.now) == expected
        reason = None if moment is None else self.reason(key)
        found = self.watchdog.exited(key, self.now)
        del self.model[key]
        if moment is None or self.now < moment + self.grace:
            assert found is None
        else:
            assert found is not None
            assert found.key == key
            assert found.cancelled_at == moment
            assert found.ignored_for == self.now - moment
            assert found.why == reason

    @invariant()
    def next_check_and_stuck_match_the_model(self) -> None:
        if self.watchdog is None:
            return
        moments = [m for k in self.model if (m := self.moment(k)) is not None]
        earliest = min(moments) if moments else None
        check = self.watchdog.next_check()
        assert check == (None if earliest is None else earliest + self.grace)
        stuck = self.watchdog.stuck(self.now)
        if earliest is None or self.now < earliest + self.grace:
            assert stuck is None
        else:
            assert stuck is not None
            assert self.moment(stuck.key) == earliest
            assert stuck.ignored_for == self.now - earliest
        assert len(self.watchdog) == sum(1 for v in self.model.values() if v != [None] * 3)
        for key in self.model:
            assert self.watchdog.deadline(key) == self.scope_deadline(key)


TestWatchdog = WatchdogMachine.TestCase
TestWatchdog.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_no_start_counts_from_arrival() -> None:
    """A task is late when its handler starts more than no_start after it arrived."""
    watchdog: Watchdog[int] = Watchdog(TaskTimeouts(no_start=seconds(1)))
    assert watchdog.waited_too_long(10.0, 11.0) is None
    assert watchdog.waited_too_long(10.0, 11.5) == 1.5
    assert Watchdog[int](TaskTimeouts()).waited_too_long(0.0, 1e9) is None


def test_on_a_tie_the_timeout_is_the_reason() -> None:
    """Property (the reason a fenced worker reports): when a handler's
    start_to_close deadline, its heartbeat deadline and an explicit
    cancellation fall on the same moment, its timeout is why it was
    cancelled; a heartbeat deadline tied with a cancellation is the
    heartbeat's."""
    both = TaskTimeouts(start_to_close=seconds(1), heartbeat=seconds(1), cancel_grace=seconds(1))
    watchdog: Watchdog[str] = Watchdog(both)
    watchdog.started("tie", 0.0)
    watchdog.cancelled("tie", 1.0, "lease lost")
    stuck = watchdog.exited("tie", 2.0)
    assert stuck is not None
    assert (stuck.why, stuck.cancelled_at) == (watchdog.timeout_text(), 1.0)
    beat_only: Watchdog[str] = Watchdog(TaskTimeouts(heartbeat=seconds(1), cancel_grace=seconds(1)))
    beat_only.started("tie", 0.0)
    beat_only.cancelled("tie", 1.0, "lease lost")
    stuck = beat_only.exited("tie", 2.0)
    assert stuck is not None
    assert stuck.why == beat_only.heartbeat_text()


def test_a_cancelled_handler_has_ten_seconds_to_exit_by_default() -> None:
    """The documented default grace (docs/timeouts.md): 10 s, and only the
    limits asked for apply."""
    assert TaskTimeouts() == TaskTimeouts(
        start_to_close=None, no_start=None, cancel_grace=seconds(10), heartbeat=None
    )


def test_task_timeouts_are_validated() -> None:
    """Bad limits are refused with InvalidArgumentError when built."""
    for bad in (
        {"start_to_close": timedelta(0)},
        {"start_to_close": 5},
        {"no_start": timedelta(seconds=-1)},
        {"cancel_grace": None},
        {"cancel_grace": timedelta(0)},
        {"heartbeat": timedelta(0)},
        {"heartbeat": timedelta(seconds=-1)},
        {"heartbeat": 1.0},
        {"heartbeat": float("inf")},
    ):
        with pytest.raises(InvalidArgumentError):
            TaskTimeouts(**bad)  # type: ignore[arg-type]


# -- the worker -------------------------------------------------------------------


class Fences:
    """Every `report_fence` call the worker makes (instead of telling a supervisor)."""

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.reported = trio.Event()

    def __call__(self, reason: str) -> None:
        self.reports.append(reason)
        self.reported.set()


@pytest.fixture
def fences(monkeypatch: pytest.MonkeyPatch) -> Fences:
    fences = Fences()
    monkeypatch.setattr(_supervision, "report_fence", fences)
    return fences


async def run_capturing(
    worker: Worker, caught: list[BaseException], *, task_status: trio.TaskStatus[None]
) -> None:
    try:
        await worker.run(task_status=task_status)
    except Exception as exc:
        caught.append(exc)


async def enqueue(queue: TaskQueue, n: int, task_type: str = "t", **spec: Any) -> list[str]:
    result = await queue.enqueue_many([TaskSpec(task_type, **spec) for _ in range(n)])
    return [r.task.id for r in result.results]


async def states(queue: TaskQueue, ids: list[str]) -> list[TaskState]:
    return [(await queue.get_by_id(task_id)).state for task_id in ids]


@pytest.mark.trio
async def test_start_to_close_cancels_exactly_its_handler(tmp_path: pathlib.Path) -> None:
    """The handler's scope carries its start_to_close deadline (ctx.deadline):
    past it exactly that handler is cancelled — another one running at the
    same time runs on and is acked — and the task is nacked with an error
    naming the timeout, then retried per its backoff (attempt 2 succeeds)."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("stc")
            [slow] = await enqueue(queue, 1, retry_backoff=FAST_RETRY, task_type="slow")
            slow_started = trio.Event()
            slow_cancelled = trio.Event()
            seen: list[tuple[str, int, str | None]] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                seen.append((task.task_type, ctx.attempt, task.last_error))
                assert ctx.deadline is not None
                assert ctx.deadline > trio.current_time()
                if task.task_type == "slow" and ctx.attempt == 1:
                    slow_started.set()
                    try:
                        await trio.sleep_forever()
                    finally:
                        slow_cancelled.set()
                if task.task_type == "bystander":
                    # Started later than the slow one, so its own deadline is later.
                    await slow_cancelled.wait()

            worker = queue.worker(
                handle,
                concurrency=2,
                task_timeouts=TaskTimeouts(start_to_close=seconds(0.5)),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await slow_started.wait()
                await trio.sleep(0.1)  # margin: the bystander's deadline is later
                [bystander] = await enqueue(queue, 1, task_type="bystander")
                tasks = await wait_states(queue, [slow, bystander], {TaskState.SUCCEEDED})
                await worker.close()
            assert [t.attempt for t in tasks] == [2, 1]
            assert ("slow", 2, "start_to_close timeout of 0.5s exceeded") in seen
            assert [s for s in seen if s[0] == "bystander"] == [("bystander", 1, None)]


@pytest.mark.trio
async def test_a_late_return_without_yielding_is_not_acked(tmp_path: pathlib.Path) -> None:
    """A handler that returns after its deadline without ever yielding (it
    blocked the loop with time.sleep, so no cancellation could reach it) is
    not acked: the task is nacked with the timeout and runs again."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("blocking")
            [task_id] = await enqueue(queue, 1, retry_backoff=FAST_RETRY)
            errors: list[str | None] = []

            def handle(task: Task, ctx: TaskContext) -> None:
                errors.append(task.last_error)
                if ctx.attempt == 1:
                    time.sleep(0.4)  # past start_to_close, within cancel_grace

            worker = queue.worker(handle, task_timeouts=TaskTimeouts(start_to_close=seconds(0.2)))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
                await worker.close()
            assert task.attempt == 2
            assert errors == [None, "start_to_close timeout of 0.2s exceeded"]


@pytest.mark.trio
async def test_a_handler_ignoring_its_timeout_fences_the_worker(
    autojump_clock: trio.testing.MockClock, fences: Fences
) -> None:
    """A handler still running cancel_grace after its start_to_close deadline
    (it shields itself) fences the worker: the supervisor is told once, no
    task enqueued afterwards reaches a handler, a handler running at the
    fence may still finish and is acked, and run() raises WorkerFencedError
    naming the task and `ringo supervise` — once the stuck handler exits."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            client = env.client
            queue = client.queue("fenced")
            [stuck] = await enqueue(queue, 1, task_type="stuck")
            timed_out = trio.Event()
            release = trio.Event()
            stuck_exited = trio.Event()
            handled: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                handled.append(task.id)
                if task.task_type == "stuck":
                    try:
                        await trio.sleep_forever()
                    except trio.Cancelled:
                        timed_out.set()
                        # Bounded, so a broken worker cannot hang the test.
                        with trio.CancelScope(shield=True), trio.move_on_after(15):
                            await release.wait()
                        stuck_exited.set()
                        raise
                if task.task_type == "bystander":
                    await fences.reported.wait()

            worker = queue.worker(
                handle,
                concurrency=3,
                grace_period=seconds(10),
                task_timeouts=TaskTimeouts(start_to_close=seconds(1.0), cancel_grace=seconds(0.5)),
            )
            caught: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(run_capturing, worker, caught)
                await timed_out.wait()
                # Starts within the grace; its own deadline is a second later.
                [bystander] = await enqueue(queue, 1, task_type="bystander")
                await fences.reported.wait()
                assert not stuck_exited.is_set()  # found while it ran, not when it returned
                after = await enqueue(queue, 3, task_type="after")
                await wait_states(queue, [bystander], {TaskState.SUCCEEDED})
                await trio.sleep(3)
                release.set()
            assert len(fences.reports) == 1
            assert stuck in fences.reports[0]
            assert "ignored its cancellation" in fences.reports[0]
            [error] = caught
            assert isinstance(error, WorkerFencedError)
            text = str(error)
            assert f"task {stuck} (attempt 1)" in text
            assert "start_to_close timeout of 1s exceeded" in text
            assert "ringo supervise" in text
            # The report went out at the fence; the error, raised once the
            # handler exited, says how long it really ignored its cancellation.
            assert _ignored_for(fences.reports[0]) < 1 < 3.5 <= _ignored_for(text)
            assert not set(after) & set(handled)
            assert await states(queue, after) == [TaskState.PENDING] * 3
            # The stuck handler's lease was handed back when it finally exited.
            assert await states(queue, [stuck]) == [TaskState.PENDING]


def _ignored_for(text: str) -> float:
    found = re.search(r"ignored its cancellation \(.*?\) for ([0-9.e+]+)s", text)
    assert found is not None, text
    return float(found.group(1))


@pytest.mark.trio
@pytest.mark.parametrize("timeouts", [None, TaskTimeouts(cancel_grace=seconds(0.3))])
async def test_close_past_grace_starts_the_grace_clock(
    autojump_clock: trio.testing.MockClock, fences: Fences, timeouts: TaskTimeouts | None
) -> None:
    """With task_timeouts, a handler that ignores the cancellation of a close
    past its grace period fences the worker once cancel_grace has passed:
    run() raises WorkerFencedError saying why it was cancelled. Without
    task_timeouts the same handler is today's orphan: no fence, no report,
    run() returns normally once it exits."""
    with trio.fail_after(30):
        async with RingoTestEnv.start() as env:
            client = env.client
            queue = client.queue("closing")
            await enqueue(queue, 1)
            started = trio.Event()
            release = trio.Event()

            exited = False

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal exited
                started.set()
                with trio.CancelScope(shield=True), trio.move_on_after(15):
                    await release.wait()
                exited = True

            worker = queue.worker(handle, grace_period=seconds(0.1), task_timeouts=timeouts)
            caught: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(run_capturing, worker, caught)
                await started.wait()
                nursery.start_soon(worker.close)
                if timeouts is None:
                    await trio.sleep(1.0)  # well past where a fence would have come
                else:
                    await fences.reported.wait()
                    assert not exited  # found while it ran, not when it returned
                release.set()
            if timeouts is None:
                assert fences.reports == []
                assert caught == []
            else:
                assert len(fences.reports) == 1
                [error] = caught
                assert isinstance(error, WorkerFencedError)
                assert "the worker closed past its grace period" in str(error)


@pytest.mark.trio
async def test_a_task_that_cannot_start_in_time_is_handed_back_and_fences(
    tmp_path: pathlib.Path, fences: Fences
) -> None:
    """no_start: a task whose handler could not start within no_start of its
    arrival (the event loop was blocked right after the push) is not run
    late: it is handed back at once without spending its attempt, and the
    worker is fenced (run() raises WorkerFencedError naming no_start)."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("starved")
            [late] = await enqueue(queue, 1)
            handled: list[str] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                handled.append(task.id)

            worker = queue.worker(handle, task_timeouts=TaskTimeouts(no_start=seconds(0.1)))
            start_handler = worker._start_handler

            def starve(*args: Any, **kwargs: Any) -> None:
                start_handler(*args, **kwargs)
                time.sleep(0.3)  # the loop is blocked before the handler can start

            worker._start_handler = starve  # type: ignore[method-assign]
            caught: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(run_capturing, worker, caught)
            assert handled == []
            [error] = caught
            assert isinstance(error, WorkerFencedError)
            assert "no_start=0.1s" in str(error)
            assert len(fences.reports) == 1
            task = await queue.get_by_id(late)
            assert task.state is TaskState.PENDING
            # Released: the attempt the worker never ran is not spent.
            assert task.attempt == 0
            # Handed back for an immediate retry, not after the backoff.
            assert task.available_at is not None
            assert task.updated_at is not None
            assert task.available_at <= task.updated_at


@pytest.mark.trio
async def test_without_task_timeouts_nothing_changes(tmp_path: pathlib.Path) -> None:
    """A worker without task_timeouts has no deadline (ctx.deadline is None)
    and acks a handler however long it blocked."""
    with trio.fail_after(30):
        async with Ringo.local(tmp_path) as client:
            queue = client.queue("plain")
            [task_id] = await enqueue(queue, 1)
            deadlines: list[float | None] = []

            def handle(task: Task, ctx: TaskContext) -> None:
                deadlines.append(ctx.deadline)
                time.sleep(0.2)

            worker = queue.worker(handle)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
                await worker.close()
            assert task.attempt == 1
            assert deadlines == [None]


@pytest.mark.trio
async def test_task_timeouts_must_be_task_timeouts(tmp_path: pathlib.Path) -> None:
    """queue.worker refuses anything but a TaskTimeouts (or None) at once."""
    async with Ringo.local(tmp_path) as client:
        queue = client.queue("bad")
        for bad in ({"start_to_close": 1}, "1s", timedelta(seconds=1)):
            with pytest.raises(InvalidArgumentError, match="TaskTimeouts"):
                queue.worker(lambda task, ctx: None, task_timeouts=bad)  # type: ignore[arg-type]
        queue.worker(lambda task, ctx: None, task_timeouts=TaskTimeouts())


# -- heartbeat --------------------------------------------------------------------

HEARTBEAT = 1.0


@pytest.mark.trio
async def test_progress_keeps_a_handler_alive_past_many_heartbeats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """heartbeat: a handler that reports progress every half heartbeat —
    `mark_progress` or `report_progress`, both count — runs to completion
    long past several heartbeat timeouts: never cancelled, acked on its
    first attempt."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("beating")
            [task_id] = await enqueue(queue, 1, retry_backoff=FAST_RETRY)
            ran: list[float] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                start = trio.current_time()
                for i in range(12):  # 6 heartbeats' worth
                    await trio.sleep(HEARTBEAT / 2)
                    if i % 2:
                        ctx.mark_progress()
                    else:
                        await ctx.report_progress(i, 12)
                ran.append(trio.current_time() - start)

            worker = queue.worker(handle, task_timeouts=TaskTimeouts(heartbeat=seconds(HEARTBEAT)))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
                await worker.close()
    assert task.attempt == 1
    [took] = ran
    assert took >= 5 * HEARTBEAT  # virtual time: past several heartbeat timeouts


@pytest.mark.trio
async def test_a_silent_handler_is_cancelled_a_heartbeat_after_its_last_report(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """heartbeat: a handler that stops reporting progress is cancelled one
    heartbeat after its last report (its scope's deadline, pushed forward by
    each report, runs out) — not after its start — and the task's outcome is
    start_to_close's: the attempt is spent, the task nacked with an error
    naming the heartbeat timeout and retried per its backoff."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("silent")
            [task_id] = await enqueue(queue, 1, retry_backoff=FAST_RETRY)
            seen: list[tuple[int, str | None]] = []
            last_report = cancelled_at = 0.0

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal last_report, cancelled_at
                seen.append((ctx.attempt, task.last_error))
                if ctx.attempt > 1:
                    return
                for _ in range(5):
                    await trio.sleep(HEARTBEAT * 0.9)
                    ctx.mark_progress()
                    last_report = trio.current_time()
                try:
                    await trio.sleep_forever()
                finally:
                    cancelled_at = trio.current_time()

            worker = queue.worker(handle, task_timeouts=TaskTimeouts(heartbeat=seconds(HEARTBEAT)))
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                [task] = await wait_states(queue, [task_id], {TaskState.SUCCEEDED})
                await worker.close()
    assert task.attempt == 2
    [(_, first), (_, retried)] = seen
    assert first is None
    assert retried is not None
    assert retried.startswith("heartbeat timeout of 1s exceeded")
    assert last_report > 4 * HEARTBEAT  # well past the first heartbeat from the start
    assert cancelled_at == pytest.approx(last_report + HEARTBEAT, abs=1e-6)


@pytest.mark.trio
async def test_progress_does_not_extend_start_to_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """heartbeat with start_to_close: the scope's deadline is the earlier of
    the two, so a handler reporting progress all along is still cancelled at
    start_to_close, and the task's error names start_to_close."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("both")
            [task_id] = await enqueue(queue, 1, max_attempts=1)
            elapsed: list[float] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                start = trio.current_time()
                try:
                    while True:
                        await trio.sleep(HEARTBEAT / 2)
                        ctx.mark_progress()
                finally:
                    elapsed.append(trio.current_time() - start)

            worker = queue.worker(
                handle,
                task_timeouts=TaskTimeouts(
                    start_to_close=seconds(3.2), heartbeat=seconds(HEARTBEAT)
                ),
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                [task] = await wait_states(queue, [task_id], {TaskState.DEAD})
                await worker.close()
    assert task.last_error == "start_to_close timeout of 3.2s exceeded"
    assert elapsed == [pytest.approx(3.2, abs=1e-6)]


@pytest.mark.trio
async def test_a_handler_ignoring_its_heartbeat_timeout_fences_the_worker(
    autojump_clock: trio.testing.MockClock, fences: Fences
) -> None:
    """heartbeat: a handler that swallows the cancellation of its heartbeat
    timeout is fenced exactly as for start_to_close: once cancel_grace has
    passed the supervisor is told, run() raises WorkerFencedError naming the
    heartbeat timeout — once the stuck handler exits — and the task is handed
    back (PENDING); progress it reports while ignoring the cancellation
    rescues nothing."""
    with trio.fail_after(60):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("deaf")
            [stuck] = await enqueue(queue, 1)
            release = trio.Event()
            exited = False

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal exited
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    with trio.CancelScope(shield=True), trio.move_on_after(15):
                        while not release.is_set():
                            ctx.mark_progress()
                            await trio.sleep(0.1)
                    exited = True
                    raise

            worker = queue.worker(
                handle,
                task_timeouts=TaskTimeouts(heartbeat=seconds(HEARTBEAT), cancel_grace=seconds(0.5)),
            )
            caught: list[BaseException] = []
            async with trio.open_nursery() as nursery:
                await nursery.start(run_capturing, worker, caught)
                await fences.reported.wait()
                assert not exited  # found while it ran, not when it returned
                release.set()
            assert await states(queue, [stuck]) == [TaskState.PENDING]
    assert len(fences.reports) == 1
    [error] = caught
    assert isinstance(error, WorkerFencedError)
    text = str(error)
    assert f"task {stuck} (attempt 1)" in text
    assert "heartbeat timeout of 1s exceeded" in text
    assert "ringo supervise" in text
