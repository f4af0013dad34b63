"""DeleteTasks and retention in the daemon: what a call may ask, what it answers, the
ringod flags, and retention never holding up other calls."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from grpclib.const import Status

from ringo_trio._contract.limits import MAX_DELETE_BATCH
from ringo_trio._proto.grpc.health.v1 import HealthCheckRequest, HealthCheckResponseServingStatus
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    DeleteTasksRequest,
    DeleteTasksResponse,
    GetTaskRequest,
    TaskSpec,
    TaskState,
)
from ringo_trio.server import flags
from ringo_trio.server import main as _main
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.retention import (
    DEFAULT_POSTGRES_RETENTION_BATCH,
    DEFAULT_RETENTION_BATCH,
    RetentionPolicy,
)
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.testing import DaemonProcess
from tests._kit.grpc_client import Client, connect, expect_status, new_queue, ref

pytestmark = pytest.mark.anyio


async def finished(client: Client, queue: str, n: int) -> list[str]:
    """`n` SUCCEEDED tasks of `queue`, in the order they finished; their ids."""
    ids = []
    for _ in range(n):
        await client.enqueue(queue)
        [leased] = await client.claim(queue)
        await client.stub.ack(AckRequest(context=client.context, lease=ref(leased)))
        assert leased.task is not None
        ids.append(leased.task.id)
    return ids


async def delete(client: Client, queue: str, **fields: object) -> DeleteTasksResponse:
    return await client.stub.delete_tasks(
        DeleteTasksRequest(context=client.context, queue=queue, **fields)  # type: ignore[arg-type]
    )


async def exists(client: Client, queue: str, task_id: str) -> bool:
    try:
        await client.stub.get_task(
            GetTaskRequest(context=client.context, queue=queue, task_id=task_id)
        )
    except Exception:
        return False
    return True


async def test_delete_tasks_pages_through_finished_tasks_oldest_first(
    daemon: DaemonProcess,
) -> None:
    """DeleteTasks deletes at most `limit` finished tasks, oldest finished first, and
    says `more` exactly when it stopped at the limit; limit 0 means the maximum.
    Active tasks and other queues are left alone."""
    with anyio.fail_after(30):
        async with connect(daemon) as client:
            queue, other = new_queue(), new_queue()
            ids = await finished(client, queue, 5)
            [kept] = await finished(client, other, 1)
            pending = await client.enqueue(queue)

            first = await delete(client, queue, limit=2)
            assert (first.deleted_count, first.more) == (2, True)
            assert [await exists(client, queue, i) for i in ids] == [False] * 2 + [True] * 3
            rest = await delete(client, queue)
            assert (rest.deleted_count, rest.more) == (3, False)
            assert await exists(client, queue, pending.id)
            assert await exists(client, other, kept)


async def test_delete_tasks_filters_by_state_and_finish_time(daemon: DaemonProcess) -> None:
    """Only the named finished states go, and with `finished_before` only tasks that
    finished before it."""
    with anyio.fail_after(30):
        async with connect(daemon) as client:
            queue = new_queue()
            [ok] = await finished(client, queue, 1)
            by_state = await delete(client, queue, states=[TaskState.DEAD, TaskState.CANCELLED])
            assert by_state.deleted_count == 0
            long_ago = datetime(2000, 1, 1).astimezone()
            by_age = await delete(client, queue, finished_before=long_ago)
            assert by_age.deleted_count == 0
            assert await exists(client, queue, ok)
            done = await delete(client, queue, states=[TaskState.SUCCEEDED])
            assert done.deleted_count == 1


@pytest.mark.parametrize(
    ("fields", "fragments"),
    [
        ({"states": [TaskState.PENDING]}, ("states[0]", "PENDING", "finished")),
        ({"states": [TaskState.SUCCEEDED, TaskState.LEASED]}, ("states[1]", "LEASED")),
        ({"limit": MAX_DELETE_BATCH + 1}, ("limit", str(MAX_DELETE_BATCH))),
        ({"queue": ""}, ("queue",)),
    ],
)
async def test_delete_tasks_refuses_what_it_cannot_do(
    daemon: DaemonProcess, fields: dict[str, object], fragments: Sequence[str]
) -> None:
    """Active states, a limit over MAX_DELETE_BATCH and a missing queue are
    INVALID_ARGUMENT naming the field (and the limit), and nothing is deleted."""
    with anyio.fail_after(30):
        async with connect(daemon) as client:
            queue = new_queue()
            [ok] = await finished(client, queue, 1)
            request = {"queue": queue, **fields}
            await expect_status(
                delete(client, **request),  # type: ignore[arg-type]
                Status.INVALID_ARGUMENT,
                *fragments,
            )
            assert await exists(client, queue, ok)


async def test_a_minor_8_session_cannot_delete(daemon: DaemonProcess) -> None:
    """DeleteTasks needs protocol minor 9: a session negotiated at minor 8 is refused
    UNIMPLEMENTED and nothing is deleted."""
    with anyio.fail_after(30):
        async with connect(daemon) as client, connect(daemon, minor=8) as old:
            queue = new_queue()
            [ok] = await finished(client, queue, 1)
            await expect_status(delete(old, queue), Status.UNIMPLEMENTED, "minor 9")
            assert await exists(client, queue, ok)


# -- ringod's flags --------------------------------------------------------------


def ringod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ringo_trio.server", *args],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def test_ringod_documents_its_retention_flags() -> None:
    """--help names every retention flag, its default and how to turn it off."""
    out = ringod("--help").stdout
    for text in (
        "--retain-succeeded",
        "--retain-dead",
        "--retain-cancelled",
        "--retention-interval",
        "--retention-batch",
        "forever",
        "30d",
    ):
        assert text in out, text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--retain-dead", "0"], "forever"),
        (["--retain-succeeded", "soon"], "not a duration"),
        (["--retention-batch", str(MAX_DELETE_BATCH + 1)], str(MAX_DELETE_BATCH)),
        (["--retention-interval", "0"], "positive"),
    ],
)
def test_ringod_refuses_a_bad_retention(args: list[str], fragment: str) -> None:
    """A retention flag ringod cannot honour is a usage error (exit 2) that says why,
    never a silent default."""
    result = ringod(*args)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr


# -- retention and the other calls -------------------------------------------------


class CountingEngine(SQLiteEngine):
    """The real engine, counting the retention batches it has committed."""

    batches = 0

    async def delete_finished(
        self,
        queue: str | None,
        states: Sequence[int],
        finished_before: datetime | None,
        limit: int,
    ) -> int:
        deleted = await super().delete_finished(queue, states, finished_before, limit)
        self.batches += 1
        return deleted


async def test_health_is_answered_while_retention_purges(tmp_path: Path) -> None:
    """While the daemon's retention deletes 20,000 dead tasks (SQLite, on the event
    loop), health checks keep being answered between its batches: a purge never
    holds the loop for more than one batch."""
    total, batch = 20_000, 500
    engine = CountingEngine(tmp_path / "ringo.db")
    policy = RetentionPolicy(dead=timedelta(hours=1), batch=batch, interval=3600)
    daemon = Daemon(DaemonConfig(host="127.0.0.1", port=0, retention=policy), engine)
    # Dead a day ago; filled before the daemon serves, so its reaper sees none of it.
    await engine.open()
    past = datetime.now(UTC) - timedelta(days=1)
    for _ in range(total // 1000):
        await engine.enqueue("q", [TaskSpec(task_type="t", max_attempts=1)] * 1000, past)
        await engine.claim("q", [], 1000, "w", timedelta(seconds=1), past)
    assert await engine.expire_leases(past + timedelta(seconds=2)) == total
    stop = asyncio.Event()
    ready = anyio.Event()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            # Its first pass is an interval (an hour) away: the test runs one itself.
            tg.start_soon(daemon.serve, stop, lambda _daemon: ready.set())
            await ready.wait()
            try:
                batches_at_answers: list[int] = []
                async with connect(daemon.endpoint, negotiate=False) as client:
                    purging = anyio.Event()

                    async def check_health() -> None:
                        await purging.wait()
                        while engine.batches <= total // batch:
                            reply = await client.health.check(HealthCheckRequest())
                            assert reply.status is HealthCheckResponseServingStatus.SERVING
                            batches_at_answers.append(engine.batches)

                    async with anyio.create_task_group() as checks:
                        checks.start_soon(check_health)
                        await client.health.check(HealthCheckRequest())  # connected
                        purging.set()
                        assert await daemon.retention.sweep() == total
            finally:
                stop.set()
    during = [n for n in batches_at_answers if 0 < n < total // batch]
    assert len(set(during)) > 1, batches_at_answers


def test_ringod_sizes_retention_batches_by_engine() -> None:
    """Without --retention-batch, a batch is small on SQLite (it holds the event loop)
    and larger on PostgreSQL (where each commit costs a WAL flush instead); the
    flag, when given, wins on both."""
    sqlite = flags.StorageChoice(data_dir=Path("data"))
    postgres = flags.StorageChoice(postgres_dsn="postgresql://db/ringo")
    assert _main._retention_batch_for(None, sqlite) == DEFAULT_RETENTION_BATCH
    assert _main._retention_batch_for(None, postgres) == DEFAULT_POSTGRES_RETENTION_BATCH
    assert DEFAULT_RETENTION_BATCH < DEFAULT_POSTGRES_RETENTION_BATCH
    assert _main._retention_batch_for(7, sqlite) == _main._retention_batch_for(7, postgres) == 7
