"""The door every RPC passes: token checks, drain refusal, in-flight count.

grpclib's generated service methods only see the decoded message, so
connection-level policy hooks into the server's ``RecvRequest`` event, which
fires after the headers arrive and before the request body is read. Raising
`GRPCError` there answers the call without running the method.

The same hook wraps the method so the daemon knows how many calls are in
flight: graceful shutdown refuses new calls with ``UNAVAILABLE`` and waits
(bounded) for that count to reach zero before it closes the server, which
would otherwise cancel the calls mid-operation. A call still running when
the bound runs out is cancelled and answered ``UNAVAILABLE``. Methods named
in ``uncounted`` (a shared daemon's ``AttachLocal`` membership streams, which
end only when told to and are ended by the drain itself) pass the checks but
are not counted, so the drain never waits on them.

A shared daemon (``local_token``) also requires exactly one
``x-ringo-local-token`` metadata value equal to its secret on every call,
health included, independently of the bearer token: both may be required.
Secrets are compared in constant time.

A call failing either check is not answered at once: `throttle.AuthThrottle`
says how long its answer waits (failures of one address are answered one
after another, with growing delays) and when its connection is closed
instead, so guessing a token costs the guesser time rather than the daemon
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hmac
import time
from collections.abc import Collection, Coroutine
from typing import Any, Protocol

from grpclib.const import Status
from grpclib.events import RecvRequest, listen
from grpclib.exceptions import GRPCError
from grpclib.metadata import Deadline
from grpclib.protocol import Peer
from grpclib.server import Server, Stream

from .throttle import AuthThrottle, Verdict

__all__ = ["LOCAL_TOKEN_HEADER", "Gate", "current_connection", "time_remaining"]

LOCAL_TOKEN_HEADER = "x-ringo-local-token"

_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_SCHEME = "bearer "


class _MethodFunc(Protocol):
    # grpclib's handler shape (its own alias lives in a private module).
    def __call__(self, stream: Stream[Any, Any]) -> Coroutine[Any, Any, None]: ...


# The client's deadline of the call running in this task. Service methods see
# only the message; a long-poll needs the deadline to answer in time instead of
# being cancelled by grpclib with leases it could no longer deliver.
_deadline: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "ringod_call_deadline", default=None
)


# The connection the call running in this task came on (its transport), by
# which WaitTask counts parked calls per connection.
_connection: contextvars.ContextVar[object] = contextvars.ContextVar(
    "ringod_call_connection", default=None
)


def current_connection() -> object:
    """What identifies the current call's connection (None outside a call)."""
    return _connection.get()


def time_remaining() -> float | None:
    """Seconds left until the current call's client deadline (None: no deadline)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline.time_remaining()


class Gate:
    def __init__(
        self,
        token: str | None,
        *,
        local_token: str | None = None,
        uncounted: Collection[str] = (),
        throttle: AuthThrottle | None = None,
    ) -> None:
        self._expected = f"{_SCHEME}{token}".encode() if token else None
        self._local_expected = local_token.encode() if local_token else None
        self._uncounted = frozenset(uncounted)
        self.throttle = throttle or AuthThrottle()
        self.draining = False
        # One counting wrapper per service method, built on first use: the
        # method objects grpclib hands us are fixed for the server's life.
        self._wrapped: dict[_MethodFunc, _MethodFunc] = {}
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def install(self, server: Server) -> None:
        listen(server, RecvRequest, self._on_request)

    def _authorized(self, event: RecvRequest) -> bool:
        if self._expected is None:
            return True
        values = event.metadata.getall("authorization", [])
        if len(values) != 1:
            return False
        value = values[0]
        presented = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
        # The auth scheme is case-insensitive (RFC 7235); the token is not.
        scheme, token = presented[: len(_SCHEME)], presented[len(_SCHEME) :]
        candidate = (scheme.lower() + token).encode()
        return hmac.compare_digest(candidate, self._expected)

    def _local_member(self, event: RecvRequest) -> bool:
        if self._local_expected is None:
            return True
        values = event.metadata.getall(LOCAL_TOKEN_HEADER, [])
        if len(values) != 1:
            return False
        value = values[0]
        presented = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(presented, self._local_expected)

    async def _on_request(self, event: RecvRequest) -> None:
        if not self._local_member(event):
            self._refuse(event, f"missing or invalid {LOCAL_TOKEN_HEADER}")
            return
        if not self._authorized(event):
            self._refuse(
                event, "missing or invalid bearer token (metadata 'authorization: Bearer <token>')"
            )
            return
        is_health = event.method_name.startswith(_HEALTH_PREFIX)
        if self.draining and not is_health:
            # Health stays answerable so a prober sees NOT_SERVING rather
            # than a refusal while the daemon drains.
            raise GRPCError(Status.UNAVAILABLE, "the daemon is shutting down")
        if event.method_name in self._uncounted:
            return
        method = event.method_func
        counted = self._wrapped.get(method)
        if counted is None:
            counted = self._wrapped[method] = self._counted(method)
        event.method_func = counted

    def _refuse(self, event: RecvRequest, message: str) -> None:
        """Answer UNAUTHENTICATED when the throttle says so (see the module docstring)."""
        peer = event.peer
        address = peer.addr()
        host, port = (str(address[0]), int(address[1])) if address else ("", 0)
        verdict = self.throttle.failed(host, port, time.monotonic())
        if verdict.drop:
            _close(peer)
            # grpclib sends nothing on a closing connection.
            event.method_func = _nothing
            return
        event.method_func = self._refusal(verdict, peer, message)

    def _refusal(self, verdict: Verdict, peer: Peer, message: str) -> _MethodFunc:
        turn = verdict.turn
        assert turn is not None

        async def refuse(stream: Stream[Any, Any]) -> None:
            try:
                # Waiting in the call's own task holds one stream of the
                # guesser's, which the throttle bounds per address.
                async with turn:
                    await asyncio.sleep(verdict.delay)
                    await stream.send_trailing_metadata(
                        status=Status.UNAUTHENTICATED, status_message=message
                    )
            finally:
                self.throttle.answered(verdict)
            if verdict.close:
                # After the answer: close() flushes it before the FIN.
                _close(peer)

        return refuse

    def _counted(self, method: _MethodFunc) -> _MethodFunc:
        async def counted(stream: Stream[Any, Any]) -> None:
            # grpclib runs each call in its own task, so this value is seen by
            # that call's method only.
            _deadline.set(stream.deadline)
            _connection.set(getattr(stream.peer, "_transport", None))
            self._in_flight += 1
            self._idle.clear()
            try:
                await method(stream)
            except asyncio.CancelledError:
                if self.draining:
                    await self._answer_unavailable(stream)
                raise
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

        return counted

    @staticmethod
    async def _answer_unavailable(stream: Stream[Any, Any]) -> None:
        # A call cut off by the shutdown timeout would otherwise get no
        # trailers at all and hang its client until the process is gone.
        # UNAVAILABLE is the honest answer: it may or may not have happened.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await stream.send_trailing_metadata(
                    status=Status.UNAVAILABLE,
                    status_message="the daemon shut down before this call finished",
                )

    async def wait_idle(self, seconds: float) -> bool:
        """True when no call is in flight, False if `seconds` ran out first."""
        try:
            async with asyncio.timeout(seconds):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


def _close(peer: Peer) -> None:
    # grpclib exposes a connection's transport only through its Peer (which
    # wraps exactly that); closing it ends every stream of the connection.
    transport = getattr(peer, "_transport", None)
    if transport is not None:
        transport.close()


async def _nothing(stream: Stream[Any, Any]) -> None:
    return None
