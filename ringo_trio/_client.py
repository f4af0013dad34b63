"""Ringo and RingoClient: the factories and the facade that owns a connection's life.

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

*Calls* — negotiation, the retry rules, recovery and the Work streams' access
to all three — are `ringo_trio._connection.Connection`'s, which `TaskQueue`
and `Worker` depend on; the client reaches into neither.
"""

from __future__ import annotations

import functools
import os
import secrets
import ssl
from contextlib import AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.abc
import anyio.lowlevel

from ._connection import Connection
from ._contract import limits as _limits
from ._contract.versions import Feature
from ._endpoint import Endpoint, parse_endpoint
from ._errors import (
    InvalidArgumentError,
    RingoError,
    require,
)
from ._local.process import LocalDaemon
from ._models import (
    LimitStatus,
    PostgresStorage,
    QueueStats,
    Schedule,
    SQLiteStorage,
    check_name,
)
from ._proto.ringo.v1 import (
    ListLimitsRequest,
    ListLimitsResponse,
    ListQueuesRequest,
    ListQueuesResponse,
    ListSchedulesRequest,
    ListSchedulesResponse,
)
from ._queue.queue import TaskQueue
from ._transport.base import DEFAULT_KEEPALIVE, ClientTransport, Keepalive
from ._transport.grpclib import client_tls_context

if TYPE_CHECKING:
    from ._local.shared import SharedLocalDaemon

__all__ = ["TOKEN_ENV", "CompressionOption", "Ringo", "RingoClient"]

#: The bearer token `Ringo.connect` sends when given none, as every ``ringo``
#: command reads it when ``--token`` is not given.
TOKEN_ENV = "RINGO_TOKEN"


CompressionOption = Literal["none", "gzip"]


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


def _keepalive(interval: object, timeout: object) -> Keepalive | None:
    if interval is None:
        return None
    keepalive = Keepalive(
        _finite_seconds("keepalive_interval", interval),
        _finite_seconds("keepalive_timeout", timeout),
    )
    return keepalive


def _finite_seconds(what: str, value: object) -> float:
    seconds = _positive_seconds(what, value)
    if seconds == float("inf"):
        raise InvalidArgumentError(f"{what} must be a finite number of seconds")
    return seconds


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
        transport: ClientTransport | None = None,
        keepalive: Keepalive | None = DEFAULT_KEEPALIVE,
    ) -> None:
        # ``transport`` (a ready-made `ClientTransport` instead of an endpoint
        # or a daemon) is how `ringo_trio.testing` wires a client to an
        # in-process daemon.
        if sum(given is not None for given in (endpoint, daemon, transport)) != 1:
            raise InvalidArgumentError("give exactly one of endpoint, daemon and transport")
        self._compression = _normalize_compression(compression)
        self._endpoint: Endpoint | None = parse_endpoint(endpoint) if endpoint is not None else None
        if tls is not None:
            if not isinstance(tls, ssl.SSLContext):
                raise InvalidArgumentError("tls must be an ssl.SSLContext")
            if self._endpoint is None:
                raise InvalidArgumentError("tls is for a daemon given by endpoint")
            self._endpoint = self._endpoint.with_tls(tls)
        self._connection = Connection(
            endpoint=self._endpoint,
            metadata=_bearer_metadata(token),
            daemon=daemon,
            transport=transport,
            keepalive=keepalive,
        )
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._queues: dict[str, TaskQueue] = {}
        self._entered = False
        self._close_done: anyio.Event | None = None

    # -- properties ---------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return self._connection.daemon is not None

    @property
    def compression(self) -> CompressionOption:
        """The effective message compression: always ``"none"`` (see `Ringo.connect`)."""
        return self._compression

    @property
    def endpoint(self) -> str | None:
        """The daemon's endpoint; for a local client known once started."""
        return self._connection.endpoint

    @property
    def protocol_minor(self) -> int:
        """The protocol minor negotiated with the daemon."""
        return self._connection.protocol_minor

    @property
    def closed(self) -> bool:
        return self._connection.closed

    @property
    def daemon_pid(self) -> int | None:
        """Process id of the local daemon (None for a remote client)."""
        daemon = self._connection.daemon
        return daemon.pid if daemon is not None else None

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> RingoClient:
        if self._entered:
            raise RingoError("a RingoClient can be entered only once")
        self._entered = True
        stack = AsyncExitStack()
        try:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            await self._connection.open(stack, self._tg)
        except BaseException as exc:
            # Each component shields and bounds its own cleanup (a daemon is
            # killed even when this start was cancelled).
            self._connection.mark_closed()
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
            self._connection.mark_closed()
            await self._close_done.wait()
            return
        self._close_done = anyio.Event()
        self._connection.refuse_new_workers()
        errors: list[Exception] = []
        stopped_by: BaseException | None = None
        try:
            # Workers drain on the still-open channel before it closes. The
            # caller's deadline bounds the whole close, releases included:
            # the drain gets the time up to `_release_reserve` before it;
            # cut short there (or by the caller's cancellation), the workers
            # stop at once — handlers cancelled, leases released — and the
            # channel closes only once those releases are answered or the
            # deadline comes. Closing it at once sent nothing (issue 24).
            workers = list(self._connection.workers)
            deadline = anyio.current_effective_deadline()
            try:
                with anyio.CancelScope(deadline=_drain_deadline(deadline, anyio.current_time())):
                    # All drains start together (their grace periods overlap);
                    # the waits then end in any order.
                    for worker in workers:
                        worker.request_close()
                    for worker in workers:
                        await worker.close()
            except BaseException as exc:
                stopped_by = exc
            finally:
                # Shielded: a cancelled caller still gets its releases sent
                # (a second Ctrl-C still ends it: see `_interrupts`). Each stop
                # is bounded by its worker's stop_timeout, all of them by the
                # caller's deadline; a drained worker's returns at once.
                with anyio.CancelScope(shield=True, deadline=deadline):
                    async with anyio.create_task_group() as stopping:
                        for worker in workers:
                            stopping.start_soon(
                                functools.partial(worker.stop, reason=_CLOSED_BEFORE_DRAINED)
                            )
            errors = await self._connection.close()
        finally:
            self._close_done.set()
        if stopped_by is not None:
            raise stopped_by
        # A caller whose deadline passed while the stop used it up learns so
        # as from any other call: by its cancellation.
        await anyio.lowlevel.checkpoint_if_cancelled()
        if errors:
            raise ExceptionGroup("errors while closing the Ringo client", errors)

    close = aclose

    # -- queues -------------------------------------------------------------

    def queue(self, name: str) -> TaskQueue:
        """The `TaskQueue` named ``name`` (one object per name per client)."""
        check_name("queue name", name)
        if self._connection.closed:
            raise RingoError("client is closed")
        existing = self._queues.get(name)
        if existing is None:
            existing = self._queues[name] = TaskQueue(self._connection, name)
        return existing

    async def queues(self) -> list[QueueStats]:
        """Every queue that holds a task, by name, with its counts by state
        (no per-type breakdown: `TaskQueue.stats` has it). Protocol minor >= 9.

        Pages through ListQueues (1,000 queues a call); a queue created or
        emptied meanwhile may or may not be in the answer."""
        require(self._connection.protocol_minor, Feature.OPERATE, "RingoClient.queues")
        found: list[QueueStats] = []
        token = ""
        while True:
            reply = await self._connection.call(
                "ListQueues",
                ListQueuesRequest(page_size=_limits.MAX_LIST_PAGE, page_token=token),
                ListQueuesResponse,
                read_only=True,
            )
            found.extend(QueueStats.from_wire(q) for q in reply.queues)
            token = reply.next_page_token
            if not token:
                return found

    async def schedules(self) -> list[Schedule]:
        """Every queue's schedules, by (queue, name); `TaskQueue.schedules`
        has one queue's. Protocol minor >= 13."""
        require(self._connection.protocol_minor, Feature.SCHEDULES, "RingoClient.schedules")
        reply = await self._connection.call(
            "ListSchedules", ListSchedulesRequest(), ListSchedulesResponse, read_only=True
        )
        return [Schedule.from_wire(s) for s in reply.schedules]

    async def limits(self, *, with_keys: bool = False) -> list[LimitStatus]:
        """Every queue's limit rules, in (queue, prefix) order
        (`TaskQueue.limits` for one queue's). Protocol minor >= 13."""
        require(self._connection.protocol_minor, Feature.LIMITS, "RingoClient.limits")
        reply = await self._connection.call(
            "ListLimits",
            ListLimitsRequest(with_keys=with_keys),
            ListLimitsResponse,
            read_only=True,
        )
        return [LimitStatus.from_wire(s) for s in reply.limits]


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
        keepalive_interval: float | timedelta | None = DEFAULT_KEEPALIVE.interval,
        keepalive_timeout: float | timedelta = DEFAULT_KEEPALIVE.timeout,
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

        ``keepalive_interval``/``keepalive_timeout``: as for `Ringo.connect`;
        a daemon that froze is found within their sum, for a shared daemon's
        idle member too.
        """
        keepalive = _keepalive(keepalive_interval, keepalive_timeout)
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
            from ._local.shared import SharedLocalDaemon

            return RingoClient(
                daemon=SharedLocalDaemon(
                    data_dir,
                    daemon_path=daemon_path,
                    startup_timeout=_positive_seconds("startup_timeout", startup_timeout),
                ),
                keepalive=keepalive,
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
        return RingoClient(daemon=daemon, token=token, keepalive=keepalive)

    @staticmethod
    def connect(
        endpoint: str,
        token: str | None = None,
        *,
        compression: CompressionOption | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
        keepalive_interval: float | timedelta | None = DEFAULT_KEEPALIVE.interval,
        keepalive_timeout: float | timedelta = DEFAULT_KEEPALIVE.timeout,
    ) -> RingoClient:
        """A client of the daemon at ``endpoint``.

        ``endpoint`` is ``host``, ``host:port`` (default port 7233) or a URL
        with scheme ``grpc``/``http`` (plaintext) or ``grpcs``/``https``
        (TLS). ``token`` is sent as a bearer token; when it is None (not
        given) the environment's ``$RINGO_TOKEN`` is, if set and not empty —
        the argument wins over the environment, as ``--token`` does in the
        ``ringo`` commands. ``token=""`` sends none, whatever the environment.
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

        Keepalive: the channel sends an HTTP/2 PING every
        ``keepalive_interval`` seconds (idle or not) and closes the
        connection when one is not acknowledged within ``keepalive_timeout``
        seconds, so a daemon that froze, or a network path that went dark
        without a reset, fails the calls and Work streams waiting on it
        (`UnavailableError`; workers reconnect) instead of holding them.
        Seconds or `timedelta`, positive and finite; ``keepalive_interval=None``
        sends no pings (for a proxy in between that objects to them).
        """
        keepalive = _keepalive(keepalive_interval, keepalive_timeout)
        if token is None:
            # Read here, not at import: a token exported after the import counts.
            token = os.environ.get(TOKEN_ENV) or None
        context: ssl.SSLContext | None = None
        if tls_ca is not None or tls_cert is not None or tls_key is not None:
            context = _tls_context(endpoint, tls_ca, tls_cert, tls_key)
        return RingoClient(
            endpoint=endpoint,
            token=token,
            compression=compression,
            tls=context,
            keepalive=keepalive,
        )


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


_CLOSED_BEFORE_DRAINED = "the client was closed before its workers drained"

# How much of a deadline-bound ``aclose`` is kept for the stop after the
# drain: releases and the daemon's answers take a round trip or two.
_RELEASE_RESERVE = 1.0


def _drain_deadline(deadline: float, now: float) -> float:
    """When a deadline-bound close stops draining: `_RELEASE_RESERVE` before
    the caller's ``deadline``, or halfway there when less time is left."""
    if deadline == float("inf"):
        return deadline
    return max(now, deadline - min(_RELEASE_RESERVE, (deadline - now) / 2))
