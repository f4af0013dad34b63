"""The PostgreSQL server the PostgreSQL rows run on (ours and procrastinate's):
``$RINGO_BENCH_POSTGRES``, default the local test server; every run gets a
fresh database, dropped afterwards."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import _proc

ADMIN = os.environ.get("RINGO_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def psql(sql: str, dsn: str = ADMIN) -> str:
    done = subprocess.run(
        ["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qAtXc", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the server; yields its DSN."""
    name = f"ringo_bench_{os.getpid()}_{secrets.token_hex(4)}"
    psql(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(ADMIN)._replace(path="/" + name))
    finally:
        psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def server_cpu(dsn: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving `dsn`'s database
    (readable when the server runs on this machine; empty otherwise)."""
    database = urlsplit(dsn).path.lstrip("/")
    out = psql(f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}'")
    return {int(pid): _proc.cpu_seconds(int(pid)) for pid in out.split()}


def cpu_since(dsn: str, before: dict[int, float]) -> float:
    """CPU seconds the database's backends used since `before` (server_cpu)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in server_cpu(dsn).items())
