"""The worker process's side of `ringo supervise`: reports and the loop watchdog.

Theory of operation
-------------------
A supervisor (`ringo_trio._supervise.parent.Supervisor`) starts each worker process
with the write end of a pipe inherited as file descriptor
``$RINGO_SUPERVISOR_FD``. Importing this module takes that descriptor over —
it removes the variable and makes the descriptor non-inheritable, so nothing
this process starts can write into the pipe — and switches it to
non-blocking. Everything here is a no-op in an unsupervised process, so the
worker can call it unconditionally.

The child writes newline-delimited JSON, one ``os.write`` per message. A
write of at most ``PIPE_BUF`` bytes to a pipe is atomic, so messages written
by the event loop and by the watchdog thread never interleave and no lock is
needed (a lock is exactly what a fence report from a thread must not wait
on):

``{"kind": "heartbeat"}``
    From the event loop, several times per stall threshold. The supervisor
    kills a process whose reports stop (it is stopped, or the interpreter is
    stuck where no Python thread runs).
``{"kind": "ready", "worker_id": ...}``
    The worker registered with the daemon.
``{"kind": "fenced", "reason": ...}``
    This process must be replaced: a handler ignored cancellation past its
    grace (the worker reports it) or blocked the event loop (the watchdog
    thread reports it). The supervisor SIGKILLs the process on receipt.

Writes never block and never raise: a full pipe drops a heartbeat (the fence
is kept and re-sent with the next heartbeat); a broken pipe means the
supervisor is gone, which the heartbeat task turns into a drain of this
worker, so a worker never outlives its supervisor for long.

The loop watchdog (`watch_event_loop`) is the only way to notice a handler
that blocks the event loop — ``time.sleep`` or a long computation in an
``async def``. No cancellation can reach such a handler, because cancellation
is delivered by the very loop it blocks. So a heartbeat task in the loop
stamps a timestamp, and a daemon thread compares it with the clock; past the
stall threshold (`stall_threshold`) the thread reports the fence itself.
When the thread overslept (the whole process was paused: SIGSTOP, a
suspended VM) it does not blame the loop for that time.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import anyio

from .._contract import limits as _limits
from .._work._timeouts import TaskTimeouts

__all__ = [
    "ENV_FD",
    "EXIT_FENCED",
    "heartbeat_period",
    "report_fence",
    "report_ready",
    "stall_threshold",
    "supervised",
    "watch_event_loop",
]

#: The environment variable naming the inherited report descriptor.
ENV_FD = "RINGO_SUPERVISOR_FD"
#: Exit status of a worker process whose worker was fenced (EX_TEMPFAIL:
#: "try again" — the supervisor replaces it).
EXIT_FENCED = 75

# Messages must fit one atomic pipe write; reasons are cut to fit.
_MAX_MESSAGE = min(select.PIPE_BUF, 4096)


class _Channel:
    """The write end of the report pipe: atomic, non-blocking, never raising."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: The supervisor closed its end (it exited): nobody listens any more.
        self.lost = False
        #: A fence not yet written (the pipe was full); re-sent until it is.
        self._pending_fence: bytes | None = None

    @classmethod
    def from_environment(cls) -> _Channel | None:
        value = os.environ.pop(ENV_FD, None)
        if value is None:
            return None
        try:
            fd = int(value)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return None
            os.set_inheritable(fd, False)
            os.set_blocking(fd, False)
        except (ValueError, OSError):
            # Not a descriptor we were given: behave as unsupervised.
            return None
        return cls(fd)

    def _write(self, line: bytes) -> bool:
        """Whether the line went out whole (False: pipe full or gone)."""
        if self.lost:
            return False
        try:
            return os.write(self.fd, line) == len(line)
        except BlockingIOError:
            return False
        except OSError:
            # EPIPE (the supervisor exited) or EBADF: nobody will read again.
            self.lost = True
            return False

    def send(self, message: dict[str, object]) -> bool:
        """Send one message (after a pending fence); False if it was dropped."""
        pending = self._pending_fence
        if pending is not None:
            if not self._write(pending):
                return False
            self._pending_fence = None
        return self._write(_encode(message))

    def fence(self, reason: str) -> None:
        line = _encode({"kind": "fenced", "reason": reason})
        if not self._write(line) and not self.lost:
            self._pending_fence = line


def _encode(message: dict[str, object]) -> bytes:
    line = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
    reason = message.get("reason")
    if len(line) > _MAX_MESSAGE and isinstance(reason, str):
        excess = len(line) - _MAX_MESSAGE
        # ensure_ascii: one character of the reason is at least one byte, so
        # cutting `excess` (+ the ellipsis) characters is always enough.
        short = {**message, "reason": reason[: max(0, len(reason) - excess - 3)] + "..."}
        line = json.dumps(short, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"
    return line


_CHANNEL: _Channel | None = _Channel.from_environment()


def supervised() -> bool:
    """Whether a supervisor started this process and listens for its reports."""
    return _CHANNEL is not None


def report_fence(reason: str) -> None:
    """Tell the supervisor this process is fenced (a handler would not stop),
    so it replaces the process. Must not block and must not raise."""
    channel = _CHANNEL
    if channel is None:
        return
    # Called on failure paths, from any thread: nothing may escape.
    with contextlib.suppress(Exception):
        channel.fence(str(reason))


def report_ready(worker_id: str) -> None:
    """Tell the supervisor the worker registered (for its log and its view of the process)."""
    channel = _CHANNEL
    if channel is not None:
        channel.send({"kind": "ready", "worker_id": worker_id})


# -- the loop watchdog ----------------------------------------------------------


def stall_threshold(
    task_timeouts: TaskTimeouts | None,
    lease_duration: timedelta,
    explicit: timedelta | None = None,
) -> timedelta:
    """How long the event loop may go without running before the process is fenced.

    ``explicit`` when given; otherwise the lease duration (0 means the
    daemon's default), or, when ``start_to_close`` is set, the smaller of
    that and ``start_to_close + cancel_grace``. Past the first, the handler
    outlived the point at which the worker would have fenced a handler that
    merely ignores cancellation; past the second, no lease of this process
    can have been renewed (renewals need the loop), so its tasks are being
    handed to other workers anyway.
    """
    if explicit is not None:
        return explicit
    lease = lease_duration if lease_duration > timedelta(0) else _limits.DEFAULT_LEASE
    if task_timeouts is None or task_timeouts.start_to_close is None:
        return lease
    return min(lease, task_timeouts.start_to_close + task_timeouts.cancel_grace)


def heartbeat_period(stall: float) -> float:
    """Seconds between heartbeats (and watchdog checks): a few per stall
    threshold, at most one a second, at least 20 a second."""
    return min(1.0, max(0.05, stall / 4))


class _Ticks:
    __slots__ = ("last",)

    def __init__(self) -> None:
        # A float written by the loop thread, read by the watchdog thread:
        # a single attribute store/load is atomic in CPython.
        self.last = time.monotonic()


def _watch(ticks: _Ticks, stop: threading.Event, stall: float, period: float) -> None:
    """The watchdog thread: fence once when the loop has not ticked for ``stall`` s."""
    woke = time.monotonic()
    resumed = woke
    while not stop.wait(period):
        now = time.monotonic()
        if now - woke > period + stall / 2:
            # This thread overslept: the whole process was paused (or starved
            # of CPU); the loop had no chance to tick either.
            resumed = now
        woke = now
        blocked = now - max(ticks.last, resumed)
        if blocked > stall:
            report_fence(
                f"event loop blocked for {blocked:.1f} s (stall threshold {stall:g} s):"
                " a handler is blocking it, e.g. time.sleep or CPU-bound work in an"
                " async def; run blocking code with anyio.to_thread.run_sync"
            )
            channel = _CHANNEL
            if channel is not None and channel.lost:
                # The supervisor is gone and the loop is stuck: nothing else
                # can end this process, whose leases are expiring anyway.
                os._exit(EXIT_FENCED)
            return


async def _beat(ticks: _Ticks, period: float, on_supervisor_lost: Callable[[], object]) -> None:
    lost_reported = False
    while True:
        ticks.last = time.monotonic()
        channel = _CHANNEL
        if channel is not None:
            channel.send({"kind": "heartbeat"})
            if channel.lost and not lost_reported:
                lost_reported = True
                on_supervisor_lost()
        await anyio.sleep(period)


@contextlib.asynccontextmanager
async def watch_event_loop(
    stall: timedelta, *, on_supervisor_lost: Callable[[], object] = lambda: None
) -> AsyncIterator[None]:
    """Heartbeats to the supervisor plus a thread that fences a blocked loop.

    While the block runs, a heartbeat task (in a task group owned by this
    context manager) ticks every `heartbeat_period` and a daemon thread
    reports a fence when the loop has not ticked for ``stall``. When the
    supervisor goes away (its pipe breaks) ``on_supervisor_lost`` is called
    once, from the loop, so the caller can drain. On exit the task is
    cancelled and the thread stopped and joined.
    """
    seconds = stall.total_seconds()
    if not seconds > 0:
        raise ValueError("the stall threshold must be positive")
    period = heartbeat_period(seconds)
    ticks = _Ticks()
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch,
        args=(ticks, stop, seconds, period),
        name="ringo-loop-watchdog",
        daemon=True,
    )
    thread.start()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_beat, ticks, period, on_supervisor_lost)
            try:
                yield
            finally:
                group.cancel_scope.cancel()
    finally:
        stop.set()
        # The thread wakes from stop.wait at once; the timeout only bounds a
        # thread stuck inside a report (which never blocks).
        thread.join(timeout=1.0)
