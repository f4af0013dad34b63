"""Claims cancelled in flight, on every engine: no claimed lease outlives a
cancelled claim.

A claim's await points are found, not assumed: while a claim runs, every
task created on the loop (the caller's and any the claim starts, e.g. to
shield its statement) is stepped through `_Stepping`, which counts each time
one of them suspends. A dry run counts a claim's suspensions; then the claim
is run again once per suspension, its caller cancelled exactly there.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef, Task, TaskState
from ringo_trio.server.storage import handback
from ringo_trio.server.storage.base import Push, Storage, TaskFilter
from ringo_trio.server.storage.handback import guard_claim
from tests._kit.storage import LEASE, SyncEngine, ref_of, spec

# Past this many suspensions a claim is assumed to be looping, not claiming.
_MOST_SUSPENSIONS = 200
_GUARD = 60  # seconds: the PostgreSQL runs use sockets


class _Stepping:
    """Awaits `coro`, telling `counter` each time it suspends."""

    def __init__(self, coro: Coroutine[Any, Any, Any], counter: _Suspensions) -> None:
        self._coro = coro
        self._counter = counter

    def __await__(self) -> Generator[Any, Any, Any]:
        send, throw = self._coro.send, self._coro.throw
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = send(value) if error is None else throw(error)
            except StopIteration as stop:
                return stop.value
            self._counter.suspended()
            try:
                value, error = (yield yielded), None
            except BaseException as exc:
                value, error = None, exc


class _Suspensions:
    """A task factory counting the suspensions of the tasks it makes, which
    cancels `target` at the `cancel_at`-th (and, `again`, at every later one)."""

    def __init__(self, cancel_at: int | None, *, again: bool = False) -> None:
        self.count = 0
        self.cancel_at = cancel_at
        self.again = again
        self.target: asyncio.Task[Any] | None = None

    def factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(self._stepped(coro), loop=loop, **kwargs)
        # A task cancelled before its first step never starts `_stepped`,
        # which would leave `coro` never awaited; closing a finished one is a
        # no-op.
        task.add_done_callback(lambda _: coro.close())
        return task

    async def _stepped(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await _Stepping(coro, self)

    def suspended(self) -> None:
        self.count += 1
        at = self.cancel_at
        if at is None or self.target is None:
            return
        if self.count == at or (self.again and self.count > at):
            self.target.cancel()


@dataclass
class _Outcome:
    cancelled: bool
    returned: list[str]
    """Task ids the claim answered with (when it was not cancelled)."""
    suspensions: int


def _claim_call(method: str) -> Callable[..., Coroutine[Any, Any, Sequence[Any]]]:
    def call(raw: Storage, queue: str, limit: int) -> Coroutine[Any, Any, Sequence[Any]]:
        now = datetime.now(UTC)
        if method == "claim":
            return raw.claim(queue, [], limit, "w", LEASE, now)
        return raw.claim_pushes(queue, [], limit, "w", LEASE, now)

    return call


def _ids(answer: Sequence[Any]) -> list[str]:
    return [item.task_id if isinstance(item, Push) else item.task.id for item in answer]


async def _run_claim(
    claim: Coroutine[Any, Any, Sequence[Any]], cancel_at: int | None, *, again: bool = False
) -> _Outcome:
    loop = asyncio.get_running_loop()
    counter = _Suspensions(cancel_at, again=again)
    previous = loop.get_task_factory()
    loop.set_task_factory(counter.factory)
    try:
        task = loop.create_task(claim)
        counter.target = task
        if cancel_at == 0:
            task.cancel()
        try:
            async with asyncio.timeout(_GUARD):
                answer = await task
        except asyncio.CancelledError:
            return _Outcome(True, [], counter.count)
        return _Outcome(False, _ids(answer), counter.count)
    finally:
        loop.set_task_factory(previous)


def _tasks(engine: SyncEngine, queue: str) -> list[Task]:
    page = engine.list_tasks(queue, TaskFilter(), newest_first=False, after=None, limit=1000)
    return page.tasks  # type: ignore[no-any-return]


def _assert_untouched(tasks: list[Task], returned: Sequence[str] = ()) -> None:
    """Exactly the `returned` tasks are LEASED (attempt 1); every other one is
    PENDING with its attempt unspent and no lease."""
    for task in tasks:
        if task.id in returned:
            assert (task.state, task.attempt) == (TaskState.LEASED, 1), task
        else:
            assert (task.state, task.attempt, task.lease_until, task.worker_id) == (
                TaskState.PENDING,
                0,
                None,
                "",
            ), task


@pytest.mark.parametrize("method", ["claim", "claim_pushes"])
@pytest.mark.parametrize("again", [False, True], ids=["once", "again"])
def test_no_claimed_lease_outlives_a_cancelled_claim(
    engine: SyncEngine, method: str, again: bool
) -> None:
    """Property: no claimed lease outlives a cancelled claim. Its caller
    cancelled at any one of the claim's suspensions — before it starts, while
    its statement is in flight, after the commit but before the answer is
    read — (and, `again`, at every suspension after that too, as a task
    group cancelling its children twice does), a claim either returns its
    leases or raises CancelledError having left every task PENDING with its
    attempt unspent, its queue reported to `released_listener`. SQLite's
    claim never suspends, which is why it has no such window; PostgreSQL's
    does, at each round trip."""
    claim = _claim_call(method)
    now = datetime.now(UTC)
    engine.enqueue("dry", [spec()] * 3, now)
    dry = engine.run(_run_claim(claim(engine.raw, "dry", 2), None))
    assert not dry.cancelled
    assert len(dry.returned) == 2
    if engine.kind.name == "sqlite":
        assert dry.suspensions == 0
    else:
        assert dry.suspensions > 0
    heard: list[str] = []
    engine.raw.released_listener = heard.append
    cancelled = 0
    for cancel_at in range(_MOST_SUSPENSIONS):
        queue = f"q{cancel_at}"
        engine.enqueue(queue, [spec()] * 3, now)
        outcome = engine.run(_run_claim(claim(engine.raw, queue, 2), cancel_at, again=again))
        if outcome.cancelled:
            cancelled += 1
            _assert_untouched(_tasks(engine, queue))
            # A claim that got to run committed, so it handed back, and said
            # so: the daemon wakes the queue's claimers on it.
            assert heard == ([queue] if cancel_at > 0 else []), heard
            heard.clear()
            continue
        # Past the claim's last suspension: it answered, and the leases it
        # answered with are exactly the LEASED tasks.
        assert len(outcome.returned) == 2
        _assert_untouched(_tasks(engine, queue), outcome.returned)
        break
    else:
        raise AssertionError(f"a claim still suspending after {_MOST_SUSPENSIONS} suspensions")
    # Every run before the first that outlasted its suspensions was cancelled:
    # before it started, and at each suspension. On PostgreSQL that is at
    # least the caller's own wait and one inside the statement's round trip.
    assert cancelled == cancel_at
    assert cancelled >= (1 if engine.kind.name == "sqlite" else 3)


def test_a_claim_whose_answer_cannot_be_built_leaves_no_lease(engine: SyncEngine) -> None:
    """Property: when a committed claim's rows fail to become its answer, the
    leases are handed back: every task PENDING, attempt unspent."""
    now = datetime.now(UTC)
    engine.enqueue("q", [spec()] * 3, now)

    def build(_leased: list[LeasedTask]) -> list[LeasedTask]:
        raise RuntimeError("a row the encoder cannot take")

    def refs(leased: list[LeasedTask]) -> list[LeaseRef]:
        return [ref_of(item) for item in leased]

    raw = engine.raw
    claim = raw.claim("q", [], 2, "w", LEASE, now)
    with pytest.raises(RuntimeError, match="encoder"):
        engine.run(asyncio.wait_for(guard_claim(raw, claim, refs, build, "q", now), _GUARD))
    _assert_untouched(_tasks(engine, "q"))


class _StuckClaims(Storage):
    """Only `claim` and `release`: a claim that never finishes, releases recorded."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.claim_cancelled = asyncio.Event()
        self.released: list[LeaseRef] = []

    async def claim(self, *args: Any) -> list[LeasedTask]:  # type: ignore[override]
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.claim_cancelled.set()
            raise
        raise AssertionError("unreachable")

    async def release(self, refs: Sequence[LeaseRef], now: datetime) -> int:
        self.released += refs
        return len(refs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


_StuckClaims.__abstractmethods__ = frozenset()


def test_a_cancelled_claim_that_never_finishes_is_given_up_after_a_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: the canceller of a claim stuck in its backend waits for it at
    most HAND_BACK_TIMEOUT (then the claim is cancelled too, with a warning),
    so a dead database cannot hold a cancelled stream, or shutdown, forever."""
    monkeypatch.setattr(handback, "HAND_BACK_TIMEOUT", 0.05)
    storage = _StuckClaims()
    now = datetime.now(UTC)

    async def scenario() -> None:
        claiming = asyncio.ensure_future(
            guard_claim(storage, storage.claim(), lambda _: [], list, "q", now)
        )
        await storage.entered.wait()
        claiming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        # The abandoned claim is cancelled in turn.
        await storage.claim_cancelled.wait()

    # On a thread of its own: a canceller that never gives up swallows every
    # cancellation, so a timeout inside its loop could not end the test.
    finished: list[bool] = []
    runner = threading.Thread(
        target=lambda: finished.append(asyncio.run(scenario()) is None), daemon=True
    )
    with caplog.at_level(logging.WARNING, logger="ringo_trio.server"):
        runner.start()
        runner.join(10)
    assert finished == [True], "the canceller of a stuck claim never came back"
    assert storage.released == []
    assert any("given up" in r.getMessage() for r in caplog.records)
