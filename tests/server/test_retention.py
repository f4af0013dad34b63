"""The daemon's retention (`server/retention.py`) on its own: the policy's
bounds, and a pass against a store that records its batches, on virtual time.
Retention through a daemon is in tests/queue/test_purge.py (ringod's
defaults over weeks of virtual time) and tests/server/rpc/test_purge.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from ringo_trio._contract.limits import MAX_DELETE_BATCH
from ringo_trio._proto.ringo.v1 import TaskState
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.retention import Retention, RetentionPolicy
from ringo_trio.server.storage.base import Storage, StorageUnavailable
from tests._kit.virtual_daemon import in_background, now, on_virtual_time

NOW = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    "fields",
    [
        {"succeeded": -HOUR},
        {"dead": timedelta(0)},
        {"cancelled": timedelta(0)},
        {"cancelled": -HOUR},
        {"interval": 0.0},
        {"batch": 0},
        {"batch": MAX_DELETE_BATCH + 1},
        {"pause": -0.001},
    ],
)
def test_a_policy_that_cannot_be_honoured_is_refused(fields: dict[str, Any]) -> None:
    """Property: a negative retention, a dead or cancelled retention of no
    time (every such task deleted at once, which `None`'s "forever" is
    easily mistaken for; only succeeded tasks can be kept no time, and
    then their acks delete them), a pass every 0
    seconds, an empty or oversized batch and a negative pause are refused
    when the policy is made, never run."""
    with pytest.raises(ValueError, match=r"retention|interval|batch|pause"):
        RetentionPolicy(**fields)


def test_the_edges_of_a_policy_are_accepted() -> None:
    """Property: the smallest retention, interval and pause and both ends of
    the batch's range are policies a daemon runs."""
    tiny = timedelta(microseconds=1)
    for fields in (
        {"succeeded": tiny, "dead": tiny, "cancelled": tiny},
        {"interval": 0.001, "pause": 0.0},
        {"batch": 1},
        {"batch": MAX_DELETE_BATCH},
    ):
        RetentionPolicy(**fields)  # type: ignore[arg-type]


class _Store:
    """Finished tasks by state, each with its finishing moment; deletes them
    as `Storage.delete_finished` does, recording each batch's virtual time."""

    def __init__(self, finished: dict[TaskState, list[datetime]]) -> None:
        self.finished = {int(s): sorted(at) for s, at in finished.items()}
        self.batches: list[tuple[float, int, int]] = []  # (at, state, deleted)
        self.fail: Exception | None = None

    async def delete_finished(
        self, queue: str | None, states: Sequence[int], before: datetime | None, limit: int
    ) -> int:
        if self.fail is not None:
            raise self.fail
        assert queue is None  # retention: every queue
        [state] = states
        old = [at for at in self.finished.get(state, []) if before is None or at < before][:limit]
        self.finished[state] = self.finished[state][len(old) :]
        self.batches.append((now(), state, len(old)))
        return len(old)


def _retention(store: _Store, policy: RetentionPolicy) -> Retention:
    return Retention(cast(Storage, store), ManualClock(NOW), policy)


@on_virtual_time
async def test_a_pass_deletes_what_is_too_old_batch_after_batch_and_tells_the_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Property: a pass deletes, per retained state, every task that finished
    before its retention, oldest first, `batch` at a time with `pause`
    between batches, until a batch comes back short; it keeps the younger
    ones and the states kept forever, answers how many it deleted, tells
    the daemon's WaitTask calls (a deleted task is NOT_FOUND) and logs
    what it deleted and how long the pass took."""
    store = _Store(
        {
            TaskState.SUCCEEDED: [NOW - 2 * HOUR] * 5 + [NOW - HOUR / 2],
            TaskState.DEAD: [NOW - 2 * HOUR] * 2,
            TaskState.CANCELLED: [NOW - 2 * HOUR],
        }
    )
    retention = _retention(store, RetentionPolicy(succeeded=HOUR, dead=HOUR, batch=2, pause=0.25))
    told: list[float] = []
    retention.deleted_listener = lambda: told.append(now())
    await asyncio.sleep(10)  # the pass does not start at the loop's time 0
    start = now()
    with caplog.at_level(logging.INFO, logger="ringo_trio.server"):
        assert await retention.sweep() == 7
    succeeded, dead = int(TaskState.SUCCEEDED), int(TaskState.DEAD)
    assert [(at - start, state, n) for at, state, n in store.batches] == [
        (0.0, succeeded, 2),
        (0.25, succeeded, 2),
        (0.5, succeeded, 1),
        (0.5, dead, 2),
        (0.75, dead, 0),
    ]
    assert store.finished[succeeded] == [NOW - HOUR / 2]
    assert len(store.finished[int(TaskState.CANCELLED)]) == 1
    assert told == [start + 0.75]
    [record] = caplog.records
    assert record.getMessage() == (
        "retention deleted 7 finished task(s) in 0.75s: 5 SUCCEEDED, 2 DEAD"
    )


@on_virtual_time
async def test_succeeded_tasks_kept_no_time_go_with_their_acks_and_a_pass_takes_the_rest() -> None:
    """Property (``--retain-succeeded never``): a policy keeping succeeded
    tasks no time has the acks delete them (`delete_at_ack`), and its pass
    deletes the SUCCEEDED tasks the acks kept (a waited one, one acked by
    the unary call) once they are an interval old, never younger: a waiter
    woken by the ack reads its task before the pass can take it."""
    policy = RetentionPolicy(succeeded=timedelta(0), interval=60.0)
    assert policy.delete_at_ack
    assert not RetentionPolicy(succeeded=HOUR).delete_at_ack
    assert not RetentionPolicy().delete_at_ack
    minute = timedelta(minutes=1)
    store = _Store({TaskState.SUCCEEDED: [NOW - 2 * minute, NOW - minute / 2]})
    assert await _retention(store, policy).sweep() == 1
    assert store.finished[int(TaskState.SUCCEEDED)] == [NOW - minute / 2]


@on_virtual_time
async def test_a_pass_that_deletes_nothing_tells_nobody() -> None:
    """Property: a quiet pass costs one probe per state and wakes no
    WaitTask recheck."""
    store = _Store({TaskState.SUCCEEDED: [NOW - HOUR / 2]})
    retention = _retention(store, RetentionPolicy(succeeded=HOUR))
    told: list[float] = []
    retention.deleted_listener = lambda: told.append(now())
    assert await retention.sweep() == 0
    assert len(store.batches) == 1
    assert told == []


@pytest.mark.parametrize("error", [StorageUnavailable("down"), RuntimeError("bug")])
@on_virtual_time
async def test_a_failed_pass_is_logged_and_counts_nothing(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """Property: a pass that fails (the database away, a full disk, a bug) is
    logged, says it deleted nothing and never ends the daemon; the next
    pass starts over."""
    store = _Store({TaskState.DEAD: [NOW - 2 * HOUR]})
    store.fail = error
    retention = _retention(store, RetentionPolicy(dead=HOUR))
    told: list[float] = []
    retention.deleted_listener = lambda: told.append(now())
    with caplog.at_level(logging.WARNING, logger="ringo_trio.server"):
        assert await retention.sweep() == 0
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        f"retention pass failed ({error})"
        if isinstance(error, StorageUnavailable)
        else "retention pass failed"
    ]
    assert told == []
    store.fail = None
    assert await retention.sweep() == 1


@on_virtual_time
async def test_passes_come_every_interval_from_one_interval_after_the_start() -> None:
    """Property: the daemon's retention passes run every `interval` seconds
    for its whole life, the first one interval after it starts (not at once:
    a starting daemon has its clients to take back first); a policy that
    keeps everything runs no pass at all."""
    store = _Store({TaskState.DEAD: []})
    start = now()
    async with in_background(_retention(store, RetentionPolicy(dead=HOUR, interval=60)).run()):
        await asyncio.sleep(200)
    assert [at - start for at, _, _ in store.batches] == [60.0, 120.0, 180.0]
    async with asyncio.timeout(1):
        await _retention(store, RetentionPolicy()).run()
    assert len(store.batches) == 3
