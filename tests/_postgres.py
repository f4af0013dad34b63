"""The real PostgreSQL server every machine of this project runs (127.0.0.1:5432).

Tests never mock it: each test that needs it gets a database of its own,
created here and dropped (with its connections) when the test ends. The
admin connection goes through `psql`, so creating databases needs no driver.
``RINGO_TEST_POSTGRES`` overrides the server (a libpq URL of its admin DB).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

ADMIN_DSN = os.environ.get("RINGO_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", ADMIN_DSN, "-v", "ON_ERROR_STOP=1", "-qXc", sql],
        check=True,
        capture_output=True,
        timeout=60,
    )


def dsn_for(database: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit(parts._replace(path="/" + database))


@contextmanager
def fresh_database(prefix: str = "ringo_test") -> Iterator[str]:
    """Create an empty database, yield its DSN, drop it (forcibly) afterwards."""
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    _psql(f'CREATE DATABASE "{name}"')
    try:
        yield dsn_for(name)
    finally:
        _psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
