"""`TaskQueue.enqueue_many` over a compact EnqueueMany reply (minor 11) and
over the full echo (minor 10): the user sees the tasks it created whole."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import trio

from ringo_trio import Ringo, TaskSpec, TaskState
from ringo_trio._contract import versions
from ringo_trio.testing import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.trio


@pytest.fixture(params=[versions.MINOR, 10], ids=lambda minor: f"minor{minor}")
def ringod(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[DaemonProcess]:
    with spawn_daemon(tmp_path / "data", protocol_minor=request.param) as daemon:
        yield daemon


async def test_created_tasks_come_back_with_their_payload(ringod: DaemonProcess) -> None:
    """Property: at minor 11 (a reply without payloads) and at minor 10 (the
    full echo), every created task comes back with the payload it was sent
    with; a duplicate comes back whole at minor 10 and without payload and
    result at minor 11, where `get_by_id` reads it whole."""
    with trio.fail_after(60):
        async with Ringo.connect(ringod.endpoint) as client:
            assert client.protocol_minor == ringod.protocol_minor
            queue = client.queue("q")
            first = await queue.enqueue(TaskSpec("t", b"original", unique_key="dup"))
            specs = [TaskSpec("t", bytes([i]) * (i + 1), unique_key=f"k{i}") for i in range(50)]
            batch = await queue.enqueue_many([*specs, TaskSpec("t", b"other", unique_key="dup")])
            assert (batch.created_count, batch.duplicate_count) == (50, 1)
            for spec, result in zip(specs, batch.results, strict=False):
                assert result.created
                assert result.task.payload == spec.payload
                assert result.task.state is TaskState.PENDING
                assert (await queue.get_by_id(result.task.id)).payload == spec.payload
            duplicate = batch.results[-1]
            assert not duplicate.created
            assert duplicate.task.id == first.task.id
            compact = client.protocol_minor >= 11
            assert duplicate.task.payload == (b"" if compact else b"original")
            assert (await queue.get_by_id(duplicate.task.id)).payload == b"original"


async def test_a_batch_too_big_to_echo_keeps_its_payloads(ringod: DaemonProcess) -> None:
    """Property: 60 tasks of 100 KB (an echo over 4 MiB, so the reply is
    compact at either minor) come back with their payloads; resubmitting
    creates nothing."""
    with trio.fail_after(60):
        async with Ringo.connect(ringod.endpoint) as client:
            queue = client.queue("big")
            specs = [TaskSpec("t", bytes([i]) * 100_000, unique_key=f"b{i}") for i in range(60)]
            batch = await queue.enqueue_many(specs)
            assert batch.created_count == 60
            assert [r.task.payload for r in batch.results] == [s.payload for s in specs]
            again = await queue.enqueue_many(specs)
            assert (again.created_count, again.duplicate_count) == (0, 60)
            assert all(r.task.payload == b"" for r in again.results)
