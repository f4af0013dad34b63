"""What a bench process reads about itself, or a child, from /proc (Linux), and
stopping a child."""

from __future__ import annotations

import json
import os
import pathlib
import resource
import selectors
import subprocess
import time
from typing import Any


def peak_rss_kb(pid: int | str = "self") -> float:
    """A process's peak RSS in KiB: ``VmHWM``, which belongs to its own
    address space. ``ru_maxrss`` does not: Linux carries it over ``execve``,
    so a child spawned by a bigger process reports at least its parent's."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) if pid == "self" else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it cannot be read)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a child process (killed if it lingers 30 s) and close its stdout."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class Lines:
    """The JSON objects a child writes a line each on its stdout, read one at
    a time with a deadline (other lines, e.g. py-spy's, are skipped)."""

    def __init__(self, proc: subprocess.Popen[bytes], who: str = "the child") -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.who = who
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self.buffer:
                    line, _, self.buffer = self.buffer.partition(b"\n")
                    if line.startswith(b"{"):
                        result: dict[str, Any] = json.loads(line)
                        return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.who} said nothing for {timeout:g}s")
                if selector.select(remaining):
                    chunk = os.read(self.fd, 65536)
                    if not chunk:
                        raise RuntimeError(f"{self.who} exited ({self.proc.wait()})")
                    self.buffer += chunk
