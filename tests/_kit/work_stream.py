"""The daemon's Work stream in-process against a fake stream (faults on cue), and the
Work-stream tests' helpers over gRPC: a registered worker, enqueue, result checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ringo_trio._contract import versions
from ringo_trio._contract.work import server as machine
from ringo_trio._proto.ringo.v1 import (
    EnqueueManyRequest,
    ErrorCode,
    LeasedTask,
    NegotiateRequest,
    RequestContext,
    TaskSpec,
    WorkRequest,
    WorkResponse,
    WorkResult,
)
from ringo_trio.server.clock import Clock
from ringo_trio.server.rpc.service import QueueService
from ringo_trio.server.rpc.sessions import SessionTable
from ringo_trio.server.rpc.wakeups import LeaseReaper, QueueWakeups
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.grpc_client import Client, WorkStream, elements, open_work


@asynccontextmanager
async def worker(client: Client, queue: str, **registration: Any) -> AsyncIterator[WorkStream]:
    """A registered Work stream on `queue`."""
    async with open_work(client) as work:
        await work.register(queue, **registration)
        yield work


def ok(result: WorkResult) -> WorkResult:
    assert result.error is None, result.error
    return result


def refused(result: WorkResult, code: ErrorCode, **metadata: str) -> WorkResult:
    assert result.error is not None, f"request {result.request_id} was not refused"
    assert result.error.code == code, result.error
    for key, value in metadata.items():
        assert result.error.metadata.get(key) == value, result.error
    return result


async def enqueue_n(client: Client, queue: str, count: int) -> list[str]:
    response = await client.stub.enqueue_many(
        EnqueueManyRequest(
            context=client.context,
            queue=queue,
            tasks=[TaskSpec(task_type="t", payload=str(i).encode()) for i in range(count)],
        )
    )
    return [r.task.id for r in response.results if r.task is not None]


class FakeStream:
    """`WorkStreamIO` whose sends of task frames can be made to fail or hang."""

    def __init__(self, on_task: Callable[[int], Any] | None = None) -> None:
        self.inbox: asyncio.Queue[WorkRequest | None] = asyncio.Queue()
        self.received = 0
        self.sent: list[WorkResponse] = []
        self.task_sends = 0
        self._on_task = on_task
        self._changed = asyncio.Event()

    async def recv_message(self) -> WorkRequest | None:
        message = await self.inbox.get()
        self.received += 1
        self._poke()
        return message

    async def send_message(self, message: WorkResponse) -> None:
        if message.task is not None or message.batch is not None:
            self.task_sends += 1
            if self._on_task is not None:
                await self._on_task(self.task_sends)
        # What the worker would decode, so the daemon's own encoding is checked.
        self.sent.append(WorkResponse.parse(bytes(message)))
        self._poke()

    def _poke(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    @property
    def tasks(self) -> list[LeasedTask]:
        return [m.task for sent in self.sent for m in elements(sent) if m.task is not None]


@pytest.fixture(params=[9, 10], ids=["minor9", "minor10-split"])
def push_minor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The in-process push tests at both frame forms: minor 9 sends a frame per
    push; at minor 10 every message is cut down to one push, so a message's
    fate is again one lease's (`test_a_batch_*` cover whole batches)."""
    if request.param >= 10:
        monkeypatch.setattr(machine, "PUSH_MESSAGE_BYTES", 1)
    return int(request.param)


@asynccontextmanager
async def in_process(
    tmp_path: Path, clock: Clock | None = None, minor: int = versions.MINOR
) -> AsyncIterator[tuple[QueueService, SQLiteEngine, Any]]:
    engine = SQLiteEngine(tmp_path / "ringo.db")
    await engine.open()
    clock = clock or Clock()
    wakeups = QueueWakeups()
    service = QueueService(
        engine,
        clock=clock,
        sessions=SessionTable(timedelta(hours=1)),
        served_minor=versions.MINOR,
        wakeups=wakeups,
        reaper=LeaseReaper(engine, clock, wakeups),
    )
    negotiated = await service.negotiate(NegotiateRequest(protocol_major=1, protocol_minor=minor))
    context = RequestContext(1, negotiated.protocol_minor, negotiated.session_token)
    try:
        yield service, engine, context
    finally:
        await engine.close()
