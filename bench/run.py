"""Benchmarks: one ``ringod`` (SQLite) and, for the Worker rows, ONE separate
worker process (``bench/worker.py``), so the worker's peak RSS is its own.

    python bench/run.py [--quick] [--repeat 3] [--profile DIR]
    python bench/run.py --baseline REV [--only NAME[,NAME]] [--quick | --tasks N]

Rows:

* unary calls from this process (sequential and 40-concurrent ``Enqueue``,
  manual ``claim(32)`` + unary ack): best of ``--repeat``;
* ``enqueue_many`` in calls of 1000: timed while pre-enqueueing the Worker
  runs' tasks (best run);
* Worker, no-op handler, concurrency 64: N tasks pre-enqueued, then the
  worker process starts; timed from its registration until it has closed
  (every ack answered), checked with the daemon (no task left active).
  Latency p50/p99 is enqueue (the daemon's ``created_at``) → the handler's
  return; all tasks are enqueued before the worker starts, so it is mostly
  queue wait;
* Worker, 10 ms-sleep handler, concurrency 256, timed the same way;
* the worker process's peak RSS (``VmHWM``, reported by the worker);
* PostgreSQL scale-out: 1, 2 and 3 daemons on one fresh database (created on
  the server ``$RINGO_BENCH_POSTGRES`` names, default the local test server,
  and dropped afterwards), a worker process per daemon (no-op handler,
  concurrency 64 each). The tasks are enqueued with one shared
  ``not_before`` in the near future, after every worker has registered, so
  all daemons start on them at the same moment; timed from that moment until
  the queue has no active task. Best of ``--repeat``. ``--postgres-only``
  runs just these rows and replaces their section of bench/results.md;
  ``--no-postgres`` skips them and keeps the section that is there.

* the peer, huey (``bench/peer_huey.py``: SQLite, WAL, ``synchronous=NORMAL``,
  one consumer process; no-op at 16 threads, 10 ms at 100 threads, steady
  rate after the first completion), measured in rounds that alternate with
  our no-op and 10 ms Worker runs (fresh daemons, medians), and the ratios
  ringo_trio / huey: the "Against huey" section of bench/results.md. The full
  run does these rounds after the rows above; ``--only noop,sleep,huey``
  runs just them and replaces that section. huey is a bench-only dependency
  (the nox session installs it). ``--baseline`` leaves huey out: the peer
  does not change with the tree.

``--profile DIR`` re-runs the no-op Worker case under ``py-spy`` (which must
be installed: ``pip install py-spy``), the daemon and the worker each sampled
separately, and prints where the time goes (self and inclusive, % of
samples); raw collapsed stacks are left in DIR.

``--baseline REV`` measures git revision REV and this tree side by side in
one run (bench/compare.py: a temporary ``git worktree``, each side's
processes importing its own tree, rounds alternating the sides, medians) and
writes the table (metric, baseline, current, current / baseline) as the
"Comparing two trees" section of bench/results.md, leaving the other
sections as they are. ``--only noop,enqueue_many`` (names: noop, sleep,
enqueue_many, unary, postgres, huey) runs a subset; without ``--baseline`` it
prints the current tree's figures and writes nothing, unless huey is among
them (then it writes the "Against huey" section).

Writes the results tables to bench/results.md and prints them. The text from
the "## Where the time goes" heading on is kept as it is (it is written by
hand from a ``--profile`` run).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import _proc
import _tree
import compare
import trio

from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskSpec
from ringo_trio._proto.ringo.v1 import GetQueueActivityRequest, GetQueueActivityResponse
from ringo_trio.testing import DaemonProcess, spawn_daemon

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results.md"
WORKER = HERE / "worker.py"
ANALYSIS_HEADING = "## Where the time goes"
POSTGRES_HEADING = "## PostgreSQL scale-out"
POSTGRES_ADMIN = os.environ.get("RINGO_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

TARGET_NOOP = 3_000.0  # tasks/s, no-op handler, concurrency 64
TARGET_SLEEP = 2_500.0  # tasks/s, 10 ms handler, concurrency 256
TARGET_ENQUEUE = 20_000.0  # tasks/s, enqueue_many in calls of 1000
TARGET_RSS_MB = 60.0  # worker process peak RSS


# -- unary rows (this process) -------------------------------------------------


async def _sequential_enqueue(client: RingoClient, n: int) -> float:
    q = client.queue("bench-seq")
    t0 = time.perf_counter()
    for _ in range(n):
        await q.enqueue(task_type="t", payload=b"x")
    return n / (time.perf_counter() - t0)


async def _concurrent_enqueue(client: RingoClient, n: int, width: int = 40) -> float:
    q = client.queue("bench-conc")
    per = max(1, n // width)

    async def one() -> None:
        for _ in range(per):
            await q.enqueue(task_type="t", payload=b"x")

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(one)
    return per * width / (time.perf_counter() - t0)


async def _claim_ack(client: RingoClient, n: int, width: int = 16) -> float:
    q = client.queue("bench-claim")
    await q.enqueue_many([TaskSpec(task_type="t", payload=b"x") for _ in range(n)])
    done = 0

    async def loop() -> None:
        nonlocal done
        while done < n:
            batch = await q.claim(32, lease_duration=timedelta(seconds=60))
            if not batch:
                return
            for leased in batch:
                await leased.ack()
                done += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(width):
            nursery.start_soon(loop)
    return done / (time.perf_counter() - t0)


async def _unary(endpoint: str, n: int, repeat: int) -> list[tuple[str, float, str]]:
    async def best(fn: Callable[[], Awaitable[float]]) -> float:
        return max([await fn() for _ in range(repeat)])

    async with Ringo.connect(endpoint) as client:
        return [
            ("Enqueue, sequential", await best(lambda: _sequential_enqueue(client, n)), "calls/s"),
            (
                "Enqueue, 40 concurrent",
                await best(lambda: _concurrent_enqueue(client, n)),
                "calls/s",
            ),
            (
                "manual claim(32) + unary ack, 16 loops",
                await best(lambda: _claim_ack(client, n)),
                "tasks/s",
            ),
        ]


# -- Worker rows (a separate worker process) -----------------------------------------


@dataclass
class WorkRun:
    tasks: int
    concurrency: int
    sleep: float
    enqueue_rate: float  # tasks/s of the pre-enqueue (enqueue_many, calls of 1000)
    startup: float  # seconds from spawning the worker process to its registration
    elapsed: float  # registration → closed (every ack answered)
    p50: float
    p99: float
    peak_rss_mb: float
    worker_cpu: float  # CPU seconds of the worker process while timed
    daemon_cpu: float  # CPU seconds of the daemon over the same span (about)

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed


async def _prefill(endpoint: str, queue: str, n: int) -> float:
    specs = [TaskSpec(task_type="t", payload=b"x" * 64) for _ in range(n)]
    async with Ringo.connect(endpoint) as client:
        q = client.queue(queue)
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            await q.enqueue_many(specs[start : start + 1000])
        return n / (time.perf_counter() - t0)


async def _active(endpoint: str, queue: str) -> int:
    async with Ringo.connect(endpoint) as client:
        return await _active_count(client, queue)


async def _active_count(client: RingoClient, queue: str) -> int:
    q = client.queue(queue)
    if hasattr(q, "active_count"):
        return int(await q.active_count())
    # A baseline tree from before TaskQueue.active_count (--baseline).
    reply = await client._call(  # type: ignore[attr-defined]
        "GetQueueActivity",
        GetQueueActivityRequest(queue=queue),
        GetQueueActivityResponse,
        read_only=True,
    )
    return int(reply.active_task_count)


class _Lines:
    """JSON lines from a child's stdout, with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout: float) -> dict[str, Any]:
        """The next JSON object line (other lines, e.g. py-spy's, are skipped)."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self.buffer:
                    line, _, self.buffer = self.buffer.partition(b"\n")
                    if line.startswith(b"{"):
                        result: dict[str, Any] = json.loads(line)
                        return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the bench worker said nothing for {timeout:g}s")
                if selector.select(remaining):
                    chunk = os.read(self.fd, 65536)
                    if not chunk:
                        raise RuntimeError(f"the bench worker exited ({self.proc.wait()})")
                    self.buffer += chunk


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); [0] here is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _work_run(
    daemon: DaemonProcess,
    queue: str,
    n: int,
    concurrency: int,
    sleep: float,
    *,
    wrap: list[str] | None = None,
    before_start: Callable[[], None] | None = None,
) -> WorkRun:
    enqueue_rate = trio.run(_prefill, daemon.endpoint, queue, n)
    if before_start is not None:
        before_start()
    command = [
        *_tree.python(),
        str(WORKER),
        daemon.endpoint,
        queue,
        "--expect",
        str(n),
        "--concurrency",
        str(concurrency),
        "--sleep",
        repr(sleep),
    ]
    daemon_cpu_before = _cpu_seconds(daemon.pid)
    spawned = time.perf_counter()
    # Its own process group, so that a wrapper (py-spy) and the worker go together.
    proc = subprocess.Popen(
        [*(wrap or []), *command], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        lines = _Lines(proc)
        registered = lines.next(60)
        assert registered["event"] == "registered", registered
        startup = time.perf_counter() - spawned
        done = lines.next(600)
        assert done["event"] == "done", done
        daemon_cpu = _cpu_seconds(daemon.pid) - daemon_cpu_before
        if proc.wait(timeout=60) != 0:
            raise RuntimeError(f"the bench worker exited with status {proc.returncode}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    active = trio.run(_active, daemon.endpoint, queue)
    if active or done["tasks"] != n:
        raise RuntimeError(f"{queue}: {active} task(s) still active, {done['tasks']} handled")
    return WorkRun(
        tasks=n,
        concurrency=concurrency,
        sleep=sleep,
        enqueue_rate=enqueue_rate,
        startup=startup,
        elapsed=done["elapsed"],
        p50=done["p50"],
        p99=done["p99"],
        peak_rss_mb=done["peak_rss_kb"] / 1024,
        worker_cpu=done["cpu"],
        daemon_cpu=daemon_cpu,
    )


# -- PostgreSQL scale-out (daemons and worker processes on one database) -------


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", POSTGRES_ADMIN, "-v", "ON_ERROR_STOP=1", "-qXc", sql],
        check=True,
        capture_output=True,
        timeout=120,
    )


@contextmanager
def _fresh_database() -> Iterator[str]:
    name = f"ringo_bench_{os.getpid()}_{secrets.token_hex(4)}"
    _psql(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(POSTGRES_ADMIN)._replace(path="/" + name))
    finally:
        _psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_cpu(dsn: str) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving `dsn`'s database
    (readable when the server runs on this machine; empty otherwise)."""
    database = urlsplit(dsn).path.lstrip("/")
    done = subprocess.run(
        [
            "psql",
            POSTGRES_ADMIN,
            "-qAtXc",
            f"SELECT pid FROM pg_stat_activity WHERE datname = '{database}'",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pids = [int(line) for line in done.stdout.split()]
    return {pid: _cpu_seconds(pid) for pid in pids}


async def _scaleout_worker(endpoint: str, queue: str, concurrency: int) -> None:
    """A worker process of the scale-out rows: registers, says so, handles
    until its stdin closes, closes the worker and reports what it did."""
    seen = 0

    async def handle(task: Task, ctx: TaskContext) -> None:
        nonlocal seen
        seen += 1

    async with Ringo.connect(endpoint) as client:
        worker = client.queue(queue).worker(handle, concurrency=concurrency)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            cpu_started = time.process_time()
            print(json.dumps({"event": "registered"}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            await worker.close()
    cpu = time.process_time() - cpu_started
    print(json.dumps({"event": "done", "tasks": seen, "cpu": cpu}), flush=True)


@dataclass
class ScaleRun:
    daemons: int
    tasks: int
    elapsed: float  # the shared not_before → no active task left
    per_worker: list[int]  # tasks each worker (one per daemon) handled
    daemon_cpu: float  # CPU seconds of all daemons while timed (about)
    worker_cpu: float  # CPU seconds of all worker processes, registration → close
    server_cpu: float  # CPU seconds of the database's server backends while timed (about)

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed


async def _enqueue_at(endpoint: str, queue: str, n: int, at: datetime) -> None:
    spec = TaskSpec(task_type="t", payload=b"x" * 64, not_before=at)
    async with Ringo.connect(endpoint) as client:
        q = client.queue(queue)
        for start in range(0, n, 1000):
            await q.enqueue_many([spec] * min(1000, n - start))


async def _until_idle(endpoint: str, queue: str, at: datetime) -> float:
    """Seconds from `at` until the queue has no active task (polled)."""
    async with Ringo.connect(endpoint) as client:
        while True:
            if await _active_count(client, queue) == 0:
                return (datetime.now(UTC) - at).total_seconds()
            await trio.sleep(0.05)


def _scale_run(count: int, n: int, concurrency: int = 64) -> ScaleRun:
    queue = "bench-scaleout"
    with _fresh_database() as dsn, ExitStack() as stack:
        daemons = [
            stack.enter_context(
                DaemonProcess(
                    None,
                    postgres_dsn=dsn,
                    extra_args=["--log-level", "warning"],
                    command=_tree.daemon_command(),
                )
            )
            for _ in range(count)
        ]
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for daemon in daemons:
                worker = subprocess.Popen(
                    [
                        *[*_tree.python(), str(pathlib.Path(__file__).resolve())],
                        *["--scaleout-worker", daemon.endpoint, queue, str(concurrency)],
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                workers.append(worker)
            lines = [_Lines(worker) for worker in workers]
            for line in lines:
                assert line.next(60)["event"] == "registered"
            # Time enough to enqueue everything before any of it is due.
            at = datetime.now(UTC) + timedelta(seconds=1.0 + n / 5_000)
            trio.run(_enqueue_at, daemons[0].endpoint, queue, n, at)
            if datetime.now(UTC) >= at:
                raise RuntimeError("enqueueing took longer than the head start; lower --tasks")
            cpu_before = sum(_cpu_seconds(d.pid) for d in daemons)
            server_before = _server_cpu(dsn)
            elapsed = trio.run(_until_idle, daemons[0].endpoint, queue, at)
            daemon_cpu = sum(_cpu_seconds(d.pid) for d in daemons) - cpu_before
            server_cpu = sum(
                cpu - server_before.get(pid, 0.0) for pid, cpu in _server_cpu(dsn).items()
            )
            reports = []
            for worker, line in zip(workers, lines, strict=True):
                assert worker.stdin is not None
                worker.stdin.close()
                reports.append(line.next(60))
        finally:
            for worker in workers:
                if worker.poll() is None and worker.stdin is not None and not worker.stdin.closed:
                    worker.stdin.close()
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
                assert worker.stdout is not None
                worker.stdout.close()
    per_worker = [int(r["tasks"]) for r in reports]
    if sum(per_worker) < n:
        raise RuntimeError(f"{count} daemons: {sum(per_worker)} of {n} tasks handled")
    return ScaleRun(
        daemons=count,
        tasks=n,
        elapsed=elapsed,
        per_worker=per_worker,
        daemon_cpu=daemon_cpu,
        worker_cpu=sum(float(r["cpu"]) for r in reports),
        server_cpu=server_cpu,
    )


def _scaleout_section(runs: Sequence[Sequence[ScaleRun]], repeat: int) -> str:
    best = [max(group, key=lambda r: r.rate) for group in runs]
    base = best[0].rate
    lines = [
        POSTGRES_HEADING,
        "",
        f"{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} cores, PostgreSQL on the same"
        f" machine; {best[0].tasks:,} no-op tasks per run, best of {repeat}. N `ringod`"
        " processes on ONE fresh database, one worker process per daemon (`Worker`,"
        " concurrency 64, no-op handler). Every task is enqueued with one shared"
        " `not_before` after all workers registered, so the daemons start together;"
        " timed from that moment until no task of the queue is active.",
        "",
        "| daemons (+ one worker process each) | throughput | vs 1 daemon"
        " | tasks per worker | CPU per 1,000 tasks: workers / daemons / PostgreSQL"
        " | cores busy (sum) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in best:
        per = 1000 / run.tasks
        cpu = run.worker_cpu + run.daemon_cpu + run.server_cpu
        lines.append(
            f"| {run.daemons} | {run.rate:,.0f} tasks/s | {run.rate / base:.2f} x"
            f" | {' / '.join(f'{t:,}' for t in run.per_worker)}"
            f" | {run.worker_cpu * per:.2f} s / {run.daemon_cpu * per:.2f} s"
            f" / {run.server_cpu * per:.2f} s | {cpu / run.elapsed:.2f} |"
        )
    lines += [
        "",
        "Runs: "
        + "; ".join(
            f"{group[0].daemons} daemon(s) {', '.join(f'{r.rate:,.0f}' for r in group)}"
            for group in runs
        )
        + " tasks/s. PostgreSQL's CPU is that of the database's server backends,"
        " read from /proc; cores busy = all three CPU figures over the run's time"
        " (other jobs on the machine not counted).",
        "",
        "**Reading the curve.** A Work stream executes its worker's commands in order,"
        " each ack one PostgreSQL transaction, so a single stream is bound by that round"
        " trip as much as by CPU; every added daemon brings its own stream and its own"
        f" round trips. **{os.cpu_count()} cores bound the curve**: N daemons, N worker"
        " processes and PostgreSQL itself share them (cores busy above, plus whatever"
        f" else runs: load average {os.getloadavg()[0]:.1f} at the end), so on this"
        " machine another daemon soon only splits the same CPU, and run-to-run noise"
        " is large. On a machine per daemon, throughput grows with daemons until the"
        " database's CPU (or its commit I/O) is the limit. The lever for a single"
        " daemon is per-stream ack latency (group commit of a stream's pending acks;"
        " proposal 5 below).",
        "",
    ]
    return "\n".join(lines) + "\n"


# -- profile -------------------------------------------------------------------


def _package(where: str) -> str:
    """The package a frame belongs to: ``ringo_trio/server/_work.py`` -> ``ringo_trio.server``."""
    parts = where.split("/")
    if len(parts) == 1:
        return parts[0] if parts[0].endswith((".so", ")")) or "." not in parts[0] else "(stdlib)"
    if parts[0] == "ringo_trio":
        return ".".join(parts[:-1])
    return parts[0] if parts[0] not in ("asyncio",) else "asyncio"


def _top(raw: pathlib.Path, limit: int = 15) -> str:
    """Self and inclusive time per function, and self time per package, from
    py-spy's raw (collapsed) output, as % of all samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        packages[_package(frames[-1].partition(" (")[2].rstrip(")"))] += count
        for frame in set(frames):
            inclusive[frame] += count
    total = max(total, 1)
    out = [f"{raw.name}: {total} samples"]
    out.append(f"  self time by package (top {limit}):")
    out += [f"    {100 * c / total:5.1f}%  {p}" for p, c in packages.most_common(limit)]
    out.append(f"  top {limit} functions by self time:")
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(limit)]
    # Frames on (nearly) every stack (the loop, main) say nothing.
    informative = [(f, c) for f, c in inclusive.most_common() if c < 0.9 * total]
    out.append(f"  top {2 * limit} functions by inclusive time (under 90%):")
    out += [f"    {100 * c / total:5.1f}%  {f}" for f, c in informative[: 2 * limit]]
    return "\n".join(out)


def _profile(daemon: DaemonProcess, n: int, out_dir: pathlib.Path, *, native: bool) -> str:
    py_spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).with_name("py-spy"))
    if not pathlib.Path(py_spy).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    out_dir.mkdir(parents=True, exist_ok=True)
    daemon_raw = out_dir / "daemon.txt"
    worker_raw = out_dir / "worker.txt"
    common = ["--format", "raw", "--rate", "200", "--nolineno", *(["--native"] if native else [])]
    spies: list[subprocess.Popen[bytes]] = []

    def attach_to_daemon() -> None:
        # After the pre-enqueue: the daemon's profile covers the worker run only.
        spies.append(
            subprocess.Popen(
                [py_spy, "record", *common, "--pid", str(daemon.pid), "-o", str(daemon_raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        time.sleep(1.0)  # let py-spy attach

    try:
        run = _work_run(
            daemon,
            "bench-profile",
            n,
            64,
            0.0,
            wrap=[py_spy, "record", *common, "-o", str(worker_raw), "--"],
            before_start=attach_to_daemon,
        )
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
    report = [
        f"no-op Worker run under py-spy: {run.rate:,.0f} tasks/s (sampling slows it down)",
        _top(worker_raw),
        _top(daemon_raw),
    ]
    return "\n\n".join(report)


# -- one benchmark in a tree child (bench/compare.py) ----------------------------


@contextmanager
def _sqlite_daemon() -> Iterator[DaemonProcess]:
    """A fresh ``ringod`` on SQLite in a temporary directory."""
    with (
        tempfile.TemporaryDirectory(prefix="ringo-bench-") as tmp,
        spawn_daemon(
            pathlib.Path(tmp) / "data",
            extra_args=["--log-level", "warning"],
            command=_tree.daemon_command(),
        ) as daemon,
    ):
        yield daemon


def _metric(name: str, value: float, unit: str, *, higher: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "higher_is_better": higher}


def _worker_metrics(run: WorkRun, what: str) -> list[dict[str, Any]]:
    per = 1000 / run.tasks
    return [
        _metric(f"{what}: throughput", run.rate, "tasks/s"),
        _metric(f"{what}: worker CPU per 1,000 tasks", run.worker_cpu * per, "s", higher=False),
        _metric(f"{what}: daemon CPU per 1,000 tasks", run.daemon_cpu * per, "s", higher=False),
        _metric(f"{what}: worker peak RSS", run.peak_rss_mb, "MB", higher=False),
    ]


_NOOP = "Worker, no-op handler, concurrency 64 ({tasks:,} tasks)"
_SLEEP = "Worker, 10 ms-sleep handler, concurrency 256 ({tasks:,} tasks)"


def _huey_metrics(tasks: int) -> list[dict[str, Any]]:
    """The peer's two runs, each naming the throughput of ours it is compared
    with ("versus"): huey no-op at 16 threads against our no-op at
    concurrency 64, huey 10 ms at 100 threads against ours at 256; N is our
    10 ms run's (10,000 by default, the issue's figure)."""
    import peer_huey  # huey is a bench-only dependency, needed for this row only

    metrics = []
    for what, threads, sleep, ours in (
        ("no-op", 16, 0.0, _NOOP.format(tasks=tasks)),
        ("10 ms", 100, 0.010, _SLEEP.format(tasks=tasks // 2)),
    ):
        run = peer_huey.run(tasks // 2, threads, sleep)
        label = f"huey {what}, {threads} threads ({run.tasks:,} tasks)"
        metrics += [
            {
                **_metric(f"{label}: throughput", run.rate, "tasks/s"),
                "versus": f"{ours}: throughput",
            },
            _metric(f"{label}: consumer CPU per 1,000 tasks", run.cpu_per_1000, "s", higher=False),
            _metric(f"{label}: consumer peak RSS", run.peak_rss_mb, "MB", higher=False),
        ]
    return metrics


def _tree_child(name: str, n: int, tasks: int) -> list[dict[str, Any]]:
    """Benchmark `name` once (one of compare.BENCHMARK_NAMES) on a fresh daemon."""
    if name == "huey":
        return _huey_metrics(tasks)
    if name == "postgres":
        runs = [_scale_run(count, tasks) for count in (1, 2, 3)]
        return [
            _metric(
                f"PostgreSQL scale-out, {r.daemons} daemon(s), {tasks:,} tasks", r.rate, "tasks/s"
            )
            for r in runs
        ]
    with _sqlite_daemon() as daemon:
        if name == "enqueue_many":
            rate = trio.run(_prefill, daemon.endpoint, "bench-enqueue", tasks)
            return [_metric(f"enqueue_many, calls of 1000 ({tasks:,} tasks)", rate, "tasks/s")]
        if name == "unary":
            rows = trio.run(_unary, daemon.endpoint, n, 1)
            return [_metric(f"{row} (n={n})", value, unit) for row, value, unit in rows]
        if name == "noop":
            run = _work_run(daemon, "bench-noop", tasks, 64, 0.0)
            return [
                *_worker_metrics(run, _NOOP.format(tasks=tasks)),
                _metric(
                    "no-op run: worker process start → registered", run.startup, "s", higher=False
                ),
            ]
        if name == "sleep":
            run = _work_run(daemon, "bench-sleep", tasks // 2, 256, 0.010)
            return _worker_metrics(run, _SLEEP.format(tasks=tasks // 2))
    raise SystemExit(f"unknown benchmark {name!r}")


# -- report --------------------------------------------------------------------


def _rate(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}"


def _cpu(run: WorkRun) -> str:
    per = 1000 / run.tasks
    busy = 100 / run.elapsed
    # What the busier process alone allows if each had a core to itself.
    ceiling = run.tasks / max(run.worker_cpu, run.daemon_cpu, 1e-9)
    return (
        f"{run.worker_cpu * per:.2f} s / {run.daemon_cpu * per:.2f} s"
        f" ({run.worker_cpu * busy:.0f} % / {run.daemon_cpu * busy:.0f} %);"
        f" CPU-bound ceiling ≈ {ceiling:,.0f} tasks/s"
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _table(
    unary: list[tuple[str, float, str]], noop: WorkRun, slow: WorkRun, enqueue: float
) -> str:
    rss = max(noop.peak_rss_mb, slow.peak_rss_mb)
    rows = [
        (
            f"Worker, no-op handler, concurrency {noop.concurrency} ({noop.tasks:,} tasks)",
            _rate(noop.rate, "tasks/s"),
            f"≥ {TARGET_NOOP:,.0f} tasks/s",
            _verdict(noop.rate >= TARGET_NOOP),
        ),
        (
            f"Worker, 10 ms-sleep handler, concurrency {slow.concurrency} ({slow.tasks:,} tasks)",
            _rate(slow.rate, "tasks/s"),
            f"≥ {TARGET_SLEEP:,.0f} tasks/s",
            _verdict(slow.rate >= TARGET_SLEEP),
        ),
        (
            "enqueue_many, calls of 1000",
            _rate(enqueue, "tasks/s"),
            f"≥ {TARGET_ENQUEUE:,.0f} tasks/s",
            _verdict(enqueue >= TARGET_ENQUEUE),
        ),
        (
            "worker process peak RSS",
            f"{rss:.0f} MB",
            f"≤ {TARGET_RSS_MB:.0f} MB",
            _verdict(rss <= TARGET_RSS_MB),
        ),
        (
            "enqueue→ack latency p50 / p99, no-op run (all pre-enqueued: mostly queue wait)",
            f"{noop.p50 * 1000:,.0f} / {noop.p99 * 1000:,.0f} ms",
            "",
            "",
        ),
        ("CPU per 1,000 no-op tasks: worker / daemon (busy % of the run)", _cpu(noop), "", ""),
        ("CPU per 1,000 10 ms tasks: worker / daemon (busy % of the run)", _cpu(slow), "", ""),
        ("worker process start → registered", f"{noop.startup:.2f} s", "", ""),
    ]
    rows += [(name, _rate(value, unit), "", "") for name, value, unit in unary]
    lines = ["| measurement | result | target | status |", "| --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines) + "\n"


def _sections() -> list[str]:
    """bench/results.md as [SQLite rows, PostgreSQL section, comparison
    section, huey section, analysis] (a section not in the file is empty)."""
    rest = RESULTS.read_text() if RESULTS.exists() else ""
    tail = []
    for heading in (ANALYSIS_HEADING, compare.PEER_HEADING, compare.HEADING, POSTGRES_HEADING):
        at = rest.find(heading)
        rest, section = (rest[:at], rest[at:]) if at >= 0 else (rest, "")
        tail.insert(0, section)
    return [rest, *tail]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run (smoke test)")
    parser.add_argument("-n", type=int, default=None, help="unary operations per measurement")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per Worker run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per row, best counts; with --baseline or --only: rounds, the median counts",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure git revision REV, side by side, and report current / baseline",
    )
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        metavar="NAME[,NAME]",
        help=f"run only these benchmarks ({', '.join(compare.BENCHMARK_NAMES)}); without"
        " --baseline: print the current tree's figures, do not write results.md",
    )
    parser.add_argument("--profile", type=pathlib.Path, default=None, metavar="DIR")
    parser.add_argument(
        "--native", action="store_true", help="with --profile: native frames too (slower)"
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write results.md")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--postgres-only", action="store_true", help="only the scale-out rows")
    which.add_argument("--no-postgres", action="store_true", help="skip the scale-out rows")
    parser.add_argument("--scaleout-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--tree-child", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scaleout_worker is not None:
        endpoint, queue, concurrency = args.scaleout_worker
        trio.run(_scaleout_worker, endpoint, queue, int(concurrency))
        return
    n = args.n or (300 if args.quick else 2000)
    tasks = args.tasks or (2000 if args.quick else 20_000)
    if args.tree_child is not None:
        print(json.dumps({"metrics": _tree_child(args.tree_child, n, tasks)}))
        return
    sqlite_rows, postgres_rows, compared, peer, analysis = _sections()
    sizes = f"unary n={n}, {tasks:,} tasks per run{' (--quick)' if args.quick else ''}"
    options = ["-n", str(n), "--tasks", str(tasks)]
    if args.baseline is not None or args.only is not None:
        if args.profile is not None:
            parser.error("--profile measures one tree: not with --baseline or --only")
        names = args.only or list(compare.BENCHMARK_NAMES)
        unknown = set(names) - set(compare.BENCHMARK_NAMES)
        if unknown:
            parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
        if args.baseline is not None:
            # The peer does not depend on the tree: two trees, one huey.
            names = [name for name in names if name != "huey"]
            if not names:
                parser.error("--baseline compares two trees; huey is not one (drop --baseline)")
        if args.postgres_only:
            names = ["postgres"]
        elif args.no_postgres:
            names = [name for name in names if name != "postgres"]
        section = compare.compare(args.baseline, names, args.repeat or 3, options, sizes)
        sys.stdout.write(section)
        if args.baseline is not None:
            compared = section
        elif section.startswith(compare.PEER_HEADING):
            peer = section
        else:
            return
        if not args.no_write:
            RESULTS.write_text(sqlite_rows + postgres_rows + compared + peer + analysis)
        return
    repeat = args.repeat or (1 if args.quick else 3)
    if not args.no_postgres and args.profile is None:
        runs = [[_scale_run(count, tasks) for _ in range(repeat)] for count in (1, 2, 3)]
        postgres_rows = _scaleout_section(runs, repeat)
        sys.stdout.write(postgres_rows)
    if args.postgres_only:
        if not args.no_write:
            RESULTS.write_text(sqlite_rows + postgres_rows + compared + peer + analysis)
        return

    load_before = os.getloadavg()[0]
    with _sqlite_daemon() as daemon:
        if args.profile is not None:
            print(_profile(daemon, tasks, args.profile, native=args.native))
            return
        unary = trio.run(_unary, daemon.endpoint, n, repeat)
        noops = [_work_run(daemon, f"bench-noop-{i}", tasks, 64, 0.0) for i in range(repeat)]
        slows = [
            _work_run(daemon, f"bench-sleep-{i}", tasks // 2, 256, 0.010) for i in range(repeat)
        ]
        loop = daemon.info.get("loop", "?")
    noop = max(noops, key=lambda r: r.rate)
    slow = max(slows, key=lambda r: r.rate)
    enqueue = max(r.enqueue_rate for r in [*noops, *slows])
    bench_rss = _proc.peak_rss_kb() / 1024
    load_after = os.getloadavg()[0]
    header = (
        f"# Benchmarks\n\n{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} cores (os.cpu_count()),"
        f" {platform.python_implementation()} {platform.python_version()},"
        f" {platform.machine()}; best of {repeat}; unary n={n}, {tasks:,} tasks per no-op"
        f" Worker run, {tasks // 2:,} per 10 ms run{' (--quick)' if args.quick else ''}."
        f" Load average (1 min) {load_before:.1f} before, {load_after:.1f} after: on a shared"
        " machine other processes compete for the cores, so look at the CPU row too.\n\n"
        f"One `ringod` (SQLite WAL, loop {loop}), ONE separate worker process"
        " (`bench/worker.py`, one `Worker` under trio) whose peak RSS is its own, and this"
        " process as the producer (enqueue, unary rows). Reproduce: `nox -s bench`"
        " (or `python bench/run.py`).\n\n"
    )
    footer = (
        f"\nWorker rows are timed from the worker's registration until `Worker.close()`"
        f" returned (every ack answered), then checked with the daemon (no task of the"
        f" queue PENDING or LEASED). Best no-op run: {noop.elapsed:.2f} s; runs:"
        f" {', '.join(f'{r.rate:,.0f}' for r in noops)} tasks/s (no-op),"
        f" {', '.join(f'{r.rate:,.0f}' for r in slows)} tasks/s (10 ms)."
        f" Producer (this) process peak RSS {bench_rss:.0f} MB.\n\n"
    )
    text = header + _table(unary, noop, slow, enqueue) + footer
    sys.stdout.write(text)
    # Its own interleaved rounds (fresh daemons, medians), as with --only.
    peer = compare.compare(None, ["noop", "sleep", "huey"], repeat, options, sizes)
    sys.stdout.write(peer)
    if not args.no_write:
        RESULTS.write_text(text + postgres_rows + compared + peer + analysis)


if __name__ == "__main__":
    main()
