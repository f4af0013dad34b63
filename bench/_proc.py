"""What a bench process reads about itself, or a child, from /proc (Linux), and
stopping a child."""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess


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
