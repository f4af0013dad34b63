"""The negotiated connection to one daemon: sessions, calls and their retry rules, recovery.

`TaskQueue` and `Worker` depend on this module only; `RingoClient`
(`ringo_trio._client`) is the facade that owns a `Connection`'s lifetime.

Theory of operation
-------------------
*Ownership.* `Connection.open` enters, on the client's exit stack and in the
entering task: the local daemon's process owner (for `Ringo.local`) and the
`Transport` (which, under trio, is where the trio-asyncio loop lives) or the
`ClientTransport` it was given (the testing kit's in-memory one); its
background tasks (a shared daemon's membership) run in the client's task
group. `Connection.close` is the graceful part of shutdown: close the channel,
stop the daemon through its lifecycle pipe — each step shielded and bounded.

*Sessions.* After connecting, the connection negotiates: it offers protocol
major `versions.MAJOR` and its newest minor, and keeps the minor the daemon
agreed to together with the short-lived session token (`NegotiatedSession`).
Every request carries them in its ``RequestContext``.

*Retry rules* (the contract users rely on; see `Connection.call`):

* A rejected session (the daemon answers ``OUT_OF_RANGE`` before running the
  operation) is renegotiated and the call is sent once more — only if the
  token actually changed, so a daemon that keeps refusing cannot loop us.
* ``UNAVAILABLE`` triggers connection recovery (3 attempts, 0.2/0.6/1.5 s
  apart; for a local client this restarts a dead daemon, at most 3 times in
  the client's life, 0.3 s * 2^n apart) so that *later* calls work. The failed
  call itself is never replayed if it is a mutation — an unavailable reply
  may hide a committed write — and raises `UnavailableError`. Only the
  read-only ``GetTask`` is re-sent once after recovery.
* Recovery is serialised by a lock and keyed by the session token the failed
  call carried: when several calls fail together, the first recovers and the
  others find a fresh token and skip straight to their own outcome. Calls
  issued while a recovery runs wait for it instead of hammering a restarting
  daemon. A Work stream recovers the same way (`recover`) before it reopens.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc

from ._contract import limits as _limits
from ._contract import versions as _versions
from ._contract.versions import SDK_NAME, SDK_VERSION
from ._endpoint import Endpoint, parse_endpoint
from ._errors import (
    IncompatibleVersionError,
    RingoError,
    UnauthenticatedError,
    UnavailableError,
)
from ._local.process import LocalDaemon
from ._proto.ringo.v1 import (
    AttachLocalRequest,
    AttachLocalResponse,
    NegotiateRequest,
    NegotiateResponse,
    RequestContext,
)
from ._transport.base import (
    DEFAULT_KEEPALIVE,
    ClientTransport,
    Keepalive,
    SessionRejectedError,
    StreamChannels,
)
from ._transport.grpclib import Transport

if TYPE_CHECKING:
    from ._local.shared import SharedLocalDaemon
    from ._work.worker import Worker

__all__ = ["DEFAULT_RPC_TIMEOUT", "NO_SESSION", "Connection", "NegotiatedSession"]

_T = TypeVar("_T")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

DEFAULT_RPC_TIMEOUT = 30.0
_RECOVERY_BACKOFF = (0.2, 0.6, 1.5)
_MAX_DAEMON_RESTARTS = 3
_DAEMON_RESTART_BACKOFF = 0.3
_HEALTH_POLL_INTERVAL = 0.05
_CLOSE_CHANNEL_TIMEOUT = 5.0

_SERVICE = "/ringo.v1.QueueService/"
_LOCAL_TOKEN_HEADER = "x-ringo-local-token"


@dataclass(frozen=True, slots=True)
class NegotiatedSession:
    """What negotiation agreed: the minor and the session token (and the
    ``RequestContext`` every request of the session carries)."""

    minor: int
    token: str
    # Built once per negotiation and shared by every request of the session
    # (nothing mutates it), instead of one allocation per call.
    context: RequestContext = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        context = RequestContext(
            protocol_major=_versions.MAJOR,
            protocol_minor=self.minor,
            session_token=self.token,
        )
        object.__setattr__(self, "context", context)


NO_SESSION = NegotiatedSession(minor=_versions.MINOR, token="")


class Connection:
    """One client's negotiated connection to its daemon (see the module docstring)."""

    def __init__(
        self,
        *,
        endpoint: Endpoint | None,
        metadata: tuple[tuple[str, str], ...],
        daemon: LocalDaemon | SharedLocalDaemon | None,
        transport: ClientTransport | None = None,
        keepalive: Keepalive | None = DEFAULT_KEEPALIVE,
    ) -> None:
        # ``transport``: a ready-made one to enter instead of a `Transport` to
        # ``endpoint`` (the testing kit's in-memory transport).
        self._endpoint = endpoint
        self.keepalive = keepalive
        self._metadata = metadata
        self._daemon = daemon
        self._given_transport = transport
        self._transport: ClientTransport | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session = NO_SESSION
        self._closed = False
        self._recovery_lock = anyio.Lock()
        # WaitTask calls this client has parked: the daemon holds at most
        # MAX_WAITS_PER_CONNECTION per connection, so more wait here, in
        # order, instead of failing with RESOURCE_EXHAUSTED.
        self.wait_slots = anyio.Semaphore(_limits.MAX_WAITS_PER_CONNECTION)
        self._daemon_restarts = 0
        # Shared mode: the generation this client is a member of (None: not attached).
        self._member_of: str | None = None
        # Weak: a worker that finished (or was never run) is not kept alive by
        # its connection; the client's `aclose` drains the ones still around.
        self.workers: weakref.WeakSet[Worker] = weakref.WeakSet()
        self._accepting_workers = True

    # -- observation --------------------------------------------------------

    @property
    def session(self) -> NegotiatedSession:
        """The current negotiated session (replaced by every renegotiation)."""
        return self._session

    @property
    def protocol_minor(self) -> int:
        return self._session.minor

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def daemon(self) -> LocalDaemon | SharedLocalDaemon | None:
        return self._daemon

    @property
    def endpoint(self) -> str | None:
        if self._transport is not None:
            return self._transport.endpoint.authority
        return self._endpoint.authority if self._endpoint is not None else None

    @property
    def _shared(self) -> SharedLocalDaemon | None:
        daemon = self._daemon
        return None if daemon is None or isinstance(daemon, LocalDaemon) else daemon

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        shared = self._shared
        if shared is None or shared.token is None:
            return self._metadata
        return (*self._metadata, (_LOCAL_TOKEN_HEADER, shared.token))

    # -- lifetime -----------------------------------------------------------

    async def open(self, stack: AsyncExitStack, tg: anyio.abc.TaskGroup) -> None:
        """Start the daemon (local), connect and negotiate; what is opened is
        closed by ``stack``, background tasks run in ``tg``."""
        self._tg = tg
        transport = self._given_transport
        if transport is None:
            if self._daemon is not None:
                await stack.enter_async_context(self._daemon)
                endpoint = parse_endpoint(await self._daemon.start())
            else:
                assert self._endpoint is not None
                endpoint = self._endpoint
            transport = Transport(
                endpoint, metadata=self._call_metadata(), keepalive=self.keepalive
            )
        self._transport = await stack.enter_async_context(transport)
        if self._shared is not None:
            await self._join_shared()
        else:
            if self._daemon is not None:
                await self._wait_serving(self._daemon.startup_timeout)
            await self._negotiate()

    def mark_closed(self) -> None:
        """Later calls raise `RingoError`; recovery stops (a daemon is not restarted)."""
        self._closed = True

    async def close(self) -> list[Exception]:
        """Close the channel and stop a local daemon, each step shielded and
        bounded; returns what failed."""
        self._closed = True
        errors: list[Exception] = []
        with anyio.CancelScope(shield=True):
            if self._transport is not None:
                with anyio.move_on_after(_CLOSE_CHANNEL_TIMEOUT):
                    try:
                        await self._transport.aclose()
                    except Exception as error:
                        errors.append(error)
            if self._daemon is not None:
                try:
                    await self._daemon.stop()  # bounded by stop_timeout, then kill
                except Exception as error:
                    errors.append(error)
        return errors

    def register_worker(self, worker: Worker) -> None:
        if self._closed or not self._accepting_workers:
            raise RingoError("client is closed")
        self.workers.add(worker)

    def refuse_new_workers(self) -> None:
        """The client is closing: the workers it drains are the ones there are."""
        self._accepting_workers = False

    # -- calls --------------------------------------------------------------

    def open_stream(
        self,
        method: str,
        request_type: type[_Req],
        response_type: type[_Resp],
        **options: Any,
    ) -> AbstractAsyncContextManager[StreamChannels[_Req, _Resp]]:
        """A stream of ``method`` of the queue service (see `Transport.open_stream`)."""
        return self.require_transport().open_stream(
            _SERVICE + method, request_type, response_type, **options
        )

    def require_transport(self) -> ClientTransport:
        if self._closed:
            raise RingoError("client is closed")
        if self._transport is None:
            raise RingoError("client is not started; use 'async with Ringo.connect(...) as client'")
        return self._transport

    async def call(
        self,
        method: str,
        request: Any,
        response_type: type[_T],
        *,
        read_only: bool = False,
        extra_timeout: float = 0.0,
    ) -> _T:
        """Send one unary call with the session context, applying the retry rules.

        ``extra_timeout`` extends the deadline for calls the daemon may hold
        (a long-polling claim).
        """
        transport = self.require_transport()
        timeout = DEFAULT_RPC_TIMEOUT + extra_timeout
        if self._recovery_lock.locked():
            # Wait out a recovery in progress rather than hit a restarting daemon.
            async with self._recovery_lock:
                pass
        route = _SERVICE + method
        sent = self._session
        request.context = sent.context
        try:
            return await transport.unary(route, request, response_type, rpc_timeout=timeout)
        except SessionRejectedError:
            if self._closed:
                raise
            # Rejected before the operation ran: safe to send again, once.
            await self.recover(sent, session_rejected=True)
            if self._session.token == sent.token:
                raise
        except UnavailableError:
            if self._closed:
                raise
            await self.recover(sent, session_rejected=False)
            if not read_only:
                # Never replay a mutation: it may have been applied.
                raise
        request.context = self._session.context
        return await transport.unary(route, request, response_type, rpc_timeout=timeout)

    async def recover(self, failed: NegotiatedSession, *, session_rejected: bool) -> None:
        """Bounded best-effort recovery so later calls can succeed.

        Failures are swallowed: the caller raises the error of its own call.
        """
        async with self._recovery_lock:
            if self._closed or self._session.token != failed.token:
                return  # closed, or another call already recovered this session
            for attempt, delay in enumerate(_RECOVERY_BACKOFF):
                # A session rejection proves the daemon is up: renegotiate now.
                if attempt > 0 or not session_rejected:
                    await anyio.sleep(delay)
                if self._closed:
                    return
                try:
                    await self._reconnect()
                    return
                except RingoError:
                    if self._daemon_restarts_exhausted():
                        return

    def _daemon_restarts_exhausted(self) -> bool:
        return (
            self._daemon is not None
            and self._daemon.is_dead
            and self._daemon_restarts >= _MAX_DAEMON_RESTARTS
        )

    async def _reconnect(self) -> None:
        transport = self.require_transport()
        daemon = self._daemon
        if daemon is not None and daemon.is_dead:
            if self._daemon_restarts >= _MAX_DAEMON_RESTARTS:
                raise UnavailableError(
                    f"local daemon restart budget ({_MAX_DAEMON_RESTARTS}) exhausted;"
                    f" last stderr: {daemon.stderr_tail}"
                )
            self._daemon_restarts += 1
            await anyio.sleep(_DAEMON_RESTART_BACKOFF * 2 ** (self._daemon_restarts - 1))
            if self._closed:
                # aclose() stopped the daemon meanwhile; do not resurrect it.
                raise RingoError("client is closed")
            if self._shared is not None:
                await self._join_shared(transport)  # re-elect: the daemon is gone
                return
            endpoint = parse_endpoint(await daemon.start())
            await transport.reset(endpoint)
            await self._wait_serving(daemon.startup_timeout)
        await self._negotiate()
        shared = self._shared
        if shared is not None and self._member_of is None and self._tg is not None:
            # The daemon lives on but our membership stream broke: re-attach.
            await self._tg.start(self._membership, shared.generation)

    async def _wait_serving(self, limit_s: float) -> None:
        """Poll health until SERVING: readiness on stdout precedes it by design."""
        transport = self.require_transport()
        last: str = "no answer"
        with anyio.move_on_after(limit_s):
            while True:
                try:
                    if await transport.health_check(rpc_timeout=2.0):
                        return
                    last = "health status is not SERVING"
                except UnauthenticatedError:
                    raise  # a wrong shared-daemon token does not heal by waiting
                except RingoError as error:
                    last = str(error)
                await anyio.sleep(_HEALTH_POLL_INTERVAL)
        raise RingoError(f"local daemon did not report SERVING within {limit_s:g}s: {last}")

    # -- shared local daemon ------------------------------------------------

    async def _join_shared(self, transport: ClientTransport | None = None) -> None:
        """Elect or adopt the data dir's shared daemon, connect, negotiate and
        attach as a member. An identity that does not hold up (no answer, a
        wrong token, another generation) is never trusted again: one bounded
        re-election, as the seed does."""
        shared = self._shared
        assert shared is not None
        assert self._tg is not None
        elected = transport is None  # on entry, start() has just run
        transport = transport or self.require_transport()
        for attempt in range(2):
            if attempt or not elected:
                endpoint = parse_endpoint(await shared.start())
                await transport.reset(endpoint, metadata=self._call_metadata())
            try:
                await self._wait_serving(shared.startup_timeout if shared.started_here else 3.0)
                await self._negotiate()
                await self._tg.start(self._membership, shared.generation)
                return
            except RingoError:
                if attempt:
                    raise
                shared.invalidate_current()

    async def _membership(
        self,
        generation: str,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold this process's AttachLocal stream: the shared daemon counts its
        members by these and lingers out once the last one is gone. When the
        stream ends under us (the daemon died or is going), recover at once —
        re-elect, reconnect, re-attach — instead of waiting for the next call."""
        transport = self.require_transport()
        started = False
        try:
            async with transport.open_stream(
                _SERVICE + "AttachLocal",
                AttachLocalRequest,
                AttachLocalResponse,
                request=AttachLocalRequest(generation=generation),
            ) as stream:
                try:
                    first = await stream.receive.receive()
                except anyio.EndOfStream:
                    raise UnavailableError("the shared daemon closed AttachLocal") from None
                if first.generation != generation:
                    raise UnavailableError(
                        f"the shared daemon is generation {first.generation!r}, not {generation!r}"
                    )
                self._member_of = generation
                started = True
                task_status.started()
                async for _ in stream.receive:
                    pass
        except RingoError:
            if not started:
                raise
        finally:
            if self._member_of == generation:
                self._member_of = None
        if self._closed:
            return
        # Membership lost: recovery re-elects (the daemon is dead) or finds
        # another call already did; a new membership task is started by it.
        await self.recover(self._session, session_rejected=False)

    async def _negotiate(self) -> None:
        transport = self.require_transport()
        reply = await transport.unary(
            _SERVICE + "Negotiate",
            NegotiateRequest(
                sdk_name=SDK_NAME,
                sdk_version=SDK_VERSION,
                protocol_major=_versions.MAJOR,
                protocol_minor=_versions.MINOR,
            ),
            NegotiateResponse,
            rpc_timeout=DEFAULT_RPC_TIMEOUT,
        )
        if reply.protocol_major != _versions.MAJOR:
            raise IncompatibleVersionError(
                f"the daemon speaks protocol major {reply.protocol_major}, this SDK"
                f" speaks {_versions.MAJOR}; upgrade one side"
            )
        self._session = NegotiatedSession(
            minor=min(reply.protocol_minor, _versions.MINOR), token=reply.session_token
        )
