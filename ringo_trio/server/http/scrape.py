"""Scraping ``/metrics`` without holding the daemon's loop (docs/operations.md).

Theory of operation
-------------------
A scrape is `PrometheusMetrics.render` (`metrics`), shared through
`_Exposition`. At the label cap the exposition is ~115,000 series, ~9.5 MB,
1-2 s of CPU; done on the loop it stalled every call that long. A scrape now
reads storage (`PrometheusMetrics.refresh`, in pages) and the live Work
streams on the loop (a few dict reads: the taps belong to the loop), and
only then formats the text in a worker thread (`render_thread`: one thread
of `serve_metrics`'s lifetime, at nice 10 on Linux), which reads the
registry (prometheus_client's collectors are thread-safe) and that snapshot.
The loop thread still shares the GIL with the render, so while a render runs
(`_render_mode`) CPython's cyclic garbage collector is paused (the render's
~10^6 short-lived objects otherwise trigger full collections of 40-100 ms
each, measured, with the GIL held; reference counting frees them anyway) and
the GIL switch interval is 1 ms instead of 5 (the loop thread waits that
long for the GIL after each system call; health p50 under 50 scrapers 9 -> 4
ms). Both are process-wide and restored when the last render ends.
Concurrent scrapes share one render in flight, and a body rendered less than
`SCRAPE_TTL` seconds ago is served again as is: however many scrapers, at
most one render runs at a time, with a pause of at least `SCRAPE_TTL`
between two.

The HTTP responder (`serve_metrics`, on the daemon's h11 `server` with
`METRICS_HTTP` limits) answers ``GET /metrics`` (404 for any other path,
405 for any other method).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .server import HttpLimits, Request, Response, serve_http

if TYPE_CHECKING:
    from .metrics import PrometheusMetrics

__all__ = ["METRICS_HTTP", "SCRAPE_TTL", "render_text", "render_thread", "serve_metrics"]

# A scrape's body is served again to scrapes within this many seconds.
SCRAPE_TTL = 1.0


def render_text(registry: CollectorRegistry) -> bytes:
    """The text format of `registry`, rendered in `_render_mode` (in a worker thread)."""
    with _render_mode():
        return generate_latest(registry)


# While a render runs: a thread waiting for the GIL gets it within this many
# seconds (CPython's default is 5 ms).
_RENDER_SWITCH_INTERVAL = 0.001
# The render thread's nice value (Linux): the loop thread first.
_RENDER_NICE = 10

_mode_lock = threading.Lock()
_renders = 0
_saved_gc = False
_saved_switch = 0.005


@contextlib.contextmanager
def _render_mode() -> Generator[None]:
    """While the block runs (and any other `_render_mode` block of the
    process): the cyclic garbage collector off, and the GIL handed over
    every `_RENDER_SWITCH_INTERVAL`; both back as they were after."""
    global _renders, _saved_gc, _saved_switch
    with _mode_lock:
        if _renders == 0:
            _saved_gc = gc.isenabled()
            _saved_switch = sys.getswitchinterval()
            gc.disable()
            sys.setswitchinterval(_RENDER_SWITCH_INTERVAL)
        _renders += 1
    try:
        yield
    finally:
        with _mode_lock:
            _renders -= 1
            if _renders == 0:
                sys.setswitchinterval(_saved_switch)
                if _saved_gc:
                    gc.enable()


def _background_thread() -> None:
    """Lower the calling thread's CPU priority (Linux: a thread's own nice
    value; elsewhere the call would name a process, so nothing)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _RENDER_NICE)


@contextlib.contextmanager
def render_thread() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """The thread `PrometheusMetrics.render` renders in, at a lower CPU
    priority; let go at the end (a render still running finishes)."""
    executor = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="ringod metrics", initializer=_background_thread
    )
    try:
        yield executor
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


class _Exposition:
    """One rendered body for every scrape: concurrent scrapes wait for the
    render in flight, and a body younger than `ttl` seconds is reused.

    The render runs in the task of the scrape that found nothing to reuse;
    the others wait on a future it resolves. Should that scrape be
    cancelled (the daemon stopping), the future is cancelled and a waiter
    that is still wanted renders in its stead."""

    def __init__(
        self,
        render: Callable[[], Awaitable[bytes]],
        *,
        ttl: float = SCRAPE_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._render = render
        self._ttl = ttl
        self._clock = clock
        self._body = b""
        self._rendered_at: float | None = None
        self._pending: asyncio.Future[bytes] | None = None
        self.renders = 0
        """Renders started (the tests count them)."""

    async def body(self) -> bytes:
        while True:
            if self._rendered_at is not None and self._clock() - self._rendered_at < self._ttl:
                return self._body
            pending = self._pending
            if pending is not None:
                # wait(), unlike awaiting the future, raises only when this
                # task itself is cancelled.
                await asyncio.wait([pending])
                if pending.cancelled():
                    continue
                return pending.result()
            pending = self._pending = asyncio.get_running_loop().create_future()
            self.renders += 1
            try:
                body = await self._render()
            except Exception as exc:
                pending.set_exception(exc)
                # Retrieved here, so no waiter is no "never retrieved" warning.
                pending.exception()
                raise
            except BaseException:
                pending.cancel()
                raise
            finally:
                self._pending = None
            # The TTL counts from the end of the render: with renders slower
            # than it, back-to-back renders would otherwise never pause.
            self._body, self._rendered_at = body, self._clock()
            pending.set_result(body)
            return body


# -- the HTTP responder --------------------------------------------------------

# Scrapes are small and rare: a few connections, short heads, no bodies.
# One Prometheus scrapes over one connection at a time: two per address leave
# the other two for another scraper however one client behaves.
METRICS_HTTP = HttpLimits(
    max_connections=4, max_connections_per_address=2, max_head_bytes=8 * 1024, max_body_bytes=0
)
_METRICS_PATH = "/metrics"


async def serve_metrics(
    sock: socket.socket,
    metrics: PrometheusMetrics,
    refresh: Callable[[], Awaitable[None]],
) -> None:
    """Answer scrapes on the listening `sock` until cancelled; closes it.

    `refresh` reads storage before each render; scrapes share renders
    (`_Exposition`).
    """
    with render_thread() as executor:
        exposition = _Exposition(functools.partial(metrics.render, refresh, executor))

        async def answer(request: Request) -> Response:
            if request.path != _METRICS_PATH:
                return Response(404, b"not found; metrics are at /metrics\n")
            if request.method != "GET":
                return Response(405, b"only GET\n", headers=[("Allow", "GET")])
            body = await exposition.body()
            return Response(200, body, content_type=CONTENT_TYPE_LATEST)

        await serve_http(sock, answer, METRICS_HTTP, name="metrics")
