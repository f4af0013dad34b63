"""Benchmarks: ours (one ``ringod`` and ONE separate worker process,
``bench/worker.py``, so the worker's peak RSS is its own) side by side with
the peers (graphile-worker, pgqueuer, BullMQ, huey, procrastinate) in the
same run; ratios against the issues' targets.

    python bench/run.py [--quick] [--repeat 3]            # everything (20-30 min)
    python bench/run.py --only NAME[,NAME] [--repeat 3]   # a subset of the rounds
    python bench/run.py --baseline REV [--only NAME[,NAME]]
    python bench/run.py --postgres-only | --profile DIR

A full run writes two sections of bench/results.md, in this order:

1. The first table, this tree alone (best of ``--repeat``): unary calls
   (sequential and 40-concurrent ``Enqueue``, manual ``claim(32)`` + unary
   ack); ``enqueue_many`` in calls of 1000 (timed while pre-enqueueing the
   Worker runs' tasks); the Worker runs, no-op handler at concurrency 64 and
   a 10 ms sleep at concurrency 256: N tasks pre-enqueued, then the worker
   process starts; timed from its registration until it has closed (every
   ack answered), checked with the daemon (no task left active); the worker's
   peak RSS (``VmHWM``) and CPU.
2. "Targets: against the peers" (bench/compare.py), rounds in which every
   benchmark runs once, ours and the peers' one after the other on fresh
   processes, files and databases; cells are medians over the rounds, ratios
   ours / peer of the medians; one row per target of the issue: ours, peer,
   ratio, goal, met. The benchmarks (``--only`` names):

   * ``noop``, ``sleep``: the Worker runs above, also as the steady rate
     after the first completion (how the peers are measured);
   * ``noop_prefetch``, ``sleep_prefetch``: the same with ``prefetch`` =
     concurrency (the Worker's counterpart of the peers' perf settings);
   * ``pg_noop``, ``pg_sleep``: those prefetch runs on ONE daemon on a fresh
     PostgreSQL database, with the database backends' CPU;
   * ``noop_never``, ``pg_noop_never``: the no-op prefetch runs on a daemon
     started with ``--retain-succeeded never`` (the acks delete their tasks,
     as the peers delete their jobs);
   * ``graphile`` (``bench/peer_graphile.py``), ``pgqueuer``
     (``bench/peer_pgqueuer.py``): the same server, a fresh database per run,
     ``--peer-tasks`` jobs added in bulk, then one worker process, no-op at
     concurrency 64 and 10 ms at 256, steady rate after the first completion,
     worker and database CPU; ``bullmq`` (``bench/peer_bullmq.py``) likewise
     on Redis (127.0.0.1:6379), a fresh queue per run (their settings in
     each module's docstring);
   * ``huey`` (``bench/peer_huey.py``): SQLite, WAL, ``synchronous=NORMAL``,
     one consumer process, no-op at 16 threads and 10 ms at 100 threads,
     ``--peer-tasks`` tasks (10,000), steady rate after the first completion;
   * ``postgres``: 1, 2 and 3 daemons on one fresh database (created on the
     server ``$RINGO_BENCH_POSTGRES`` names, default the local test server,
     and dropped afterwards), a worker process per daemon (no-op,
     concurrency 64 each), and one daemon with two worker processes, the
     tasks due at one shared ``not_before`` after every worker registered,
     timed from then until no task is active;
   * ``procrastinate`` (``bench/peer_procrastinate.py``): the same server, a
     fresh database, ``--peer-tasks`` no-op jobs deferred in batches of 1,000,
     then one worker process at concurrency 64, steady rate after the first
     completion (its jobs table polled);
   * ``latency``: enqueue → handler start at low load: an idle worker,
     registered and left idle for 1 s, then ``--latency-tasks`` (200) tasks
     enqueued one at a time, ``--latency-gap`` (5 ms) apart, p50 and p99;
     then the same for huey (an idle consumer, 16 threads);
   * ``enqueue_many`` alone (target 40,000 tasks/s);
   * ``unary``: the unary rows.

   ``unary``, ``noop`` and ``sleep`` also run on the ``--start-tree REV``
   tree (default: the tree the issue was filed against, when "no lower than
   today" was set; ``none`` to skip) in the same rounds: the "Enqueue, 40
   concurrent" ratio, and the Worker runs' throughput and CPU per 1,000
   tasks of each process before and after.

   Naming a peer runs the rows it is compared with too (huey: noop, sleep;
   bullmq: noop_prefetch, sleep_prefetch; graphile, pgqueuer: pg_noop,
   pg_sleep; procrastinate: postgres). ``--only`` runs just those rounds and replaces
   the targets section (rows not measured are left out of it).

Knobs: ``--repeat`` (rounds and best-of, default 3), ``--tasks`` (ours per
run, default 20,000; the 10 ms runs take half),
``--peer-tasks`` (10,000), ``-n`` (unary calls per measurement, 2,000),
``--latency-tasks``, ``--latency-gap``, ``--quick`` (small sizes, one
round: a smoke test), ``--no-postgres`` (skips ours and procrastinate's
PostgreSQL rows), ``--no-write`` (print only). With the defaults a full run
took 14 minutes on 2 cores shared with other jobs (load average 3-5);
``postgres`` (1-2 min a round) and ``procrastinate`` (30-70 s) are the
longest.

``--postgres-only`` measures the scale-out alone (`SCALE_OUT`: 1-3 daemons,
two worker processes on one daemon, each without and with prefetch), best of
``--repeat`` with CPU per process kind, and replaces the "PostgreSQL
scale-out" section (not part of the full run, whose targets section has the
figures without prefetch).

``--baseline REV`` measures git revision REV and this tree side by side in
one run (bench/compare.py: a temporary ``git worktree``, each side's
processes importing its own tree, rounds alternating the sides, medians) and
writes the table (metric, baseline, current, current / baseline) as the
"Comparing two trees" section, leaving the others as they are; the peers
are left out (they do not change with the tree).

``--profile DIR`` re-runs the no-op Worker case under ``py-spy`` (which must
be installed: ``pip install py-spy``), the daemon and the worker each sampled
separately, and prints where the time goes (self and inclusive, % of
samples); raw collapsed stacks are left in DIR.

Every run prints what it writes. Sections of bench/results.md a run does not
measure stay as they are, and the "## Where the time goes" section is never
touched (it is written by hand from a ``--profile`` run). huey and
procrastinate are bench-only dependencies (the nox session installs them).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import _pg
import _proc
import _stats
import _tree
import compare
import trio
import worker as _worker

from ringo_trio import Ringo, RingoClient, Task, TaskContext, TaskSpec
from ringo_trio._proto.ringo.v1 import GetQueueActivityRequest, GetQueueActivityResponse
from ringo_trio.testing import DaemonProcess, spawn_daemon

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results.md"
WORKER = HERE / "worker.py"
POSTGRES_HEADING = "## PostgreSQL scale-out"

TARGET_NOOP = 3_000.0  # tasks/s, no-op handler, concurrency 64
TARGET_SLEEP = 2_500.0  # tasks/s, 10 ms handler, concurrency 256
TARGET_ENQUEUE = 40_000.0  # tasks/s, enqueue_many in calls of 1000
TARGET_RSS_MB = 60.0  # worker process peak RSS
TARGET_PEER_RATIO = 2.0  # ours / huey's throughput ("twice the fastest embedded peer")
TARGET_POSTGRES_RATIO = 3.0  # one daemon on PostgreSQL / procrastinate (issue 15)
# Issue 29: one daemon on PostgreSQL / graphile-worker (perf configuration)
# and / pgqueuer; SQLite / BullMQ; worker + daemon CPU per no-op task; the
# low-load enqueue → start latency no higher than before (2-3 ms).
TARGET_GRAPHILE_RATIO = 0.75
TARGET_PGQUEUER_RATIO = 2.0
TARGET_BULLMQ_RATIO = 1.2
TARGET_CPU_PER_TASK_US = 45.0
TARGET_LATENCY_P50_MS = 3.0
# The tree issue 29 was taken up on: "no lower than today" for unary
# Enqueue, and the "before" of the Worker runs' throughput and CPU per task.
START_TREE = "4ccc377"
IDLE = 1.0  # seconds a latency run's worker (ours or huey's) idles before the trickle


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
    first_handler: float  # seconds from registration to the 1st handler's return
    last_handler: float  # ... to the Nth's
    server_cpu: float = 0.0  # CPU seconds of the PostgreSQL backends, same span (PostgreSQL runs)

    @property
    def rate(self) -> float:
        return self.tasks / self.elapsed

    @property
    def steady_rate(self) -> float:
        """After the first completion, as the peers are measured."""
        return _stats.steady_rate(self.tasks, 1, self.first_handler, self.last_handler)


async def _prefill(endpoint: str, queue: str, n: int) -> float:
    specs = [TaskSpec(task_type="t", payload=b"x" * 64) for _ in range(n)]
    async with Ringo.connect(endpoint) as client:
        q = client.queue(queue)
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            await q.enqueue_many(specs[start : start + 1000])
        return n / (time.perf_counter() - t0)


async def _trickle(endpoint: str, queue: str, n: int, gap: float) -> None:
    """Enqueue `n` tasks one at a time, `gap` seconds apart, each carrying
    the time just before its enqueue call (worker.py --stamp)."""
    async with Ringo.connect(endpoint) as client:
        q = client.queue(queue)
        for _ in range(n):
            await q.enqueue(task_type="t", payload=struct.pack("d", time.time()))
            await trio.sleep(gap)


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


def _work_run(
    daemon: DaemonProcess,
    queue: str,
    n: int,
    concurrency: int,
    sleep: float,
    *,
    wrap: list[str] | None = None,
    before_start: Callable[[], None] | None = None,
    trickle: float | None = None,
    dsn: str | None = None,
    prefetch: int = 0,
) -> WorkRun:
    """One worker process on `n` tasks: enqueued all at once before it starts
    (enqueue_many), or with `trickle`: once it has registered and been idle
    for IDLE seconds, one at a time, `trickle` seconds apart (latency from
    the send time: worker.py --stamp; enqueue_rate is then 0)."""
    enqueue_rate = 0.0 if trickle is not None else trio.run(_prefill, daemon.endpoint, queue, n)
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
        *(["--prefetch", str(prefetch)] if prefetch else []),
        *(["--stamp"] if trickle is not None else []),
    ]
    daemon_cpu_before = _proc.cpu_seconds(daemon.pid)
    server_before = _pg.server_cpu(dsn) if dsn else {}
    spawned = time.perf_counter()
    # Its own process group, so that a wrapper (py-spy) and the worker go together.
    proc = subprocess.Popen(
        [*(wrap or []), *command], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        lines = _proc.Lines(proc, "the bench worker")
        registered = lines.next(60)
        assert registered["event"] == "registered", registered
        startup = time.perf_counter() - spawned
        if trickle is not None:
            time.sleep(IDLE)
            trio.run(_trickle, daemon.endpoint, queue, n, trickle)
        done = lines.next(600)
        assert done["event"] == "done", done
        daemon_cpu = _proc.cpu_seconds(daemon.pid) - daemon_cpu_before
        server_cpu = _pg.cpu_since(dsn, server_before) if dsn else 0.0
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
        first_handler=done["first_handler"],
        last_handler=done["last_handler"],
        server_cpu=server_cpu,
    )


# -- PostgreSQL scale-out (daemons and worker processes on one database) -------


async def _scaleout_worker(endpoint: str, queue: str, concurrency: int, prefetch: int) -> None:
    """A worker process of the scale-out rows: registers, says so, handles
    until its stdin closes, closes the worker and reports what it did."""
    seen = 0

    async def handle(task: Task, ctx: TaskContext) -> None:
        nonlocal seen
        seen += 1

    async with Ringo.connect(endpoint) as client:
        worker = client.queue(queue).worker(handle, concurrency=concurrency, prefetch=prefetch)
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
    workers: int  # worker processes in all (one or more per daemon)
    prefetch: int  # each worker's
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
    """Seconds from `at` until the queue has no active task, polled as a
    user's drain would (`active_count`: the daemon reads the queue's counts,
    so the polls cost the database next to nothing)."""
    async with Ringo.connect(endpoint) as client:
        while True:
            if await _active_count(client, queue) == 0:
                return (datetime.now(UTC) - at).total_seconds()
            await trio.sleep(0.05)


# --postgres-only: (daemons, worker processes per daemon, prefetch), each
# against the first row of its prefetch.
SCALE_OUT = ((1, 1, 0), (2, 1, 0), (3, 1, 0), (1, 2, 0), (1, 1, 64), (2, 1, 64), (1, 2, 64))


class _HeadStartMissed(RuntimeError):
    pass


def _scale_run(
    count: int, n: int, concurrency: int = 64, *, workers: int = 1, prefetch: int = 0
) -> ScaleRun:
    """One scale-out run. Enqueueing must be over before the shared start;
    on a busy machine it can take longer than the first guess, so a run that
    misses it starts again (fresh database) with a longer head start. The
    head start is not timed: only a wasted wait when it is too long."""
    for rate in (5_000.0, 1_500.0, 500.0):
        try:
            return _scale_attempt(count, n, concurrency, rate, workers, prefetch)
        except _HeadStartMissed:
            print(f"scale-out: enqueueing {n:,} tasks took over {n / rate:.0f} s; again")
    raise RuntimeError(f"enqueueing {n:,} tasks never fit the head start; lower --tasks")


def _scale_attempt(
    count: int, n: int, concurrency: int, enqueue_rate: float, workers_each: int, prefetch: int
) -> ScaleRun:
    queue = "bench-scaleout"
    with _pg.fresh_database() as dsn, ExitStack() as stack:
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
            for daemon in [d for d in daemons for _ in range(workers_each)]:
                worker = subprocess.Popen(
                    [
                        *[*_tree.python(), str(pathlib.Path(__file__).resolve())],
                        "--scaleout-worker",
                        *[daemon.endpoint, queue, str(concurrency), str(prefetch)],
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                workers.append(worker)
            lines = [_proc.Lines(worker, "a bench worker") for worker in workers]
            for line in lines:
                assert line.next(60)["event"] == "registered"
            # Time enough to enqueue everything before any of it is due.
            at = datetime.now(UTC) + timedelta(seconds=1.0 + n / enqueue_rate)
            trio.run(_enqueue_at, daemons[0].endpoint, queue, n, at)
            if datetime.now(UTC) >= at:
                raise _HeadStartMissed
            cpu_before = sum(_proc.cpu_seconds(d.pid) for d in daemons)
            server_before = _pg.server_cpu(dsn)
            elapsed = trio.run(_until_idle, daemons[0].endpoint, queue, at)
            daemon_cpu = sum(_proc.cpu_seconds(d.pid) for d in daemons) - cpu_before
            server_cpu = _pg.cpu_since(dsn, server_before)
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
        workers=len(per_worker),
        prefetch=prefetch,
        tasks=n,
        elapsed=elapsed,
        per_worker=per_worker,
        daemon_cpu=daemon_cpu,
        worker_cpu=sum(float(r["cpu"]) for r in reports),
        server_cpu=server_cpu,
    )


def _scaleout_section(runs: Sequence[Sequence[ScaleRun]], repeat: int) -> str:
    best = [max(group, key=lambda r: r.rate) for group in runs]
    # Each row against one daemon and one worker process of its own prefetch.
    base = {r.prefetch: r.rate for r in reversed(best) if (r.daemons, r.workers) == (1, 1)}
    lines = [
        POSTGRES_HEADING,
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, PostgreSQL on"
        f" the same machine (load average {os.getloadavg()[0]:.1f} at the end);"
        f" {best[0].tasks:,} no-op tasks per run, best of {repeat}. N `ringod` processes"
        " on ONE fresh database, one or two worker processes per daemon (`Worker`,"
        " concurrency 64, no-op handler, `prefetch` 0 or 64). Every task is enqueued"
        " with one shared `not_before` after all workers registered, so they start"
        " together; timed from that moment until no task of the queue is active."
        " Reproduce: `python bench/run.py --postgres-only`.",
        "",
        "| daemons / worker processes / prefetch | throughput | vs 1 / 1, same prefetch"
        " | tasks per worker | CPU per 1,000 tasks: workers / daemons / PostgreSQL"
        " | cores busy (sum) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in best:
        per = 1000 / run.tasks
        cpu = run.worker_cpu + run.daemon_cpu + run.server_cpu
        ratio = run.rate / base[run.prefetch] if run.prefetch in base else float("nan")
        lines.append(
            f"| {run.daemons} / {run.workers} / {run.prefetch} | {run.rate:,.0f} tasks/s"
            f" | {ratio:.2f} x | {' / '.join(f'{t:,}' for t in run.per_worker)}"
            f" | {run.worker_cpu * per:.2f} s / {run.daemon_cpu * per:.2f} s"
            f" / {run.server_cpu * per:.2f} s | {cpu / run.elapsed:.2f} |"
        )
    lines += [
        "",
        "Runs: "
        + "; ".join(
            f"{group[0].daemons} / {group[0].workers} / {group[0].prefetch}"
            f" {', '.join(f'{r.rate:,.0f}' for r in group)}"
            for group in runs
        )
        + " tasks/s. PostgreSQL's CPU is that of the database's server backends,"
        " read from /proc; cores busy = all three CPU figures over the run's time"
        " (other jobs on the machine not counted).",
        "",
        "**Reading it.** Every process here shares the same"
        f" {os.cpu_count()} cores: daemons, worker processes and PostgreSQL. Once they"
        " are busy (the last column near the core count), another process only"
        " splits the same CPU, and what moves the rate is CPU per task (the CPU"
        " column). Where cores are left, a second worker process adds handlers'"
        " CPU and a second daemon its own Work streams and round trips; on a"
        " machine per process, throughput grows until the database's CPU or its"
        " commit I/O is the limit.",
        "",
    ]
    return "\n".join(lines) + "\n"


# -- profile -------------------------------------------------------------------


def _package(where: str) -> str:
    """The package a frame belongs to: ``ringo_trio/server/daemon.py`` -> ``ringo_trio.server``."""
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
def _sqlite_daemon(flags: Sequence[str] = ()) -> Iterator[DaemonProcess]:
    """A fresh ``ringod`` on SQLite in a temporary directory, with `flags`."""
    with (
        tempfile.TemporaryDirectory(prefix="ringo-bench-") as tmp,
        spawn_daemon(
            pathlib.Path(tmp) / "data",
            extra_args=["--log-level", "warning", *flags],
            command=_tree.daemon_command(),
        ) as daemon,
    ):
        yield daemon


@contextmanager
def _postgres_daemon(flags: Sequence[str] = ()) -> Iterator[tuple[DaemonProcess, str]]:
    """A fresh ``ringod`` with `flags` on a fresh PostgreSQL database
    (`_pg`); yields it and the DSN."""
    with (
        _pg.fresh_database() as dsn,
        DaemonProcess(
            None,
            postgres_dsn=dsn,
            extra_args=["--log-level", "warning", *flags],
            command=_tree.daemon_command(),
        ) as daemon,
    ):
        yield daemon, dsn


def _metric(name: str, value: float, unit: str, *, higher: bool = True) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "higher_is_better": higher}


def _worker_metrics(run: WorkRun, what: str) -> list[dict[str, Any]]:
    per = 1000 / run.tasks
    return [
        _metric(f"{what}: throughput", run.rate, "tasks/s"),
        _metric(f"{what}: {_STEADY}", run.steady_rate, "tasks/s"),
        _metric(f"{what}: worker CPU per 1,000 tasks", run.worker_cpu * per, "s", higher=False),
        _metric(f"{what}: daemon CPU per 1,000 tasks", run.daemon_cpu * per, "s", higher=False),
        _metric(
            f"{what}: {_CPU_PER_TASK}",
            (run.worker_cpu + run.daemon_cpu) / run.tasks * 1e6,
            "µs",
            higher=False,
        ),
        *(
            [_metric(f"{what}: {_SERVER_CPU}", run.server_cpu * per, "s", higher=False)]
            if run.server_cpu
            else []
        ),
        _metric(f"{what}: worker peak RSS", run.peak_rss_mb, "MB", higher=False),
    ]


# Metric names, shared by the children that measure them and _targets.
_NOOP = "Worker, no-op handler, concurrency 64 ({tasks:,} tasks)"
_SLEEP = "Worker, 10 ms-sleep handler, concurrency 256 ({tasks:,} tasks)"
_STEADY = "steady rate after the first completion"
_CPU_PER_TASK = "worker + daemon CPU per task"
_SERVER_CPU = "PostgreSQL CPU per 1,000 tasks"
# The Worker runs with `prefetch` = concurrency (docs/worker.md): our
# counterpart of the peers' perf configurations (graphile-worker's local
# queue, pgqueuer's batches), on SQLite and on one PostgreSQL daemon.
_NOOP_PREFETCH = "Worker, no-op handler, concurrency 64, prefetch 64 ({tasks:,} tasks)"
_SLEEP_PREFETCH = "Worker, 10 ms-sleep handler, concurrency 256, prefetch 256 ({tasks:,} tasks)"
_PG_NOOP = "PostgreSQL, one daemon, no-op handler, concurrency 64, prefetch 64 ({tasks:,} tasks)"
_PG_SLEEP = (
    "PostgreSQL, one daemon, 10 ms-sleep handler, concurrency 256, prefetch 256 ({tasks:,} tasks)"
)
# --only name: (label, on PostgreSQL, concurrency, handler's sleep, prefetch)
# `--retain-succeeded never`: the acks delete their tasks, as the peers'
# workers delete their jobs (bench/results.md, "Levers").
_NEVER = ("--retain-succeeded", "never")
_KEPT_NEVER = ", succeeded tasks not kept"
_PREFETCH_RUNS: dict[str, tuple[str, bool, int, float, int, tuple[str, ...]]] = {
    "noop_prefetch": (_NOOP_PREFETCH, False, 64, 0.0, 64, ()),
    "sleep_prefetch": (_SLEEP_PREFETCH, False, 256, 0.010, 256, ()),
    "pg_noop": (_PG_NOOP, True, 64, 0.0, 64, ()),
    "pg_sleep": (_PG_SLEEP, True, 256, 0.010, 256, ()),
    "noop_never": (_NOOP_PREFETCH + _KEPT_NEVER, False, 64, 0.0, 64, _NEVER),
    "pg_noop_never": (_PG_NOOP + _KEPT_NEVER, True, 64, 0.0, 64, _NEVER),
}
# The peers run as ours do: no-op at concurrency 64, a 10 ms sleep at 256.
_PEER_RUNS = (("no-op", 64, 0.0), ("10 ms", 256, 0.010))
_PEERS = {
    # --only name: (module, what the rows call it, its server's CPU)
    "graphile": ("peer_graphile", "graphile-worker", "PostgreSQL"),
    "bullmq": ("peer_bullmq", "BullMQ", "Redis"),
    "pgqueuer": ("peer_pgqueuer", "pgqueuer", "PostgreSQL"),
}
_PEER = "{who} {what}, one worker process, concurrency {concurrency} ({tasks:,} tasks)"
_HUEY = "huey {what}, {threads} threads ({tasks:,} tasks)"
_HUEY_RUNS = (("no-op", 16, 0.0), ("10 ms", 100, 0.010))
_PG = "PostgreSQL scale-out, {daemons} daemon(s), {tasks:,} tasks"
_PG_WORKERS = "PostgreSQL scale-out, 1 daemon, 2 worker processes, {tasks:,} tasks"
_PROCRASTINATE = "procrastinate, one worker process, concurrency 64 ({tasks:,} tasks)"
_LATENCY = "enqueue → handler start at low load, {who} ({tasks} tasks {gap:g} ms apart)"
_ENQUEUE_MANY = "enqueue_many, calls of 1000 ({tasks:,} tasks)"


def _huey_metrics(tasks: int) -> list[dict[str, Any]]:
    """The peer's two runs: no-op at 16 threads, next to our no-op at
    concurrency 64, and 10 ms at 100 threads, next to ours at 256."""
    import peer_huey  # huey is a bench-only dependency, needed for this row only

    metrics = []
    for what, threads, sleep in _HUEY_RUNS:
        run = peer_huey.run(tasks, threads, sleep)
        label = _HUEY.format(what=what, threads=threads, tasks=tasks)
        metrics += [
            _metric(f"{label}: {_STEADY}", run.rate, "tasks/s"),
            _metric(f"{label}: consumer CPU per 1,000 tasks", run.cpu_per_1000, "s", higher=False),
            _metric(f"{label}: consumer peak RSS", run.peak_rss_mb, "MB", higher=False),
        ]
    return metrics


def _peer_metrics(name: str, tasks: int) -> list[dict[str, Any]]:
    """A peer of `_PEERS`: its no-op run at concurrency 64 and its 10 ms run
    at 256, each one worker process on a fresh database (or Redis queue)."""
    import importlib

    module_name, who, server = _PEERS[name]
    module = importlib.import_module(module_name)  # bench-only dependencies
    metrics = []
    for what, concurrency, sleep in _PEER_RUNS:
        run = module.run(tasks, concurrency, sleep)
        label = _PEER.format(who=who, what=what, concurrency=concurrency, tasks=tasks)
        per = 1000 / run.counted
        metrics += [
            _metric(f"{label}: {_STEADY}", run.rate, "tasks/s"),
            _metric(f"{label}: enqueue, batches of 1000", run.enqueue_rate, "tasks/s"),
            _metric(
                f"{label}: worker CPU per 1,000 tasks", run.worker_cpu * per, "s", higher=False
            ),
            _metric(
                f"{label}: {server} CPU per 1,000 tasks", run.server_cpu * per, "s", higher=False
            ),
            _metric(f"{label}: worker peak RSS", run.peak_rss_mb, "MB", higher=False),
        ]
    return metrics


def _procrastinate_metrics(tasks: int) -> list[dict[str, Any]]:
    import peer_procrastinate  # a bench-only dependency, needed for this row only

    run = peer_procrastinate.run(tasks)
    label = _PROCRASTINATE.format(tasks=tasks)
    per = 1000 / run.counted
    return [
        _metric(f"{label}: {_STEADY}", run.rate, "tasks/s"),
        _metric(f"{label}: deferral, batches of 1000", run.enqueue_rate, "tasks/s"),
        _metric(f"{label}: worker CPU per 1,000 tasks", run.worker_cpu * per, "s", higher=False),
        _metric(
            f"{label}: PostgreSQL CPU per 1,000 tasks", run.server_cpu * per, "s", higher=False
        ),
        _metric(f"{label}: worker peak RSS", run.peak_rss_mb, "MB", higher=False),
    ]


def _latency_metrics(tasks: int, gap: float) -> list[dict[str, Any]]:
    """Ours (an idle worker process, unary enqueues from trio) and huey's (an
    idle consumer, 16 threads), the same trickle, one after the other."""
    import peer_huey

    with _sqlite_daemon() as daemon:
        ours = _work_run(daemon, "bench-latency", tasks, 64, 0.0, trickle=gap)
    huey = peer_huey.latency(tasks, 16, gap, IDLE)
    metrics = []
    for who, p50, p99 in (
        ("ringo_trio", ours.p50, ours.p99),
        ("huey, 16 threads", huey.p50, huey.p99),
    ):
        label = _LATENCY.format(who=who, tasks=tasks, gap=gap * 1000)
        metrics += [
            _metric(f"{label}: p50", p50 * 1000, "ms", higher=False),
            _metric(f"{label}: p99", p99 * 1000, "ms", higher=False),
        ]
    return metrics


def _tree_child(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Benchmark `name` once (one of compare.BENCHMARK_NAMES) on a fresh daemon."""
    n, tasks = args.n, args.tasks
    if name == "huey":
        return _huey_metrics(args.peer_tasks)
    if name == "procrastinate":
        return _procrastinate_metrics(args.peer_tasks)
    if name in _PEERS:
        return _peer_metrics(name, args.peer_tasks)
    if name in _PREFETCH_RUNS:
        # As the SQLite Worker runs, with a prefetch; on PostgreSQL, one daemon.
        label, postgres, concurrency, sleep, prefetch, flags = _PREFETCH_RUNS[name]
        count = tasks if not sleep else tasks // 2
        with ExitStack() as stack:
            if postgres:
                daemon, dsn = stack.enter_context(_postgres_daemon(flags))
            else:
                daemon, dsn = stack.enter_context(_sqlite_daemon(flags)), None
            run = _work_run(
                daemon, f"bench-{name}", count, concurrency, sleep, dsn=dsn, prefetch=prefetch
            )
        return _worker_metrics(run, label.format(tasks=count))
    if name == "latency":
        return _latency_metrics(args.latency_tasks, args.latency_gap)
    if name == "postgres":
        runs = [_scale_run(count, tasks) for count in (1, 2, 3)]
        two = _scale_run(1, tasks, workers=2)
        return [
            *(_metric(_PG.format(daemons=r.daemons, tasks=tasks), r.rate, "tasks/s") for r in runs),
            _metric(_PG_WORKERS.format(tasks=tasks), two.rate, "tasks/s"),
        ]
    with _sqlite_daemon() as daemon:
        if name == "enqueue_many":
            rate = trio.run(_prefill, daemon.endpoint, "bench-enqueue", tasks)
            return [_metric(_ENQUEUE_MANY.format(tasks=tasks), rate, "tasks/s")]
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


# What runs on the --start-tree too: held against it in the targets table.
_ON_START_TREE = ("unary", "noop", "sleep")


def _targets(args: argparse.Namespace) -> list[compare.Target]:
    """The issue's targets, each with what it is held against in the same run."""
    Target = compare.Target
    tasks, peer_tasks = args.tasks, args.peer_tasks
    noop, sleep = _NOOP.format(tasks=tasks), _SLEEP.format(tasks=tasks // 2)
    huey = [_HUEY.format(what=w, threads=t, tasks=peer_tasks) for w, t, _ in _HUEY_RUNS]
    procrastinate = f"{_PROCRASTINATE.format(tasks=peer_tasks)}: {_STEADY}"
    latency = [
        _LATENCY.format(who=who, tasks=args.latency_tasks, gap=args.latency_gap * 1000)
        for who in ("ringo_trio", "huey, 16 threads")
    ]
    pg = [_PG.format(daemons=d, tasks=tasks) for d in (1, 2, 3)]
    pg_runs = (_PG_NOOP.format(tasks=tasks), _PG_SLEEP.format(tasks=tasks // 2))
    fast = (_NOOP_PREFETCH.format(tasks=tasks), _SLEEP_PREFETCH.format(tasks=tasks // 2))
    ratio = TARGET_PEER_RATIO

    def peer(name: str, run: int) -> str:
        what, concurrency, _ = _PEER_RUNS[run]
        who = _PEERS[name][1]
        return _PEER.format(who=who, what=what, concurrency=concurrency, tasks=peer_tasks)

    # Each fast peer with the engine and the runs of ours it is held against,
    # and what the two runs of each are.
    companions = (
        ("graphile", "PostgreSQL", pg_runs),
        ("pgqueuer", "PostgreSQL", pg_runs),
        ("bullmq", "SQLite", fast),
    )
    runs_of = ("no-op c=64", "10 ms c=256")

    # Our no-op runs on a daemon that keeps no succeeded task, as the peers
    # keep no finished job: the like-for-like rows, held to the same goals.
    never = {
        engine: _PREFETCH_RUNS[name][0].format(tasks=tasks)
        for engine, name in (("PostgreSQL", "pg_noop_never"), ("SQLite", "noop_never"))
    }
    kept_never = "no-op c=64, succeeded tasks not kept"
    goals = (TARGET_GRAPHILE_RATIO, TARGET_PGQUEUER_RATIO, TARGET_BULLMQ_RATIO)
    # (peer, what, our run, the peer's run, goal)
    steady = [
        (name, f"{engine}, {what}", ours, i, goal)
        for (name, engine, runs), goal in zip(companions, goals, strict=True)
        for i, (ours, what) in enumerate(zip(runs, runs_of, strict=True))
    ] + [
        (name, f"{engine}, {kept_never}", never[engine], 0, goal)
        for (name, engine, _runs), goal in zip(companions, goals, strict=True)
    ]
    against_peers = [
        Target(
            f"{what} / {_PEERS[name][1]}, steady rate",
            f"{ours}: {_STEADY}",
            "tasks/s",
            peer=f"{peer(name, i)}: {_STEADY}",
            ratio_at_least=goal,
        )
        for name, what, ours, i, goal in steady
    ]
    cpu_per_task = [
        Target(
            f"{engine}, {what}, worker + daemon CPU per task",
            f"{ours}: {_CPU_PER_TASK}",
            "µs",
            at_most=TARGET_CPU_PER_TASK_US if what.startswith("no-op c=64") else None,
        )
        for engine, runs, whats in (
            ("SQLite", (noop, sleep), runs_of),
            ("SQLite, prefetch", fast, runs_of),
            ("PostgreSQL, prefetch", pg_runs, runs_of),
            ("SQLite", (never["SQLite"],), (kept_never,)),
            ("PostgreSQL", (never["PostgreSQL"],), (kept_never,)),
        )
        for ours, what in zip(runs, whats, strict=True)
    ]
    worker_cpu = [
        Target(
            f"worker CPU per 1,000 tasks, {what} ({engine}) / {_PEERS[name][1]}",
            f"{ours}: worker CPU per 1,000 tasks",
            "s",
            peer=f"{peer(name, i)}: worker CPU per 1,000 tasks",
        )
        for name, engine, runs in companions
        for i, (ours, what) in enumerate(zip(runs, runs_of, strict=True))
    ]
    server_cpu = [
        Target(
            f"PostgreSQL CPU per 1,000 tasks, {what} / {_PEERS[name][1]}",
            f"{ours}: {_SERVER_CPU}",
            "s",
            peer=f"{peer(name, i)}: PostgreSQL CPU per 1,000 tasks",
        )
        for name in ("graphile", "pgqueuer")
        for ours, what, i in (
            *((ours, what, i) for i, (ours, what) in enumerate(zip(pg_runs, runs_of, strict=True))),
            (never["PostgreSQL"], kept_never, 0),
        )
    ]
    return [
        *against_peers,
        *cpu_per_task,
        *worker_cpu,
        *server_cpu,
        Target(
            "no-op handler, c=64, one worker process / huey (16 threads), steady rate",
            f"{noop}: {_STEADY}",
            "tasks/s",
            peer=f"{huey[0]}: {_STEADY}",
            ratio_at_least=ratio,
        ),
        Target(
            "10 ms handler, c=256 / huey (100 threads), steady rate",
            f"{sleep}: {_STEADY}",
            "tasks/s",
            peer=f"{huey[1]}: {_STEADY}",
            ratio_at_least=ratio,
        ),
        Target(
            "PostgreSQL, one daemon / procrastinate (one worker, concurrency 64)",
            pg[0],
            "tasks/s",
            peer=procrastinate,
            ratio_at_least=TARGET_POSTGRES_RATIO,
        ),
        Target("PostgreSQL, 2 daemons / procrastinate", pg[1], "tasks/s", peer=procrastinate),
        Target("PostgreSQL, 3 daemons / procrastinate", pg[2], "tasks/s", peer=procrastinate),
        Target(
            "PostgreSQL, 1 daemon + 2 worker processes / procrastinate",
            _PG_WORKERS.format(tasks=tasks),
            "tasks/s",
            peer=procrastinate,
        ),
        Target(
            "enqueue_many, calls of 1000",
            _ENQUEUE_MANY.format(tasks=tasks),
            "tasks/s",
            at_least=TARGET_ENQUEUE,
        ),
        Target(
            "unary Enqueue from trio, 40 concurrent / the start tree",
            f"Enqueue, 40 concurrent (n={args.n})",
            "calls/s",
            baseline=True,
            ratio_at_least=1.0,
        ),
        *(
            Target(f"{what}, {label} / the start tree", f"{run}: {metric}", unit, baseline=True)
            for what, run in (("no-op c=64", noop), ("10 ms c=256", sleep))
            for label, metric, unit in (
                ("steady rate", _STEADY, "tasks/s"),
                ("worker CPU per 1,000 tasks", "worker CPU per 1,000 tasks", "s"),
                ("daemon CPU per 1,000 tasks", "daemon CPU per 1,000 tasks", "s"),
            )
        ),
        Target(
            "worker peak RSS, no-op c=64 / huey consumer (16 threads)",
            f"{noop}: worker peak RSS",
            "MB",
            peer=f"{huey[0]}: consumer peak RSS",
            at_most=TARGET_RSS_MB,
        ),
        Target(
            "worker peak RSS, 10 ms c=256 / huey consumer (100 threads)",
            f"{sleep}: worker peak RSS",
            "MB",
            peer=f"{huey[1]}: consumer peak RSS",
            at_most=TARGET_RSS_MB,
        ),
        Target(
            "latency at low load, enqueue → handler start, p50 / huey",
            f"{latency[0]}: p50",
            "ms",
            peer=f"{latency[1]}: p50",
            at_most=TARGET_LATENCY_P50_MS,
        ),
        Target(
            "latency at low load, enqueue → handler start, p99 / huey",
            f"{latency[0]}: p99",
            "ms",
            peer=f"{latency[1]}: p99",
        ),
    ]


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


def _sqlite_rows(args: argparse.Namespace, repeat: int) -> str:
    """The first table: this tree alone, best of `repeat`."""
    n, tasks = args.n, args.tasks
    load_before = os.getloadavg()[0]
    with _sqlite_daemon() as daemon:
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
        " (or `python bench/run.py`). The issue's targets, side by side with the peers,"
        f' are in the next section ("{compare.PEER_HEADING[3:]}").\n\n'
    )
    footer = (
        f"\nWorker rows are timed from the worker's registration until `Worker.close()`"
        f" returned (every ack answered), then checked with the daemon (no task of the"
        f" queue PENDING or LEASED). Best no-op run: {noop.elapsed:.2f} s; runs:"
        f" {', '.join(f'{r.rate:,.0f}' for r in noops)} tasks/s (no-op),"
        f" {', '.join(f'{r.rate:,.0f}' for r in slows)} tasks/s (10 ms)."
        f" Producer (this) process peak RSS {bench_rss:.0f} MB.\n\n"
    )
    return header + _table(unary, noop, slow, enqueue) + footer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small, fast run (smoke test)")
    parser.add_argument("-n", type=int, default=None, help="unary operations per measurement")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per Worker run")
    parser.add_argument(
        "--peer-tasks", type=int, default=None, help="tasks per huey / procrastinate run"
    )
    parser.add_argument("--latency-tasks", type=int, default=200, help="tasks per latency run")
    parser.add_argument(
        "--latency-gap", type=float, default=0.005, help="seconds between latency enqueues"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per row, best counts; in side-by-side rounds: rounds, the median counts",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure git revision REV, side by side, and report current / baseline",
    )
    parser.add_argument(
        "--start-tree",
        metavar="REV",
        default=START_TREE,
        help=f"the tree unary Enqueue and the Worker runs are held against"
        f" (default {START_TREE}; 'none': skip)",
    )
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        metavar="NAME[,NAME]",
        help=f"run only these benchmarks ({', '.join(compare.BENCHMARK_NAMES)})",
    )
    parser.add_argument("--profile", type=pathlib.Path, default=None, metavar="DIR")
    parser.add_argument(
        "--native", action="store_true", help="with --profile: native frames too (slower)"
    )
    parser.add_argument("--no-write", action="store_true", help="print, do not write results.md")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--postgres-only", action="store_true", help="only the scale-out rows")
    which.add_argument(
        "--no-postgres", action="store_true", help="skip PostgreSQL (ours and procrastinate)"
    )
    parser.add_argument("--scaleout-worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--tree-child", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.scaleout_worker is not None:
        endpoint, queue, concurrency, prefetch = args.scaleout_worker
        _worker.tune_gc_if_known()
        trio.run(_scaleout_worker, endpoint, queue, int(concurrency), int(prefetch))
        return
    args.n = args.n or (300 if args.quick else 2000)
    args.tasks = args.tasks or (2000 if args.quick else 20_000)
    args.peer_tasks = args.peer_tasks or (1000 if args.quick else 10_000)
    if args.tree_child is not None:
        print(json.dumps({"metrics": _tree_child(args.tree_child, args)}))
        return
    repeat = args.repeat or (1 if args.quick else 3)

    def write(heading: str | None, section: str, *, first: bool = False) -> None:
        sys.stdout.write(section)
        if not args.no_write:
            text = RESULTS.read_text() if RESULTS.exists() else ""
            text = compare.replace_section(text, heading, section, first=first)
            RESULTS.write_text(text)

    if args.profile is not None:
        if args.baseline is not None or args.only is not None:
            parser.error("--profile measures one tree: not with --baseline or --only")
        with _sqlite_daemon() as daemon:
            print(_profile(daemon, args.tasks, args.profile, native=args.native))
        return
    if args.postgres_only:
        runs = [
            [
                _scale_run(daemons, args.tasks, workers=workers, prefetch=prefetch)
                for _ in range(repeat)
            ]
            for daemons, workers, prefetch in SCALE_OUT
        ]
        write(POSTGRES_HEADING, _scaleout_section(runs, repeat))
        return
    names = args.only or list(compare.BENCHMARK_NAMES)
    unknown = set(names) - set(compare.BENCHMARK_NAMES)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
    names = compare.expand(names)
    if args.no_postgres:
        names = [name for name in names if name not in compare.POSTGRES_NAMES]
    sizes = (
        f"unary n={args.n}, {args.tasks:,} tasks per run of ours, {args.peer_tasks:,} per"
        f" peer run, latency {args.latency_tasks} tasks {args.latency_gap * 1000:g} ms apart"
        f"{' (--quick)' if args.quick else ''}"
    )
    options = [
        *["-n", str(args.n), "--tasks", str(args.tasks), "--peer-tasks", str(args.peer_tasks)],
        *["--latency-tasks", str(args.latency_tasks), "--latency-gap", repr(args.latency_gap)],
    ]
    rounds = args.repeat or (1 if args.quick else 3)
    if args.baseline is not None:
        # Two trees; the peers do not change with the tree.
        names = [name for name in names if name not in compare.PEER_NAMES]
        if not names:
            parser.error("--baseline compares two trees; the peers are not one (drop --baseline)")
        write(compare.HEADING, compare.compare(args.baseline, names, rounds, options, sizes))
        return
    if args.only is None:
        write(None, _sqlite_rows(args, repeat))
    on_start_tree = [name for name in _ON_START_TREE if name in names]
    section = compare.compare(
        None if args.start_tree == "none" or not on_start_tree else args.start_tree,
        names,
        rounds,
        options,
        sizes,
        targets=_targets(args),
        baseline_names=on_start_tree,
    )
    write(compare.PEER_HEADING, section, first=True)


if __name__ == "__main__":
    main()
