"""One serving lifetime of the daemon: storage, gRPC server, background tasks.

`Daemon.serve` owns everything it starts. The background tasks — the lease
reaper, the storage watch, the safety poll, retention (`retention`), the
schedule loop (`schedules`: due schedules become tasks) and
the storage's upkeep (`Storage.maintain`: SQLite's WAL checkpoints in a
worker thread, whose wait it bounds) — run in an `asyncio.TaskGroup` that
cannot outlive the call; grpclib's per-call tasks are drained and then
cancelled by the server; storage is closed last, after no call can touch it
any more.

**Metrics** (``DaemonConfig.metrics_listen``, `http.metrics`): the /metrics
responder is one more background task of that group; without it, the
daemon's `metrics` is the do-nothing `Metrics`. The **dashboard**
(``ui_listen``, `http.ui`) is another, on the same h11 `http.server`, with the
purges it runs in the background in a task group of its own inside that
task (`Dashboard.serve`); without it nothing of it is built and storage is
not wrapped for its sparklines.

**Other daemons.** On a database several daemons share (PostgreSQL), work
can become claimable without this daemon doing anything: another daemon
enqueued, nacked, released or expired it. `Storage.watch` reports that
(LISTEN/NOTIFY) and every report wakes that queue's long polls and Work
streams; a report without a queue (the watch connection was re-established,
so notifications may have been missed) wakes every queue. The *safety poll*
(`DaemonConfig.safety_poll`) wakes every watched queue periodically, so even
a notification lost some other way costs at most one period. Leases granted
by another daemon that died need neither: `Storage.next_wakeup` includes
every lease's expiry, so an idle dispatcher wakes when such a lease runs out
and its claim takes the task over; the reaper's backstop sweep covers the
rest. Paused queues (`rpc.paused`) are read from storage before serving;
another daemon's pause or resume arrives through the same watch, and the
paused set is re-read at every reconnect and every
`DaemonConfig.paused_refresh` seconds.

**Storage full.** An engine reports every write that failed for want of
room (`Storage.full_listener`); health turns NOT_SERVING at the first, so a
load balancer or supervisor stops sending work, and the *room probe* then
tries `Storage.probe` every `_ROOM_PROBE_INTERVAL` seconds until a write
commits again, when health returns to SERVING. Calls keep being served
meanwhile: reads work, and writes answer RESOURCE_EXHAUSTED.

**Storage unreachable.** For an engine whose backend is a server
(`Storage.can_be_unreachable`: PostgreSQL) the *reach probe* runs
`Storage.ping` every `DaemonConfig.storage_probe` seconds, each bounded by
`storage_probe_timeout`; health is NOT_SERVING from the first failed ping
until one succeeds, so an outage shows within probe + timeout (3 s by
default). An operation that failed for want of a connection
(`Storage.unavailable_listener`) makes the probe ping at once rather than
at its next beat; it is not taken as proof by itself, since one dropped
pool connection is no outage. Calls are served meanwhile (those that need
storage answer UNAVAILABLE), and health follows storage back without a
restart. Health is SERVING only while storage is neither full nor
unreachable.

Shutdown order (on `stop`):

1. health flips to NOT_SERVING (Watch streams deliver it and end);
2. the gate refuses new calls with UNAVAILABLE; a shared daemon's member
   (AttachLocal) streams end UNAVAILABLE at once (the gate does not count
   them, so they never hold up step 4);
3. long-poll claims are woken and return what they have (nothing); Work
   streams stop pushing, and each ends (UNAVAILABLE) once its worker holds
   no lease pushed on it;
4. in-flight calls (Work streams included) get `shutdown_timeout` seconds to
   finish;
5. the server is closed (cancelling stragglers) and the background tasks
   cancelled;
6. storage is closed.

A **shared** daemon (`DaemonConfig.local_token` and `generation`; see
`members`) also sets `stop` by itself: when no member attached within
`attach_timeout` seconds of `on_ready`, or the last member has been gone for
`linger` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ringo_trio._contract import limits, versions

from .clock import Clock
from .http.metrics import NO_METRICS, Metrics, PrometheusMetrics
from .http.scrape import serve_metrics
from .http.ui import Activity, Dashboard, instrument_activity
from .http.ui.app import SQLITE_PURGE_PAUSE
from .retention import Retention, RetentionPolicy
from .rpc.codec import StrictCodec
from .rpc.commit import GroupCommit
from .rpc.connections import ConnectionLimits, GuardedServer
from .rpc.gate import Gate
from .rpc.health import HealthService
from .rpc.members import ATTACH_LOCAL_METHOD, DEFAULT_ATTACH_TIMEOUT, DEFAULT_LINGER, Members
from .rpc.memory import InMemoryChannel
from .rpc.paused import DEFAULT_PAUSED_REFRESH, PausedQueues
from .rpc.service import QueueService
from .rpc.sessions import SessionTable
from .rpc.throttle import DEFAULT_CAP, AuthThrottle
from .rpc.waits import DEFAULT_RECHECK_INTERVAL as DEFAULT_WAIT_RECHECK
from .rpc.waits import REASK_WINDOW, TaskWaits
from .rpc.wakeups import LeaseReaper, QueueWakeups
from .schedules import ScheduleLoop
from .storage.base import Storage, StorageFull
from .storage.sqlite import SQLiteEngine

__all__ = ["Daemon", "DaemonConfig", "ListenError", "format_endpoint"]

log = logging.getLogger("ringo_trio.server")

_ROOM_PROBE_INTERVAL = 1.0
_FULL = "storage full"
_UNREACHABLE = "storage unreachable"


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    host: str = "127.0.0.1"
    port: int = limits.DEFAULT_PORT
    protocol_minor: int = versions.MINOR
    session_ttl: timedelta = limits.DEFAULT_SESSION_TTL
    token: str | None = None
    shutdown_timeout: float = 5.0
    reaper_backstop: float = 5.0
    heartbeat_interval: float = 10.0
    # Shared mode: both set, or neither.
    local_token: str | None = None
    generation: str | None = None
    linger: float = DEFAULT_LINGER
    attach_timeout: float = DEFAULT_ATTACH_TIMEOUT
    # Seconds between wake-ups of every watched queue; None: no safety poll.
    safety_poll: float | None = None
    # The longest a failed authentication waits for its answer (_throttle).
    auth_failure_delay: float = DEFAULT_CAP
    # Where to serve Prometheus /metrics (None: no metrics, no cost).
    metrics_listen: tuple[str, int] | None = None
    # Where to serve the dashboard (None: none, no cost); without actions.
    ui_listen: tuple[str, int] | None = None
    ui_read_only: bool = False
    # TLS (None: plaintext); built and checked by the command line.
    tls: ssl.SSLContext | None = None
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Storage upkeep off the event loop (SQLite: WAL checkpoints in a worker
    # thread, `Storage.maintain`). Off for an in-process daemon on a virtual
    # clock, where waiting for a real thread would let virtual time run ahead;
    # the loop's own automatic checkpoint then does the work.
    storage_upkeep: bool = True
    # Finished tasks older than this are deleted in the background (_retention);
    # the default keeps them all (ringod's flags default to 7d/30d/7d).
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    # The reach probe (engines that can be unreachable): seconds between
    # pings, and the longest a ping may take before storage counts as down.
    storage_probe: float = 1.0
    storage_probe_timeout: float = 2.0
    # WaitTask: parked calls at most (``--max-waits``), and seconds between
    # the batched rechecks of their tasks while any are parked.
    max_waits: int = limits.DEFAULT_MAX_WAITS
    # Seconds between re-reads of the paused queues on a shared store (the
    # staleness bound should a notification be lost, `rpc.paused`).
    paused_refresh: float = DEFAULT_PAUSED_REFRESH
    wait_recheck: float = DEFAULT_WAIT_RECHECK

    @property
    def shared(self) -> bool:
        return self.local_token is not None


class ListenError(OSError):
    """The configured address cannot be bound."""


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _bind(host: str, port: int) -> socket.socket:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _listen_http(address: tuple[str, int], what: str) -> socket.socket:
    host, port = address
    try:
        sock = await _bind(host, port)
    except OSError as exc:
        raise ListenError(f"cannot serve {what} on {format_endpoint(host, port)}: {exc}") from exc
    try:
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock


class Daemon:
    def __init__(
        self, config: DaemonConfig, storage: Storage, *, clock: Clock | None = None
    ) -> None:
        if (config.local_token is None) != (config.generation is None):
            raise ValueError("a shared daemon needs both local_token and generation")
        if config.local_token == "":
            raise ValueError("local_token must not be empty")
        if config.safety_poll is not None and not config.safety_poll > 0:
            raise ValueError("safety_poll must be positive (or None for none)")
        if not (config.storage_probe > 0 and config.storage_probe_timeout > 0):
            raise ValueError("storage_probe and storage_probe_timeout must be positive")
        self.config = config
        self.storage = storage
        self.clock = clock or Clock()
        self._prometheus = PrometheusMetrics() if config.metrics_listen is not None else None
        self.metrics: Metrics = self._prometheus or NO_METRICS
        self.metrics.instrument(storage)
        self.wakeups = QueueWakeups()
        self.reaper = LeaseReaper(
            storage, self.clock, self.wakeups, backstop=config.reaper_backstop
        )
        self.retention = Retention(storage, self.clock, config.retention)
        self.waits = TaskWaits(
            storage,
            max_waits=config.max_waits,
            recheck_interval=config.wait_recheck,
            # Acks that delete must not take a result from under a client
            # between two of its calls.
            reask_window=REASK_WINDOW if config.retention.delete_at_ack else 0.0,
        )
        # Expiry and purges count what they changed without naming it: a
        # recheck finds the waited tasks among them.
        self.reaper.expired_listener = self.waits.recheck
        self.retention.deleted_listener = self.waits.recheck
        storage.delete_succeeded = config.retention.delete_at_ack
        storage.waited = self.waits
        self.paused = PausedQueues(storage, self.wakeups, refresh_interval=config.paused_refresh)
        # Schedules: each tick one task, enqueued here and woken like an enqueue.
        self.schedules = ScheduleLoop(storage, self.clock, self.wakeups.notify)
        self.sessions = SessionTable(config.session_ttl)
        self.health = HealthService()
        self.members = Members(
            config.generation, linger=config.linger, attach_timeout=config.attach_timeout
        )
        self.gate = Gate(
            config.token,
            local_token=config.local_token,
            uncounted={ATTACH_LOCAL_METHOD},
            throttle=AuthThrottle(cap=config.auth_failure_delay),
        )
        self.commit = GroupCommit(storage)
        self.queue_service = QueueService(
            storage,
            clock=self.clock,
            sessions=self.sessions,
            served_minor=config.protocol_minor,
            wakeups=self.wakeups,
            reaper=self.reaper,
            heartbeat_interval=config.heartbeat_interval,
            members=self.members,
            commit=self.commit,
            waits=self.waits,
            paused=self.paused,
            schedules=self.schedules,
        )
        self.queue_service.work_streams.metrics = self.metrics
        self.dashboard: Dashboard | None = None
        if config.ui_listen is not None:
            activity = Activity()
            instrument_activity(storage, activity)
            self.dashboard = Dashboard(
                service=self.queue_service,
                rpc_sessions=self.sessions,
                clock=self.clock,
                activity=activity,
                # The gate's: one address guessing over gRPC and HTTP waits in one line.
                throttle=self.gate.throttle,
                token=config.token,
                read_only=config.ui_read_only,
                listen_host=config.ui_listen[0],
                # Retention's batches were measured against health-check
                # latency; a purge click deletes the same way.
                purge_batch=config.retention.batch,
                purge_pause=(
                    max(config.retention.pause, SQLITE_PURGE_PAUSE)
                    if isinstance(storage, SQLiteEngine)
                    else config.retention.pause
                ),
            )
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.ui_port: int | None = None
        self._server: GuardedServer | None = None
        self._full = asyncio.Event()
        storage.full_listener = self._storage_full
        # Set by an operation that lost its connection: ping now.
        self._ping_now = asyncio.Event()
        storage.unavailable_listener = self._storage_unavailable

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the daemon is not serving")
        return format_endpoint(self.config.host, self.port)

    async def serve(
        self, stop: asyncio.Event, on_ready: Callable[[Daemon], None], *, in_memory: bool = False
    ) -> None:
        """Serve until `stop` is set, then shut down gracefully.

        `on_ready` runs once the port is bound and health says SERVING.
        Raises `ListenError` when the address cannot be bound. ``in_memory``
        binds no socket: clients connect through `in_memory_channel` (the
        testing kit's in-process daemon).
        """
        await self.storage.open()
        try:
            await self._serve_open(stop, on_ready, in_memory)
        finally:
            await self.storage.close()

    def in_memory_channel(self) -> InMemoryChannel:
        """A grpclib channel to this daemon without a socket (``serve(in_memory=True)``)."""
        if self._server is None:
            raise RuntimeError("the daemon is not serving")
        return InMemoryChannel(self._server)

    async def _serve_open(
        self, stop: asyncio.Event, on_ready: Callable[[Daemon], None], in_memory: bool
    ) -> None:
        # Before any call can arrive: a paused queue stays paused across
        # restarts (a failure here fails the start, like opening storage).
        await self.paused.load()
        server = GuardedServer(
            [self.queue_service, self.health], codec=StrictCodec(), limits=self.config.connections
        )
        # Before the gate's listener, so a call the gate refuses is counted.
        self.metrics.install(server)
        self.gate.install(server)
        metrics_sock = await self._listen_metrics()
        try:
            ui_sock = await self._listen_ui()
        except BaseException:
            if metrics_sock is not None:
                metrics_sock.close()
            raise
        if in_memory:
            server.start_in_memory()
            where = "memory"
        else:
            try:
                where = await self._listen(server)
            except BaseException:
                for sock in (metrics_sock, ui_sock):
                    if sock is not None:
                        sock.close()
                raise
        self._server = server
        try:
            async with asyncio.TaskGroup() as tasks:
                background = [
                    tasks.create_task(self.reaper.run(), name="ringod lease reaper"),
                    tasks.create_task(self.commit.run(), name="ringod group commit"),
                    tasks.create_task(self.waits.run(), name="ringod task waits"),
                    tasks.create_task(self._watch(), name="ringod storage watch"),
                    tasks.create_task(self.paused.run(), name="ringod paused queues"),
                    tasks.create_task(self._room_probe(), name="ringod room probe"),
                    tasks.create_task(self._reach_probe(), name="ringod reach probe"),
                    tasks.create_task(self.retention.run(), name="ringod retention"),
                    tasks.create_task(self.schedules.run(), name="ringod schedules"),
                ]
                if self.config.storage_upkeep:
                    background.append(
                        tasks.create_task(self.storage.maintain(), name="ringod storage upkeep")
                    )
                if metrics_sock is not None:
                    assert self._prometheus is not None
                    background.append(
                        tasks.create_task(
                            serve_metrics(metrics_sock, self._prometheus, self._refresh_metrics),
                            name="ringod metrics",
                        )
                    )
                    metrics_sock = None
                if ui_sock is not None:
                    assert self.dashboard is not None
                    background.append(
                        tasks.create_task(self.dashboard.serve(ui_sock), name="ringod ui")
                    )
                    ui_sock = None
                if self.config.safety_poll is not None:
                    background.append(
                        tasks.create_task(
                            self._safety_poll(self.config.safety_poll), name="ringod safety poll"
                        )
                    )
                self.health.set_serving()
                log.info("serving on %s", where)
                on_ready(self)

                def idle(reason: str) -> None:
                    if not stop.is_set():
                        log.info("%s: shutting down", reason)
                        stop.set()

                self.members.arm(idle)
                await stop.wait()
                await self._drain()
                for task in background:
                    task.cancel()
        finally:
            for sock in (metrics_sock, ui_sock):
                if sock is not None:
                    sock.close()
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.shutdown_timeout):
                    await server.wait_closed()

    async def _listen(self, server: GuardedServer) -> str:
        try:
            sock = await _bind(self.config.host, self.config.port)
        except OSError as exc:
            where = format_endpoint(self.config.host, self.config.port)
            raise ListenError(f"cannot serve on {where}: {exc}") from exc
        try:
            await server.start(sock=sock, ssl=self.config.tls)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        return self.endpoint

    async def _listen_metrics(self) -> socket.socket | None:
        if self.config.metrics_listen is None:
            return None
        sock = await _listen_http(self.config.metrics_listen, "metrics")
        self.metrics_port = sock.getsockname()[1]
        host = self.config.metrics_listen[0]
        log.info("metrics at http://%s/metrics", format_endpoint(host, self.metrics_port))
        return sock

    async def _listen_ui(self) -> socket.socket | None:
        if self.config.ui_listen is None:
            return None
        sock = await _listen_http(self.config.ui_listen, "the dashboard")
        self.ui_port = sock.getsockname()[1]
        log.info("dashboard at http://%s/", format_endpoint(self.config.ui_listen[0], self.ui_port))
        return sock

    async def _refresh_metrics(self) -> None:
        assert self._prometheus is not None
        await self._prometheus.refresh(self.storage, self.clock.now())

    def _other_daemon_changed(self, queue: str | None) -> None:
        if queue is None:
            # Reconnected: a pause or resume may have been missed too.
            self.paused.stale()
            self.wakeups.notify_all()
        else:
            self.wakeups.notify(queue)

    async def _watch(self) -> None:
        try:
            await self.storage.watch(self._other_daemon_changed, self.paused.changed_elsewhere)
        except Exception:
            # The engine promises not to raise; should it anyway, serving goes
            # on, with the safety poll as the only news from other daemons.
            log.exception(
                "watching storage for other daemons' work failed; relying on the safety poll"
            )

    def _storage_full(self, exc: StorageFull) -> None:
        if not self._full.is_set():
            log.error("storage is full, health NOT_SERVING until a write commits: %s", exc)
            self._full.set()
            self.health.set_trouble(_FULL, True)

    async def _room_probe(self) -> None:
        while True:
            await self._full.wait()
            await asyncio.sleep(_ROOM_PROBE_INTERVAL)
            try:
                await self.storage.probe(self.clock.now())
            except Exception as exc:
                # Still full (already reported), or any other failure: a
                # write does not work yet either way.
                log.debug("room probe failed: %r", exc)
                continue
            log.warning("storage writes again")
            self._full.clear()
            self.health.set_trouble(_FULL, False)

    def _storage_unavailable(self, _exc: Exception) -> None:
        self._ping_now.set()

    async def _reach_probe(self) -> None:
        if not self.storage.can_be_unreachable:
            return
        down = False
        while True:
            self._ping_now.clear()
            try:
                async with asyncio.timeout(self.config.storage_probe_timeout):
                    await self.storage.ping()
            except Exception as exc:
                if not down:
                    down = True
                    why = "no answer in time" if isinstance(exc, TimeoutError) else exc
                    log.error("storage cannot be reached, health NOT_SERVING: %s", why)
                    self.health.set_trouble(_UNREACHABLE, True)
            else:
                if down:
                    down = False
                    log.warning("storage can be reached again")
                    self.health.set_trouble(_UNREACHABLE, False)
            if down:
                # Every operation fails now: their reports must not turn
                # the probe into a reconnect loop.
                await asyncio.sleep(self.config.storage_probe)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.storage_probe):
                    await self._ping_now.wait()

    async def _safety_poll(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.wakeups.notify_all()

    async def _drain(self) -> None:
        self.health.shutdown()
        self.gate.draining = True
        self.members.close()
        self.wakeups.close()
        self.waits.close()
        # Idle Work streams end at once; one whose worker still holds leases
        # stays (counted by the gate) until they are settled or time runs out.
        self.queue_service.work_streams.shutdown()
        if not await self.gate.wait_idle(self.config.shutdown_timeout):
            log.warning(
                "%d call(s) still running after %.1fs; cancelling them",
                self.gate.in_flight,
                self.config.shutdown_timeout,
            )
