from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._kit.postgres import fresh_database


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    """A DSN of an empty PostgreSQL database that exists for this test only."""
    with fresh_database() as dsn:
        yield dsn
