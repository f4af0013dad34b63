"""Fixtures of the daemon tests: real ``ringod`` processes, asyncio clients."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ringo_trio.testing import DaemonProcess, spawn_daemon


@pytest.fixture
def anyio_backend() -> str:
    # grpclib (client and server) is asyncio-only.
    return "asyncio"


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon shared by every test that isolates itself by queue name."""
    with spawn_daemon(tmp_path_factory.mktemp("shared") / "data") as process:
        yield process
    assert process.process.returncode == 0, process.stderr_text()
