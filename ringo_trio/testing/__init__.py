"""Testing kits for code that uses Ringo.

* `RingoTestEnv` (``async with RingoTestEnv.start() as env``): a daemon in the
  test's own process and event loop, a client wired to it without sockets,
  and time that follows the event loop's clock — under trio's
  ``autojump_clock`` a one-hour retry delay passes instantly. See
  docs/testing.md.
* `task_context`: a real `TaskContext` for calling a handler directly,
  recording its progress reports; ``ctx.cancel()`` takes its lease away.
* `spawn_daemon` / `DaemonProcess`: a real ``ringod`` child process, for what
  only a process shows (restarts, signals, the command line).
"""

from ._context import TestTaskContext, task_context
from ._env import RingoTestEnv, TimeMode, Until
from ._process import DaemonProcess, DaemonStartError, spawn_daemon

__all__ = [
    "DaemonProcess",
    "DaemonStartError",
    "RingoTestEnv",
    "TestTaskContext",
    "TimeMode",
    "Until",
    "spawn_daemon",
    "task_context",
]
