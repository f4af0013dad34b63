"""The ``ringo`` command line.

``ringo demo``
    The README's main job, end to end on the embedded default: a private
    daemon on SQLite, N tasks enqueued with ``enqueue_many``, ONE credit
    controlled `Worker` working them off (injected sleeps and failures), a
    live progress bar, then a summary table checked against the daemon.

``ringo worker module:function --queue Q``
    Run a handler as a worker of one queue, against a daemon (``--endpoint``)
    or a private one (``--data-dir``), until SIGINT or SIGTERM; the first
    signal drains gracefully (`Worker.close`), a second one stops at once.

Exit codes: 0 success, 1 failure (a demo task unaccounted for, the daemon
gone), 2 usage (bad flags, a handler that cannot be imported), 130 a second
Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import math
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TextIO

import trio

from ._client import Ringo, RingoClient
from ._errors import PermanentTaskError, RetryTaskError, RingoError
from ._models import Task, TaskSpec, TaskState
from ._proto.ringo.v1 import GetQueueActivityRequest, GetQueueActivityResponse
from ._queue import TaskQueue
from ._worker import Handler, TaskContext

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_NO_DELAY = timedelta(0)
#: Redraw cadence of the progress bar on a terminal, and of the plain
#: progress lines when the output is a file or a pipe.
_TTY_REFRESH = 0.2
_LOG_REFRESH = 1.0
#: Tasks whose final state is cross-checked with GetTask after a demo.
_VERIFY_SAMPLE = 100


# -- ringo demo ---------------------------------------------------------------


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
    reply = await client._call(
        "GetQueueActivity",
        GetQueueActivityRequest(queue=queue),
        GetQueueActivityResponse,
        read_only=True,
    )
    return int(reply.active_task_count)


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


async def _demo(args: argparse.Namespace, data_dir: str, out: TextIO, bar_out: TextIO) -> int:
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


def _run_demo(args: argparse.Namespace) -> int:
    problems = []
    if args.tasks < 1:
        problems.append("--tasks must be >= 1")
    if args.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    if not 1 <= args.batch <= 1000:
        problems.append("--batch must be between 1 and 1000")
    if not 0.0 <= args.failure_rate <= 1.0:
        problems.append("--failure-rate must be in [0, 1]")
    if not args.sleep >= 0.0:
        problems.append("--sleep must be >= 0")
    if not 1 <= args.max_attempts <= 1000:
        problems.append("--max-attempts must be between 1 and 1000")
    if problems:
        print(f"ringo demo: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_USAGE
    # The bar goes where a person watches: the terminal on stdout, else stderr
    # (so that a redirected stdout holds just the report).
    bar_out = sys.stdout if sys.stdout.isatty() else sys.stderr
    with ExitStack() as stack:
        data_dir = args.data_dir
        if data_dir is None:
            data_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="ringo-demo-", ignore_cleanup_errors=True)
            )
        return _trio_main("ringo demo", _demo, args, data_dir, sys.stdout, bar_out)


# -- ringo worker -------------------------------------------------------------


class _UsageError(Exception):
    pass


def load_handler(spec: str) -> Handler:
    """Import ``module:function`` (also from the current directory); `_UsageError` if it fails."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _UsageError(f"handler {spec!r} must look like module:function")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise _UsageError(
            f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise _UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise _UsageError(f"{spec} is a {type(target).__name__}, not a callable")
    handler: Handler = target
    return handler


def _logged(handler: Handler) -> Handler:
    """The handler, reporting its failures on stderr (it still raises them to the worker)."""

    async def run(task: Task, ctx: TaskContext) -> Any:
        try:
            result = handler(task, ctx)
            if inspect.isawaitable(result):
                result = await result
            return result
        except (RetryTaskError, PermanentTaskError) as exc:
            print(
                f"ringo worker: task {task.id} attempt {ctx.attempt}/{ctx.max_attempts}:"
                f" {type(exc).__name__}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            raise
        except Exception:
            print(
                f"ringo worker: task {task.id} attempt {ctx.attempt}/{ctx.max_attempts} failed:",
                file=sys.stderr,
            )
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            raise

    return run


@dataclass
class _WorkerState:
    stop: Callable[[], None] | None = None  # set once registered: starts the drain
    forced: bool = False


async def _watch_signals(
    signals: Any, state: _WorkerState, scope: trio.CancelScope, grace: float
) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        if state.stop is None:
            # Not registered yet (or a second signal): nothing to drain, stop now.
            state.forced = True
            print(f"ringo worker: {name}, stopping now", file=sys.stderr, flush=True)
            scope.cancel()
            return
        print(
            f"ringo worker: {name}, draining (grace period {grace:g} s;"
            " send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        stop, state.stop = state.stop, None
        stop()


async def _worker_main(args: argparse.Namespace, handler: Handler) -> int:
    state = _WorkerState()
    grace = float(args.grace_period)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            outer.start_soon(_watch_signals, signals, state, outer.cancel_scope, grace)
            client = (
                Ringo.connect(args.endpoint, token=args.token)
                if args.endpoint is not None
                else Ringo.local(args.data_dir)
            )
            async with client:
                worker = client.queue(args.queue).worker(
                    _logged(handler),
                    task_types=args.task_type or None,
                    concurrency=args.concurrency,
                    lease_duration=timedelta(seconds=args.lease_duration),
                    grace_period=timedelta(seconds=grace),
                )
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    print(
                        f"ringo worker: registered {worker.worker_id} on queue {args.queue!r}"
                        f" at {client.endpoint} (concurrency {args.concurrency})",
                        flush=True,
                    )
                    state.stop = lambda: nursery.start_soon(worker.close)
                # worker.run returned: closed by a signal (drained), or failed.
                state.stop = None
            outer.cancel_scope.cancel()
    if state.forced:
        return EXIT_INTERRUPTED
    print("ringo worker: drained, bye", file=sys.stderr, flush=True)
    return EXIT_OK


def _run_worker(args: argparse.Namespace) -> int:
    problems = []
    if (args.endpoint is None) == (args.data_dir is None):
        problems.append("give exactly one of --endpoint and --data-dir")
    if args.token is not None and args.endpoint is None:
        problems.append("--token needs --endpoint")
    if args.concurrency < 1:
        problems.append("--concurrency must be >= 1")
    if not args.lease_duration > 0:
        problems.append("--lease-duration must be > 0")
    if not args.grace_period >= 0:
        problems.append("--grace-period must be >= 0")
    if problems:
        print(f"ringo worker: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        handler = load_handler(args.handler)
    except _UsageError as exc:
        print(f"ringo worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _trio_main("ringo worker", _worker_main, args, handler)


# -- running ------------------------------------------------------------------


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _trio_main(prog: str, fn: Callable[..., Awaitable[int]], *args: Any) -> int:
    """`trio.run`, with expected failures (also inside exception groups) as one line."""
    # The demo's progress bar may have left the cursor mid-line.
    nl = "\n" if prog == "ringo demo" else ""
    try:
        return trio.run(fn, *args)
    except BaseException as error:
        leaves = _leaves(error)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            print(f"{nl}{prog}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if all(isinstance(leaf, RingoError | OSError) for leaf in leaves):
            for leaf in leaves:
                print(f"{nl}{prog}: {type(leaf).__name__}: {leaf}", file=sys.stderr)
            return EXIT_FAILURE
        raise


# -- parsing ------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringo", description="Ringo task queue tools")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo",
        help="enqueue and work off tasks on a private SQLite daemon, then summarize",
        description="Start a private daemon on SQLite, enqueue tasks, work them off with one"
        " worker while showing a progress bar, and print a summary checked against the daemon.",
    )
    demo.add_argument("-n", "--tasks", type=int, default=10_000, help="tasks to run (10000)")
    demo.add_argument(
        "-c", "--concurrency", type=int, default=64, help="handlers running at once (64)"
    )
    demo.add_argument(
        "--batch", type=int, default=1000, help="tasks per enqueue_many call, at most 1000 (1000)"
    )
    demo.add_argument(
        "--failure-rate",
        type=float,
        default=0.05,
        help="probability that an attempt fails and is retried at once (0.05)",
    )
    demo.add_argument("--sleep", type=float, default=0.0, help="seconds each handler sleeps (0)")
    demo.add_argument(
        "--max-attempts", type=int, default=3, help="attempts per task before it is DEAD (3)"
    )
    demo.add_argument("--queue", default="demo", help="queue name (demo)")
    demo.add_argument("--data-dir", default=None, help="data dir (default: a fresh temp dir)")

    worker = commands.add_parser(
        "worker",
        help="run module:function as a worker of a queue until Ctrl-C / SIGTERM",
        description="Run a handler `async def handle(task, ctx)` as a worker. The first SIGINT"
        " or SIGTERM drains (no new tasks; running handlers get the grace period), a second"
        " one stops at once.",
    )
    worker.add_argument("handler", help="the handler, as module:function (module may be in .)")
    worker.add_argument("-q", "--queue", required=True, help="queue to work on")
    worker.add_argument("--endpoint", default=None, help="daemon to connect to (host:port or URL)")
    worker.add_argument("--data-dir", default=None, help="run a private daemon on this data dir")
    worker.add_argument("--token", default=None, help="bearer token for --endpoint")
    worker.add_argument(
        "-c", "--concurrency", type=int, default=1, help="handlers running at once (1)"
    )
    worker.add_argument(
        "--task-type",
        action="append",
        default=[],
        help="only these task types (repeatable; default all)",
    )
    worker.add_argument(
        "--lease-duration", type=float, default=60.0, help="lease duration, seconds (60)"
    )
    worker.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        help="seconds running handlers get to finish on shutdown (30)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _run_demo(args)
    if args.command == "worker":
        return _run_worker(args)
    return EXIT_USAGE  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
