"""Ringo and RingoClient: connection, negotiation and the retry rules of unary calls.

Theory of operation
-------------------
*Ownership.* A `RingoClient` is an async context manager. Entering it opens,
in this order and in the entering task: the client's task group (home of every
background task the client ever runs), the local daemon's process owner (for
`Ringo.local`), and the `Transport` (which, under trio, is where the
trio-asyncio loop lives). Leaving it closes them in reverse. Nothing the
client starts can outlive the ``async with`` block. `RingoClient.aclose`
performs the graceful part of shutdown (close the channel, stop the daemon
through its lifecycle pipe) and may be called from any task, any number of
times; every step is shielded from cancellation and bounded in time, so a
cancelled caller can neither skip cleanup nor hang in it. A failed or
cancelled entry runs the same unwinding before it re-raises, so a half-started
daemon is never leaked.

*Sessions.* After connecting, the client negotiates: it offers protocol major
`PROTOCOL_MAJOR` and its newest minor, and keeps the minor the daemon agreed
to together with the short-lived session token. Every request carries them in
its ``RequestContext``.

*Retry rules* (the contract users rely on; see `RingoClient._call`):

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
  daemon.
"""

from __future__ import annotations

import os
import secrets
import ssl
import weakref
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
import anyio.abc

from . import _limits
from ._daemon import LocalDaemon
from ._endpoint import Endpoint, parse_endpoint
from ._errors import (
    IncompatibleVersionError,
    InvalidArgumentError,
    RingoError,
    UnauthenticatedError,
    UnavailableError,
)
from ._models import PostgresStorage, SQLiteStorage, _check_name
from ._proto.ringo.v1 import (
    AttachLocalRequest,
    AttachLocalResponse,
    NegotiateRequest,
    NegotiateResponse,
    RequestContext,
)
from ._queue import TaskQueue
from ._transport import SessionRejectedError, Transport, client_tls_context
from ._version import SDK_NAME, SDK_VERSION

if TYPE_CHECKING:
    from ._shared import SharedLocalDaemon
    from ._work.worker import Worker

__all__ = ["CompressionOption", "Ringo", "RingoClient"]

_T = TypeVar("_T")

CompressionOption = Literal["none", "gzip"]

DEFAULT_RPC_TIMEOUT = 30.0
_RECOVERY_BACKOFF = (0.2, 0.6, 1.5)
_MAX_DAEMON_RESTARTS = 3
_DAEMON_RESTART_BACKOFF = 0.3
_HEALTH_POLL_INTERVAL = 0.05
_CLOSE_CHANNEL_TIMEOUT = 5.0

_SERVICE = "/ringo.v1.QueueService/"
_LOCAL_TOKEN_HEADER = "x-ringo-local-token"


def _normalize_compression(value: object) -> CompressionOption:
    if value is None or value == "none":
        return "none"
    if value == "gzip":
        raise InvalidArgumentError(
            "compression='gzip' is not supported: ringo_trio's gRPC transport (grpclib)"
            " has no message compression, and accepting the option without compressing"
            " would be a lie; use compression='none' or leave it unset"
        )
    raise InvalidArgumentError(f"unsupported compression {value!r}; expected 'none' or None")


def _bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    if token is None or token == "":
        return ()
    if not isinstance(token, str):
        raise InvalidArgumentError("token must be a string")
    if not token.isascii() or any(c in token for c in "\r\n\0") or token != token.strip():
        raise InvalidArgumentError("token must be printable ASCII without surrounding whitespace")
    return (("authorization", f"Bearer {token}"),)


def _check_path(what: str, value: object) -> str:
    path = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(path, str):
        raise InvalidArgumentError(f"{what} must be a path")
    if not path:
        raise InvalidArgumentError(f"{what} is required")
    return path


def _positive_seconds(what: str, value: object) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidArgumentError(f"{what} must be a positive number of seconds")
    return float(value)


@dataclass(frozen=True, slots=True)
class _Session:
    minor: int
    token: str
    # Built once per negotiation and shared by every request of the session
    # (nothing mutates it), instead of one allocation per call.
    context: RequestContext = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        context = RequestContext(
            protocol_major=_limits.PROTOCOL_MAJOR,
            protocol_minor=self.minor,
            session_token=self.token,
        )
        object.__setattr__(self, "context", context)


_NO_SESSION = _Session(minor=_limits.PROTOCOL_MINOR, token="")


class RingoClient:
    """A client of one Ringo daemon; create it with `Ringo.local` or `Ringo.connect`.

    ::

        async with Ringo.connect("127.0.0.1:7233") as client:
            result = await client.queue("emails").enqueue(task_type="send", payload=b"...")
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        daemon: LocalDaemon | SharedLocalDaemon | None = None,
        compression: CompressionOption | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if (endpoint is None) == (daemon is None):
            raise InvalidArgumentError("give exactly one of endpoint and daemon")
        self._compression = _normalize_compression(compression)
        self._endpoint: Endpoint | None = parse_endpoint(endpoint) if endpoint is not None else None
        if tls is not None:
            if not isinstance(tls, ssl.SSLContext):
                raise InvalidArgumentError("tls must be an ssl.SSLContext")
            if self._endpoint is None:
                raise InvalidArgumentError("tls is for a daemon given by endpoint")
            self._endpoint = self._endpoint.with_tls(tls)
        self._metadata = _bearer_metadata(token)
        self._daemon = daemon
        self._transport: Transport | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._session = _NO_SESSION
        self._queues: dict[str, TaskQueue] = {}
        self._entered = False
        self._closed = False
        self._close_done: anyio.Event | None = None
        self._recovery_lock = anyio.Lock()
        self._daemon_restarts = 0
        # Weak: a worker that finished (or was never run) is not kept alive by
        # its client; `aclose` drains the ones still around.
        self._workers: weakref.WeakSet[Worker] = weakref.WeakSet()
        # Shared mode: the generation this client is a member of (None: not attached).
        self._member_of: str | None = None

    # -- properties ---------------------------------------------------------

    @property
    def _shared(self) -> SharedLocalDaemon | None:
        daemon = self._daemon
        return None if daemon is None or isinstance(daemon, LocalDaemon) else daemon

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        shared = self._shared
        if shared is None or shared.token is None:
            return self._metadata
        return (*self._metadata, (_LOCAL_TOKEN_HEADER, shared.token))

    @property
    def is_local(self) -> bool:
        return self._daemon is not None

    @property
    def compression(self) -> CompressionOption:
        """The effective message compression: always ``"none"`` (see `Ringo.connect`)."""
        return self._compression

    @property
    def endpoint(self) -> str | None:
        """The daemon's endpoint; for a local client known once started."""
        if self._transport is not None:
            return self._transport.endpoint.authority
        return self._endpoint.authority if self._endpoint is not None else None

    @property
    def protocol_minor(self) -> int:
        """The protocol minor negotiated with the daemon."""
        return self._session.minor

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def daemon_pid(self) -> int | None:
        """Process id of the local daemon (None for a remote client)."""
        return self._daemon.pid if self._daemon is not None else None

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> RingoClient:
        if self._entered:
            raise RingoError("a RingoClient can be entered only once")
        self._entered = True
        stack = AsyncExitStack()
        try:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            if self._daemon is not None:
                await stack.enter_async_context(self._daemon)
                endpoint = parse_endpoint(await self._daemon.start())
            else:
                assert self._endpoint is not None
                endpoint = self._endpoint
            self._transport = await stack.enter_async_context(
                Transport(endpoint, metadata=self._call_metadata())
            )
            if self._shared is not None:
                await self._join_shared()
            else:
                if self._daemon is not None:
                    await self._wait_serving(self._daemon.startup_timeout)
                await self._negotiate()
        except BaseException as exc:
            # Each component shields and bounds its own cleanup (a daemon is
            # killed even when this start was cancelled).
            self._closed = True
            if self._tg is not None:
                self._tg.cancel_scope.cancel()
            try:
                await stack.aclose()
            except BaseException as cleanup_error:
                exc.add_note(f"while unwinding a failed start: {cleanup_error!r}")
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        close_error: BaseException | None = None
        try:
            await self.aclose()
        except Exception as error:
            close_error = error
        finally:
            if stack is not None:
                assert self._tg is not None
                self._tg.cancel_scope.cancel()
                await stack.aclose()
        if close_error is not None:
            if exc is None:
                raise close_error
            # The body's exception is what the caller must see; the cleanup
            # failure rides along instead of replacing it.
            exc.add_note(f"while closing the Ringo client: {close_error!r}")

    async def aclose(self) -> None:
        """Drain this client's workers, close the channel and stop a local daemon.

        Idempotent; safe from any task. Workers get their grace period (see
        `Worker.close`); calls in flight then fail with `UnavailableError`;
        later calls raise `RingoError`.
        """
        if self._close_done is not None:
            self._closed = True
            await self._close_done.wait()
            return
        self._close_done = anyio.Event()
        errors: list[Exception] = []
        stopped_by: BaseException | None = None
        try:
            # Workers drain on the still-open channel before it closes. The
            # caller's deadline wins over their grace periods: cut short, they
            # stop at once (handlers cancelled, leases released) while the
            # channel closes.
            workers = list(self._workers)
            try:
                for worker in workers:
                    worker._request_close()
                for worker in workers:
                    await worker.close()
            except BaseException as exc:
                stopped_by = exc
                for worker in workers:
                    worker._stop_now("the client was closed before its workers drained")
            with anyio.CancelScope(shield=True):
                self._closed = True
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
        finally:
            self._close_done.set()
        if stopped_by is not None:
            raise stopped_by
        if errors:
            raise ExceptionGroup("errors while closing the Ringo client", errors)

    close = aclose

    def _register_worker(self, worker: Worker) -> None:
        if self._closed or self._close_done is not None:
            raise RingoError("client is closed")
        self._workers.add(worker)

    # -- queues -------------------------------------------------------------

    def queue(self, name: str) -> TaskQueue:
        """The `TaskQueue` named ``name`` (one object per name per client)."""
        _check_name("queue name", name)
        if self._closed:
            raise RingoError("client is closed")
        existing = self._queues.get(name)
        if existing is None:
            existing = self._queues[name] = TaskQueue(self, name)
        return existing

    # -- calls --------------------------------------------------------------

    def _require_transport(self) -> Transport:
        if self._closed:
            raise RingoError("client is closed")
        if self._transport is None:
            raise RingoError("client is not started; use 'async with Ringo.connect(...) as client'")
        return self._transport

    async def _call(
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
        transport = self._require_transport()
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
            await self._recover(sent, session_rejected=True)
            if self._session.token == sent.token:
                raise
        except UnavailableError:
            if self._closed:
                raise
            await self._recover(sent, session_rejected=False)
            if not read_only:
                # Never replay a mutation: it may have been applied.
                raise
        request.context = self._session.context
        return await transport.unary(route, request, response_type, rpc_timeout=timeout)

    async def _recover(self, failed: _Session, *, session_rejected: bool) -> None:
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
        transport = self._require_transport()
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
        transport = self._require_transport()
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

    async def _join_shared(self, transport: Transport | None = None) -> None:
        """Elect or adopt the data dir's shared daemon, connect, negotiate and
        attach as a member. An identity that does not hold up (no answer, a
        wrong token, another generation) is never trusted again: one bounded
        re-election, as the seed does."""
        shared = self._shared
        assert shared is not None
        assert self._tg is not None
        elected = transport is None  # on entry, start() has just run
        transport = transport or self._require_transport()
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
        transport = self._require_transport()
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
        await self._recover(self._session, session_rejected=False)

    async def _negotiate(self) -> None:
        transport = self._require_transport()
        reply = await transport.unary(
            _SERVICE + "Negotiate",
            NegotiateRequest(
                sdk_name=SDK_NAME,
                sdk_version=SDK_VERSION,
                protocol_major=_limits.PROTOCOL_MAJOR,
                protocol_minor=_limits.PROTOCOL_MINOR,
            ),
            NegotiateResponse,
            rpc_timeout=DEFAULT_RPC_TIMEOUT,
        )
        if reply.protocol_major != _limits.PROTOCOL_MAJOR:
            raise IncompatibleVersionError(
                f"the daemon speaks protocol major {reply.protocol_major}, this SDK"
                f" speaks {_limits.PROTOCOL_MAJOR}; upgrade one side"
            )
        self._session = _Session(
            minor=min(reply.protocol_minor, _limits.PROTOCOL_MINOR), token=reply.session_token
        )


class Ringo:
    """Factories for clients: `Ringo.local` (private daemon) and `Ringo.connect` (remote).

    Both are synchronous and validate their arguments at once; connecting
    happens when the returned client is entered with ``async with``.
    """

    @staticmethod
    def local(
        data_dir: str | os.PathLike[str],
        storage: str | SQLiteStorage | PostgresStorage = "sqlite",
        daemon_path: str | os.PathLike[str] | None = None,
        *,
        shared: bool = False,
        startup_timeout: float = 15.0,
        stop_timeout: float = 10.0,
    ) -> RingoClient:
        """A client with its own daemon child process storing in ``data_dir``.

        ``storage`` is ``"sqlite"``/`SQLiteStorage` (the default) or
        `PostgresStorage`: the daemon then stores in that (user-managed)
        database, creating or migrating its schema, and gets the DSN through
        its environment, never its command line; ``data_dir`` is still
        created but holds nothing. ``daemon_path`` runs another daemon executable
        instead of ``python -m ringo_trio.server``. The daemon exits with
        the client — and with this process, however it dies.

        Other local users cannot use the daemon: it requires a random secret
        only this client holds (``shared=True``: only processes that can read
        the data dir), and the data dir is made 0700 with its database files
        0600, whatever the umask.

        ``shared=True`` (SQLite only): every process that opens ``data_dir``
        this way uses ONE daemon. The first elects itself and starts it; the
        others attach to it (``AttachLocal``); it stops a short linger after
        the last member leaves, and when it dies the members elect a new one
        and reconnect. See docs/client.md.
        """
        if not isinstance(shared, bool):
            raise InvalidArgumentError("shared must be a boolean")
        data_dir = _check_path("data_dir", data_dir)
        if daemon_path is not None:
            daemon_path = _check_path("daemon_path", daemon_path)
        postgres: PostgresStorage | None = None
        if isinstance(storage, PostgresStorage):
            postgres = storage
        elif not (storage == "sqlite" or isinstance(storage, SQLiteStorage)):
            raise InvalidArgumentError(
                f"unsupported local storage {storage!r}; use 'sqlite', SQLiteStorage()"
                " or PostgresStorage(dsn)"
            )
        if shared:
            if postgres is not None:
                # Sharing is an election over one machine's data dir; daemons
                # on one PostgreSQL database need none (run several, or one
                # `ringod` every process connects to).
                raise InvalidArgumentError(
                    "shared local mode supports SQLite only; with PostgreSQL run"
                    " ringod and use Ringo.connect, or one Ringo.local per process"
                )
            from ._shared import SharedLocalDaemon

            return RingoClient(
                daemon=SharedLocalDaemon(
                    data_dir,
                    daemon_path=daemon_path,
                    startup_timeout=_positive_seconds("startup_timeout", startup_timeout),
                )
            )
        # Loopback is open to every local user: the daemon serves only
        # callers holding this secret (it gets it through its environment).
        token = secrets.token_urlsafe(32)
        daemon = LocalDaemon(
            data_dir,
            postgres=postgres,
            daemon_path=daemon_path,
            startup_timeout=_positive_seconds("startup_timeout", startup_timeout),
            stop_timeout=_positive_seconds("stop_timeout", stop_timeout),
            token=token,
        )
        return RingoClient(daemon=daemon, token=token)

    @staticmethod
    def connect(
        endpoint: str,
        token: str | None = None,
        *,
        compression: CompressionOption | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> RingoClient:
        """A client of the daemon at ``endpoint``.

        ``endpoint`` is ``host``, ``host:port`` (default port 7233) or a URL
        with scheme ``grpc``/``http`` (plaintext) or ``grpcs``/``https``
        (TLS). ``token`` is sent as a bearer token.
        ``compression`` accepts ``"none"`` or None: the transport cannot
        compress messages, so ``"gzip"`` is refused with
        `InvalidArgumentError` rather than silently ignored.

        TLS trusts the system's CAs unless ``tls_ca`` names a PEM bundle to
        trust instead (a private CA). ``tls_cert`` (with ``tls_key``, unless
        the key is in the same PEM file) is the client certificate a daemon
        doing mutual TLS (``ringod --tls-client-ca``) asks for. Any of the
        three turns TLS on; with an explicit ``grpc://``/``http://`` scheme
        they are an `InvalidArgumentError`, as is a file that cannot be
        loaded (checked here, before any network activity).
        """
        context: ssl.SSLContext | None = None
        if tls_ca is not None or tls_cert is not None or tls_key is not None:
            context = _tls_context(endpoint, tls_ca, tls_cert, tls_key)
        return RingoClient(endpoint=endpoint, token=token, compression=compression, tls=context)


def _tls_context(
    endpoint: object,
    ca: str | os.PathLike[str] | None,
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
) -> ssl.SSLContext:
    if isinstance(endpoint, str) and endpoint.lower().startswith(("grpc://", "http://")):
        raise InvalidArgumentError(
            f"endpoint {endpoint!r} asks for plaintext, but TLS options were given;"
            " use grpcs:// (or no scheme)"
        )
    if key is not None and cert is None:
        raise InvalidArgumentError("tls_key needs tls_cert (the certificate it belongs to)")
    paths = {
        name: None if value is None else _check_path(name, value)
        for name, value in (("tls_ca", ca), ("tls_cert", cert), ("tls_key", key))
    }
    try:
        return client_tls_context(paths["tls_ca"], paths["tls_cert"], paths["tls_key"])
    except (OSError, ssl.SSLError) as exc:
        given = ", ".join(f"{name}={path!r}" for name, path in paths.items() if path)
        raise InvalidArgumentError(f"cannot load the TLS files ({given}): {exc}") from exc
