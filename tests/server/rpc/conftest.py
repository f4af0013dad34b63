"""``push_minor``, the in-process Work-stream tests' two frame forms
(tests/_kit/work_stream.py), and ``make_engine``, a fresh engine of each
kind for the tests that serve a daemon in-process (`tests._kit.grpc_client.serving`),
found here by name."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ringo_trio.server.storage.base import Storage
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from tests._kit.postgres import fresh_database
from tests._kit.work_stream import push_minor as push_minor


@pytest.fixture(params=["postgres", "sqlite"])
def make_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    """A fresh engine of each kind (PostgreSQL: a database of this test's own)."""
    if request.param == "sqlite":
        yield lambda: SQLiteEngine(tmp_path / "ringo.db")
        return
    with fresh_database("ringo_rpc") as dsn:
        yield lambda: PostgresEngine(dsn)
