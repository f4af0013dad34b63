"""Running `ringo` operator commands as a child process against a real daemon
(the tests of `ringo queues`, `ringo tasks ...` and `ringo enqueue`)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ringo_trio.testing import DaemonProcess, spawn_daemon

CLI = [sys.executable, "-m", "ringo_trio._cli"]
TIMEOUT = 60


def run_ringo(
    daemon: DaemonProcess,
    *args: str,
    stdin: bytes | None = None,
    cwd: pathlib.Path | None = None,
    encoding: str = "utf-8",
) -> subprocess.CompletedProcess[str]:
    """`ringo ARGS... --endpoint DAEMON` (``encoding="latin-1"`` lets any byte
    of stdin and stdout through unchanged)."""
    return subprocess.run(
        [*CLI, *args, "--endpoint", daemon.endpoint],
        capture_output=True,
        timeout=TIMEOUT,
        input=(stdin or b"").decode(encoding),
        text=True,
        encoding=encoding,
        cwd=cwd,
    )


def run_ringo_json(daemon: DaemonProcess, *args: str, **kwargs: Any) -> Any:
    """`run_ringo` with ``--json``, which must succeed; the parsed document."""
    result = run_ringo(daemon, *args, "--json", **kwargs)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One real ``ringod`` (SQLite) for a module's CLI tests."""
    with spawn_daemon(tmp_path_factory.mktemp("cli") / "ringod") as process:
        yield process
