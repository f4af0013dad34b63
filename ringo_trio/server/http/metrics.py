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
* **Storage at scrape time** (`refresh`): tasks by queue and state, the
  oldest due task's age and the paused flag come from `Storage.list_queues`: the first
  `limits.MAX_METRIC_QUEUES` queues, read on the daemon's loop in pages of
  `_REFRESH_PAGE` (on SQLite a page of 1,000 queues holds the loop ~26 ms,
  one of 100 ~3 ms), the loop free between pages, then a one-queue probe
  past the cap for ``ringo_queues_truncated``. Schedule ticks fired and
  skipped come from the stored schedules (`Storage.list_schedules`, the
  first `limits.MAX_METRIC_SCHEDULES`): the counts are the store's, so
  every daemon sharing it reports the same totals (sum with ``max``, not
  ``sum``, across daemons). Then the limit rules of
  those queues (`Storage.list_limits` with keys) for
  ``ringo_limit_waiting_tasks``.

**Bounded memory.** Queue names come from clients, so labelled children are
made for at most `limits.MAX_METRIC_QUEUES` queues; later queues share the
label ``queue=""``. Methods and storage operations are fixed sets.

Scrapes are answered by `scrape.serve_metrics`, which renders off the loop.

The exposition is prometheus_client's (`generate_latest`,
`CONTENT_TYPE_LATEST`); nothing here formats the text format by hand.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import time
from collections.abc import (
    Awaitable,
    Callable,
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
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import QueueStats

from ..storage.base import (
    Ack,
    EnqueueOutcome,
    LeaseLost,
    Nack,
    Reject,
    Settlement,
    Storage,
    StorageUnavailable,
)
from ..storage.rows import to_us
from .scrape import render_text

__all__ = [
    "NO_METRICS",
    "NO_TAP",
    "Metrics",
    "PrometheusMetrics",
    "StreamTap",
    "instrument_storage",
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
    "cancel_ids",
    "delete_ids",
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
            "ringo_tasks_cancelled", "Tasks cancelled (CancelTask, CancelTasks).", q, registry=r
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
            held = await _held_by_rules(storage, now, {q.queue for q in queues})
        except Exception as exc:
            # Once per outage, not once per scrape.
            if self._snapshot.ok:
                log.warning("metrics: reading the queues failed: %r", exc)
            self._snapshot = _Snapshot(ok=False)
            return
        try:
            schedules = [
                ((s.queue, s.name), s.fired, s.skipped)
                for s in await storage.list_schedules(None, limits.MAX_METRIC_SCHEDULES)
            ]
        except Exception as exc:
            if self._snapshot.ok:
                log.warning("metrics: reading the schedules failed: %r", exc)
            schedules = []
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
                    stats.paused,
                )
                for stats in queues
            ],
            truncated=truncated,
            schedules=schedules,
            held=held,
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
        return await loop.run_in_executor(executor, render_text, self.registry)


_REFRESH_PAGE = 100


async def _held_by_rules(
    storage: Storage, now: datetime, reported: set[str]
) -> list[tuple[str, str, int]]:
    """(queue, prefix, tasks held) of every rule of the reported queues: the
    due waiting tasks of the rule's keys that may not start now, the key's
    rate not letting it yet or its concurrency full. Reads ListLimits'
    figures, so a rule counts its `MAX_LIMIT_KEYS_LISTED` keys with the
    most waiting."""
    held: list[tuple[str, str, int]] = []
    now_us = to_us(now)
    for status in await storage.list_limits(None, now, with_keys=True):
        if status.queue not in reported:
            continue
        rule = status.rule
        held.append(
            (
                status.queue,
                rule.prefix,
                sum(
                    key.waiting
                    for key in status.keys
                    if (key.next_start_us is not None and key.next_start_us > now_us)
                    or (rule.concurrency and key.leased >= rule.concurrency)
                ),
            )
        )
    return held


class _Snapshot:
    __slots__ = ("held", "ok", "queues", "schedules", "truncated")

    def __init__(
        self,
        queues: list[tuple[str, dict[str, int], float, bool]] | None = None,
        *,
        ok: bool = True,
        truncated: bool = False,
        schedules: list[tuple[tuple[str, str], int, int]] | None = None,
        held: list[tuple[str, str, int]] | None = None,
    ) -> None:
        self.queues = queues or []
        # ((queue, schedule), fired, skipped)
        self.schedules = schedules or []
        self.ok = ok
        self.truncated = truncated
        self.held = held or []


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
        paused = GaugeMetricFamily(
            "ringo_queue_paused",
            "1 while the queue is paused (nothing pushed or claimed), else 0.",
            labels=("queue",),
        )
        for queue, counts, age, is_paused in snapshot.queues:
            for state, count in counts.items():
                tasks.add_metric((queue, state), count)
            oldest.add_metric((queue,), age)
            paused.add_metric((queue,), 1 if is_paused else 0)
        yield tasks
        yield oldest
        yield paused
        ticks = CounterMetricFamily(
            "ringo_schedule_ticks",
            "Ticks of each stored schedule that fired (became a task) or were skipped"
            " (misfire policy), read from storage when scraped (the store's totals).",
            labels=("queue", "schedule", "outcome"),
        )
        for (queue, name), fired, skipped in snapshot.schedules:
            ticks.add_metric((queue, name, "fired"), fired)
            ticks.add_metric((queue, name, "skipped"), skipped)
        yield ticks
        held = GaugeMetricFamily(
            "ringo_limit_waiting_tasks",
            "Due PENDING tasks a limit rule holds back (their key's rate or"
            " concurrency does not let them start yet), by queue and rule prefix.",
            labels=("queue", "prefix"),
        )
        for queue, prefix, count in snapshot.held:
            held.add_metric((queue, prefix), count)
        yield held
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
    "cancel_ids": lambda m, done, queue, *_: m.queue(queue).cancelled.inc(len(done)),
    "delete_ids": lambda m, changed, *_: m.deleted.inc(changed),
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
