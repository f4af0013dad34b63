"""The storage metrics of a group commit (`instrument_storage` on settle_many)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
from ringo_trio.server.http.metrics import PrometheusMetrics, instrument_storage
from ringo_trio.server.storage.base import Ack, LeaseLost, Nack, Reject
from ringo_trio.server.storage.sqlite import SQLiteEngine

pytestmark = pytest.mark.anyio

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def _ref(leased: object) -> LeaseRef:
    lease = leased.lease  # type: ignore[attr-defined]
    return LeaseRef(task_id=lease.task_id, attempt=lease.attempt, lease_token=lease.lease_token)


async def test_a_group_commit_counts_each_settled_item_by_queue(tmp_path: Path) -> None:
    """Property: settle_many counts each item that took
    effect as acked, nacked or rejected under its task's queue, a lost item
    as nothing, and is timed as one settle_many storage call each."""
    metrics = PrometheusMetrics()
    engine = SQLiteEngine(tmp_path / "ringo.db")
    await engine.open()
    try:
        instrument_storage(engine, metrics)
        for queue in ("a", "b"):
            await engine.enqueue(queue, [TaskSpec(task_type="t") for _ in range(3)], NOW)
        lease = timedelta(minutes=1)
        a = [_ref(x) for x in await engine.claim("a", [], 3, "w", lease, NOW)]
        b = [_ref(x) for x in await engine.claim("b", [], 3, "w", lease, NOW)]
        answers = await engine.settle_many(
            [Ack(a[0]), Nack(a[1], "e"), Reject(b[0], "e"), Ack(a[0]), Ack(b[1])], NOW
        )
        assert [isinstance(a, str) for a in answers] == [True, True, True, False, True]
        assert isinstance(answers[3], LeaseLost)
        assert await engine.settle_many([Ack(b[2]), Nack(a[2], "e")], NOW) == ["b", "a"]
    finally:
        await engine.close()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("ringo_tasks_acked_total", queue="a") == 1
    assert sample("ringo_tasks_acked_total", queue="b") == 2
    assert sample("ringo_tasks_nacked_total", queue="a") == 2
    assert sample("ringo_tasks_rejected_total", queue="b") == 1
    assert not sample("ringo_tasks_rejected_total", queue="a")
    assert sample("ringo_storage_call_seconds_count", operation="settle_many") == 2
    assert not sample("ringo_storage_call_seconds_count", operation="ack")
