"""Testing kits for code that uses Ringo.

* `RingoTestEnv` (``async with RingoTestEnv.start() as env``): a daemon in the
  test's own process and event loop, a client wired to it without sockets,
  and time that follows the event loop's clock — under trio's
  ``autojump_clock`` a one-hour retry delay passes instantly. See
  docs/testing.md.
* `spawn_daemon` / `DaemonProcess`: a real ``ringod`` child process, for what
  only a process shows (restarts, signals, the command line).
"""

from ._env import RingoTestEnv, TimeMode
from ._process import DaemonProcess, DaemonStartError, spawn_daemon

__all__ = ["DaemonProcess", "DaemonStartError", "RingoTestEnv", "TimeMode", "spawn_daemon"]
