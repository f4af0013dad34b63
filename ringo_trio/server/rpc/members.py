"""Membership of a shared local daemon: the ``AttachLocal`` streams.

Theory of operation
-------------------
A *shared* daemon (``ringod --local-token-file F --generation G``) serves one
data dir for every SDK process of a machine that uses it, and stops by itself
once none does. An SDK process is a **member** while it holds one open
``AttachLocal`` server stream; the daemon counts those streams and nothing
else (unary calls and Work streams do not keep it alive).

**Attach.** A request naming another generation is ``FAILED_PRECONDITION``
("generation mismatch"), as is any AttachLocal on a daemon that is not shared:
the caller found a stale identity and must not take this daemon for its own.
Otherwise the stream counts as a member from that moment, the daemon answers
``AttachLocalResponse(generation=G)`` at once and then sends nothing more.

**Detach.** The member ends the call (cancel / RST_STREAM), its connection
drops (the process died: the kernel closes the socket and grpclib cancels
every call of that connection), or its deadline passes: in each case grpclib
cancels the call's task and the ``finally`` that was armed with the count
takes the member off. Every attach is matched by exactly one detach.

**Linger.** Each time the count drops to 0 a timer of ``linger`` seconds
starts; an attach cancels it. When it fires with the count still 0 the
daemon shuts down gracefully (the SIGTERM path, exit 0). The same timer,
started when the daemon has announced itself, bounds the wait for the *first*
member with ``attach_timeout``: the process that started a shared daemon may
die before it attaches, and the daemon must not serve nobody for ever. When
either fires, newcomers are refused ``UNAVAILABLE`` from that instant, so no
process attaches to a daemon that is already on its way out.

**Shutdown.** `Members.close` ends every member stream with ``UNAVAILABLE``
at once. The gate does not count these streams as calls in flight, so they
never hold up the drain (they would hold it for the whole shutdown timeout:
they end only when told to).

All of this runs on the daemon's one event loop; attach, detach and the
timer callback never interleave.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ringo_trio._proto.ringo.v1 import AttachLocalRequest, AttachLocalResponse

__all__ = [
    "ATTACH_LOCAL_METHOD",
    "DEFAULT_ATTACH_TIMEOUT",
    "DEFAULT_LINGER",
    "MAX_GENERATION_CHARS",
    "Members",
]

log = logging.getLogger("ringo_trio.server")

ATTACH_LOCAL_METHOD = "/ringo.v1.QueueService/AttachLocal"
DEFAULT_LINGER = 2.0
DEFAULT_ATTACH_TIMEOUT = 15.0
MAX_GENERATION_CHARS = 200

_NOT_SHARED = "not a shared daemon"
_STOPPING = "the shared daemon is shutting down"


class Members:
    """The open AttachLocal streams of one daemon, and the timer that stops
    it when there are none. ``generation=None``: not a shared daemon (every
    AttachLocal is refused and no timer ever runs)."""

    def __init__(
        self,
        generation: str | None,
        *,
        linger: float = DEFAULT_LINGER,
        attach_timeout: float = DEFAULT_ATTACH_TIMEOUT,
    ) -> None:
        if generation is not None and not 0 < len(generation) <= MAX_GENERATION_CHARS:
            raise ValueError(f"generation must be 1..{MAX_GENERATION_CHARS} characters")
        if not linger >= 0:
            raise ValueError("linger must be >= 0 seconds")
        if not attach_timeout > 0:
            raise ValueError("attach_timeout must be > 0 seconds")
        self.generation = generation
        self.linger = linger
        self.attach_timeout = attach_timeout
        self._count = 0
        self._attached_ever = False
        self._closing = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._on_idle: Callable[[str], None] | None = None

    @property
    def shared(self) -> bool:
        return self.generation is not None

    @property
    def count(self) -> int:
        """Members attached right now."""
        return self._count

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def arm(self, on_idle: Callable[[str], None]) -> None:
        """Start watching (the daemon has announced itself): `on_idle(reason)`
        runs once, when nobody attached within ``attach_timeout`` or the last
        member has been gone for ``linger`` seconds."""
        if not self.shared or self.closing:
            return
        self._on_idle = on_idle
        if self._count == 0:
            if self._attached_ever:
                self._start_timer(self.linger, self._linger_reason())
            else:
                self._start_timer(
                    self.attach_timeout,
                    f"no member attached within {self.attach_timeout:g}s (--attach-timeout)",
                )

    def close(self) -> None:
        """Refuse new members and end every member stream (UNAVAILABLE)."""
        self._cancel_timer()
        self._closing.set()

    # -- the count -----------------------------------------------------------

    def _attach(self) -> None:
        self._count += 1
        self._attached_ever = True
        self._cancel_timer()
        log.debug("member attached (%d now)", self._count)

    def _detach(self) -> None:
        self._count -= 1
        log.debug("member detached (%d left)", self._count)
        if self._count == 0 and self._on_idle is not None and not self.closing:
            self._start_timer(self.linger, self._linger_reason())

    def _linger_reason(self) -> str:
        return f"no member for {self.linger:g}s (--linger)"

    def _start_timer(self, delay: float, reason: str) -> None:
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire, reason)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, reason: str) -> None:
        self._timer = None
        if self._count or self.closing or self._on_idle is None:
            return
        self.close()
        self._on_idle(reason)

    # -- the RPC ---------------------------------------------------------------

    async def serve_call(self, stream: Any) -> None:
        """grpclib's handler of ``AttachLocal`` (request → one response, then
        silence until the member leaves or the daemon stops)."""
        request: AttachLocalRequest | None = await stream.recv_message()
        if request is None:
            raise GRPCError(Status.INVALID_ARGUMENT, "AttachLocal needs its request message")
        if self.generation is None:
            raise GRPCError(Status.FAILED_PRECONDITION, _NOT_SHARED)
        if request.generation != self.generation:
            raise GRPCError(
                Status.FAILED_PRECONDITION,
                f"generation mismatch: this shared daemon is generation"
                f" {self.generation!r}, the request names {request.generation!r}",
            )
        if self.closing:
            raise GRPCError(Status.UNAVAILABLE, _STOPPING)
        # Counted before the first await, so the linger timer cannot fire
        # between the check above and the member being counted; the `finally`
        # is armed in the same step, so every attach meets its detach.
        self._attach()
        try:
            await stream.send_message(AttachLocalResponse(generation=self.generation))
            await self._closing.wait()
        finally:
            self._detach()
        raise GRPCError(Status.UNAVAILABLE, _STOPPING)
