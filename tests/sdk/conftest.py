"""Fixtures shared by the SDK tests: real daemons (remote and local) and process probes."""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Callable, Iterator

import anyio
import pytest

from ringo_trio import Ringo, RingoClient
from ringo_trio._contract import versions
from ringo_trio.testing import DaemonProcess, spawn_daemon


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as dead)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the parenthesised command name.
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture(params=[9, 11], ids=["minor9", "minor11"])
def sdk_minor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The Work-stream tests that matter run at both frame forms: the SDK
    negotiates minor 9 (a frame per command and per push) or 10 (batch
    frames both ways)."""
    monkeypatch.setattr(versions, "MINOR", request.param)
    return int(request.param)


@pytest.fixture
def daemon(tmp_path: pathlib.Path) -> Iterator[DaemonProcess]:
    """A ringod on a fixed port, so a restart (after kill) comes back where clients look."""
    port = free_port()
    with spawn_daemon(tmp_path / "remote", extra_args=["--listen", f"127.0.0.1:{port}"]) as d:
        yield d


@pytest.fixture(params=["local", "remote"])
def make_client(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Callable[[], RingoClient]:
    """A factory of (unentered) clients: Ringo.local on tmp_path, or Ringo.connect to a ringod."""
    if request.param == "local":
        return lambda: Ringo.local(tmp_path / "local")
    remote: DaemonProcess = request.getfixturevalue("daemon")
    return lambda: Ringo.connect(remote.endpoint)


def kill_local_daemon(client: RingoClient) -> int:
    pid = client.daemon_pid
    assert pid is not None
    os.kill(pid, 9)
    return pid


def live_daemon_children() -> list[str]:
    """Command lines of this process's children that are live ringo daemons."""
    mine = os.getpid()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == mine and fields[0] not in ("Z", "X") and b"ringo" in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.fixture(autouse=True)
def no_leaked_daemons() -> Iterator[None]:
    """Every SDK test ends with no daemon child left running that it started
    (a session-scoped daemon of another directory's fixtures may outlive it)."""
    before = set(live_daemon_children())
    yield
    assert [d for d in live_daemon_children() if d not in before] == []


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` (state outside our control: processes, other threads)."""
    with anyio.fail_after(within):
        while True:
            if predicate():
                return
            await anyio.sleep(0.02)
