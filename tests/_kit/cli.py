"""Running `ringo` operator commands as a child process against a real daemon
(the tests of `ringo queues`, `ringo tasks ...` and `ringo enqueue`), and
`Child`, a long-running ``ringo`` process whose output is read line by line
(``ringo worker``, the supervisor)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import selectors
import subprocess
import sys
import time
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


CLI = [sys.executable, "-m", "ringo_trio._cli"]


class Child:
    """A ``ringo`` child process whose stdout+stderr are read line by line."""

    def __init__(self, cwd: pathlib.Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CLI, *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        self._fd = self.proc.stdout.fileno()
        self._buffer = b""
        self.lines: list[str] = []

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """The first output line (old or new) matching ``pattern``; fails after ``timeout``."""
        return self.wait_for_all(pattern, 1, timeout)[0]

    def wait_for_all(self, pattern: str, count: int, timeout: float = 20.0) -> list[re.Match[str]]:
        """The first ``count`` output lines (old or new) matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            matches = [m for line in self.lines if (m := re.search(pattern, line))]
            if len(matches) >= count:
                return matches[:count]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(
                    f"{len(matches)}/{count} lines matching {pattern!r} within {timeout}s:"
                    f" {self.lines}"
                )
            if not self._read(remaining):
                pytest.fail(f"exited before printing {pattern!r}: {self.lines}")

    def _read(self, timeout: float) -> bool:
        """Read what arrives within ``timeout`` into `lines`; False at end of output."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._fd, selectors.EVENT_READ)
            if selector.select(timeout):
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    return False
                self._buffer += chunk
                *complete, self._buffer = self._buffer.split(b"\n")
                self.lines += [line.decode() for line in complete]
        return True

    def finish(self, timeout: float = 20.0) -> int:
        """Wait for the exit and the end of the output — which every process
        sharing it (its children too) must close — killing it after ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            self.proc.wait(timeout=timeout)
            while (remaining := deadline - time.monotonic()) > 0 and self._read(remaining):
                pass
        except subprocess.TimeoutExpired:
            pass
        if self.proc.returncode is None or deadline - time.monotonic() <= 0:
            self.kill()
            pytest.fail(f"ringo (or a child sharing its output) outlived {timeout}s: {self.lines}")
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if self._buffer:
            self.lines.append(self._buffer.decode())
            self._buffer = b""
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
