"""``ringod --metrics-listen``: Prometheus /metrics scraped over real HTTP, and
the daemon's log lines (``--log-format json``, ``--log-wire``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import logging
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ringo_trio._contract import limits
from ringo_trio._proto.ringo.v1 import (
    AckRequest,
    CreditUpdate,
    NackRequest,
    RejectRequest,
    ReleaseRequest,
    Schedule,
    TaskSpec,
)
from ringo_trio.server.http import metrics as _metrics
from ringo_trio.server.http import scrape as _scrape
from ringo_trio.server.http.metrics import PrometheusMetrics
from ringo_trio.server.logs import JsonFormatter
from ringo_trio.server.main import EXIT_FAILURE
from ringo_trio.server.storage.postgres import PostgresEngine
from ringo_trio.server.storage.sqlite import SQLiteEngine
from ringo_trio.testing import DaemonProcess, spawn_daemon
from tests._kit.grpc_client import connect, new_queue, open_work, ref
from tests._kit.postgres import fresh_database

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def metrics_daemon(engine: str, tmp_path: Path, *extra: str) -> Iterator[DaemonProcess]:
    args = ["--metrics-listen", "127.0.0.1:0", *extra]
    if engine == "sqlite":
        with spawn_daemon(tmp_path / "data", extra_args=args) as process:
            yield process
    else:
        with fresh_database() as dsn, spawn_daemon(None, postgres_dsn=dsn, extra_args=args) as p:
            yield p


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


async def scrape(process: DaemonProcess) -> Samples:
    status, content_type, body = await anyio.to_thread.run_sync(
        get, f"http://{process.info['metrics']}/metrics"
    )
    assert status == 200, body
    assert content_type.startswith("text/plain"), content_type
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_scrape_reports_what_the_workload_did(engine: str, tmp_path: Path) -> None:
    """Property: one real GET /metrics after a workload shows exactly that
    workload: enqueues created vs duplicate, acks/nacks/rejects by queue,
    tasks by state read from storage, one push-to-settle observation per
    settle with its outcome, the open Work stream and its unspent credit,
    credit granted, storage calls and gRPC calls by method and status."""
    queue = new_queue("metrics")
    idle = new_queue("idle")
    with anyio.fail_after(60), metrics_daemon(engine, tmp_path) as process:
        async with connect(process) as client:
            await client.enqueue(idle)
            await client.enqueue(idle)
            for index in range(5):
                await client.enqueue(queue, unique_key=f"k{index}")
            await client.enqueue(queue, unique_key="k0")  # a duplicate
            async with open_work(client) as work:
                await work.register(queue)
                await work.call(credit=CreditUpdate(available=5))
                leased = await work.wait_tasks(5)
                for item in leased[:3]:
                    assert (await work.call(ack=AckRequest(lease=ref(item)))).error is None
                nack = NackRequest(lease=ref(leased[3]), retry_delay_override=timedelta(hours=1))
                assert (await work.call(nack=nack)).error is None
                reject = RejectRequest(lease=ref(leased[4]), error="bad input")
                assert (await work.call(reject=reject)).error is None
                assert (await work.call(credit=CreditUpdate(available=2))).error is None
                await client.enqueue(queue)
                [handed_back] = (await work.wait_tasks(6))[5:]
                release = ReleaseRequest(lease=ref(handed_back))
                assert (await work.call(release=release)).error is None
                # Claimable again at once: pushed again with the last credit.
                [again] = (await work.wait_tasks(7))[6:]
                assert again.task is not None
                assert handed_back.task is not None
                assert again.task.id == handed_back.task.id

                samples = await scrape(process)
                assert value(samples, "ringo_work_streams", queue=queue) == 1
                assert value(samples, "ringo_work_credit", queue=queue) == 0
                assert value(samples, "ringo_work_leases_outstanding", queue=queue) == 1
            # The daemon learns of the reset a moment later.
            after = await scrape(process)
            while value(after, "ringo_work_streams", queue=queue) != 0:
                await anyio.sleep(0.05)
                after = await scrape(process)

    created = value(samples, "ringo_tasks_enqueued_total", queue=queue, outcome="created")
    assert created == 6
    assert value(samples, "ringo_tasks_enqueued_total", queue=queue, outcome="duplicate") == 1
    assert value(samples, "ringo_tasks_acked_total", queue=queue) == 3
    assert value(samples, "ringo_tasks_nacked_total", queue=queue) == 1
    assert value(samples, "ringo_tasks_rejected_total", queue=queue) == 1
    states = {"pending": 1, "leased": 1, "succeeded": 3, "dead": 1, "cancelled": 0}
    for state, count in states.items():
        assert ("ringo_tasks", frozenset({("queue", queue), ("state", state)})) in samples, state
        assert value(samples, "ringo_tasks", queue=queue, state=state) == count, state
    # The nacked task waits an hour: nothing is due. The idle queue's tasks are.
    assert value(samples, "ringo_queue_oldest_pending_age_seconds", queue=queue) == 0
    assert ("ringo_queue_oldest_pending_age_seconds", frozenset({("queue", idle)})) in samples
    assert value(samples, "ringo_queue_oldest_pending_age_seconds", queue=idle) >= 0
    assert value(samples, "ringo_tasks", queue=idle, state="pending") == 2
    outcomes = {"acked": 3, "nacked": 1, "rejected": 1, "released": 1, "lease_lost": 0}
    for outcome, count in outcomes.items():
        seen = value(samples, "ringo_push_to_settle_seconds_count", queue=queue, outcome=outcome)
        assert seen == count, outcome
    assert value(samples, "ringo_tasks_released_total", queue=queue) == 1
    assert value(samples, "ringo_work_credit_granted_total") == 5 + 2
    # The stream's acks, nack and reject each went to storage as a group
    # commit of one (`settle_many`), not as the one-lease `ack`.
    assert value(samples, "ringo_storage_call_seconds_count", operation="settle_many") == 5
    assert value(samples, "ringo_storage_call_seconds_count", operation="ack") == 0
    assert value(samples, "ringo_storage_call_seconds_count", operation="enqueue") == 9
    assert value(samples, "ringo_rpc_total", method="Enqueue", code="OK") == 9
    assert value(samples, "ringo_rpc_seconds_count", method="Enqueue") == 9
    assert value(samples, "ringo_queues_read_ok") == 1
    # The stream ended: its credit is no longer counted.
    assert ("ringo_work_credit", frozenset({("queue", queue)})) not in after


async def test_only_get_metrics_is_served_and_bad_requests_harm_nothing(tmp_path: Path) -> None:
    """Property: another path is 404, another method 405, a malformed request
    line or a missing Host 400, a request head over the cap 431 and a client that sends
    nothing is dropped; afterwards the daemon still serves gRPC and
    /metrics."""
    with anyio.fail_after(60), metrics_daemon("sqlite", tmp_path) as process:
        base = f"http://{process.info['metrics']}"
        status, _, _ = await anyio.to_thread.run_sync(get, f"{base}/other")
        assert status == 404
        host, _, port = process.info["metrics"].rpartition(":")

        def raw(data: bytes) -> bytes:
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(data)
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks)

        def status_of(data: bytes) -> int:
            return int(raw(data).split(b" ", 2)[1])

        post = b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        assert await anyio.to_thread.run_sync(status_of, post) == 405
        assert await anyio.to_thread.run_sync(status_of, b"GARBAGE\r\n\r\n") == 400
        # HTTP/1.1 without Host is malformed (RFC 9112 section 3.2): 400.
        no_host = b"GET /metrics HTTP/1.1\r\n\r\n"
        assert await anyio.to_thread.run_sync(status_of, no_host) == 400
        huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Fill: " + b"a" * 100_000 + b"\r\n\r\n"
        # Closed while we may still be sending: refused all the same.
        with contextlib.suppress(ConnectionResetError):
            assert await anyio.to_thread.run_sync(status_of, huge) == 431
        # Connect and say nothing at all, then go away.
        await anyio.to_thread.run_sync(raw, b"")
        async with connect(process) as client:
            await client.enqueue(new_queue())
        assert value(await scrape(process), "ringo_rpc_total", method="Enqueue", code="OK") == 1
    assert process.process.returncode == 0, process.stderr_text()


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    """Property: with --log-format json every stderr line is a JSON object with
    ts, level, logger and message, including the lines about serving."""
    with anyio.fail_after(30):
        with spawn_daemon(tmp_path / "data", extra_args=["--log-format", "json"]) as process:
            async with connect(process) as client:
                await client.enqueue(new_queue())
        entries = json_lines(process.stderr_text())
    assert entries
    for entry in entries:
        assert {"ts", "level", "logger", "message"} <= entry.keys(), entry
    assert any(str(e["message"]).startswith("serving on") for e in entries)


@pytest.mark.parametrize("wire", [False, True])
async def test_wire_libraries_are_quiet_at_debug_unless_asked(wire: bool, tmp_path: Path) -> None:
    """Property: at --log-level debug, grpclib/h2/hpack log nothing below
    WARNING (no line per header block) unless --log-wire is given, when
    they do."""
    args = ["--log-format", "json", "--log-level", "debug", *(["--log-wire"] if wire else [])]
    with anyio.fail_after(30):
        with spawn_daemon(tmp_path / "data", extra_args=args) as process:
            async with connect(process) as client:
                await client.enqueue(new_queue())
        entries = json_lines(process.stderr_text())
    wire_debug = [
        e
        for e in entries
        if str(e["logger"]).split(".")[0] in {"grpclib", "h2", "hpack"} and e["level"] == "DEBUG"
    ]
    assert any(e["logger"] == "ringo_trio.server" for e in entries)
    if wire:
        assert any(str(e["logger"]).startswith("hpack") for e in wire_debug)
    else:
        assert wire_debug == []


async def test_queue_labels_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: however many queue names clients make up, the metrics label at
    most MAX_METRIC_QUEUES of them; events of later queues are counted under
    queue="" (bounded memory, bounded scrape)."""
    monkeypatch.setattr(limits, "MAX_METRIC_QUEUES", 3)
    metrics = PrometheusMetrics()
    for index in range(10):
        metrics.queue(f"q{index}").acked.inc()
    acked = {
        sample.labels["queue"]: sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        if family.name == "ringo_tasks_acked"
        for sample in family.samples
    }
    assert acked == {"q0": 1, "q1": 1, "q2": 1, "": 7}


def parsed(exposition: bytes) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(exposition.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


async def test_queues_truncated_only_past_the_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Property: ringo_queues_truncated is 0 with exactly MAX_METRIC_QUEUES
    queues (all reported by name) and 1 with one more (the first
    MAX_METRIC_QUEUES reported); the queues are read in pages, none lost or
    repeated at a page boundary."""
    monkeypatch.setattr(limits, "MAX_METRIC_QUEUES", 5)
    monkeypatch.setattr(_metrics, "_REFRESH_PAGE", 2)
    storage = SQLiteEngine(tmp_path / "ringo.db")
    await storage.open()
    try:
        metrics = PrometheusMetrics()
        now = datetime.now(UTC)
        names = [f"q{index}" for index in range(6)]
        for name in names[:5]:
            await storage.enqueue(name, [TaskSpec(task_type="t")], now)
        await metrics.refresh(storage, now)
        samples = parsed(metrics.exposition())
        assert value(samples, "ringo_queues_truncated") == 0
        reported = {dict(labels)["queue"] for name, labels in samples if name == "ringo_tasks"}
        assert reported == set(names[:5])
        await storage.enqueue(names[5], [TaskSpec(task_type="t")], now)
        await metrics.refresh(storage, now)
        samples = parsed(metrics.exposition())
        assert value(samples, "ringo_queues_truncated") == 1
        reported = {dict(labels)["queue"] for name, labels in samples if name == "ringo_tasks"}
        assert reported == set(names[:5])
        assert value(samples, "ringo_tasks", queue="q4", state="pending") == 1
    finally:
        await storage.close()


async def test_the_paused_gauge_is_one_for_a_paused_queue(tmp_path: Path) -> None:
    """Property: ringo_queue_paused{queue} is 1 for a paused queue (one
    paused ahead of time, without tasks, too) and 0 for the others, beside
    the per-queue task gauges."""
    storage = SQLiteEngine(tmp_path / "ringo.db")
    await storage.open()
    try:
        metrics = PrometheusMetrics()
        now = datetime.now(UTC)
        await storage.enqueue("busy", [TaskSpec(task_type="t")], now)
        await storage.enqueue("held", [TaskSpec(task_type="t")], now)
        await storage.set_queue_paused("held", True, now)
        await storage.set_queue_paused("ahead", True, now)
        await metrics.refresh(storage, now)
        samples = parsed(metrics.exposition())
        assert ("ringo_queue_paused", frozenset({("queue", "busy")})) in samples
        assert value(samples, "ringo_queue_paused", queue="busy") == 0
        assert value(samples, "ringo_queue_paused", queue="held") == 1
        assert value(samples, "ringo_queue_paused", queue="ahead") == 1
    finally:
        await storage.close()


async def test_a_scrape_renders_in_a_worker_thread_while_the_loop_runs() -> None:
    """Property: the exposition is rendered off the event loop: the render
    runs in another thread, and a coroutine on the loop runs while the
    render is in progress (here the render cannot finish until it has);
    the cyclic GC is paused, and the GIL switch interval short, during the
    render only."""
    metrics = PrometheusMetrics()
    entered = threading.Event()
    release = threading.Event()
    seen: dict[str, object] = {}

    class Blocking(Collector):
        def describe(self) -> Iterator[Metric]:
            # Without it, registering would call collect().
            return iter(())

        def collect(self) -> Iterator[Metric]:
            seen["thread"] = threading.get_ident()
            seen["gc"] = gc.isenabled()
            seen["switch"] = sys.getswitchinterval()
            entered.set()
            # Set by a coroutine on the loop; a render on the loop would
            # wait here in vain (the loop cannot run it) and time out.
            seen["released"] = release.wait(10)
            yield GaugeMetricFamily("blocking_probe", "test", value=1)

    metrics.registry.register(Blocking())
    refreshed: list[int] = []

    async def refresh() -> None:
        refreshed.append(threading.get_ident())

    async def loop_meanwhile() -> None:
        await anyio.to_thread.run_sync(entered.wait, 10)
        seen["loop_ran"] = True
        release.set()

    assert gc.isenabled()
    switch = sys.getswitchinterval()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop_meanwhile)
            body = await metrics.render(refresh)
    assert seen["released"] is True
    assert seen["loop_ran"] is True
    assert seen["thread"] != threading.get_ident()
    assert refreshed == [threading.get_ident()]
    assert seen["gc"] is False
    assert gc.isenabled()
    assert seen["switch"] < switch
    assert sys.getswitchinterval() == switch
    assert b"blocking_probe 1.0" in body


class _Renders:
    """A render the test releases by hand."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self) -> bytes:
        self.calls += 1
        await self.release.wait()
        self.release.clear()
        return f"body {self.calls}".encode()


async def test_concurrent_scrapes_share_one_render_and_reuse_it_briefly() -> None:
    """Property: scrapes that arrive while a render is in flight wait for that
    render and all get its body (one render for them all); a scrape within
    SCRAPE_TTL of the render's end gets the same body without a render; a
    later one renders anew."""
    clock = [100.0]
    render = _Renders()
    exposition = _scrape._Exposition(render, ttl=1.0, clock=lambda: clock[0])
    bodies: list[bytes] = []

    async def scrape_once() -> None:
        bodies.append(await exposition.body())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(scrape_once)
            await wait_until(lambda: render.calls == 1)
            render.release.set()
        assert bodies == [b"body 1"] * 20
        assert render.calls == exposition.renders == 1
        clock[0] += 0.9
        assert await exposition.body() == b"body 1"
        assert render.calls == 1
        clock[0] += 0.1
        render.release.set()
        assert await exposition.body() == b"body 2"
        assert render.calls == 2


async def test_a_cancelled_scrape_hands_the_render_to_a_waiting_one() -> None:
    """Property: when the scrape doing the render is cancelled, a scrape that
    was waiting for it renders instead of waiting forever; a failed render
    fails the scrapes waiting on it, and the next scrape tries again."""
    render = _Renders()
    exposition = _scrape._Exposition(render, ttl=1.0, clock=lambda: 0.0)
    got: list[bytes] = []

    async def waiter() -> None:
        got.append(await exposition.body())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            async with anyio.create_task_group() as first:
                first.start_soon(exposition.body)
                await wait_until(lambda: render.calls == 1)
                tg.start_soon(waiter)
                # Let the waiter reach its wait on the render in flight.
                for _ in range(10):
                    await anyio.lowlevel.checkpoint()
                first.cancel_scope.cancel()
            await wait_until(lambda: render.calls == 2)
            render.release.set()
        assert got == [b"body 2"]

        async def broken() -> bytes:
            raise RuntimeError("render failed")

        failing = _scrape._Exposition(broken, ttl=1.0, clock=lambda: 0.0)
        with pytest.raises(RuntimeError):
            await failing.body()
        with pytest.raises(RuntimeError):
            await failing.body()


async def wait_until(condition: Callable[[], bool]) -> None:
    while not condition():
        await anyio.lowlevel.checkpoint()


async def test_json_log_lines_carry_extra_fields() -> None:
    """Property: a record's extra= fields (e.g. ringo_queue) become keys of its
    JSON line next to ts, level, logger and message; a traceback is `exc`."""
    logger = logging.getLogger("tests.metrics.json")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        logger.warning("queue %s is slow", "q1", extra={"ringo_queue": "q1", "pending": 7})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second = json_lines(stream.getvalue())
    assert first["message"] == "queue q1 is slow"
    assert first["level"] == "WARNING"
    assert first["logger"] == "tests.metrics.json"
    assert (first["ringo_queue"], first["pending"]) == ("q1", 7)
    assert "ValueError: boom" in str(second["exc"])


def test_help_says_metrics_are_unauthenticated() -> None:
    """Property: --help documents --metrics-listen (off by default, the usual
    address, no authentication), --log-format and --log-wire."""
    result = subprocess.run(
        [sys.executable, "-m", "ringo_trio.server", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for fragment in ("--metrics-listen", "127.0.0.1:9464", "without authentication"):
        assert fragment in text
    assert "--log-format {text,json}" in text
    assert "--log-wire" in text


def test_metrics_address_in_use_fails_with_a_message(tmp_path: Path) -> None:
    """Property: an unbindable --metrics-listen address is a clear startup
    failure (exit 1, the address named), not a daemon serving without metrics."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *(sys.executable, "-m", "ringo_trio.server"),
                *("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")),
                *("--metrics-listen", f"127.0.0.1:{port}"),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode == EXIT_FAILURE
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_schedule_ticks_are_read_from_storage(engine: str, tmp_path: Path) -> None:
    """Property: ringo_schedule_ticks_total{queue,schedule,outcome} is each
    stored schedule's fired and skipped count as storage has it at the
    scrape (a SKIP schedule that missed ticks shows them skipped, the one it
    fired fired); a deleted schedule is no longer reported; at most
    MAX_METRIC_SCHEDULES schedules are."""
    with contextlib.ExitStack() as stack:
        if engine == "sqlite":
            storage: Any = SQLiteEngine(tmp_path / "ringo.db")
        else:
            storage = PostgresEngine(stack.enter_context(fresh_database()))
        await storage.open()
        try:
            now = datetime(2030, 1, 1, tzinfo=UTC)
            for queue, name in (("qa", "often"), ("qb", "hourly")):
                every = timedelta(seconds=10) if name == "often" else timedelta(hours=1)
                await storage.put_schedule(
                    Schedule(name=name, queue=queue, task_type="t", every=every, catch_up=1),
                    now,
                    max_per_queue=10,
                )
            # Six ticks of "often" due, only the latest on time: 1 fired, 5 skipped.
            await storage.fire_schedules(now + timedelta(seconds=60), 100)
            metrics = PrometheusMetrics()
            await metrics.refresh(storage, now + timedelta(seconds=60))
            samples = parsed(metrics.exposition())
            ticks = "ringo_schedule_ticks_total"
            assert value(samples, ticks, queue="qa", schedule="often", outcome="fired") == 1
            assert value(samples, ticks, queue="qa", schedule="often", outcome="skipped") == 5
            assert (ticks, frozenset({("queue", "qb"), ("schedule", "hourly"),
                                      ("outcome", "fired")})) in samples  # fmt: skip
            assert value(samples, ticks, queue="qb", schedule="hourly", outcome="fired") == 0
            await storage.delete_schedule("qa", "often")
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(limits, "MAX_METRIC_SCHEDULES", 0)
                await metrics.refresh(storage, now + timedelta(seconds=61))
                assert not [k for k in parsed(metrics.exposition()) if k[0] == ticks]
            await metrics.refresh(storage, now + timedelta(seconds=61))
            reported = {dict(labels)["schedule"] for n, labels in parsed(metrics.exposition())
                        if n == ticks}  # fmt: skip
            assert reported == {"hourly"}
        finally:
            await storage.close()
