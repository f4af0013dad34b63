"""Fixtures of the engine-agnostic storage suite.

Every test in this directory that takes `engine` (or `engine_kind`) runs once
per engine kind: "sqlite" (a file in the test's scratch dir) and "postgres"
(the real server of tests/_kit/postgres.py). PostgreSQL tests share one database
per test session and each scratch dir gets a schema of its own in it: a
schema is ~15 ms to create and migrate, a fresh database ~150 ms, and the
schema is exactly the unit the engine isolates deployments by.

Engines belong to the daemon, which is asyncio: a PostgreSQL engine will sit
on an asyncio driver and could not run under trio. So the suite drives every
engine on one `asyncio.Runner` per test, behind a thin synchronous facade
(`SyncEngine`, in tests/_kit/storage.py): tests read as plain calls, and the
hypothesis state machine can call the engine from its synchronous rules.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from ringo_trio.server.clock import ManualClock
from tests._kit.postgres import fresh_database
from tests._kit.storage import (
    ENGINE_KINDS,
    ENGINE_NAMES,
    EngineKind,
    SyncEngine,
    open_engine,
    postgres_kind,
)


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


@pytest.fixture
def engine(engine_kind: EngineKind, tmp_path: pathlib.Path) -> Iterator[SyncEngine]:
    with open_engine(engine_kind, tmp_path) as sync:
        yield sync


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
