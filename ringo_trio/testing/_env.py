"""RingoTestEnv: an in-process daemon on the event loop's clock, and a client wired to it.

Theory of operation
-------------------
*One loop, one clock.* The daemon is asyncio code. Under trio it runs on a
``trio_asyncio`` loop the environment opens, and the client's transport
(`InMemoryTransport`) crosses into that same loop rather than opening its own;
under asyncio both use the running loop. The daemon's `Clock` is a
`LoopClock` reading that loop's ``time()``, which under trio-asyncio *is*
trio's clock. So with trio's ``MockClock(autojump_threshold=0)`` (pytest-trio's
``autojump_clock`` fixture) everything moves together: the daemon's lease
expiries, retry delays, ``not_before`` times, session TTLs and its own timers,
and the worker's renewal and heartbeat timers on the SDK side.

*No sockets.* Client and daemon talk HTTP/2 through in-memory pipes
(`ringo_trio.server._memory`), so when every task is blocked nothing is in
flight: autojump only ever skips to the next timer — a retry becoming due, a
lease running out — never past a reply that a socket was about to deliver
(which is why a real daemon and ``autojump_clock`` fail with "Deadline
exceeded").

*Ownership.* `RingoTestEnv.start` is an async context manager owning, in
order: the trio-asyncio loop (trio only), a task group running
``Daemon.serve``, and the client. Leaving it closes the client (its workers
drain), then stops the daemon gracefully and waits for it; the database lives
in a temporary directory removed last.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import anyio

from .._client import RingoClient
from ..server._clock import Clock, LoopClock
from ..server._daemon import Daemon, DaemonConfig
from ..server.storage.sqlite import SQLiteEngine
from ._memory import serving_in_memory

__all__ = ["RingoTestEnv", "TimeMode"]

TimeMode = Literal["loop", "real"]


class RingoTestEnv:
    """A daemon in this process and a `RingoClient` of it; see `RingoTestEnv.start`."""

    def __init__(self, client: RingoClient, daemon: Daemon) -> None:
        self.client = client
        #: The in-process daemon (its storage, clock and configuration).
        self.daemon = daemon

    @staticmethod
    @asynccontextmanager
    async def start(
        *,
        time: TimeMode = "loop",
        data_dir: str | Path | None = None,
        start: datetime | None = None,
        session_ttl: timedelta | None = None,
    ) -> AsyncIterator[RingoTestEnv]:
        """Start a daemon in this process and yield the environment.

        ``time="loop"`` (the default): the daemon's clock follows the running
        event loop's, so under a mock clock (trio's ``autojump_clock``) time is
        virtual and skips to whatever is next due; under a real clock it is
        real time. ``time="real"``: the daemon reads the wall clock whatever
        the loop's clock does. ``start`` is the daemon's date at the start
        (default: now). ``data_dir`` keeps the SQLite database there (default:
        a temporary directory, removed on exit).
        """
        async with AsyncExitStack() as stack:
            if data_dir is None:
                data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="ringo-env-"))
            database = Path(data_dir) / "ringo.db"
            config = DaemonConfig(port=0)
            if session_ttl is not None:
                config = DaemonConfig(port=0, session_ttl=session_ttl)

            def make_daemon(loop_time: Callable[[], float]) -> Daemon:
                clock = Clock() if time == "real" else LoopClock(loop_time, start)
                return Daemon(config, SQLiteEngine(database), clock=clock)

            daemon, transport = await stack.enter_async_context(serving_in_memory(make_daemon))
            client = await stack.enter_async_context(RingoClient(transport=transport))
            yield RingoTestEnv(client, daemon)

    def now(self) -> datetime:
        """The daemon's current time (what task timestamps are made of)."""
        return self.daemon.clock.now()

    async def sleep(
        self, seconds: float = 0, *, minutes: float = 0, hours: float = 0, days: float = 0
    ) -> None:
        """Let time pass: instantly under a mock clock (everything due meanwhile
        happens, in order), really otherwise."""
        delta = timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        await anyio.sleep(delta.total_seconds())
