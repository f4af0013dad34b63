"""Daemon tests on virtual time: an in-process daemon, raw gRPC, trio's MockClock.

`on_virtual_time` runs an asyncio test body — the same grpclib client code
(`grpc_client`) as the tests against a ``ringod`` process — on a trio-asyncio loop
under ``trio.testing.MockClock(autojump_threshold=0)``. `virtual_daemon`
serves a real `Daemon` on that loop in memory (``serve(in_memory=True)``: its
gRPC server, gate, codec, services and Work stream, HTTP/2 through in-memory
pipes instead of a socket) with a `LoopClock`, so lease expiry, the reaper,
heartbeats, delays, long-poll timeouts, session TTLs and the shutdown timeout
all follow the test's virtual clock.

What the tests rely on:

* A sleep costs no real time, and autojump moves the clock only when every
  task is blocked — the daemon's, the client's, and the bytes in the
  in-memory pipes, which are delivered by loop callbacks. So `quiet` returns
  only once the daemon has done everything it would do by itself; a "nothing
  more was pushed" check after it holds however loaded the machine is.
* Times are exact: with no real I/O, a waiter woken by an event returns at
  the virtual instant of that event, and one woken by a timer at the timer's
  deadline, so the tests assert *when* (in virtual seconds) instead of "fast
  enough" in real seconds.

Guards: the body runs under a virtual ``fail_after`` (a deadlock jumps
straight to it and fails at once) and a real-time watchdog (a livelock,
where virtual time cannot move, fails instead of hanging the run).

Write bodies with asyncio's own tasks and timeouts (``asyncio.create_task``,
``asyncio.timeout``): anyio's task groups and cancel scopes fail on
trio-asyncio's loop once they cancel ("no running event loop").
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio.testing
import trio_asyncio

from ringo_trio.server.clock import LoopClock
from ringo_trio.server.daemon import Daemon, DaemonConfig
from ringo_trio.server.storage.sqlite import SQLiteEngine

__all__ = [
    "PROMPT",
    "Served",
    "in_background",
    "now",
    "on_virtual_time",
    "quiet",
    "virtual_daemon",
]

#: The virtual seconds a test body may take (a deadlock reaches it at once).
VIRTUAL_LIMIT = 600.0
#: The real seconds a test body may take (only a livelock or a very slow box).
REAL_LIMIT = 60.0
#: A virtual pause: everything the daemon does by itself has happened after it.
QUIET = 1.0
#: Virtual seconds within which a wake-up by an event must arrive. It arrives
#: at the event's own instant (0 s) today; the bound only leaves room for a
#: coalescing delay. Each test's alternative path (a lease running out, a
#: heartbeat, a timeout) is far longer, so a missed wake-up fails.
PROMPT = 0.1


def on_virtual_time(
    test: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """Run the asyncio test ``test`` on trio's ``MockClock(autojump_threshold=0)``
    (through trio-asyncio), under `VIRTUAL_LIMIT` virtual and `REAL_LIMIT`
    real seconds. Its fixtures are passed through unchanged."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        async def main() -> None:
            token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as watchdog:
                timer = threading.Timer(REAL_LIMIT, token.run_sync_soon, [watchdog.cancel])
                timer.daemon = True
                timer.start()
                try:
                    async with trio_asyncio.open_loop() as loop:
                        with trio.fail_after(VIRTUAL_LIMIT):
                            await loop.run_aio_coroutine(test(*args, **kwargs))
                finally:
                    timer.cancel()
            if watchdog.cancelled_caught:
                raise AssertionError(f"the test ran for more than {REAL_LIMIT} s of real time")

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    return run


def now() -> float:
    """The virtual time of the running loop (seconds)."""
    return asyncio.get_running_loop().time()


@asynccontextmanager
async def in_background(loop: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run `loop` (a daemon part's ``run()``, which runs until cancelled) as
    a task while the block runs; cancelled and awaited when it ends, so a
    loop that failed or returned early fails the test there."""
    task = asyncio.create_task(loop)
    try:
        yield
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the background loop returned before it was cancelled")


async def quiet(seconds: float = QUIET) -> None:
    """Let ``seconds`` of virtual time pass, which (autojump) first lets
    everything that can run without the clock moving run to completion."""
    await asyncio.sleep(seconds)


@dataclass
class Served:
    """A daemon serving in memory (`virtual_daemon`)."""

    daemon: Daemon
    #: Set it to shut the daemon down gracefully (what ringod's SIGTERM does).
    stop: asyncio.Event
    #: `Daemon.serve`: done once the daemon has stopped.
    serving: asyncio.Task[None]


@asynccontextmanager
async def virtual_daemon(
    data_dir: Path | None = None, *, engine: SQLiteEngine | None = None, **config: Any
) -> AsyncIterator[Served]:
    """Serve a `Daemon` (on ``engine``, else SQLite in ``data_dir``, else in a
    temporary directory; `DaemonConfig` fields in ``config``) in memory on the
    running loop, on its clock. On exit it is stopped gracefully and waited
    for."""
    with tempfile.TemporaryDirectory(prefix="ringo-virtual-") as scratch:
        if engine is None:
            engine = SQLiteEngine(Path(data_dir or scratch) / "ringo.db")
        loop = asyncio.get_running_loop()
        # No upkeep thread: waiting for a real thread would let virtual time run ahead.
        daemon = Daemon(
            DaemonConfig(port=0, storage_upkeep=False, **config),
            engine,
            clock=LoopClock(loop.time),
        )
        stop = asyncio.Event()
        ready = asyncio.Event()
        serving = asyncio.create_task(daemon.serve(stop, lambda _: ready.set(), in_memory=True))
        started = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
            if serving.done():
                serving.result()
                raise AssertionError("the daemon stopped before it was ready")
            yield Served(daemon, stop, serving)
        finally:
            started.cancel()
            stop.set()
            await serving
