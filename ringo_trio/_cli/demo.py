"""``ringo demo``: the README's main job, end to end on the embedded default.

A private daemon on SQLite, N tasks enqueued with ``enqueue_many``, ONE
credit-controlled `Worker` working them off (injected sleeps and failures),
a live progress bar, then a summary table checked against the daemon. The
flags are parsed and checked by `ringo_trio._cli.main`.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TextIO

import trio

from .._client import Ringo, RingoClient
from .._errors import RetryTaskError
from .._models import Task, TaskSpec, TaskState
from .._queue.queue import TaskQueue
from .._work._handlers import Handler, TaskContext
from .ops import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

_NO_DELAY = timedelta(0)
#: Redraw cadence of the progress bar on a terminal, and of the plain
#: progress lines when the output is a file or a pipe.
_TTY_REFRESH = 0.2
_LOG_REFRESH = 1.0
#: Tasks whose final state is cross-checked with GetTask after a demo.
_VERIFY_SAMPLE = 100


@dataclass
class _DemoStats:
    total: int
    succeeded: int = 0
    dead: int = 0
    retries: int = 0
    #: Monotonic time of the last task reaching its final outcome.
    last_settled: float = 0.0
    #: Final outcome per task id, as its handler decided it.
    outcomes: dict[str, TaskState] = field(default_factory=dict)
    #: Seconds from the daemon's ``created_at`` to the handler's ack.
    latencies: list[float] = field(default_factory=list)
    all_done: trio.Event = field(default_factory=trio.Event)

    @property
    def done(self) -> int:
        return self.succeeded + self.dead


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (nan when empty)."""
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


class _Progress:
    """A one-line bar redrawn in place on a terminal; plain lines otherwise."""

    def __init__(self, stats: _DemoStats, out: TextIO, *, tty: bool) -> None:
        self.stats = stats
        self.out = out
        self.tty = tty
        self.interval = _TTY_REFRESH if tty else _LOG_REFRESH
        self.started: float | None = None

    def _rate(self) -> float:
        if self.started is None:
            return 0.0
        return self.stats.done / max(time.monotonic() - self.started, 1e-9)

    def draw(self) -> None:
        s = self.stats
        if self.tty:
            width = 30
            filled = int(width * s.done / s.total) if s.total else width
            self.out.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {s.done:,}/{s.total:,}"
                f"  {self._rate():,.0f} tasks/s  retries {s.retries:,}  dead {s.dead:,}   "
            )
        else:
            self.out.write(
                f"progress: {s.done:,}/{s.total:,} done  {self._rate():,.0f} tasks/s"
                f"  retries {s.retries:,}  dead {s.dead:,}\n"
            )
        self.out.flush()

    async def run(self) -> None:
        while True:
            await trio.sleep(self.interval)
            self.draw()

    def finish(self) -> None:
        self.draw()
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def _demo_handler(stats: _DemoStats, args: argparse.Namespace) -> Handler:
    sleep: float = args.sleep
    failure_rate: float = args.failure_rate
    outcomes = stats.outcomes
    latencies = stats.latencies
    clock = time.time
    rand = random.random

    async def handle(task: Task, ctx: TaskContext) -> None:
        if sleep > 0:
            await trio.sleep(sleep)
        fail = failure_rate > 0 and rand() < failure_rate
        if task.id in outcomes:  # redelivered after its outcome: count it once
            if fail:
                raise RetryTaskError("demo failure", delay=_NO_DELAY)
            return
        if fail:
            if ctx.attempt >= ctx.max_attempts:
                # The daemon turns a failed last attempt into DEAD.
                outcomes[task.id] = TaskState.DEAD
                stats.dead += 1
                _settled(stats)
            else:
                stats.retries += 1
            raise RetryTaskError("demo failure", delay=_NO_DELAY)
        outcomes[task.id] = TaskState.SUCCEEDED
        stats.succeeded += 1
        if task.created_at is not None:
            latencies.append(clock() - task.created_at.timestamp())
        _settled(stats)

    return handle


def _settled(stats: _DemoStats) -> None:
    stats.last_settled = time.monotonic()
    if stats.done >= stats.total:
        stats.all_done.set()


async def _active_count(client: RingoClient, queue: str) -> int:
    """PENDING + LEASED tasks of the queue, as the daemon counts them."""
    return await client.queue(queue).active_count()


async def _verify(
    client: RingoClient, queue: TaskQueue, stats: _DemoStats, ids: list[str]
) -> list[str]:
    """Ask the daemon whether every task is accounted for; the problems found."""
    problems: list[str] = []
    active = await _active_count(client, queue.name)
    if active:
        problems.append(f"the daemon still holds {active:,} PENDING or LEASED task(s)")
    missing = len(set(ids) - stats.outcomes.keys())
    if missing:
        problems.append(f"{missing:,} task(s) never reached SUCCEEDED or DEAD in a handler")
    for task_id in random.sample(ids, min(_VERIFY_SAMPLE, len(ids))):
        task = await queue.get_by_id(task_id)
        expected = stats.outcomes.get(task_id)
        if expected is not None and task.state is not expected:
            problems.append(
                f"task {task_id}: the handler settled it {expected.name}, the daemon says"
                f" {task.state.name}"
            )
    return problems


def _ms(seconds: float) -> str:
    return "n/a (nothing acked)" if math.isnan(seconds) else f"{seconds * 1000:,.0f} ms"


def _table(rows: Sequence[tuple[str, str]]) -> str:
    name_w = max(len("metric"), *(len(name) for name, _ in rows))
    value_w = max(len("value"), *(len(value) for _, value in rows))
    lines = [
        f"| {'metric'.ljust(name_w)} | {'value'.ljust(value_w)} |",
        f"|{'-' * (name_w + 2)}|{'-' * (value_w + 2)}|",
    ]
    lines += [f"| {name.ljust(name_w)} | {value.rjust(value_w)} |" for name, value in rows]
    return "\n".join(lines) + "\n"


async def demo(args: argparse.Namespace, data_dir: str, out: TextIO, bar_out: TextIO) -> int:
    """`_demo_run`, stopped cleanly (a cancellation, not a KeyboardInterrupt
    landing anywhere) by SIGINT or SIGTERM."""
    code = EXIT_INTERRUPTED
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    print(f"\nringo demo: {signal.Signals(signum).name}, stopping", file=sys.stderr)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            code = await _demo_run(args, data_dir, out, bar_out)
            nursery.cancel_scope.cancel()
    return code


async def _demo_run(args: argparse.Namespace, data_dir: str, out: TextIO, bar_out: TextIO) -> int:
    where = data_dir if args.data_dir else f"{data_dir} (temporary, removed afterwards)"
    out.write(f"ringo demo: private daemon on SQLite in {where}\n")
    out.flush()
    async with Ringo.local(data_dir) as client:
        queue = client.queue(args.queue)
        leftover = await _active_count(client, queue.name)
        if leftover:
            # The counts below are of this run's tasks only; refuse to mix.
            print(
                f"ringo demo: queue {queue.name!r} in {data_dir} already holds {leftover:,}"
                " PENDING or LEASED task(s); use another --queue or --data-dir",
                file=sys.stderr,
            )
            return EXIT_USAGE
        stats = _DemoStats(total=args.tasks)
        out.write(
            f"ringo demo: enqueueing {args.tasks:,} tasks (enqueue_many, {args.batch} per call)\n"
        )
        out.flush()
        ids: list[str] = []
        enqueue_started = time.monotonic()
        for start in range(0, args.tasks, args.batch):
            specs = [
                TaskSpec(
                    task_type="demo", payload=f"task-{i}".encode(), max_attempts=args.max_attempts
                )
                for i in range(start, min(start + args.batch, args.tasks))
            ]
            result = await queue.enqueue_many(specs)
            ids.extend(r.task.id for r in result.results)
        enqueue_seconds = time.monotonic() - enqueue_started
        out.write(
            f"ringo demo: working them off with one worker, concurrency {args.concurrency}"
            f" (sleep {args.sleep:g} s, failure rate {args.failure_rate:g},"
            f" max attempts {args.max_attempts})\n"
        )
        out.flush()
        progress = _Progress(stats, bar_out, tty=bar_out.isatty())
        worker = queue.worker(
            _demo_handler(stats, args),
            concurrency=args.concurrency,
            grace_period=timedelta(seconds=5),
            # A safety net: should a task never reach its handler, the drained
            # queue still ends the run (and the check below reports it).
            on_idle=stats.all_done.set,
        )
        async with trio.open_nursery() as nursery:
            started = time.monotonic()
            progress.started = started
            await nursery.start(worker.run)
            nursery.start_soon(progress.run)
            await stats.all_done.wait()
            # Throughput counts until the last task settled, not until the
            # close below (nor until on_idle, which waits out 1 s of quiet).
            elapsed = max(stats.last_settled, started) - started
            progress.finish()
            await worker.close()
            nursery.cancel_scope.cancel()
        problems = await _verify(client, queue, stats, ids)
    latencies = sorted(stats.latencies)
    rows = [
        ("tasks", f"{stats.total:,}"),
        ("succeeded", f"{stats.succeeded:,}"),
        ("dead", f"{stats.dead:,}"),
        ("retries", f"{stats.retries:,}"),
        ("elapsed", f"{elapsed:.2f} s"),
        ("throughput", f"{stats.done / max(elapsed, 1e-9):,.0f} tasks/s"),
        ("enqueue (enqueue_many)", f"{stats.total / max(enqueue_seconds, 1e-9):,.0f} tasks/s"),
        ("latency p50 enqueue→ack", _ms(_percentile(latencies, 0.50))),
        ("latency p99 enqueue→ack", _ms(_percentile(latencies, 0.99))),
        ("concurrency", f"{args.concurrency}"),
    ]
    out.write("\n" + _table(rows))
    if problems:
        for problem in problems:
            out.write(f"ringo demo: UNACCOUNTED: {problem}\n")
        out.flush()
        return EXIT_FAILURE
    out.write(
        f"ringo demo: all {stats.total:,} tasks accounted for (the daemon holds none active)\n"
    )
    out.flush()
    return EXIT_OK
