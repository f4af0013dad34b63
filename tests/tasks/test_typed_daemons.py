"""Typed tasks against a real ``ringod`` on each engine: enqueue, the router
worker and awaited results over real sockets."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
import trio

from ringo_trio import PermanentTaskError, Ringo, TaskFailedError, TaskRegistry, TaskState
from ringo_trio.testing import DaemonProcess, spawn_daemon

pytestmark = pytest.mark.trio

GUARD = 40

tasks = TaskRegistry(queue="typed")


@dataclass
class Invoice:
    number: UUID
    issued: datetime
    lines: list[str]


@tasks.task
async def bill(customer: str, lines: list[str]) -> Invoice:
    if not lines:
        raise PermanentTaskError("nothing to bill")
    return Invoice(number=uuid4(), issued=datetime.now(UTC), lines=sorted(lines))


@pytest.fixture(params=["sqlite", "postgres"])
def engine_daemon(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[DaemonProcess]:
    if request.param == "sqlite":
        with spawn_daemon(tmp_path / "data") as d:
            yield d
        return
    with spawn_daemon(None, postgres_dsn=request.getfixturevalue("postgres_dsn")) as d:
        yield d


async def test_results_and_failures_over_a_real_daemon(engine_daemon: DaemonProcess) -> None:
    """Property (both engines): a typed task's return value comes back from
    ``handle.result()`` as the annotated type (a dataclass with a UUID and an
    aware datetime) through the daemon's storage; a task the function
    rejects raises TaskFailedError with its error; a payload that does not
    validate is DEAD on its first attempt."""
    with trio.fail_after(GUARD):
        async with Ringo.connect(engine_daemon.endpoint) as client:
            good = await bill.enqueue(client, "acme", ["b", "a"])
            empty = await bill.enqueue(client, customer="acme", lines=[])
            invalid = await client.queue("typed").enqueue(
                task_type=bill.name, payload=b'{"customer": "acme", "lines": "nope"}'
            )
            async with trio.open_nursery() as nursery:
                worker = tasks.worker(client, concurrency=4)
                await nursery.start(worker.run)
                invoice = await good.result(timeout=GUARD)
                with pytest.raises(TaskFailedError, match="nothing to bill"):
                    await empty.result(timeout=GUARD)
                dead = await client.queue("typed").wait(invalid.task.id, timeout=GUARD)
                await worker.close()
    assert isinstance(invoice, Invoice)
    assert isinstance(invoice.number, UUID)
    assert invoice.issued.tzinfo is not None
    assert invoice.lines == ["a", "b"]
    assert (dead.state, dead.attempt) == (TaskState.DEAD, 1)
    assert "lines" in (dead.last_error or "")
