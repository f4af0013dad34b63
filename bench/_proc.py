"""What a bench process reads about itself from /proc (Linux)."""

from __future__ import annotations

import pathlib
import resource


def peak_rss_kb() -> float:
    """This process's peak RSS in KiB: ``VmHWM``, which belongs to its own
    address space. ``ru_maxrss`` does not: Linux carries it over ``execve``,
    so a child spawned by a bigger process reports at least its parent's."""
    try:
        status = pathlib.Path("/proc/self/status").read_text()
    except OSError:
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return float(line.split()[1])
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
