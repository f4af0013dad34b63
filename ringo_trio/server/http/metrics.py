"""Prometheus metrics of one daemon (``ringod --metrics-listen``; docs/operations.md).

Theory of operation
-------------------
The rest of the daemon reports events through a `Metrics` object. The base
class is the switched-off daemon's: every method does nothing, so the hooks
in the Work stream cost one method call when ``--metrics-listen`` is not
given. `PrometheusMetrics` keeps its collectors in a `CollectorRegistry` of
its own (never prometheus_client's global one: one process may run several
daemons, the tests do) and is fed from four places:

* **Storage** (`instrument_storage`): the engine instance's methods are
  wrapped once, where the daemon receives it. Every call is timed by
  operation, and the outcomes the engine returns are counted: enqueued
  (created vs duplicate), acked, nacked, rejected (one by one, or in a group
  commit, whose `settle_many` answer names each settled task's queue),
  cancelled, retried by queue, and lease expiries and purged tasks in total. Wrapping the instance
  rather than subclassing `Storage` keeps the engine's identity and every
  method it has, including ones added after this was written.
* **Work streams** (`StreamTap`, one per registered stream): push-to-settle
  latency (from a task frame's push to the worker's ack, nack, reject or
  release of that lease on the same stream, or to its lease being found
  lost), open streams by queue, credit granted; unspent credit and
  unsettled pushes are read from the live taps at scrape time, so a push
  costs one dict insert and a settle one dict pop plus an observation.
* **gRPC** (`install`): grpclib's ``RecvRequest`` / ``SendTrailingMetadata``
  events count every call by method and status and time it. A call's start
  rides a context variable: grpclib runs both events in the call's task.
* **Storage at scrape time** (`refresh`): tasks by queue and state and the
  oldest due task's age come from `Storage.list_queues`: the first
  `limits.MAX_METRIC_QUEUES` queues, read on the daemon's loop in pages of
  `_REFRESH_PAGE` (on SQLite a page of 1,000 queues holds the loop ~26 ms,
  one of 100 ~3 ms), the loop free between pages, then a one-queue probe
  past the cap for ``ringo_queues_truncated``.

**Scraping without holding the loop** (`render`, `_Exposition`). At the
label cap the exposition is ~115,000 series, ~9.5 MB, 1-2 s of CPU; done on
the loop it stalled every call that long. A scrape now reads storage (the
pages above) and the live Work streams on the loop (a few dict reads: the
taps belong to the loop), and only then formats the text in a worker thread
(`render_thread`: one thread of `serve_metrics`'s lifetime, at nice 10 on
Linux), which reads the registry (prometheus_client's collectors are
thread-safe) and that snapshot. The loop thread still shares the GIL with
the render, so while a render runs (`_render_mode`) CPython's cyclic
garbage collector is paused (the render's ~10^6 short-lived objects
otherwise trigger full collections of 40-100 ms each, measured, with the
GIL held; reference counting frees them anyway) and the GIL switch interval
is 1 ms instead of 5 (the loop thread waits that long for the GIL after
each system call; health p50 under 50 scrapers 9 -> 4 ms). Both are
process-wide and restored when the last render ends. Concurrent scrapes share one
render in flight, and a body rendered less than `SCRAPE_TTL` seconds ago is
served again as is: however many scrapers, at most one render runs at a
time, with a pause of at least `SCRAPE_TTL` between two.

**Bounded memory.** Queue names come from clients, so labelled children are
made for at most `limits.MAX_METRIC_QUEUES` queues; later queues share the
label ``queue=""``. Methods and storage operations are fixed sets. The
HTTP responder (`serve_metrics`, on the daemon's `_http` server with
`METRICS_HTTP` limits) answers ``GET /metrics`` (404 for any other path,
405 for any other method).

The exposition is prometheus_client's (`generate_latest`,
`CONTENT_TYPE_LATEST`); nothing here formats the text format by hand.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import gc
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from datetime import datetime
from typing import Any

from grpclib.events import RecvRequest, SendTrailingMetadata, listen
from grpclib.server import Server
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import QueueStats

from ..storage._base import (
    Ack,
    EnqueueOutcome,
    LeaseLost,
    Nack,
    Reject,
    Settlement,
    Storage,
    StorageUnavailable,
)
from .server import HttpLimits, Request, Response, serve_http

__all__ = [
    "NO_METRICS",
    "NO_TAP",
    "SCRAPE_TTL",
    "Metrics",
    "PrometheusMetrics",
    "StreamTap",
    "instrument_storage",
    "serve_metrics",
]

log = logging.getLogger("ringo_trio.server.metrics")

# Label for every queue past the first MAX_METRIC_QUEUES seen (no valid
# queue name is empty).
OTHER_QUEUES = ""

_STORAGE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
_SETTLE_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    900.0, 3600.0,
)  # fmt: skip
_RPC_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip

# Work-stream commands that settle a pushed lease, by outcome label.
_SETTLES = {"ack": "acked", "nack": "nacked", "reject": "rejected", "release": "released"}
LEASE_LOST = "lease_lost"

# Storage operations timed by `instrument_storage` (open, close and the
# never-ending watch are not).
TIMED_OPERATIONS = (
    "enqueue",
    "get",
    "retry",
    "claim",
    "claim_pushes",
    "ack",
    "nack",
    "reject",
    "settle_many",
    "extend_lease",
    "report_progress",
    "release",
    "expire_leases",
    "activity",
    "next_wakeup",
    "probe",
    "list_tasks",
    "queue_stats",
    "list_queues",
    "cancel",
    "retry_dead",
    "delete_finished",
)


class StreamTap:
    """One Work stream's hooks; this base is the switched-off one."""

    __slots__ = ()

    def pushed(self, lease_token: str) -> None:
        """A task frame carrying this lease went out on the stream."""

    def done(self, command: str, body: Any) -> None:
        """Command `command` (the WorkRequest body's name) succeeded."""

    def lost(self, body: Any) -> None:
        """A command about ``body.lease`` was answered LEASE_LOST."""

    def credit(self, granted: int) -> None:
        """A credit update added `granted` to the stream's unspent credit."""

    def close(self) -> None:
        """The stream ended."""


NO_TAP = StreamTap()


class Metrics:
    """The daemon's metrics hooks; this base is the switched-off one."""

    def work_stream(self, queue: str, credit: Callable[[], int]) -> StreamTap:
        """The tap of a stream that registered on `queue`; `credit` reads
        its unspent credit."""
        return NO_TAP

    def install(self, server: Server) -> None:
        """Count and time the server's calls."""

    def instrument(self, storage: Storage) -> None:
        """Time and count `storage`'s calls."""


NO_METRICS = Metrics()


class _Queue:
    """The labelled children of one queue, made once."""

    __slots__ = (
        "acked",
        "cancelled",
        "created",
        "duplicates",
        "label",
        "nacked",
        "rejected",
        "released",
        "retried",
        "settle",
        "streams",
    )

    def __init__(self, m: PrometheusMetrics, queue: str) -> None:
        self.label = queue
        self.created = m.enqueued.labels(queue, "created")
        self.duplicates = m.enqueued.labels(queue, "duplicate")
        self.acked = m.acked.labels(queue)
        self.nacked = m.nacked.labels(queue)
        self.rejected = m.rejected.labels(queue)
        self.cancelled = m.cancelled.labels(queue)
        self.retried = m.retried.labels(queue)
        self.released = m.released.labels(queue)
        self.streams = m.work_streams.labels(queue)
        self.settle = {
            outcome: m.push_to_settle.labels(queue, outcome)
            for outcome in (*_SETTLES.values(), LEASE_LOST)
        }


class _Tap(StreamTap):
    __slots__ = ("_credit", "_metrics", "_pushed", "_queue", "queue")

    def __init__(self, metrics: PrometheusMetrics, queue: str, credit: Callable[[], int]) -> None:
        self._metrics = metrics
        self._queue = metrics.queue(queue)
        # The label, "" past the cap like every other series of the queue.
        self.queue = self._queue.label
        self._credit = credit
        # Push time by lease token, for the leases pushed here and not yet
        # settled here: the stream's own outstanding set, with times.
        self._pushed: dict[str, float] = {}
        self._queue.streams.inc()

    def pushed(self, lease_token: str) -> None:
        self._pushed[lease_token] = time.perf_counter()

    def done(self, command: str, body: Any) -> None:
        outcome = _SETTLES.get(command)
        if outcome is not None:
            self._settled(body, outcome)
            if outcome == "released":
                self._queue.released.inc()

    def lost(self, body: Any) -> None:
        self._settled(body, LEASE_LOST)

    def _settled(self, body: Any, outcome: str) -> None:
        lease = getattr(body, "lease", None)
        if lease is None:
            return
        started = self._pushed.pop(lease.lease_token, None)
        if started is not None:
            self._queue.settle[outcome].observe(time.perf_counter() - started)

    def credit(self, granted: int) -> None:
        if granted > 0:
            self._metrics.credit_granted.inc(granted)

    def close(self) -> None:
        taps = self._metrics.taps
        if self in taps:
            taps.discard(self)
            self._queue.streams.dec()
            self._pushed.clear()

    def unspent_credit(self) -> int:
        return max(self._credit(), 0)

    def unsettled(self) -> int:
        return len(self._pushed)


_CALL: contextvars.ContextVar[tuple[str, float]] = contextvars.ContextVar("ringo_metrics_call")


class PrometheusMetrics(Metrics):
    """Collectors in a registry of their own (see the module docstring)."""

    def __init__(self) -> None:
        # Process-wide, and right for a daemon: one `_created` timestamp
        # series per counter child doubles the exposition for nothing
        # rate() needs.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        q = ("queue",)
        self.enqueued = Counter(
            "ringo_tasks_enqueued",
            "Tasks submitted by Enqueue/EnqueueMany: outcome=created, or duplicate"
            " (an existing task with the same unique key answered instead).",
            ("queue", "outcome"),
            registry=r,
        )
        self.acked = Counter("ringo_tasks_acked", "Tasks acked (SUCCEEDED).", q, registry=r)
        self.nacked = Counter(
            "ringo_tasks_nacked", "Tasks nacked (retried later, or DEAD).", q, registry=r
        )
        self.rejected = Counter("ringo_tasks_rejected", "Tasks rejected (DEAD).", q, registry=r)
        self.cancelled = Counter(
            "ringo_tasks_cancelled", "Tasks cancelled (CancelTask).", q, registry=r
        )
        self.retried = Counter(
            "ringo_tasks_retried", "Finished tasks made PENDING again (RetryTask, RetryTasks).",
            q, registry=r,
        )  # fmt: skip
        self.released = Counter(
            "ringo_tasks_released",
            "Leases a worker handed back unfinished on a Work stream (release).",
            q,
            registry=r,
        )
        self.expired = Counter(
            "ringo_leases_expired",
            "Leases the daemon's reaper found expired (task back to PENDING, or DEAD).",
            registry=r,
        )
        self.deleted = Counter(
            "ringo_tasks_deleted", "Finished tasks deleted (DeleteTasks, retention).", registry=r
        )
        self.push_to_settle = Histogram(
            "ringo_push_to_settle_seconds",
            "From a task's push on a Work stream to the worker settling that lease on the"
            " same stream: outcome=acked, nacked, rejected, released, or lease_lost.",
            ("queue", "outcome"),
            buckets=_SETTLE_BUCKETS,
            registry=r,
        )
        self.work_streams = Gauge(
            "ringo_work_streams", "Registered Work streams open now.", q, registry=r
        )
        self.credit_granted = Counter(
            "ringo_work_credit_granted",
            "Credit units Work streams granted (what each update added to the unspent credit).",
            registry=r,
        )
        self.storage_seconds = Histogram(
            "ringo_storage_call_seconds",
            "Duration of storage engine calls, by operation.",
            ("operation",),
            buckets=_STORAGE_BUCKETS,
            registry=r,
        )
        self.storage_errors = Counter(
            "ringo_storage_errors",
            "Storage calls that failed because the database was unavailable or full.",
            ("operation",),
            registry=r,
        )
        self.rpcs = Counter(
            "ringo_rpc", "gRPC calls answered, by method and status code.", ("method", "code"),
            registry=r,
        )  # fmt: skip
        self.rpc_seconds = Histogram(
            "ringo_rpc_seconds",
            "gRPC call duration by method (a stream's: its lifetime).",
            ("method",),
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        ProcessCollector(registry=r)
        self.taps: set[_Tap] = set()
        self._queues: dict[str, _Queue] = {}
        self._snapshot = _Snapshot()
        self._streams: dict[str, tuple[int, int]] = {}
        r.register(_LiveCollector(self))

    def queue(self, name: str) -> _Queue:
        """The children of queue `name` (shared past the cardinality cap)."""
        children = self._queues.get(name)
        if children is None:
            if len(self._queues) >= limits.MAX_METRIC_QUEUES:
                name = OTHER_QUEUES
                children = self._queues.get(name)
            if children is None:
                children = self._queues[name] = _Queue(self, name)
        return children

    # -- hooks -----------------------------------------------------------------

    def work_stream(self, queue: str, credit: Callable[[], int]) -> StreamTap:
        tap = _Tap(self, queue, credit)
        self.taps.add(tap)
        return tap

    def install(self, server: Server) -> None:
        listen(server, RecvRequest, self._on_request)
        listen(server, SendTrailingMetadata, self._on_trailers)

    async def _on_request(self, event: RecvRequest) -> None:
        _CALL.set((event.method_name, time.perf_counter()))

    async def _on_trailers(self, event: SendTrailingMetadata) -> None:
        call = _CALL.get(None)
        if call is None:
            return
        method, started = call
        # The method is one the server maps (grpclib raises RecvRequest only
        # for those), so the label set is fixed; the short name reads better.
        name = method.rpartition("/")[2]
        self.rpcs.labels(name, event.status.name).inc()
        self.rpc_seconds.labels(name).observe(time.perf_counter() - started)

    def instrument(self, storage: Storage) -> None:
        instrument_storage(storage, self)

    # -- scrape ----------------------------------------------------------------

    async def refresh(self, storage: Storage, now: datetime) -> None:
        """Read the figures that live in storage (tasks by queue and state):
        the first MAX_METRIC_QUEUES queues, a page at a time."""
        cap = limits.MAX_METRIC_QUEUES
        queues: list[QueueStats] = []
        try:
            while len(queues) < cap:
                after = queues[-1].queue if queues else ""
                want = min(_REFRESH_PAGE, cap - len(queues))
                page = await storage.list_queues(now, after=after, limit=want)
                queues += page
                if len(page) < want:
                    break
                # The SQLite engine never yields: give the loop to the calls
                # that waited while the page was read.
                await asyncio.sleep(0)
            # Truncated only when a queue exists past the cap (exactly `cap`
            # queues are all reported).
            truncated = len(queues) >= cap and bool(
                await storage.list_queues(now, after=queues[-1].queue, limit=1)
            )
        except Exception as exc:
            # Once per outage, not once per scrape.
            if self._snapshot.ok:
                log.warning("metrics: reading the queues failed: %r", exc)
            self._snapshot = _Snapshot(ok=False)
            return
        self._snapshot = _Snapshot(
            [
                (
                    stats.queue,
                    {
                        "pending": stats.pending,
                        "leased": stats.leased,
                        "succeeded": stats.succeeded,
                        "dead": stats.dead,
                        "cancelled": stats.cancelled,
                    },
                    (
                        max((now - stats.oldest_pending_at).total_seconds(), 0.0)
                        if stats.oldest_pending_at is not None
                        else 0.0
                    ),
                )
                for stats in queues
            ],
            truncated=truncated,
        )

    def _read_streams(self) -> None:
        """Sum the live Work streams' credit and unsettled leases by queue.
        On the loop: the taps and their credit belong to it."""
        by_queue: dict[str, tuple[int, int]] = {}
        for tap in self.taps:
            available, pushed = by_queue.get(tap.queue, (0, 0))
            by_queue[tap.queue] = (available + tap.unspent_credit(), pushed + tap.unsettled())
        self._streams = by_queue

    def exposition(self) -> bytes:
        """The text format, rendered here and now (on the calling thread)."""
        self._read_streams()
        return generate_latest(self.registry)

    async def render(
        self,
        refresh: Callable[[], Awaitable[None]],
        executor: concurrent.futures.Executor | None = None,
    ) -> bytes:
        """The text format of a scrape: `refresh` (storage) and the Work
        streams read on the loop, the text rendered in a worker thread of
        `executor` (None: the loop's default one)."""
        await refresh()
        self._read_streams()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, _render, self.registry)


_REFRESH_PAGE = 100

# A scrape's body is served again to scrapes within this many seconds.
SCRAPE_TTL = 1.0


def _render(registry: CollectorRegistry) -> bytes:
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


class _Snapshot:
    __slots__ = ("ok", "queues", "truncated")

    def __init__(
        self,
        queues: list[tuple[str, dict[str, int], float]] | None = None,
        *,
        ok: bool = True,
        truncated: bool = False,
    ) -> None:
        self.queues = queues or []
        self.ok = ok
        self.truncated = truncated


class _LiveCollector(Collector):
    """The figures read at scrape time: from storage (`refresh`) and from
    the live Work streams (`_read_streams`). Reads only those snapshots,
    so it may run in a worker thread."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics._snapshot
        streams = self._metrics._streams
        tasks = GaugeMetricFamily(
            "ringo_tasks",
            "Tasks by queue and state, read from storage when scraped.",
            labels=("queue", "state"),
        )
        oldest = GaugeMetricFamily(
            "ringo_queue_oldest_pending_age_seconds",
            "Age of the queue's oldest due PENDING task (0 when none is due).",
            labels=("queue",),
        )
        for queue, counts, age in snapshot.queues:
            for state, count in counts.items():
                tasks.add_metric((queue, state), count)
            oldest.add_metric((queue,), age)
        yield tasks
        yield oldest
        yield GaugeMetricFamily(
            "ringo_queues_read_ok",
            "1 when this scrape read the queues from storage, 0 when that failed.",
            value=1 if snapshot.ok else 0,
        )
        yield GaugeMetricFamily(
            "ringo_queues_truncated",
            f"1 when more queues exist than the {limits.MAX_METRIC_QUEUES} reported.",
            value=1 if snapshot.truncated else 0,
        )
        credit = GaugeMetricFamily(
            "ringo_work_credit",
            "Unspent credit of the open Work streams (pushes they still allow).",
            labels=("queue",),
        )
        unsettled = GaugeMetricFamily(
            "ringo_work_leases_outstanding",
            "Leases pushed on the open Work streams and not yet settled on them.",
            labels=("queue",),
        )
        for queue, (available, pushed) in streams.items():
            credit.add_metric((queue,), available)
            unsettled.add_metric((queue,), pushed)
        yield credit
        yield unsettled


# -- storage -------------------------------------------------------------------


def _count_enqueue(
    m: PrometheusMetrics, outcomes: list[EnqueueOutcome], queue: str, *_: Any
) -> None:
    created = sum(1 for outcome in outcomes if outcome.created)
    children = m.queue(queue)
    if created:
        children.created.inc(created)
    if created < len(outcomes):
        children.duplicates.inc(len(outcomes) - created)


def _count_cancel(m: PrometheusMetrics, task: Any, queue: str, _reason: str, now: datetime) -> None:
    # A task cancelled earlier is answered unchanged: only a fresh
    # cancellation finishes at this call's `now`.
    if task.finished_at == now:
        m.queue(queue).cancelled.inc()


def _count_settle_many(
    m: PrometheusMetrics, answers: list[str | LeaseLost], settlements: Sequence[Settlement], *_: Any
) -> None:
    # A settled item's answer is its task's queue; a lost one counts nothing.
    for answer, item in zip(answers, settlements, strict=True):
        if isinstance(answer, str):
            children = m.queue(answer)
            match item:
                case Ack():
                    children.acked.inc()
                case Nack():
                    children.nacked.inc()
                case Reject():
                    children.rejected.inc()


def _count_retry_dead(m: PrometheusMetrics, changed: int, queue: str, *_: Any) -> None:
    if changed:
        m.queue(queue).retried.inc(changed)


# What to count from an operation's result: ``(metrics, result, *args)``
# with the call's positional arguments (the service passes these ones
# positionally).
_COUNTERS: dict[str, Callable[..., None]] = {
    "enqueue": _count_enqueue,
    "ack": lambda m, task, *_: m.queue(task.queue).acked.inc(),
    "nack": lambda m, task, *_: m.queue(task.queue).nacked.inc(),
    "reject": lambda m, task, *_: m.queue(task.queue).rejected.inc(),
    "retry": lambda m, task, *_: m.queue(task.queue).retried.inc(),
    "settle_many": _count_settle_many,
    "cancel": _count_cancel,
    "retry_dead": _count_retry_dead,
    "expire_leases": lambda m, changed, *_: m.expired.inc(changed),
    "delete_finished": lambda m, changed, *_: m.deleted.inc(changed),
}


def instrument_storage(storage: Storage, metrics: PrometheusMetrics) -> None:
    """Wrap `storage`'s own methods (on the instance) so that each call is
    timed and its outcome counted. Idempotent per instance."""
    if getattr(storage, "_ringo_metrics", None) is metrics:
        return
    for operation in TIMED_OPERATIONS:
        wrapped = _timed(
            getattr(storage, operation),
            metrics.storage_seconds.labels(operation).observe,
            metrics.storage_errors.labels(operation).inc,
        )
        setattr(storage, operation, wrapped)
    watch_results(
        storage,
        {operation: functools.partial(count, metrics) for operation, count in _COUNTERS.items()},
        "metrics",
    )
    storage._ringo_metrics = metrics  # type: ignore[attr-defined]


def watch_results(storage: Storage, hooks: Mapping[str, Callable[..., None]], who: str) -> None:
    """After each successful call of ``storage.<operation>``, call
    ``hooks[operation](result, *args)`` (the metrics' counters, the
    dashboard's sparklines), by wrapping the instance's method. A hook that
    raises is logged: a miscount never fails the call that was counted."""
    for operation, hook in hooks.items():
        setattr(storage, operation, _after(getattr(storage, operation), hook, operation, who))


def _after(
    method: Callable[..., Awaitable[Any]], hook: Callable[..., None], operation: str, who: str
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        result = await method(*args, **kwargs)
        try:
            hook(result, *args)
        except Exception:
            log.exception("%s: recording %s failed", who, operation)
        return result

    return call


def _timed(
    method: Callable[..., Awaitable[Any]],
    observe: Callable[[float], None],
    failed: Callable[[], None],
) -> Callable[..., Awaitable[Any]]:
    perf_counter = time.perf_counter

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        started = perf_counter()
        try:
            return await method(*args, **kwargs)
        except StorageUnavailable:
            failed()
            raise
        finally:
            observe(perf_counter() - started)

    return call


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
