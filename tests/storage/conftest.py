"""Fixtures of the engine-agnostic storage suite.

Every test in this directory that takes `engine` (or `engine_kind`) runs once
per engine kind: "sqlite" (a file in the test's scratch dir) and "postgres"
(the real server of tests/_postgres.py). PostgreSQL tests share one database
per test session and each scratch dir gets a schema of its own in it: a
schema is ~15 ms to create and migrate, a fresh database ~150 ms, and the
schema is exactly the unit the engine isolates deployments by.

Engines belong to the daemon, which is asyncio: a PostgreSQL engine will sit
on an asyncio driver and could not run under trio. So the suite drives every
engine on one `asyncio.Runner` per test, behind a thin synchronous facade
(`SyncEngine`): tests read as plain calls, and the hypothesis state machine
can call the engine from its synchronous rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import pathlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from ringo_trio._proto.ringo.v1 import LeasedTask, LeaseRef, TaskSpec
from ringo_trio.server.clock import ManualClock
from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._postgres import fresh_database


@dataclass(frozen=True)
class EngineKind:
    """How to build one engine kind.

    `make(scratch)` must return an engine over the same data every time it is
    called with the same scratch dir (tests reopen). `source(scratch)` is a
    Python expression that builds that engine in another process, after
    `imports` has run (the kill -9 durability test).
    """

    name: str
    make: Callable[[pathlib.Path], Storage]
    source: Callable[[pathlib.Path], str]
    imports: str


def schema_for(scratch: pathlib.Path) -> str:
    """The PostgreSQL schema that stands for a scratch dir."""
    return "t_" + hashlib.sha256(str(scratch).encode()).hexdigest()[:20]


def postgres_kind(dsn: str) -> EngineKind:
    """PostgreSQL engines on database `dsn`, one schema per scratch dir."""
    return EngineKind(
        name="postgres",
        make=lambda scratch: PostgresEngine(dsn, schema=schema_for(scratch)),
        source=lambda scratch: f"PostgresEngine({dsn!r}, schema={schema_for(scratch)!r})",
        imports="from ringo_trio.server.storage.postgres import PostgresEngine",
    )


ENGINE_KINDS: dict[str, EngineKind] = {
    "sqlite": EngineKind(
        name="sqlite",
        make=lambda scratch: SQLiteEngine(scratch / "ringo.db"),
        source=lambda scratch: f"SQLiteEngine(pathlib.Path({str(scratch / 'ringo.db')!r}))",
        imports="from ringo_trio.server.storage.sqlite import SQLiteEngine",
    ),
}
ENGINE_NAMES = ["postgres", "sqlite"]


class SyncEngine:
    """Calls the engine's coroutines to completion on a private asyncio loop."""

    def __init__(self, kind: EngineKind, scratch: pathlib.Path, runner: asyncio.Runner) -> None:
        self.kind = kind
        self.scratch = scratch
        self._runner = runner
        self.raw: Storage = kind.make(scratch)
        self.run(self.raw.open())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self._runner.run(coro)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.raw, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(method(*args, **kwargs))

        return call

    def reopen(self) -> None:
        """Close and open a fresh engine over the same data."""
        self.run(self.raw.close())
        self.raw = self.kind.make(self.scratch)
        self.run(self.raw.open())


@pytest.fixture(scope="session")
def storage_database() -> Iterator[str]:
    """One PostgreSQL database for the session's storage tests (dropped at the end)."""
    with fresh_database("ringo_storage") as dsn:
        yield dsn


@pytest.fixture(params=ENGINE_NAMES)
def engine_kind(request: pytest.FixtureRequest) -> EngineKind:
    if request.param == "postgres":
        return postgres_kind(request.getfixturevalue("storage_database"))
    return ENGINE_KINDS[request.param]


@contextlib.contextmanager
def open_engine(kind: EngineKind, scratch: pathlib.Path) -> Iterator[SyncEngine]:
    """An open engine of `kind` on its own loop, closed afterwards."""
    with asyncio.Runner() as runner:
        sync = SyncEngine(kind, scratch, runner)
        try:
            yield sync
        finally:
            sync.run(sync.raw.close())


@pytest.fixture
def engine(engine_kind: EngineKind, tmp_path: pathlib.Path) -> Iterator[SyncEngine]:
    with open_engine(engine_kind, tmp_path) as sync:
        yield sync


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# -- helpers shared by the test modules ---------------------------------------

LEASE = timedelta(seconds=30)


def spec(task_type: str = "t", **fields: Any) -> TaskSpec:
    return TaskSpec(task_type=task_type, **fields)


def ref_of(leased: LeasedTask) -> LeaseRef:
    assert leased.lease is not None
    return LeaseRef(
        task_id=leased.lease.task_id,
        attempt=leased.lease.attempt,
        lease_token=leased.lease.lease_token,
    )


def claim_one(
    engine: SyncEngine, now: datetime, queue: str = "q", lease: timedelta = LEASE
) -> LeasedTask:
    leased = engine.claim(queue, [], 1, "w1", lease, now)
    assert len(leased) == 1, leased
    return leased[0]  # type: ignore[no-any-return]
