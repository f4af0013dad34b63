"""One daemon per data dir: an flock'd lock file holding the owner's pid.

``flock`` is released by the kernel when the holder dies, even on SIGKILL,
so a crashed daemon never leaves a stale lock behind; the pid in the file is
only there to tell a refused second daemon *who* holds the directory. The
file is never deleted: unlinking a lock file lets a third process lock a
fresh inode while the second still holds the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib

__all__ = ["LOCK_FILE_NAME", "DataDirLock", "DataDirLocked"]

LOCK_FILE_NAME = "ringod.lock"


class DataDirLocked(Exception):
    def __init__(self, data_dir: pathlib.Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not recorded yet"
        super().__init__(f"data dir {data_dir} is in use by another ringod ({holder})")
        self.data_dir = data_dir
        self.pid = pid


class DataDirLock:
    """Held from `acquire` until `release` (or process exit)."""

    def __init__(self, data_dir: pathlib.Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirLocked(self.data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # Closing drops the flock; the stale pid left behind is harmless
            # because only the flock means "held".
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        return int(text)
    except (OSError, ValueError):
        return None
