"""Durability: what a call committed survives kill -9 of the process that made it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from ringo_trio._proto.ringo.v1 import LeaseRef, Task, TaskState

from .conftest import LEASE, EngineKind, SyncEngine, ref_of, spec

# Runs in a child process: every mutation kind, each awaited to completion
# (committed), then the last task's bytes are printed and the process kills
# itself with SIGKILL -- no close(), no checkpoint, no atexit.
_CHILD = """
import asyncio, os, pathlib, signal, sys
from datetime import UTC, datetime, timedelta
from ringo_trio._proto.ringo.v1 import LeaseRef, TaskSpec
{imports}

def ref(lt):
    return LeaseRef(task_id=lt.lease.task_id, attempt=lt.lease.attempt,
                    lease_token=lt.lease.lease_token)

async def main():
    engine = {source}
    await engine.open()
    now = datetime(2030, 1, 1, tzinfo=UTC)
    tasks = {{}}
    outs = await engine.enqueue(
        "q", [TaskSpec(task_type="t", unique_key=f"k{{i}}", payload=bytes([i]))
              for i in range(7)], now)
    outs += await engine.enqueue("q", [TaskSpec(task_type="t", unique_key="k0")], now)
    assert not outs[-1].created
    leased = await engine.claim("q", [], 6, "w", timedelta(seconds=30), now)
    tasks["acked"] = await engine.ack(ref(leased[0]), now)
    tasks["nacked"] = await engine.nack(ref(leased[1]), "e", timedelta(hours=1), now)
    tasks["rejected"] = await engine.reject(ref(leased[2]), "r", now)
    await engine.extend_lease(ref(leased[3]), timedelta(minutes=9), now)
    await engine.report_progress(ref(leased[3]), 3, 4, "p", now)
    tasks["leased"] = await engine.get("q", task_id=leased[3].task.id)
    await engine.ack(ref(leased[5]), now)
    tasks["retried"] = await engine.retry("q", now, task_id=leased[5].task.id)
    await engine.expire_leases(now + timedelta(seconds=30))
    tasks["expired"] = await engine.get("q", task_id=leased[4].task.id)
    tasks["pending"] = await engine.get("q", unique_key="k6")
    # The last token, so the parent can prove the lease itself survived.
    print("token", leased[3].lease.lease_token)
    for name, task in tasks.items():
        print(name, bytes(task).hex())
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def _run_and_kill(kind: EngineKind, engine: SyncEngine) -> dict[str, str]:
    script = _CHILD.format(imports=kind.imports, source=kind.source(engine.scratch))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines())


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
