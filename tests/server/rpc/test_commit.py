"""The cross-stream group committer (`server/rpc/commit.py`) against a scripted
store: what each caller is answered, what is applied, how callers are
grouped, and what cancellation and failures do. Loop turns stand in for
time: a flush lasts a scripted number of turns, no clock is read."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringo_trio._proto.ringo.v1 import LeaseRef
from ringo_trio.server.rpc.commit import GroupCommit
from ringo_trio.server.storage.base import Ack, LeaseLost, Settlement, StorageUnavailable

T0 = datetime(2030, 1, 1, tzinfo=UTC)


async def turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Store:
    """settle_many of a store where a ref whose task id starts with "lost"
    is never live and each task settles once (the first item wins). A call
    lasts `flush_turns` loop turns, taken before it applies anything, and
    fails with StorageUnavailable while `failing`."""

    def __init__(self, flush_turns: int = 1) -> None:
        self.flush_turns = flush_turns
        self.calls: list[tuple[list[Settlement], datetime]] = []
        self.applied: list[str] = []
        self.failing = False
        self.gate: asyncio.Event | None = None

    async def settle_many(self, items: list[Settlement], now: datetime) -> list[str | LeaseLost]:
        self.calls.append((list(items), now))
        await turns(self.flush_turns)
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            raise StorageUnavailable("down")
        answers: list[str | LeaseLost] = []
        for item in items:
            task = item.ref.task_id
            if task.startswith("lost") or task in self.applied:
                answers.append(LeaseLost(task))
            else:
                self.applied.append(task)
                answers.append("q")
        return answers


def acks(name: str, n: int, lost: int = 0) -> list[Settlement]:
    """n acks of tasks `name`-i, the first `lost` of them not live."""
    return [
        Ack(LeaseRef(task_id=f"{'lost' if i < lost else ''}{name}-{i}", attempt=1))
        for i in range(n)
    ]


async def caught(coro: Any) -> Any:
    """The coroutine's result, or the exception it raised (so a failing
    call does not tear its TaskGroup down)."""
    try:
        return await coro
    except Exception as exc:
        return exc


def alone(items: list[Settlement]) -> list[bool]:
    """Which items a store settling only this batch applies."""
    seen: set[str] = set()
    out = []
    for item in items:
        task = item.ref.task_id
        out.append(not task.startswith("lost") and task not in seen)
        seen.add(task)
    return out


@dataclass(frozen=True)
class Caller:
    items: int
    lost: int
    dupes: int
    arrive: int
    cancel: int | None


_CALLERS = st.lists(
    st.builds(
        Caller,
        st.integers(1, 6),
        st.integers(0, 2),
        st.integers(0, 2),
        st.integers(0, 6),
        st.none() | st.integers(0, 6),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(callers=_CALLERS, flush_turns=st.integers(0, 4), max_items=st.integers(1, 16))
def test_each_caller_gets_its_own_answers_and_items_apply_once(
    callers: list[Caller], flush_turns: int, max_items: int
) -> None:
    """Property (group = alone, exactly once): whatever the arrivals, flush
    lengths and cancellations, every caller that was not cancelled gets
    exactly the answers its batch would get alone and its items are applied
    once; a cancelled caller's batch is applied entirely once or not at all
    (withdrawn while queued, never halfway); each flush holds whole batches
    of at most max_items settlements (or one larger batch), with the latest
    now of its callers; an idle committer flushes a lone caller at once."""
    store = Store(flush_turns)

    async def scene() -> dict[int, Any]:
        commit = GroupCommit(store, max_items=max_items)  # type: ignore[arg-type]
        outcome: dict[int, Any] = {}

        async def call(i: int, c: Caller, items: list[Settlement]) -> None:
            await turns(c.arrive)
            try:
                outcome[i] = await commit.settle(items, T0 + timedelta(seconds=i))
            except asyncio.CancelledError:
                outcome[i] = "cancelled"
                raise

        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(commit.run())
            tasks = []
            for i, c in enumerate(callers):
                items = acks(f"c{i}", c.items, c.lost)
                items += items[c.lost : c.lost + c.dupes]
                batches[i] = items
                tasks.append(tg.create_task(call(i, c, items)))
            for i, c in enumerate(callers):
                if c.cancel is not None:
                    tg.create_task(cancel_after(tasks[i], c.arrive + c.cancel))
            await asyncio.wait(tasks)
            runner.cancel()
        return outcome

    async def cancel_after(task: asyncio.Task[None], n: int) -> None:
        await turns(n)
        task.cancel()

    batches: dict[int, list[Settlement]] = {}
    outcome = asyncio.run(scene())

    applied = collections.Counter(store.applied)
    for i, items in batches.items():
        expected = alone(items)
        mine = {it.ref.task_id for it, live in zip(items, expected, strict=True) if live}
        if outcome.get(i) != "cancelled":
            assert [isinstance(a, str) for a in outcome[i]] == expected
            lost = [a for a, e in zip(outcome[i], expected, strict=True) if not e]
            assert all(isinstance(a, LeaseLost) for a in lost)
            assert all(applied[t] == 1 for t in mine)
        else:
            assert {applied[t] for t in mine} <= {0, 1}
            assert len({applied[t] for t in mine}) <= 1, "a batch applied halfway"

    by_items = {id(items[0]): i for i, items in batches.items()}
    for items, now in store.calls:
        owners = []
        k = 0
        while k < len(items):
            owner = by_items[id(items[k])]
            assert items[k : k + len(batches[owner])] == batches[owner]
            owners.append(owner)
            k += len(batches[owner])
        assert len(items) <= max_items or len(owners) == 1
        assert now == T0 + timedelta(seconds=max(owners))


def test_callers_arriving_during_a_flush_share_the_next_one() -> None:
    """Property (grouping, withdrawal): while one flush runs, every caller
    that arrives is queued, and the next flush takes them all in one
    settle_many, except a caller cancelled while queued, whose items are
    never applied; the caller of the running flush, cancelled, still has
    its items applied."""
    store = Store()

    async def scene() -> None:
        store.gate = asyncio.Event()
        commit = GroupCommit(store)  # type: ignore[arg-type]
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(commit.run())
            first = tg.create_task(commit.settle(acks("a", 2), T0))
            await turns(3)
            assert len(store.calls) == 1
            rest = [tg.create_task(commit.settle(acks(f"b{i}", 3), T0)) for i in range(5)]
            await turns(3)
            assert len(store.calls) == 1
            rest[2].cancel()
            first.cancel()
            await turns(1)
            store.gate.set()
            await asyncio.wait([first, *rest])
            runner.cancel()
        assert [len(items) for items, _ in store.calls] == [2, 12]
        assert commit.flushes == 2
        assert sorted(store.applied) == sorted(
            ["a-0", "a-1", *(f"b{i}-{k}" for i in (0, 1, 3, 4) for k in range(3))]
        )
        assert all(r.result() == ["q"] * 3 for i, r in enumerate(rest) if i != 2)

    asyncio.run(scene())


def test_a_failed_flush_fails_each_of_its_callers_and_the_next_one_works() -> None:
    """Property: when the store fails a flush, each caller of that flush
    gets the StorageUnavailable (none of it applied); the committer goes on
    and the next flush applies normally."""
    store = Store()

    async def scene() -> None:
        commit = GroupCommit(store)  # type: ignore[arg-type]
        store.failing = True
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(commit.run())
            calls = [tg.create_task(caught(commit.settle(acks(f"a{i}", 2), T0))) for i in range(3)]
            await asyncio.wait(calls)
            assert all(isinstance(c.result(), StorageUnavailable) for c in calls)
            assert store.applied == []
            store.failing = False
            assert await commit.settle(acks("b", 2), T0) == ["q", "q"]
            runner.cancel()

    asyncio.run(scene())


def test_stopping_the_committer_fails_waiting_callers_and_refuses_new_ones() -> None:
    """Property: when the committer's task ends (daemon shutdown), callers
    queued or in flight get StorageUnavailable and later calls are refused,
    rather than waiting for ever."""
    store = Store()

    async def scene() -> None:
        store.gate = asyncio.Event()
        commit = GroupCommit(store)  # type: ignore[arg-type]
        async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
            runner = tg.create_task(commit.run())
            flying = tg.create_task(caught(commit.settle(acks("a", 1), T0)))
            await turns(3)
            queued = tg.create_task(caught(commit.settle(acks("b", 1), T0)))
            await turns(1)
            runner.cancel()
        assert isinstance(flying.result(), StorageUnavailable)
        assert isinstance(queued.result(), StorageUnavailable)
        with pytest.raises(StorageUnavailable):
            async with asyncio.timeout(10):
                await commit.settle(acks("c", 1), T0)
        assert await commit.settle([], T0) == []

    asyncio.run(scene())


def test_a_flush_fills_up_to_max_items_exactly() -> None:
    """Property (groups as large as allowed): queued batches join a flush
    while its settlements stay within `max_items`, a flush of exactly
    `max_items` included; a committer of fewer than one settlement per
    flush is refused."""
    store = Store()

    async def scene() -> None:
        store.gate = asyncio.Event()
        commit = GroupCommit(store, max_items=4)  # type: ignore[arg-type]
        async with asyncio.TaskGroup() as tg:
            runner = tg.create_task(commit.run())
            calls = [tg.create_task(commit.settle(acks("first", 1), T0))]
            await turns(3)  # in flight, held at the gate
            calls += [tg.create_task(commit.settle(acks(f"b{i}", 2), T0)) for i in range(3)]
            await turns(1)
            store.gate.set()
            await asyncio.wait(calls)
            runner.cancel()
        assert [len(items) for items, _ in store.calls] == [1, 4, 2]

    asyncio.run(scene())
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(store, max_items=0)  # type: ignore[arg-type]
    GroupCommit(store, max_items=1)  # type: ignore[arg-type]
