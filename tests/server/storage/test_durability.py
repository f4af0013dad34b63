"""Durability: what a call committed survives kill -9 of the process that made it."""

from __future__ import annotations

from ringo_trio._proto.ringo.v1 import LeaseRef, Task, TaskState
from tests._kit.storage import LEASE, EngineKind, SyncEngine, ref_of, spec
from tests._kit.storage import run_and_kill as _run_and_kill


def test_committed_work_survives_kill_9(engine_kind: EngineKind, engine: SyncEngine) -> None:
    """Durable across kill -9: every call that returned in a process killed right after
    (no close, no checkpoint) is there, field for field, when the data is reopened --
    created tasks, dedupe, ack, nack, reject, extend, progress, retry, expiry."""
    # The fixture's engine stays idle; the child works on the same data.
    out = _run_and_kill(engine_kind, engine)
    engine.reopen()
    token = out.pop("token")
    assert set(out) == {"acked", "nacked", "rejected", "leased", "retried", "expired", "pending"}
    for name, hexed in out.items():
        committed = Task.parse(bytes.fromhex(hexed))
        assert engine.get("q", task_id=committed.id) == committed, name
    assert engine.activity("q", []) == 5  # pending + nacked + leased + retried + expired
    states = {name: Task.parse(bytes.fromhex(h)).state for name, h in out.items()}
    assert states["retried"] == TaskState.PENDING
    assert states["rejected"] == TaskState.DEAD
    assert states["leased"] == TaskState.LEASED
    # The surviving lease is still the live one: its token works after the restart.
    leased = Task.parse(bytes.fromhex(out["leased"]))
    assert leased.lease_until is not None
    ref = LeaseRef(task_id=leased.id, attempt=leased.attempt, lease_token=token)
    assert engine.ack(ref, leased.lease_until - LEASE).state == TaskState.SUCCEEDED


def test_a_reopened_engine_keeps_everything(engine: SyncEngine) -> None:
    """A clean close and reopen keeps tasks, keys and leases."""
    from ringo_trio.server.clock import ManualClock

    now = ManualClock().now()
    [out] = engine.enqueue("q", [spec(unique_key="k")], now)
    [lt] = engine.claim("q", [], 1, "w", LEASE, now)
    engine.reopen()
    assert engine.get("q", unique_key="k") == lt.task
    [dup] = engine.enqueue("q", [spec(unique_key="k")], now)
    assert not dup.created
    assert dup.task.id == out.task.id
    assert engine.ack(ref_of(lt), now).state == TaskState.SUCCEEDED
