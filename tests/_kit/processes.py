"""Probes of processes and ports, and polling for state outside the test's control."""

from __future__ import annotations

import os
import pathlib
import socket
from collections.abc import Callable

import anyio

from ringo_trio import RingoClient


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


async def eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` (state outside our control: processes, other threads)."""
    with anyio.fail_after(within):
        while True:
            if predicate():
                return
            await anyio.sleep(0.02)
