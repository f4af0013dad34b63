"""Testing kits for code that uses Ringo.

* `RingoTestEnv` (``async with RingoTestEnv.start() as env``): a daemon in the
  test's own process and event loop, a client wired to it without sockets,
  and time that follows the event loop's clock — under trio's
  ``autojump_clock`` a one-hour retry delay passes instantly. On a real
  clock it raises `RealClockError` (``time="real"`` if that is meant). See
  docs/testing.md.
* `AutojumpEventLoop`: the same virtual time under asyncio (anyio's pytest
  plugin: ``anyio_backend = ("asyncio", {"loop_factory": AutojumpEventLoop})``).
* `task_context`: a real `TaskContext` for calling a handler directly,
  recording its progress reports; ``ctx.cancel()`` takes its lease away.
* `spawn_daemon` / `DaemonProcess`: a real ``ringod`` child process, for what
  only a process shows (restarts, signals, the command line).
"""

from ._autojump import AutojumpEventLoop
from ._context import TestTaskContext, task_context
from ._env import RingoTestEnv, TimeMode, Until, run_worker
from ._process import DaemonProcess, DaemonStartError, spawn_daemon
from ._virtual import RealClockError

__all__ = [
    "AutojumpEventLoop",
    "DaemonProcess",
    "DaemonStartError",
    "RealClockError",
    "RingoTestEnv",
    "TestTaskContext",
    "TimeMode",
    "Until",
    "run_worker",
    "spawn_daemon",
    "task_context",
]
