"""The SDK's in-memory transport: `Transport` with a channel to an in-process daemon.

Everything that makes `ringo_trio._transport.grpclib.Transport` correct — the one
error boundary, the stream pumps, the crossings into the asyncio island — is
inherited; only two things differ. The channel is the daemon's
`InMemoryChannel` (no socket), and under trio the island is the
trio-asyncio loop the daemon already runs on (an asyncio object belongs to
one loop, so client and daemon must share it).

`serving_in_memory` runs the daemon on that loop for the testing kit.

This module touches asyncio and grpclib, so tests/test_contract.py allows it
alongside ``grpclib.py``: it is the testing kit's half of the island (only
`ringo_trio.testing` imports it, the SDK never does), and keeping every
asyncio detail of the kit here leaves `ringo_trio.testing._env`
backend-neutral.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import anyio
import grpclib.client
import sniffio

from .._endpoint import Endpoint
from ..server.daemon import Daemon
from .grpclib import Transport

__all__ = ["IN_MEMORY", "InMemoryTransport", "RunOnDaemonLoop", "serving_in_memory"]

_T = TypeVar("_T")

#: What `RingoClient.endpoint` says for a client of an in-process daemon.
IN_MEMORY = Endpoint("in-memory", 0, False)


class InMemoryTransport(Transport):
    """A `Transport` to ``daemon`` (serving with ``in_memory=True``) in this process.

    ``loop`` is the trio-asyncio loop the daemon runs on (None under asyncio,
    where both use the running loop).
    """

    def __init__(self, daemon: Daemon, loop: Any) -> None:
        super().__init__(IN_MEMORY)
        self._daemon = daemon
        self._loop = loop

    async def _trio_loop(self, stack: AsyncExitStack) -> Any:
        if self._loop is None:
            raise RuntimeError("an in-memory transport under trio needs its daemon's loop")
        return self._loop

    def _new_channel(self, endpoint: Endpoint) -> grpclib.client.Channel:
        return self._daemon.in_memory_channel()


#: Runs a coroutine of the daemon's side on its loop, from the test's side.
RunOnDaemonLoop = Callable[[Coroutine[Any, Any, _T]], Awaitable[_T]]


@asynccontextmanager
async def serving_in_memory(
    make_daemon: Callable[[Callable[[], float]], Daemon],
) -> AsyncIterator[tuple[Daemon, InMemoryTransport, RunOnDaemonLoop[Any]]]:
    """Serve ``make_daemon(loop_time)`` in memory on this task's loop; yield it,
    a transport to it (not yet entered) and how to run a coroutine on its loop.
    The daemon stops gracefully on exit.

    ``loop_time`` is the daemon's loop's clock (under trio, trio's clock).
    """
    async with AsyncExitStack() as stack:
        loop: Any = None
        if sniffio.current_async_library() == "trio":
            import trio_asyncio

            loop = await stack.enter_async_context(trio_asyncio.open_loop())
            run_aio: Any = loop.run_aio_coroutine
            loop_time = loop.time
        else:
            run_aio = _await
            loop_time = asyncio.get_running_loop().time
        daemon = make_daemon(loop_time)
        stop = asyncio.Event()
        ready = anyio.Event()
        tg = await stack.enter_async_context(anyio.create_task_group())
        # Armed before the first await that can fail: on every way out the
        # daemon is told to stop, and the task group waits for it.
        stack.callback(stop.set)
        tg.start_soon(run_aio, daemon.serve(stop, lambda _daemon: ready.set(), in_memory=True))
        await ready.wait()
        yield daemon, InMemoryTransport(daemon, loop), run_aio


async def _await(coro: Any) -> Any:
    return await coro
