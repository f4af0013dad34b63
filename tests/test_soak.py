"""Soak: many tasks, concurrent claimers, injected failures and daemon crashes.

Marked slow: `nox -s soak` runs it; the default suite does not.
"""

from __future__ import annotations

import os
import pathlib
import random
import signal
from datetime import timedelta

import pytest
import trio

from ringo_trio import (
    LeaseLostError,
    Ringo,
    RingoClient,
    TaskSpec,
    TaskState,
    UnavailableError,
)

TASKS = 20_000
CLAIMERS = 16
KILLS = 2


async def _claimer(client: RingoClient, finished: trio.Event, rng: random.Random) -> None:
    queue = client.queue("soak")
    while not finished.is_set():
        try:
            batch = await queue.claim(
                50,
                wait_timeout=timedelta(milliseconds=200),
                lease_duration=timedelta(seconds=2),
            )
            for leased in batch:
                roll = rng.random()
                if roll < 0.05:
                    await leased.nack("soak failure", delay=timedelta(0))
                elif roll < 0.06:
                    await leased.reject("soak rejection")
                else:
                    await leased.ack()
        except (UnavailableError, LeaseLostError):
            # A crash cut the call off (the daemon may or may not have applied
            # it) or the lease expired meanwhile: the task comes back by itself.
            continue


async def _settled(client: RingoClient) -> int:
    queue = client.queue("soak")
    done = 0
    for i in range(TASKS):
        task = await queue.get_by_unique_key(f"soak-{i}")
        done += task.state in (TaskState.SUCCEEDED, TaskState.DEAD)
    return done


@pytest.mark.slow
@pytest.mark.trio
async def test_soak_no_task_lost_across_daemon_crashes(tmp_path: pathlib.Path) -> None:
    """No task lost, none duplicated: 20,000 tasks worked by 16 concurrent claimers with
    5% nacks and 1% rejects, while the private daemon is SIGKILLed twice mid-run, all
    end SUCCEEDED or DEAD, and exactly 20,000 distinct tasks exist."""
    rng = random.Random(4)
    with trio.fail_after(300):
        async with Ringo.local(tmp_path / "data") as client:
            queue = client.queue("soak")
            result = await queue.enqueue_many(
                TaskSpec(task_type="soak", unique_key=f"soak-{i}", max_attempts=3)
                for i in range(TASKS)
            )
            assert result.created_count == TASKS
            finished = trio.Event()
            async with trio.open_nursery() as nursery:
                for _ in range(CLAIMERS):
                    nursery.start_soon(_claimer, client, finished, rng)
                for _ in range(KILLS):
                    await trio.sleep(3)
                    pid = client.daemon_pid
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
                while True:
                    await trio.sleep(2)
                    try:
                        if await _settled(client) == TASKS:
                            break
                    except UnavailableError:
                        continue
                finished.set()
            again = await queue.enqueue_many(
                TaskSpec(task_type="soak", unique_key=f"soak-{i}") for i in range(TASKS)
            )
            assert again.created_count == 0
            assert again.duplicate_count == TASKS
