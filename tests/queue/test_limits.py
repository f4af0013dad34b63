"""Keyed limits through the SDK and a real Worker, on virtual time.

`RingoTestEnv` runs the daemon in process on trio's autojump clock, so a
minute of rate-limited starts costs no real time and every start's instant is
exact: spacing and wake-up instants are compared in virtual seconds. What
needs two daemons on one PostgreSQL database is in test_limits_shared.py
(real sockets).
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
import trio
import trio.testing

from ringo_trio import InvalidArgumentError, LimitRule, Task, TaskContext, TaskState
from ringo_trio._contract import limits
from ringo_trio.testing import RingoTestEnv
from tests._kit.sdk_fixtures import count_calls
from tests._kit.workers import enqueue, running, wait_states

pytestmark = pytest.mark.trio

# Virtual seconds: a guard, not a timing.
GUARD = 3600
# µs rounding of the daemon's clock.
EPS = 1e-5


async def test_a_rate_spaces_one_keys_starts(autojump_clock: trio.testing.MockClock) -> None:
    """Property: 10/s with burst 1 on one key, through a real Worker of
    concurrency 8 for 60 virtual seconds: no two starts closer than 100 ms,
    and the count is within the burst of 600 (a late wake-up is not charged
    to the key's rate)."""
    with trio.fail_after(GUARD):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("rate")
            await queue.set_limit("api:", rate=10, burst=1)
            await enqueue(queue, 700, limit_key="api:x")
            starts: list[float] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                starts.append(trio.current_time())

            t0 = trio.current_time()
            async with running(queue.worker(handle, concurrency=8)):
                await trio.sleep(60)
            within = [s - t0 for s in starts if s - t0 < 60]
            gaps = [b - a for a, b in itertools.pairwise(within)]
            assert min(gaps) >= 0.1 - EPS
            assert abs(len(within) - 600) <= 1, len(within)


@pytest.mark.parametrize("cap", [1, 3])
async def test_concurrency_caps_a_key_and_a_settle_wakes_the_next(
    autojump_clock: trio.testing.MockClock, cap: int
) -> None:
    """Property: a key's concurrency cap N holds through a Worker of
    concurrency 4N (peak running == N, never more), every task finishes, and
    each start past the first N comes at the very instant a handler of the
    key ended (a settlement wakes the dispatch; the engine's 250 ms recheck
    would start it up to 250 ms later)."""
    with trio.fail_after(GUARD):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("conc")
            await queue.set_limit("tenant:", concurrency=cap)
            ids = await enqueue(queue, 6 * cap, limit_key="tenant:a")
            running_now = peak = 0
            starts: list[float] = []
            ends: list[float] = []

            async def handle(task: Task, ctx: TaskContext) -> None:
                nonlocal running_now, peak
                running_now += 1
                peak = max(peak, running_now)
                starts.append(trio.current_time())
                try:
                    await trio.sleep(1)
                finally:
                    running_now -= 1
                    ends.append(trio.current_time())

            async with running(queue.worker(handle, concurrency=4 * cap)):
                tasks = await wait_states(queue, ids, {TaskState.SUCCEEDED}, within=GUARD)
            assert len(tasks) == len(ids)
            assert peak == cap
            late = [min(s - e for e in ends if e <= s + EPS) for s in sorted(starts)[cap:]]
            assert max(late) < 0.005, late


@pytest.mark.parametrize("how", ["ack", "nack", "reject", "expiry", "cancel"])
async def test_every_end_of_a_lease_frees_the_keys_concurrency(
    autojump_clock: trio.testing.MockClock, how: str
) -> None:
    """Property: with concurrency 1, a key's second task waits PENDING while
    the first is leased, and each way the lease ends (ack, nack, reject, the
    lease expiring, CancelTask) frees the slot: a long-poll Claim parked
    before the end gets the second task at that very instant."""
    with trio.fail_after(GUARD):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("free")
            await queue.set_limit("", concurrency=1)
            first, second = await enqueue(queue, 2, limit_key="k", max_attempts=5)
            [leased] = await queue.claim(lease_duration=timedelta(seconds=10))
            assert leased.task.id == first
            assert await queue.claim(wait_timeout=timedelta(0)) == []
            assert (await queue.get_by_id(second)).state is TaskState.PENDING
            got: list[tuple[float, str]] = []

            async def park() -> None:
                [next_one] = await queue.claim(wait_timeout=timedelta(seconds=60))
                got.append((trio.current_time(), next_one.task.id))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(park)
                await trio.sleep(3)
                ended = trio.current_time()
                if how == "ack":
                    await leased.ack()
                elif how == "nack":
                    await leased.nack("again", delay=timedelta(seconds=30))
                elif how == "reject":
                    await leased.reject("no")
                elif how == "cancel":
                    await queue.cancel_by_id(first)
                else:
                    ended += 7  # the lease ends at 10 s
            [(at, task_id)] = got
            assert task_id == second
            assert at - ended < 0.1 if how == "expiry" else at - ended < EPS, at - ended


async def test_keys_are_independent(autojump_clock: trio.testing.MockClock) -> None:
    """Property: a rule applies to each key under its prefix separately
    (two keys at concurrency 1 run 2 at once), the longest prefix wins, and
    a key no rule matches (or no key) is not limited; `limits()` lists the
    rules, with their keys only when asked for."""
    with trio.fail_after(GUARD):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("keys")
            await queue.set_limit("t:", concurrency=1)
            await queue.set_limit("t:big:", concurrency=3)
            for key in ("t:a", "t:b", "t:big:c", "other"):
                await enqueue(queue, 4, limit_key=key)
            await enqueue(queue, 4)
            leased = await queue.claim(100)
            by_key: dict[str | None, int] = {}
            for item in leased:
                by_key[item.task.limit_key] = by_key.get(item.task.limit_key, 0) + 1
            assert by_key == {"t:a": 1, "t:b": 1, "t:big:c": 3, "other": 4, None: 4}
            rules = await queue.limits()
            assert [r.rule for r in rules] == [
                LimitRule("t:", concurrency=1),
                LimitRule("t:big:", concurrency=3),
            ]
            # Keys only when asked for: every key above holds tasks.
            assert [r.keys for r in rules] == [(), ()]
            keyed = await queue.limits(with_keys=True)
            assert [sorted(k.key for k in r.keys) for r in keyed] == [["t:a", "t:b"], ["t:big:c"]]


async def test_a_small_key_is_not_stuck_behind_a_deep_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Property (fairness through a Worker): a key with 2,000 tasks and one
    with 10, both at 20/s with burst 1 and enqueued the deep one first: every
    task of the small key starts within 50 ms of its own rate's schedule
    (one every 50 ms from the start), not after the deep key's backlog."""
    with trio.fail_after(GUARD):
        async with RingoTestEnv.start() as env:
            queue = env.client.queue("fair")
            await queue.set_limit("", rate=20, burst=1)
            await enqueue(queue, 2000, limit_key="deep")
            await enqueue(queue, 10, limit_key="small")
            starts: dict[str, list[float]] = {"deep": [], "small": []}

            async def handle(task: Task, ctx: TaskContext) -> None:
                assert task.limit_key is not None
                starts[task.limit_key].append(trio.current_time())

            t0 = trio.current_time()
            async with running(queue.worker(handle, concurrency=4)):
                await trio.sleep(2)
            small = [s - t0 for s in starts["small"]]
            assert len(small) == 10
            assert all(at <= 0.05 * i + 0.05 for i, at in enumerate(small)), small
            assert len(starts["deep"]) >= 35


async def test_a_bad_rule_fails_before_sending(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Property: a rule with neither a rate nor a concurrency, a prefix that
    is not a string, a `per` that is not a non-negative timedelta, or a
    burst or concurrency outside 1 to its maximum fails at once with
    `InvalidArgumentError`, nothing sent and no rule set; the bounds
    themselves are accepted, and a rule of a rate alone or a concurrency
    alone limits only that."""
    async with RingoTestEnv.start() as env:
        queue = env.client.queue("rules")
        sent = count_calls(env.client, monkeypatch)
        bad: list[dict[str, object]] = [
            {},
            {"prefix": 7, "rate": 1.0},
            {"rate": 1.0, "per": 1},
            {"rate": 1.0, "per": timedelta(seconds=-1)},
            {"rate": 1.0, "burst": 0},
            {"rate": 1.0, "burst": limits.MAX_LIMIT_BURST + 1},
            {"concurrency": 0},
            {"concurrency": limits.MAX_LIMIT_CONCURRENCY + 1},
        ]
        for arguments in bad:
            prefix = arguments.pop("prefix", "p:")
            with pytest.raises(InvalidArgumentError):
                await queue.set_limit(prefix, **arguments)  # type: ignore[arg-type]
        assert sent == []
        assert await queue.limits() == []
        await queue.set_limit("p:", rate=1.0, burst=1, concurrency=1)
        await queue.set_limit(
            "q:", rate=1.0, burst=limits.MAX_LIMIT_BURST, concurrency=limits.MAX_LIMIT_CONCURRENCY
        )
        assert [status.rule.prefix for status in await queue.limits()] == ["p:", "q:"]
        # A rate alone caps no key's concurrency, a concurrency alone no rate.
        assert await queue.set_limit("r:", rate=5.0) == LimitRule("r:", rate=5.0)
        assert await queue.set_limit("s:", concurrency=2) == LimitRule("s:", concurrency=2)
